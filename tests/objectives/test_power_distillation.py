"""Tests for rljax.objectives.power_distillation: the spec's toy, numpy references, SFT gradient."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.core.batch import make_batch
from rljax.objectives.power_distillation import power_distillation, power_weights

weights_fn = jax.jit(power_weights, static_argnames=("alpha", "group_size"))

# The spec's toy over tokens a = 0, b = 1: P(ab) = 0.4, P(ba) = P(bb) = 0.3, i.e.
# P(a) = 0.4, P(b | a) = 1, P(b) = 0.6, P(a | b) = P(b | b) = 0.5. One group holds each sequence
# once; the proposal is uniform over the three sequences (log q = log 1/3 on the first token).
TOY_TOKENS = np.array([[0, 1], [1, 0], [1, 1]], np.int32)
TOY_REF = np.log(np.array([[0.4, 1.0], [0.6, 0.5], [0.6, 0.5]], np.float32))
TOY_Q = np.array([[math.log(1 / 3), 0.0]] * 3, np.float32)


def make(tokens, mask, ref, old, group_size, rollout=None, loss_weights=None):
    b, t = mask.shape
    return make_batch(
        prompt_tokens=np.zeros((b, 1)),
        prompt_mask=np.ones((b, 1)),
        completion_tokens=tokens,
        completion_mask=mask,
        group_id=np.arange(b) // group_size,
        rewards=np.zeros(b),
        rollout_logprobs=rollout,
        old_logprobs=old,
        ref_logprobs=ref,
        loss_weights=loss_weights,
    )


TOY = make(TOY_TOKENS, np.ones((3, 2), bool), TOY_REF, TOY_Q, 3)
TOY_OBJ = jax.jit(power_distillation(3, alpha=4.0))


def weights_reference(teacher, proposal, alpha, g, valid=None):
    """SNIS weights by explicit loops, in float64."""
    valid = np.ones(len(teacher), bool) if valid is None else valid
    out = np.zeros(len(teacher))
    for start in range(0, len(teacher), g):
        idx = [i for i in range(start, start + g) if valid[i]]
        if not idx:
            continue
        logs = [alpha * float(teacher[i]) - float(proposal[i]) for i in idx]
        top = max(logs)
        z = sum(math.exp(v - top) for v in logs)
        for i, v in zip(idx, logs):
            out[i] = math.exp(v - top) / z
    return out


def test_toy_power_distribution_prefers_first_token_a():
    w = np.asarray(weights_fn(jnp.array(TOY_REF.sum(1)), jnp.array(TOY_Q.sum(1)), 4.0, 3))
    z = 0.4**4 + 2 * 0.3**4  # 0.0256 + 2 * 0.0081
    np.testing.assert_allclose(w, [0.4**4 / z, 0.3**4 / z, 0.3**4 / z], rtol=1e-5)
    # Under p^4 the first token is a with probability 0.612 ...
    np.testing.assert_allclose(w[0], 0.6124, atol=1e-4)
    # ... while p itself puts 0.6 on first token b, and per-token tempering p_1^4 does too.
    p_first = np.exp(TOY_REF[:, 0])
    assert p_first[1] == pytest.approx(0.6)
    assert 0.4**4 / (0.4**4 + 0.6**4) < 0.5
    loss, metrics = TOY_OBJ(jnp.zeros((3, 2)), jnp.zeros((3, 2)), TOY)
    assert loss == 0 and metrics["power/loss"] == 0  # new log-probs 0: log pi = 0
    np.testing.assert_allclose(metrics["power/weight_ess"], 1 / np.sum(w**2), rtol=1e-5)
    np.testing.assert_allclose(metrics["power/max_weight"], 0.4**4 / z, rtol=1e-5)


def test_sft_on_toy_group_learns_p_alpha():
    # A tabular policy trained by gradient descent on the loss converges to the SNIS target:
    # pi(first = a) -> 0.612, pi(a | b) -> 0.5 (ba and bb carry equal weight).
    def new_logprobs(params):
        first = jax.nn.log_softmax(params["first"])  # [2]
        second = jax.nn.log_softmax(params["second"], axis=-1)  # [2, 2], row = first token
        t0, t1 = TOY_TOKENS[:, 0], TOY_TOKENS[:, 1]
        return jnp.stack([first[t0], second[t0, t1]], axis=1)

    def loss_fn(params):
        return TOY_OBJ(new_logprobs(params), jnp.zeros((3, 2)), TOY)[0]

    @jax.jit
    def train(params):
        def step(_, p):
            g = jax.grad(loss_fn)(p)
            return jax.tree_util.tree_map(lambda x, d: x - 2.0 * d, p, g)

        return jax.lax.fori_loop(0, 300, step, params)

    params = train({"first": jnp.zeros(2), "second": jnp.zeros((2, 2))})
    pi_first = np.asarray(jax.nn.softmax(params["first"]))
    pi_second_b = np.asarray(jax.nn.softmax(params["second"][1]))
    z = 0.4**4 + 2 * 0.3**4
    np.testing.assert_allclose(pi_first[0], 0.4**4 / z, atol=1e-3)
    np.testing.assert_allclose(pi_second_b, [0.5, 0.5], atol=1e-4)


def test_alpha_one_with_q_equal_p_gives_uniform_weights():
    rng = np.random.default_rng(0)
    lp = np.log(rng.uniform(0.05, 1.0, size=(8, 5))).astype(np.float32)
    mask = np.ones((8, 5), bool)
    batch = make(np.zeros((8, 5), np.int32), mask, lp, lp, 4)
    obj = power_distillation(4, alpha=1.0)
    new = jnp.array(rng.normal(size=(8, 5)), jnp.float32)
    loss, metrics = obj(new, jnp.zeros((8, 5)), batch)
    np.testing.assert_allclose(metrics["power/weight_ess"], 4.0, rtol=1e-5)
    np.testing.assert_allclose(metrics["power/max_weight"], 0.25, rtol=1e-5)
    # Uniform weights: the plain SFT loss, the mean over the 2 groups of the group's mean.
    np.testing.assert_allclose(loss, -np.asarray(new).sum() / 4 / 2, rtol=1e-5)
    # teacher="old" reads old_logprobs: with alpha = 1 and q = p it is uniform too.
    _, m_old = power_distillation(4, 1.0, teacher="old")(new, jnp.zeros((8, 5)), batch)
    np.testing.assert_allclose(m_old["power/weight_ess"], 4.0, rtol=1e-5)


@pytest.mark.parametrize("g", [1, 2, 4])
def test_weights_match_reference(g):
    rng = np.random.default_rng(g)
    teacher = rng.normal(-5.0, 2.0, size=8).astype(np.float32)
    proposal = rng.normal(-5.0, 2.0, size=8).astype(np.float32)
    valid = np.array([1, 1, 0, 1, 1, 1, 1, 0], bool)
    out = weights_fn(jnp.array(teacher), jnp.array(proposal), 3.0, g, jnp.array(valid))
    ref = weights_reference(teacher, proposal, 3.0, g, valid)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-7)
    sums = np.asarray(out).reshape(-1, g).sum(1)
    has_valid = valid.reshape(-1, g).any(1)
    np.testing.assert_allclose(sums[has_valid], 1.0, rtol=1e-6)
    np.testing.assert_array_equal(sums[~has_valid], 0.0)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.floats(-50.0, 0.0), min_size=6, max_size=6),
    st.lists(st.floats(-50.0, 0.0), min_size=6, max_size=6),
    st.permutations(range(3)),
)
def test_weights_sum_to_one_and_permute_within_groups(teacher, proposal, perm):
    teacher, proposal = np.array(teacher, np.float32), np.array(proposal, np.float32)
    out = np.asarray(weights_fn(jnp.array(teacher), jnp.array(proposal), 4.0, 3))
    assert np.all(np.isfinite(out)) and np.all(out >= 0)
    np.testing.assert_allclose(out.reshape(2, 3).sum(1), 1.0, rtol=1e-5)
    idx = np.concatenate([np.array(perm), 3 + np.array(perm)])
    permuted = np.asarray(weights_fn(jnp.array(teacher[idx]), jnp.array(proposal[idx]), 4.0, 3))
    np.testing.assert_allclose(permuted, out[idx], rtol=1e-5, atol=1e-7)


RNG = np.random.default_rng(7)
B4_MASK = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], bool)
B4_REF = np.log(RNG.uniform(0.1, 1.0, size=(4, 4))).astype(np.float32)
B4_OLD = np.log(RNG.uniform(0.1, 1.0, size=(4, 4))).astype(np.float32)
B4_ROLL = np.log(RNG.uniform(0.1, 1.0, size=(4, 4))).astype(np.float32)
B4_NEW = np.log(RNG.uniform(0.1, 1.0, size=(4, 4))).astype(np.float32)
B4_W = B4_MASK * np.array([[1.0, 0.5, 2.0, 0.0]], np.float32)  # uneven token weights


@pytest.mark.parametrize("proposal", ["old", "rollout"])
@pytest.mark.parametrize("length_normalize", [False, True])
def test_gradient_equals_weighted_sft_gradient(proposal, length_normalize):
    batch = make(np.zeros((4, 4), np.int32), B4_MASK, B4_REF, B4_OLD, 2, B4_ROLL, B4_W)
    obj = power_distillation(2, alpha=2.5, proposal=proposal, length_normalize=length_normalize)
    (loss, metrics), grad = jax.value_and_grad(obj, has_aux=True)(
        jnp.array(B4_NEW), jnp.zeros((4, 4)), batch
    )
    q = B4_OLD if proposal == "old" else B4_ROLL
    w = weights_reference((B4_REF * B4_MASK).sum(1), (q * B4_MASK).sum(1), 2.5, 2)
    norm = B4_W.sum(1) if length_normalize else np.ones(4)

    def weighted_sft(lp):  # explicit weighted SFT with the numpy weights held fixed
        return -jnp.sum(jnp.asarray(w / norm, jnp.float32)[:, None] * B4_W * lp) / 2

    ref_loss, ref_grad = jax.value_and_grad(weighted_sft)(jnp.array(B4_NEW))
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-8)
    # By hand: d loss / d lp_it = -w_i * lw_it / norm_i / #groups.
    np.testing.assert_allclose(grad, -(w / norm)[:, None] * B4_W / 2, rtol=1e-5, atol=1e-8)
    ess = [1 / np.sum(w[:2] ** 2), 1 / np.sum(w[2:] ** 2)]
    np.testing.assert_allclose(metrics["power/weight_ess"], np.mean(ess), rtol=1e-5)
    np.testing.assert_allclose(metrics["power/max_weight"], w.max(), rtol=1e-5)


def test_filtered_rows_drop_out_and_stay_finite():
    weights = B4_MASK.astype(np.float32)
    weights[1] = 0.0  # a filter removed sample 1: sample 0 carries its group alone
    weights[2:] = 0.0  # the whole second group removed: it is not counted
    new = B4_NEW.copy()
    new[~B4_MASK] = np.nan  # garbage at padded positions
    batch = make(np.zeros((4, 4), np.int32), B4_MASK, B4_REF, B4_OLD, 2, loss_weights=weights)
    (loss, metrics), grad = jax.value_and_grad(power_distillation(2), has_aux=True)(
        jnp.array(new), jnp.zeros((4, 4)), batch
    )
    np.testing.assert_allclose(loss, -B4_NEW[0, :3].sum(), rtol=1e-5)  # w_0 = 1, 1 group
    assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[1:] == 0)
    np.testing.assert_allclose(metrics["power/weight_ess"], 1.0, rtol=1e-6)
    empty = make(
        np.zeros((4, 4), np.int32), B4_MASK, B4_REF, B4_OLD, 2, loss_weights=np.zeros((4, 4))
    )
    loss, metrics = power_distillation(2)(jnp.array(new), jnp.zeros((4, 4)), empty)
    assert loss == 0 and all(np.isfinite(v) for v in metrics.values())


def test_errors():
    with pytest.raises(ValueError, match="alpha=0.0 must be > 0"):
        power_distillation(2, alpha=0.0)
    with pytest.raises(ValueError, match="alpha=-1"):
        power_weights(jnp.zeros(4), jnp.zeros(4), -1, 2)
    with pytest.raises(ValueError, match="teacher='policy'"):
        power_distillation(2, teacher="policy")
    with pytest.raises(ValueError, match="proposal='ref'"):
        power_distillation(2, proposal="ref")
    with pytest.raises(ValueError, match="group_size=0"):
        power_distillation(0)
    with pytest.raises(ValueError, match="group_size=3 does not divide batch 4"):
        power_weights(jnp.zeros(4), jnp.zeros(4), 2.0, 3)
    batch = make(np.zeros((4, 4), np.int32), B4_MASK, B4_REF, B4_OLD, 2)
    with pytest.raises(ValueError, match="group_size=3 does not divide batch 4"):
        power_distillation(3)(jnp.array(B4_NEW), jnp.zeros((4, 4)), batch)
    with pytest.raises(ValueError, match="mixes group ids"):
        power_distillation(2)(
            jnp.array(B4_NEW), jnp.zeros((4, 4)), batch.replace(group_id=jnp.array([0, 1, 0, 1]))
        )

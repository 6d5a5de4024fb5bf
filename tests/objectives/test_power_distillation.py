"""Tests for rljax.objectives.power_distillation: the spec's toy, references, micro-batches."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.core.aggregation import aggregation_denominator
from rljax.core.batch import make_batch
from rljax.core.transform import Context
from rljax.objectives.power_distillation import power_weighting, power_weights, weighted_sft

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


CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
SFT = jax.jit(weighted_sft())
SFT_GRAD = jax.jit(jax.value_and_grad(weighted_sft(), has_aux=True))


def prepare(batch, group_size, **kwargs):
    """Runs `power_weighting` on the whole batch, as the prepare step does."""
    t = power_weighting(group_size, **kwargs)
    out, state, metrics = t.apply(batch, t.init(), CTX)
    assert state == ()
    return out, metrics


TOY = make(TOY_TOKENS, np.ones((3, 2), bool), TOY_REF, TOY_Q, 3)
TOY_PREPARED, TOY_METRICS = prepare(TOY, 3, alpha=4.0)


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


def loss_reference(new, lw, mask, teacher, proposal, alpha, g, length_normalize=False):
    """The old group-reading loss -(1/#groups) sum_i w_i log pi(y_i), by explicit loops."""
    b, t = lw.shape
    valid = np.array([any(lw[i, j] > 0 for j in range(t)) for i in range(b)])
    t_seq = [sum(float(teacher[i, j]) for j in range(t) if mask[i, j]) for i in range(b)]
    q_seq = [sum(float(proposal[i, j]) for j in range(t) if mask[i, j]) for i in range(b)]
    w = weights_reference(t_seq, q_seq, alpha, g, valid)
    total = 0.0
    for i in range(b):
        pos = [j for j in range(t) if lw[i, j] > 0]
        s = sum(float(lw[i, j]) * float(new[i, j]) for j in pos)
        if length_normalize and pos:
            s /= sum(float(lw[i, j]) for j in pos)
        total += w[i] * s
    n_groups = sum(valid[k : k + g].any() for k in range(0, b, g))
    return -total / max(n_groups, 1)


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
    # Nothing filtered: loss_weights become G * w_i on every token.
    np.testing.assert_allclose(TOY_PREPARED.loss_weights, 3 * w[:, None] * np.ones((3, 2)), 1e-5)
    loss, metrics = SFT(jnp.zeros((3, 2)), jnp.zeros((3, 2)), TOY_PREPARED)
    assert loss == 0 and metrics["power/loss"] == 0  # new log-probs 0: log pi = 0
    np.testing.assert_allclose(TOY_METRICS["power/weight_ess"], 1 / np.sum(w**2), rtol=1e-5)
    np.testing.assert_allclose(TOY_METRICS["power/max_weight"], 0.4**4 / z, rtol=1e-5)


def test_sft_on_toy_group_learns_p_alpha():
    # A tabular policy trained by gradient descent on the loss converges to the SNIS target:
    # pi(first = a) -> 0.612, pi(a | b) -> 0.5 (ba and bb carry equal weight).
    def new_logprobs(params):
        first = jax.nn.log_softmax(params["first"])  # [2]
        second = jax.nn.log_softmax(params["second"], axis=-1)  # [2, 2], row = first token
        t0, t1 = TOY_TOKENS[:, 0], TOY_TOKENS[:, 1]
        return jnp.stack([first[t0], second[t0, t1]], axis=1)

    def loss_fn(params):
        return weighted_sft()(new_logprobs(params), jnp.zeros((3, 2)), TOY_PREPARED)[0]

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
    prepared, metrics = prepare(batch, 4, alpha=1.0)
    np.testing.assert_allclose(metrics["power/weight_ess"], 4.0, rtol=1e-5)
    np.testing.assert_allclose(metrics["power/max_weight"], 0.25, rtol=1e-5)
    np.testing.assert_allclose(prepared.loss_weights, 1.0, rtol=1e-5)  # G * 1/G
    new = jnp.array(rng.normal(size=(8, 5)), jnp.float32)
    loss, _ = weighted_sft()(new, jnp.zeros((8, 5)), prepared)
    # Uniform weights: the plain SFT loss, the mean over the 2 groups of the group's mean.
    np.testing.assert_allclose(loss, -np.asarray(new).sum() / 4 / 2, rtol=1e-5)
    # teacher="old" reads old_logprobs: with alpha = 1 and q = p it is uniform too.
    _, m_old = prepare(batch, 4, alpha=1.0, teacher="old")
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
    prepared, metrics = prepare(
        batch, 2, alpha=2.5, proposal=proposal, length_normalize=length_normalize
    )
    (loss, _), grad = SFT_GRAD(jnp.array(B4_NEW), jnp.zeros((4, 4)), prepared)
    q = B4_OLD if proposal == "old" else B4_ROLL
    w = weights_reference((B4_REF * B4_MASK).sum(1), (q * B4_MASK).sum(1), 2.5, 2)
    norm = B4_W.sum(1) if length_normalize else np.ones(4)

    def explicit_sft(lp):  # explicit weighted SFT with the numpy weights held fixed
        return -jnp.sum(jnp.asarray(w / norm, jnp.float32)[:, None] * B4_W * lp) / 2

    ref_loss, ref_grad = jax.value_and_grad(explicit_sft)(jnp.array(B4_NEW))
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    ref = loss_reference(B4_NEW, B4_W, B4_MASK, B4_REF, q, 2.5, 2, length_normalize)
    np.testing.assert_allclose(loss, ref, rtol=1e-5)
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
    prepared, metrics = prepare(batch, 2)
    # |S| = 1 row over N = 1 group: c = 1, not G = 2, so the loss keeps its old value.
    np.testing.assert_allclose(prepared.loss_weights, weights * np.array([1, 0, 0, 0])[:, None])
    (loss, _), grad = SFT_GRAD(jnp.array(new), jnp.zeros((4, 4)), prepared)
    np.testing.assert_allclose(loss, -B4_NEW[0, :3].sum(), rtol=1e-5)  # w_0 = 1, 1 group
    assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[1:] == 0)
    np.testing.assert_allclose(metrics["power/weight_ess"], 1.0, rtol=1e-6)
    empty = make(
        np.zeros((4, 4), np.int32), B4_MASK, B4_REF, B4_OLD, 2, loss_weights=np.zeros((4, 4))
    )
    prepared, metrics = prepare(empty, 2)
    assert np.all(np.asarray(prepared.loss_weights) == 0)
    loss, sft_metrics = SFT(jnp.array(new), jnp.zeros((4, 4)), prepared)
    assert loss == 0 and all(np.isfinite(v) for v in {**metrics, **sft_metrics}.values())


# Two groups of four with filtered rows (1 wholly, 6 wholly) and uneven token weights: the
# factor c = |S| / N = 6 / 2 = 3 differs from G = 4.
MB_RNG = np.random.default_rng(11)
MB_MASK = MB_RNG.uniform(size=(8, 5)) < 0.8
MB_MASK[:, 0] = True
MB_W = MB_MASK * MB_RNG.uniform(0.2, 2.0, size=(8, 5)).astype(np.float32)
MB_W[[1, 6]] = 0.0
MB_REF = np.log(MB_RNG.uniform(0.1, 1.0, size=(8, 5))).astype(np.float32)
MB_OLD = np.log(MB_RNG.uniform(0.1, 1.0, size=(8, 5))).astype(np.float32)
MB_NEW = np.log(MB_RNG.uniform(0.1, 1.0, size=(8, 5))).astype(np.float32)
MB_BATCH = make(np.zeros((8, 5), np.int32), MB_MASK, MB_REF, MB_OLD, 4, loss_weights=MB_W)
MB_PREPARED = {ln: prepare(MB_BATCH, 4, alpha=3.0, length_normalize=ln)[0] for ln in (0, 1)}


def accumulate(objective_grad, prepared, new, perm, mode):
    """steps.update's accumulation: rows shuffled by perm, 2 micro-batches, weighted by d_m."""
    total_loss, total_weight = 0.0, 0.0
    grad = np.zeros(new.shape, np.float64)
    for ids in np.split(np.asarray(perm), 2):
        sub = jax.tree.map(lambda x, ids=ids: x[ids], prepared)
        lp = jnp.array(new[ids])
        (sub_loss, _), sub_grad = objective_grad(lp, jnp.zeros_like(lp), sub)
        d = float(aggregation_denominator(sub.loss_weights, mode))
        total_loss += d * float(sub_loss)
        grad[ids] += d * np.asarray(sub_grad)
        total_weight += d
    return total_loss / total_weight, grad / total_weight


@settings(max_examples=10, deadline=None)
@given(st.permutations(range(8)), st.booleans())
def test_loss_and_gradient_unchanged_by_shuffled_micro_batches(perm, length_normalize):
    prepared = MB_PREPARED[int(length_normalize)]
    (full_loss, _), full_grad = SFT_GRAD(jnp.array(MB_NEW), jnp.zeros((8, 5)), prepared)
    ref = loss_reference(MB_NEW, MB_W, MB_MASK, MB_REF, MB_OLD, 3.0, 4, length_normalize)
    np.testing.assert_allclose(full_loss, ref, rtol=1e-5)
    loss, grad = accumulate(SFT_GRAD, prepared, MB_NEW, perm, "seq-mean-token-sum")
    np.testing.assert_allclose(loss, ref, rtol=1e-5)
    np.testing.assert_allclose(grad, full_grad, rtol=1e-5, atol=1e-8)


def test_transform_jits_and_matches_eager():
    t = power_weighting(4, alpha=3.0)
    out, _, metrics = jax.jit(t.apply)(MB_BATCH, t.init(), CTX)
    np.testing.assert_allclose(out.loss_weights, MB_PREPARED[0].loss_weights, rtol=1e-6)
    assert set(metrics) == {"power/weight_ess", "power/max_weight"}


def test_weighted_sft_other_aggregation():
    lw = B4_W
    batch = make(np.zeros((4, 4), np.int32), B4_MASK, B4_REF, B4_OLD, 2, loss_weights=lw)
    loss, metrics = weighted_sft("token-mean")(jnp.array(B4_NEW), jnp.zeros((4, 4)), batch)
    np.testing.assert_allclose(loss, -(lw * B4_NEW).sum() / lw.sum(), rtol=1e-5)
    np.testing.assert_allclose(metrics["power/loss"], loss)


def test_errors():
    with pytest.raises(ValueError, match="alpha=0.0 must be > 0"):
        power_weighting(2, alpha=0.0)
    with pytest.raises(ValueError, match="alpha=-1"):
        power_weights(jnp.zeros(4), jnp.zeros(4), -1, 2)
    with pytest.raises(ValueError, match="teacher='policy'"):
        power_weighting(2, teacher="policy")
    with pytest.raises(ValueError, match="proposal='ref'"):
        power_weighting(2, proposal="ref")
    with pytest.raises(ValueError, match="group_size=0"):
        power_weighting(0)
    with pytest.raises(ValueError, match="group_size=3 does not divide batch 4"):
        power_weights(jnp.zeros(4), jnp.zeros(4), 2.0, 3)
    with pytest.raises(ValueError, match="unknown aggregation mode 'sum'"):
        weighted_sft("sum")
    with pytest.raises(ValueError, match="max_len=8 is only used"):
        weighted_sft(max_len=8)
    batch = make(np.zeros((4, 4), np.int32), B4_MASK, B4_REF, B4_OLD, 2)
    with pytest.raises(ValueError, match="group_size=3 does not divide batch 4"):
        prepare(batch, 3)
    with pytest.raises(ValueError, match="mixes group ids"):
        prepare(batch.replace(group_id=jnp.array([0, 1, 0, 1])), 2)

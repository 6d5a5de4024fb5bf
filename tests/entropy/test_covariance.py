"""Tests for rljax.entropy.covariance against numpy references and Cui et al.'s entropy law."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.core.batch import make_batch
from rljax.core.transform import Context
from rljax.entropy.covariance import (
    clip_cov,
    covariance_noise,
    kl_cov,
    logprob_advantage_covariance,
    token_covariance,
)
from rljax.objectives.surrogate import ppo_clip

CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
token_covariance_jit = jax.jit(token_covariance)
covariance_jit = jax.jit(logprob_advantage_covariance)
PPO = ppo_clip()
PPO_GRAD = jax.jit(jax.grad(lambda new, batch: PPO(new, jnp.zeros_like(new), batch)[0]))


@functools.lru_cache(maxsize=None)
def jitted(factory, **kwargs):
    """(value_and_grad of the objective's loss w.r.t. new_logprobs, with metrics), jitted once."""
    obj = factory(**kwargs)

    def loss(new, batch):
        return obj(new, jnp.zeros_like(new), batch)

    return jax.jit(jax.value_and_grad(loss, has_aux=True))


def make(old, adv, mask, loss_weights=None, noise=None):
    b, t = mask.shape
    extras = {} if noise is None else {"cov_noise": jnp.asarray(noise, jnp.float32)}
    return make_batch(
        prompt_tokens=np.zeros((b, 1)),
        prompt_mask=np.ones((b, 1)),
        completion_tokens=np.zeros((b, t)),
        completion_mask=mask,
        group_id=np.arange(b),
        rewards=np.zeros(b),
        old_logprobs=old,
        advantages=adv,
        loss_weights=loss_weights,
        extras=extras,
    )


def ref_token_cov(logp, adv, mask):
    """cov_i by explicit loops over the valid tokens, float64."""
    idx = [(i, j) for i in range(mask.shape[0]) for j in range(mask.shape[1]) if mask[i, j]]
    out = np.zeros(mask.shape)
    if not idx:
        return out
    mean_a = sum(float(adv[i, j]) for i, j in idx) / len(idx)
    mean_l = sum(float(logp[i, j]) for i, j in idx) / len(idx)
    for i, j in idx:
        out[i, j] = (float(adv[i, j]) - mean_a) * (float(logp[i, j]) - mean_l)
    return out


def random_case(seed, b=4, t=6, hole_p=0.3, log_ratio_scale=0.3):
    rng = np.random.default_rng(seed)
    mask = rng.random((b, t)) > hole_p
    old = -np.abs(rng.normal(size=(b, t))).astype(np.float32)
    new = (old + log_ratio_scale * rng.normal(size=(b, t))).astype(np.float32)
    adv = rng.normal(size=(b, t)).astype(np.float32)
    noise = rng.random((b, t)).astype(np.float32)
    return mask, old, new, adv, noise


# ---------------------------------------------------------------- covariance


def test_token_covariance_matches_loop_reference_with_holes():
    mask, _, new, adv, _ = random_case(0, b=3, t=5)
    mask[1, 2:] = False
    out = token_covariance_jit(jnp.array(new), jnp.array(adv), jnp.array(mask))
    ref = ref_token_cov(new, adv, mask)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(out)[~mask], 0.0)
    scalar = covariance_jit(jnp.array(new), jnp.array(adv), jnp.array(mask))
    np.testing.assert_allclose(scalar, ref[mask].mean(), rtol=1e-5, atol=1e-7)
    # Independent check: the divide-by-N sample covariance of the valid values.
    np.testing.assert_allclose(scalar, np.cov(new[mask], adv[mask], bias=True)[0, 1], rtol=1e-4)


def test_covariance_ignores_invalid_values_and_empty_mask_is_zero():
    mask, _, new, adv, _ = random_case(1, b=2, t=4)
    poisoned_new, poisoned_adv = new.copy(), adv.copy()
    poisoned_new[~mask], poisoned_adv[~mask] = 1e6, -1e6
    a = covariance_jit(jnp.array(new), jnp.array(adv), jnp.array(mask))
    b = covariance_jit(jnp.array(poisoned_new), jnp.array(poisoned_adv), jnp.array(mask))
    np.testing.assert_allclose(a, b, rtol=1e-6)
    empty = jnp.zeros((2, 4), bool)
    np.testing.assert_array_equal(token_covariance_jit(jnp.array(new), jnp.array(adv), empty), 0)
    assert float(covariance_jit(jnp.array(new), jnp.array(adv), empty)) == 0.0


def test_covariance_shape_check():
    with pytest.raises(AssertionError):
        token_covariance(jnp.zeros((2, 3)), jnp.zeros((2, 4)), jnp.ones((2, 3), bool))


# ---------------------------------------------------------------- clip_cov

# Hand case. Valid tokens (row 0: cols 0-2, row 1: cols 0-2), col 3 is padding.
# A = [2, 2, 2 | -2, -2, -2] (mean 0), log pi_new = -2 + [1, 1.5, 0.5 | -1, -1.5, -0.5]
# (mean -2), so cov = [2, 3, 1 | 2, 3, 1]. With 1 < cov < 5 the candidates are cols 0 and 1 of
# both rows (cov = 1 is excluded: strict bound). clip_ratio 0.34: int(0.34 * 6) = 2 detached.
HAND_MASK = np.array([[1, 1, 1, 0], [1, 1, 1, 0]], bool)
HAND_ADV = np.array([[2.0, 2.0, 2.0, 50.0], [-2.0, -2.0, -2.0, 50.0]], np.float32)
HAND_NEW = np.array([[-1.0, -0.5, -1.5, 0.0], [-3.0, -3.5, -2.5, 0.0]], np.float32)
HAND_DELTA = np.array([[0.05, -0.1, 0.1, 0.0], [0.02, 0.1, -0.05, 0.0]], np.float32)
HAND_OLD = HAND_NEW - HAND_DELTA
# Smallest noise overall is on a non-candidate (0, 2) and the padding; among the candidates
# (0, 1) and (1, 0) have the smallest noise.
HAND_NOISE = np.array([[0.5, 0.2, 0.01, 0.0], [0.1, 0.9, 0.05, 0.0]], np.float32)


def ppo_per_token(new, old, adv, eps_low=0.2, eps_high=0.2):
    r = np.exp(np.clip(new.astype(np.float64) - old, -20, 20))
    return np.maximum(-adv * r, -adv * np.clip(r, 1 - eps_low, 1 + eps_high)), r


def test_clip_cov_hand_case_detaches_exactly_the_smallest_noise_candidates():
    np.testing.assert_allclose(
        ref_token_cov(HAND_NEW, HAND_ADV, HAND_MASK)[HAND_MASK], [2, 3, 1, 2, 3, 1], atol=1e-12
    )
    batch = make(HAND_OLD, HAND_ADV, HAND_MASK, noise=HAND_NOISE)
    (loss, metrics), grad = jitted(clip_cov, clip_ratio=0.34)(jnp.array(HAND_NEW), batch)
    detached = np.zeros_like(HAND_MASK)
    detached[0, 1] = detached[1, 0] = True
    grad = np.asarray(grad)
    np.testing.assert_array_equal(grad == 0, detached | ~HAND_MASK)
    per_token, r = ppo_per_token(HAND_NEW, HAND_OLD, HAND_ADV)
    keep = HAND_MASK & ~detached
    np.testing.assert_allclose(loss, per_token[keep].sum() / 6, rtol=1e-5)
    np.testing.assert_allclose(grad[keep], (-HAND_ADV * r)[keep] / 6, rtol=1e-5)
    np.testing.assert_allclose(metrics["clip_cov/detached_frac"], 2 / 6, rtol=1e-6)
    np.testing.assert_allclose(metrics["clip_cov/clip_frac"], 0.0)
    np.testing.assert_allclose(metrics["clip_cov/cov_mean"], 2.0, rtol=1e-5)
    np.testing.assert_allclose(metrics["clip_cov/loss"], loss)


def test_clip_cov_never_detaches_tokens_clipped_by_ppo():
    # Token (1, 0) has cov = 2 but log-ratio -0.5 with A = -2: r = 0.61 < 0.8, clipped by PPO.
    # Clipping does not touch the covariance (new log-probs are the same).
    old = HAND_OLD.copy()
    old[1, 0] = HAND_NEW[1, 0] + 0.5
    batch = make(old, HAND_ADV, HAND_MASK, noise=HAND_NOISE)
    (loss, metrics), grad = jitted(clip_cov, clip_ratio=1.0)(jnp.array(HAND_NEW), batch)
    # clip_ratio 1: every candidate is detached, i.e. (0, 0), (0, 1), (1, 1) but not (1, 0).
    per_token, _ = ppo_per_token(HAND_NEW, old, HAND_ADV)
    np.testing.assert_allclose(per_token[1, 0], 2.0 * 0.8, rtol=1e-6)
    kept = [(0, 2), (1, 0), (1, 2)]
    np.testing.assert_allclose(loss, sum(per_token[ij] for ij in kept) / 6, rtol=1e-5)
    np.testing.assert_allclose(metrics["clip_cov/detached_frac"], 3 / 6, rtol=1e-6)
    np.testing.assert_allclose(metrics["clip_cov/clip_frac"], 1 / 6, rtol=1e-6)
    assert float(grad[1, 0]) == 0.0  # clipped: PPO's own zero gradient


def ref_clip_cov_selection(new, old, adv, mask, weights, noise, ratio, lo, hi):
    """Candidates and the detached set, following the authors' rules in numpy (float64)."""
    valid = mask & (weights > 0)
    r = np.exp(np.clip(new.astype(np.float64) - old, -20, 20))
    clipped = (-adv * np.clip(r, 0.8, 1.2) > -adv * r) & valid
    cov = ref_token_cov(new, adv, valid)
    candidate = valid & ~clipped & (cov > lo) & (cov < hi)
    n = int(valid.sum())
    count = min(max(int(ratio * n), 1), int(candidate.sum()))
    idx = [ij for ij in np.argwhere(candidate)]
    idx.sort(key=lambda ij: noise[tuple(ij)])
    detached = np.zeros_like(mask)
    for ij in idx[:count]:
        detached[tuple(ij)] = True
    return candidate, detached, count, n


RATIOS = [0.01, 0.05, 0.1, 0.29, 0.5, 0.7, 1.0]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), ratio=st.sampled_from(RATIOS))
def test_clip_cov_detached_count_and_set_are_exact(seed, ratio):
    mask, old, new, adv, noise = random_case(seed)
    rng = np.random.default_rng(seed + 1)
    weights = (rng.choice([0.0, 0.5, 1.0], size=mask.shape, p=[0.15, 0.35, 0.5]) * mask).astype(
        np.float32
    )
    batch = make(old, adv, mask, loss_weights=weights, noise=noise)
    (_, metrics), grad = jitted(clip_cov, clip_ratio=ratio, cov_lower=-0.3, cov_upper=0.3)(
        jnp.array(new), batch
    )
    candidate, detached, count, n = ref_clip_cov_selection(
        new, old, adv, mask, weights, noise, ratio, -0.3, 0.3
    )
    detached_frac = float(metrics["clip_cov/detached_frac"])
    assert round(detached_frac * n) == count if n else detached_frac == 0.0
    # Candidates are unclipped with positive weight, so their gradient is zero iff detached.
    np.testing.assert_array_equal((np.asarray(grad) == 0) & candidate, detached)


def test_clip_cov_gradient_is_ppo_clip_gradient_except_at_detached_tokens():
    mask, old, new, adv, noise = random_case(7, b=4, t=8, log_ratio_scale=0.4)
    batch = make(old, adv, mask, noise=noise)
    weights = mask.astype(np.float32)
    (loss, metrics), grad = jitted(clip_cov, clip_ratio=0.2, cov_lower=-0.5, cov_upper=0.5)(
        jnp.array(new), batch
    )
    _, detached, count, _ = ref_clip_cov_selection(
        new, old, adv, mask, weights, noise, 0.2, -0.5, 0.5
    )
    assert count >= 2
    g_ppo = np.asarray(PPO_GRAD(jnp.array(new), batch))
    grad = np.asarray(grad)
    np.testing.assert_array_equal(grad[detached], 0.0)
    assert np.all(g_ppo[detached] != 0)  # the rule really removed a gradient
    np.testing.assert_allclose(grad[~detached], g_ppo[~detached], rtol=1e-6, atol=1e-9)
    assert float(metrics["clip_cov/clip_frac"]) > 0  # some tokens clipped by PPO in this case


def test_clip_cov_without_candidates_equals_ppo_clip_exactly():
    mask, old, new, adv, noise = random_case(3, log_ratio_scale=0.4)
    batch = make(old, adv, mask, noise=noise)
    (loss, metrics), grad = jitted(clip_cov, cov_lower=1e3, cov_upper=2e3)(jnp.array(new), batch)
    ppo_loss, ppo_metrics = jax.jit(PPO)(jnp.array(new), jnp.zeros_like(new), batch)
    np.testing.assert_array_equal(loss, ppo_loss)
    np.testing.assert_array_equal(grad, PPO_GRAD(jnp.array(new), batch))
    np.testing.assert_allclose(metrics["clip_cov/clip_frac"], ppo_metrics["pg/clip_frac"])
    assert float(metrics["clip_cov/detached_frac"]) == 0.0


def test_clip_cov_empty_batch_is_finite_zero():
    mask = np.zeros((2, 3), bool)
    z = np.zeros((2, 3), np.float32)
    (loss, metrics), grad = jitted(clip_cov)(jnp.array(z), make(z, z + 1, mask, noise=z))
    assert float(loss) == 0.0
    assert all(np.isfinite(float(v)) for v in metrics.values())
    np.testing.assert_array_equal(grad, 0.0)


def test_exclude_zero_weight_controls_which_tokens_enter_the_means():
    mask, old, new, adv, noise = random_case(5)
    weights = mask.astype(np.float32)
    weights[0] = 0.0  # a row a filter removed
    batch = make(old, adv, mask, loss_weights=weights, noise=noise)
    for flag, valid in [(True, mask & (weights > 0)), (False, mask)]:
        (_, metrics), _ = jitted(clip_cov, exclude_zero_weight=flag)(jnp.array(new), batch)
        ref = ref_token_cov(new, adv, valid)[valid].mean()
        np.testing.assert_allclose(metrics["clip_cov/cov_mean"], ref, rtol=1e-5)
        (_, metrics), _ = jitted(kl_cov, exclude_zero_weight=flag)(jnp.array(new), batch)
        np.testing.assert_allclose(metrics["kl_cov/cov_mean"], ref, rtol=1e-5)


def test_covariance_noise_transform():
    mask, old, _, adv, _ = random_case(0)
    batch = make(old, adv, mask)
    batch = batch.replace(extras={"other": jnp.ones(4)})
    t = covariance_noise()
    out, state, metrics = jax.jit(t.apply)(batch, t.init(), CTX)
    noise = np.asarray(out.extras["cov_noise"])
    assert noise.shape == mask.shape and noise.dtype == np.float32
    assert noise.min() >= 0.0 and noise.max() < 1.0
    np.testing.assert_array_equal(noise, jax.random.uniform(CTX.rng, mask.shape))
    np.testing.assert_array_equal(out.extras["other"], 1.0)
    assert state == () and metrics == {}
    other, _, _ = t.apply(batch, (), CTX.replace(rng=jax.random.PRNGKey(1)))
    assert not np.array_equal(other.extras["cov_noise"], noise)


# ---------------------------------------------------------------- kl_cov


def ref_kl_cov(new, old, adv, mask, ratio, coef):
    """Loss, gradient w.r.t. new and selected set by the authors' rules in numpy (float64)."""
    cov = ref_token_cov(new, adv, mask)
    idx = np.argwhere(mask)
    n = len(idx)
    k = max(1, int(ratio * n))
    order = np.argsort(-cov[mask], kind="stable")[:k]
    selected = np.zeros_like(mask)
    for m in order:
        selected[tuple(idx[m])] = True
    lr = new.astype(np.float64) - old
    r = np.exp(lr)
    per_token = -adv * r + coef * np.abs(lr) * selected
    grad = (-adv * r + coef * np.sign(lr) * selected) * mask / n
    return per_token[mask].sum() / n, grad, selected, k, n


def test_kl_cov_selects_top_k_by_covariance_with_reference_loss_and_gradient():
    mask, old, new, adv, _ = random_case(11, b=4, t=6)
    batch = make(old, adv, mask)
    (loss, metrics), grad = jitted(kl_cov, kl_coef=1.5, k_ratio=0.25)(jnp.array(new), batch)
    ref_loss, ref_grad, selected, k, n = ref_kl_cov(new, old, adv, mask, 0.25, 1.5)
    assert k == int(0.25 * n) >= 3
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(metrics["kl_cov/selected_frac"], k / n, rtol=1e-6)
    abs_lr = np.abs(new.astype(np.float64) - old)[selected].mean()
    np.testing.assert_allclose(metrics["kl_cov/abs_log_ratio"], abs_lr, rtol=1e-5)
    cov = ref_token_cov(new, adv, mask)
    np.testing.assert_allclose(metrics["kl_cov/cov_mean"], cov[mask].mean(), rtol=1e-5)
    assert cov[selected].min() > cov[mask & ~selected].max()  # top-k, by the reference
    np.testing.assert_allclose(metrics["kl_cov/loss"], loss)


def test_kl_cov_does_not_clip_the_ratio():
    # A large ratio on an unselected token: PPO would clip, KL-Cov keeps -A * r.
    mask = np.ones((1, 3), bool)
    old = np.array([[-1.0, -1.0, -1.0]], np.float32)
    new = np.array([[-0.2, -1.0, -1.5]], np.float32)
    adv = np.array([[1.0, 1.0, 1.0]], np.float32)
    (loss, metrics), grad = jitted(kl_cov, kl_coef=1.0, k_ratio=0.01)(
        jnp.array(new), make(old, adv, mask)
    )
    # A is constant so every cov is 0: the tie goes to the first token, which is selected.
    r = np.exp(new - old)
    np.testing.assert_allclose(loss, (-r.sum() + 0.8) / 3, rtol=1e-5)
    np.testing.assert_allclose(grad, [[(-r[0, 0] + 1) / 3, -r[0, 1] / 3, -r[0, 2] / 3]], rtol=1e-5)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), ratio=st.sampled_from(RATIOS))
def test_kl_cov_selected_count_is_exact(seed, ratio):
    mask, old, new, adv, _ = random_case(seed)
    (_, metrics), grad = jitted(kl_cov, k_ratio=ratio)(jnp.array(new), make(old, adv, mask))
    n = int(mask.sum())
    if n == 0:
        assert float(metrics["kl_cov/selected_frac"]) == 0.0
        return
    assert round(float(metrics["kl_cov/selected_frac"]) * n) == max(1, int(ratio * n))
    _, ref_grad, _, _, _ = ref_kl_cov(new, old, adv, mask, ratio, 1.0)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-6)


def test_count_matches_python_float64_arithmetic():
    # Python: int(0.29 * 100) = int(28.999999999999996) = 28, while a float32 product gives 29.
    # int(0.58 * 50) = 28 likewise (float32: 29).
    for ratio, n in [(0.29, 100), (0.58, 50)]:
        mask, old, new, adv, noise = random_case(2, b=4, t=25, hole_p=0.0)
        mask = (np.arange(100) < n).reshape(4, 25)
        (_, metrics), _ = jitted(kl_cov, k_ratio=ratio)(jnp.array(new), make(old, adv, mask))
        assert round(float(metrics["kl_cov/selected_frac"]) * n) == int(ratio * n) == 28
        # clip_cov with every valid token a candidate (no clipping: new = old).
        batch = make(new, adv, mask, noise=noise)
        (_, metrics), _ = jitted(clip_cov, clip_ratio=ratio, cov_lower=-1e9, cov_upper=1e9)(
            jnp.array(new), batch
        )
        assert round(float(metrics["clip_cov/detached_frac"]) * n) == 28


def test_errors():
    with pytest.raises(ValueError, match="clip_ratio=0"):
        clip_cov(clip_ratio=0.0)
    with pytest.raises(ValueError, match="clip_ratio=1.5"):
        clip_cov(clip_ratio=1.5)
    with pytest.raises(ValueError, match="cov_lower=5.0 must be < cov_upper=1.0"):
        clip_cov(cov_lower=5.0, cov_upper=1.0)
    with pytest.raises(ValueError, match="eps_low=1.0"):
        clip_cov(eps_low=1.0)
    with pytest.raises(ValueError, match="eps_high=-0.1"):
        clip_cov(eps_high=-0.1)
    with pytest.raises(ValueError, match="unknown aggregation mode"):
        clip_cov(aggregation="mean")
    with pytest.raises(ValueError, match="k_ratio=0.0"):
        kl_cov(k_ratio=0.0)
    with pytest.raises(ValueError, match="k_ratio=2.0"):
        kl_cov(k_ratio=2.0)
    with pytest.raises(ValueError, match="kl_coef=-1"):
        kl_cov(kl_coef=-1.0)
    with pytest.raises(ValueError, match="max_len=8"):
        kl_cov(max_len=8)
    z = jnp.zeros((2, 4))
    with pytest.raises(ValueError, match="covariance_noise"):
        clip_cov()(z, z, make(HAND_OLD, HAND_ADV, HAND_MASK))
    with pytest.raises(ValueError, match=r"shape \(2, 3\)"):
        clip_cov()(z, z, make(HAND_OLD, HAND_ADV, HAND_MASK, noise=np.zeros((2, 3))))


# ---------------------------------------------------------------- the entropy law (bandit)

K = 6
Z = jnp.array([2.0, 1.0, 0.5, 0.0, -0.5, -1.0], jnp.float32)


def entropy(z):
    z = np.asarray(z, np.float64)
    logp = z - z.max() - np.log(np.exp(z - z.max()).sum())
    return -(np.exp(logp) * logp).sum()


def exact_cov(p, x, y):
    """Cov_{a~p}(x_a, y_a), float64."""
    return (p * (x - p @ x) * (y - p @ y)).sum()


def bandit_batch(z, rewards):
    """All K actions, one token each, weighted by pi: the token mean is E_{a~pi} exactly."""
    logp = jax.nn.log_softmax(z)
    pi = jnp.exp(logp)
    adv = rewards - pi @ rewards
    batch = make(logp[:, None], adv[:, None], np.ones((K, 1), bool), loss_weights=pi[:, None])
    return batch, np.asarray(logp, np.float64), np.asarray(pi, np.float64)


def ppo_loss_of_logits(z, batch):
    new = jax.nn.log_softmax(z)[:, None]
    return PPO(new, jnp.zeros_like(new), batch)[0]


PPO_LOGIT_GRAD = jax.jit(jax.grad(ppo_loss_of_logits))


@pytest.mark.parametrize(
    "rewards,sign",
    [
        (jnp.array([1.0, 0, 0, 0, 0, 0]), -1.0),  # reward the likeliest action: entropy falls
        (jnp.array([0, 0, 0, 0, 0, 1.0]), 1.0),  # reward the rarest action: entropy rises
    ],
)
def test_entropy_law_exact_for_a_ppo_step_in_a_softmax_bandit(rewards, sign):
    batch, logp, pi = bandit_batch(Z, rewards)
    grad = PPO_LOGIT_GRAD(Z, batch)
    adv = np.asarray(rewards, np.float64) - pi @ np.asarray(rewards, np.float64)
    # At r = 1 the PPO gradient is vanilla PG: z' - z = eta * pi * A.
    np.testing.assert_allclose(-np.asarray(grad), pi * adv, rtol=1e-5, atol=1e-7)
    errors = []
    for eta in (0.2, 0.1):
        z_new = np.asarray(Z, np.float64) - eta * np.asarray(grad, np.float64)
        actual = entropy(z_new) - entropy(Z)
        predicted = -exact_cov(pi, logp, z_new - np.asarray(Z, np.float64))
        assert np.sign(actual) == np.sign(predicted) == sign
        rel = abs(actual - predicted) / abs(predicted)
        assert rel < 0.5 * eta  # first-order law: relative error O(eta)
        errors.append(abs(actual - predicted))
    # The error is second order: halving eta divides it by about 4.
    assert 3.0 < errors[0] / errors[1] < 5.0


def test_entropy_law_natural_pg_with_monte_carlo_covariance():
    rewards = np.array([1.0, 0.2, -0.5, 0.8, -1.0, 0.3])
    z = np.asarray(Z, np.float64)
    logp = z - np.log(np.exp(z).sum())
    pi = np.exp(logp)
    eta = 0.05
    z_new = z + eta * (rewards - pi @ rewards)  # tabular NPG step
    actual = entropy(z_new) - entropy(Z)
    n = 20000
    actions = np.random.default_rng(0).choice(K, size=n, p=pi)
    a_i = rewards[actions] - rewards[actions].mean()
    logp_i = logp[actions]
    mask = jnp.ones((n, 1), bool)
    cov_hat = float(covariance_jit(jnp.array(logp_i[:, None]), jnp.array(a_i[:, None]), mask))
    predicted = -eta * cov_hat
    # Tolerance: 4 Monte-Carlo standard errors of the sample covariance (the std of the
    # per-sample products over sqrt(n)), plus the deterministic second-order gap between the
    # exact first-order prediction -eta * Cov_pi(log pi, A) and the true change.
    products = (a_i - a_i.mean()) * (logp_i - logp_i.mean())
    mc_se = eta * products.std() / np.sqrt(n)
    second_order = abs(actual - (-eta * exact_cov(pi, logp, rewards - pi @ rewards)))
    tol = 4 * mc_se + second_order
    assert tol < 0.2 * abs(actual)  # the test is informative: the tolerance is small
    assert abs(predicted - actual) < tol
    assert np.sign(predicted) == np.sign(actual)

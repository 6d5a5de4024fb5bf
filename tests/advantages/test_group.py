"""Tests for rljax.advantages.group against a loop-based numpy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.advantages.group import batch_std_advantages, group_advantages, grpo_advantages
from rljax.core.batch import make_batch
from rljax.core.transform import Context

REWARDS = np.array([1.0, 0.0, 0.0, 1.0, 0.5, 2.0, 0.0, -1.0], np.float32)


def reference(rewards, g, normalize_std=True, ddof=1, eps=1e-6):
    out = np.zeros(len(rewards))
    for start in range(0, len(rewards), g):
        group = [float(x) for x in rewards[start : start + g]]
        mean = sum(group) / g
        std = (sum((x - mean) ** 2 for x in group) / (g - ddof)) ** 0.5
        for k, x in enumerate(group):
            out[start + k] = (x - mean) / (std + eps) if normalize_std else x - mean
    return out


@pytest.mark.parametrize("g", [2, 4])
@pytest.mark.parametrize("normalize_std, unbiased", [(True, True), (True, False), (False, True)])
def test_matches_reference(g, normalize_std, unbiased):
    out = grpo_advantages(jnp.array(REWARDS), g, normalize_std=normalize_std, unbiased_std=unbiased)
    expected = reference(REWARDS, g, normalize_std, ddof=1 if unbiased else 0)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_hand_value_unbiased():
    # Group [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(1/3), so A = +-0.5 * sqrt(3).
    out = grpo_advantages(jnp.array([1.0, 0.0, 0.0, 1.0]), 4)
    np.testing.assert_allclose(out, 0.5 * np.sqrt(3.0) * np.array([1, -1, -1, 1]), rtol=1e-5)


@pytest.mark.parametrize("normalize_std", [True, False])
def test_all_equal_group_gives_exact_zero(normalize_std):
    # 0.1 is not exact in float32: a naive (r - mean) / eps would give rounding residue / 1e-6.
    rewards = jnp.array([0.1, 0.1, 0.1, 0.7, 0.7, 0.7, 0.0, 1.0, 0.0], jnp.float32)
    out = np.asarray(grpo_advantages(rewards, 3, normalize_std=normalize_std))
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[:6], 0.0)
    assert np.abs(out[6:]).max() > 0.1


def test_errors():
    with pytest.raises(ValueError, match="group_size=1.*at least 2"):
        grpo_advantages(jnp.zeros(4), 1)
    with pytest.raises(ValueError, match="group_size=3 does not divide batch 4"):
        grpo_advantages(jnp.zeros(4), 3)
    with pytest.raises(ValueError, match="group_size=1"):
        group_advantages(1)


def test_jit():
    out = jax.jit(grpo_advantages, static_argnums=(1,))(jnp.array(REWARDS), 4)
    np.testing.assert_allclose(out, reference(REWARDS, 4), rtol=1e-5, atol=1e-6)


def make(rewards, mask, g):
    b, t = mask.shape
    return make_batch(
        prompt_tokens=np.zeros((b, 1)),
        prompt_mask=np.ones((b, 1)),
        completion_tokens=np.zeros((b, t)),
        completion_mask=mask,
        group_id=np.arange(b) // g,
        rewards=rewards,
    )


MASK = np.array(
    [[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0]], bool
)


def test_transform_writes_token_advantages_and_metrics():
    rewards = REWARDS.copy()
    rewards[4:] = 3.0  # second group has zero reward variance
    t = group_advantages(4)
    ctx = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
    batch, state, metrics = jax.jit(t.apply)(make(rewards, MASK, 4), t.init(), ctx)
    seq = reference(rewards, 4)
    expected = np.zeros(MASK.shape)
    valid = []
    for i in range(MASK.shape[0]):
        for j in range(MASK.shape[1]):
            if MASK[i, j]:
                expected[i, j] = seq[i]
                valid.append(seq[i])
    np.testing.assert_allclose(batch.advantages, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(batch.rewards, rewards)  # rewards untouched
    assert state == ()
    np.testing.assert_allclose(metrics["advantages/mean"], np.mean(valid), atol=1e-6)
    np.testing.assert_allclose(metrics["advantages/std"], np.std(valid), rtol=1e-5)
    np.testing.assert_allclose(metrics["advantages/min"], min(valid), rtol=1e-5)
    np.testing.assert_allclose(metrics["advantages/max"], max(valid), rtol=1e-5)
    np.testing.assert_allclose(metrics["advantages/zero_std_frac"], 0.5)


def test_transform_dr_grpo_and_empty_mask_metrics():
    t = group_advantages(2, normalize_std=False)
    ctx = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
    mask = np.zeros((4, 2), bool)
    batch, _, metrics = t.apply(make(np.array([1.0, 0.0, 2.0, 2.0]), mask, 2), (), ctx)
    np.testing.assert_array_equal(batch.advantages, 0.0)
    for k in ("mean", "std", "min", "max"):
        assert metrics[f"advantages/{k}"] == 0.0


def test_transform_validates_layout_and_rewards():
    t = group_advantages(2)
    ctx = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
    batch = make(REWARDS, MASK, 2)
    with pytest.raises(ValueError, match="mixes group ids"):
        t.apply(batch.replace(group_id=jnp.array([0, 1, 0, 1, 2, 3, 2, 3])), (), ctx)
    with pytest.raises(ValueError, match=r"needs \[B\] rewards"):
        t.apply(batch.replace(rewards=jnp.zeros((8, 2))), (), ctx)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.sampled_from([0.0, 0.1, 1.0, -0.3, 5.0]), min_size=8, max_size=8),
    st.lists(st.booleans(), min_size=24, max_size=24),
)
def test_random_rewards_and_masks_are_finite_and_centred(rewards, mask):
    rewards = np.array(rewards, np.float32)
    mask = np.array(mask).reshape(8, 3)
    t = group_advantages(4)
    ctx = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
    batch, _, metrics = t.apply(make(rewards, mask, 4), (), ctx)
    adv = np.asarray(batch.advantages)
    assert np.all(np.isfinite(adv)) and all(np.isfinite(v) for v in metrics.values())
    assert np.all(adv[~mask] == 0)
    seq = np.asarray(grpo_advantages(jnp.array(rewards), 4))
    np.testing.assert_allclose(seq.reshape(2, 4).sum(axis=1), 0.0, atol=1e-5)
    for g in seq.reshape(2, 4):
        assert np.allclose(g, 0.0) or abs(np.std(g, ddof=1) - 1.0) < 1e-3


def test_batch_std_advantages_match_trl_scale_rewards_batch():
    # TRL: (r - group mean) / (torch.std(all rewards) + 1e-4), torch.std unbiased.
    rewards = np.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.5, 0.5, 0.5, 0.5], np.float32)
    r = rewards.astype(np.float64)
    centred = r - np.repeat(r.reshape(3, 4).mean(axis=1), 4)
    expected = centred / (r.std(ddof=1) + 1e-4)
    ours = batch_std_advantages(jnp.asarray(rewards), 4)
    np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-7)
    # The 1-in-4 and 3-in-4 groups get the same scale, unlike the group std's (equal here by
    # symmetry); the constant group gets exactly 0.
    np.testing.assert_array_equal(np.asarray(ours)[8:], 0.0)


def test_group_advantages_with_batch_scope_and_errors():
    rewards = jnp.asarray([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    t = group_advantages(4, std_scope="batch", eps=1e-4)
    batch = make_batch(
        prompt_tokens=np.zeros((8, 1)),
        prompt_mask=np.ones((8, 1)),
        completion_tokens=np.zeros((8, 2)),
        completion_mask=np.ones((8, 2), bool),
        group_id=np.arange(8) // 4,
        rewards=rewards,
    )
    out = t.apply(batch, t.init(), Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0)))[0]
    np.testing.assert_allclose(out.advantages[:, 0], batch_std_advantages(rewards, 4), rtol=1e-6)
    with pytest.raises(ValueError, match="std_scope='row'"):
        group_advantages(4, std_scope="row")

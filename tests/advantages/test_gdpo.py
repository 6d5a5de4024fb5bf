"""Tests for rljax.advantages.gdpo against a loop-based numpy reference of the GDPO paper's
decoupled normalisation (verl's function itself: tests/objectives/test_verl_parity.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.advantages.gdpo import decoupled_group_advantages, gdpo_advantages
from rljax.advantages.gprl import gprl_advantages
from rljax.advantages.group import grpo_advantages
from rljax.algorithms import gdpo
from rljax.core import keys
from rljax.core.batch import make_batch
from rljax.core.transform import Context

# Two groups of 3, two reward dimensions of very different scales: correctness (0/1) and a
# length bonus (0-100). Group 1 is constant in correctness.
REWARDS = np.array(
    [[1.0, 10.0], [0.0, 90.0], [0.0, 50.0], [1.0, 20.0], [1.0, 80.0], [1.0, 30.0]], np.float32
)
MASK = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]], bool)


def reference(rewards, mask, group_size, weights, normalize_std=True, eps=1e-6):
    """Per dimension and group: (r - mean) / (unbiased std + eps); weighted sum; whitened over
    valid tokens with the unbiased token variance."""
    b, k = rewards.shape
    total = np.zeros(b)
    for d in range(k):
        for g in range(0, b, group_size):
            r = rewards[g : g + group_size, d].astype(np.float64)
            centred = r - r.mean()
            if normalize_std:
                centred = centred / (r.std(ddof=1) + eps)
            total[g : g + group_size] += weights[d] * centred
    tokens = [total[i] for i in range(b) for j in range(mask.shape[1]) if mask[i, j]]
    mean, var = np.mean(tokens), np.var(tokens, ddof=1)
    return np.where(mask, (total[:, None] - mean) / np.sqrt(var + 1e-8), 0.0)


@pytest.mark.parametrize(
    "weights,normalize_std", [((1.0, 1.0), True), ((2.0, 0.5), True), ((1.0, 1.0), False)]
)
def test_matches_reference(weights, normalize_std):
    ours = gdpo_advantages(jnp.asarray(REWARDS), MASK, 3, jnp.asarray(weights), normalize_std)
    expected = reference(REWARDS, MASK, 3, weights, normalize_std)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)


def test_a_large_scale_dimension_does_not_drown_a_small_one():
    # Summed first (GRPO on r_1 + r_2), the 0-100 length bonus decides every sign in group 0;
    # decoupled, sample 0 (correct, short) keeps a positive advantage from its correctness.
    summed = np.asarray(grpo_advantages(jnp.asarray(REWARDS.sum(axis=1)), 3))
    decoupled = np.asarray(gdpo_advantages(jnp.asarray(REWARDS), MASK, 3))
    assert summed[0] < 0 < decoupled[0, 0]


def test_one_dimension_is_grpo_then_whitening():
    r = REWARDS[:, 0]
    ours = gdpo_advantages(jnp.asarray(r), MASK, 3)
    np.testing.assert_allclose(ours, reference(r[:, None], MASK, 3, (1.0,)), rtol=1e-5, atol=1e-6)


def test_gprl_shares_the_decoupled_normalisation():
    # GPRL's aggregate = sum_k lambda_k z_k with lambda normalised: with uniform weights it is
    # the mean of GDPO's per-dimension z-scores, before GDPO's whitening.
    z = np.asarray(grpo_advantages(jnp.asarray(REWARDS), 3))
    np.testing.assert_allclose(gprl_advantages(jnp.asarray(REWARDS), 3), z.mean(axis=1), rtol=1e-6)


def batch_of(rewards, extras=None):
    """Two groups of 3 with `rewards` and the completion mask MASK."""
    return make_batch(
        prompt_tokens=np.zeros((6, 1)),
        prompt_mask=np.ones((6, 1)),
        completion_tokens=np.zeros((6, 3)),
        completion_mask=MASK,
        group_id=np.arange(6) // 3,
        rewards=rewards,
        extras=extras,
    )


def test_transform_writes_advantages_and_metrics():
    batch = batch_of(REWARDS)
    t = decoupled_group_advantages(3, (1.0, 1.0))
    ctx = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
    out, _, metrics = t.apply(batch, t.init(), ctx)
    expected = reference(REWARDS, MASK, 3, (1.0, 1.0))
    np.testing.assert_allclose(out.advantages, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics["gdpo/advantages/mean"], 0.0, atol=1e-6)


def test_the_preset_on_reward_components_normalises_them_not_the_scalar_reward():
    # The driver's batch: one scalar reward per sample, the K components in extras.
    batch = batch_of(REWARDS[:, 0], {"reward_components": REWARDS})
    t = gdpo(3, weights=(2.0, 0.5), reward_components=True).transform
    ctx = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
    out, _, _ = t.apply(batch, t.init(), ctx)
    expected = reference(REWARDS, MASK, 3, (2.0, 0.5))
    np.testing.assert_allclose(out.advantages, expected, rtol=1e-5, atol=1e-6)
    assert keys.REWARD_COMPONENTS in gdpo(3, reward_components=True).reads
    assert keys.REWARD_COMPONENTS not in gdpo(3).reads


def test_errors():
    with pytest.raises(ValueError, match="group_size=1"):
        decoupled_group_advantages(1)
    with pytest.raises(ValueError, match="one per dimension"):
        gdpo_advantages(jnp.asarray(REWARDS), MASK, 3, jnp.ones(3))

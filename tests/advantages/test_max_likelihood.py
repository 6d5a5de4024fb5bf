"""Tests for rljax.advantages.max_likelihood (MaxRL) against a numpy loop of the paper's rule
and the binary-reward closed form."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.advantages.max_likelihood import max_likelihood_advantages, mean_normalized_advantages
from rljax.core.batch import make_batch
from rljax.core.transform import Context


def reference(rewards, group_size):
    out = np.zeros(len(rewards))
    for g in range(0, len(rewards), group_size):
        r = np.asarray(rewards[g : g + group_size], np.float64)
        mean = r.mean()
        out[g : g + group_size] = (r - mean) / mean if mean > 0 else 0.0
    return out


def test_matches_reference_on_graded_rewards():
    rewards = np.array([0.5, 1.0, 0.0, 0.25, 0.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0], np.float32)
    np.testing.assert_allclose(
        max_likelihood_advantages(jnp.asarray(rewards), 4), reference(rewards, 4), rtol=1e-6
    )


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_binary_closed_form(k):
    # k successes of G = 4: a success gets G/k - 1, a failure -1 (0 when all succeed).
    rewards = np.array([1.0] * k + [0.0] * (4 - k), np.float32)
    adv = np.asarray(max_likelihood_advantages(jnp.asarray(rewards), 4))
    np.testing.assert_allclose(adv[:k], 4 / k - 1, rtol=1e-6)
    np.testing.assert_allclose(adv[k:], -1.0 if k < 4 else 0.0, rtol=1e-6)


def test_a_rarely_solved_prompt_weighs_more_than_grpo_gives_it():
    # GRPO's std normalisation is symmetric: a lone success in 8 gets about +2.5, a lone
    # failure about -2.5. MaxRL gives the lone success +7 but each success of a 7-in-8 group
    # only +1/7: a rare success raises the likelihood of success far more.
    rare = max_likelihood_advantages(jnp.asarray([1.0] + [0.0] * 7), 8)
    common = max_likelihood_advantages(jnp.asarray([0.0] + [1.0] * 7), 8)
    np.testing.assert_allclose(rare[0], 7.0, rtol=1e-6)
    np.testing.assert_allclose(common[1], 1 / 7, rtol=1e-6)
    np.testing.assert_allclose(common[0], -1.0, rtol=1e-6)


def test_transform_broadcasts_over_valid_tokens():
    mask = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], bool)
    batch = make_batch(
        prompt_tokens=np.zeros((4, 1)),
        prompt_mask=np.ones((4, 1)),
        completion_tokens=np.zeros((4, 3)),
        completion_mask=mask,
        group_id=np.array([0, 0, 0, 0]),
        rewards=np.array([1.0, 0.0, 0.0, 0.0]),
    )
    t = mean_normalized_advantages(4)
    ctx = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
    out, _, metrics = t.apply(batch, t.init(), ctx)
    np.testing.assert_allclose(out.advantages, np.where(mask, [[3.0], [-1.0], [-1.0], [-1.0]], 0))
    assert "maxrl/advantages/mean" in metrics


def test_errors():
    with pytest.raises(ValueError, match="group_size=1"):
        mean_normalized_advantages(1)
    with pytest.raises(ValueError, match="does not divide"):
        max_likelihood_advantages(jnp.zeros(6), 4)

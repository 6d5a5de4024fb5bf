"""Tests for rljax.entropy.high_entropy: the 80/20 token mask against numpy's quantile, and the
objective wrapper's gradient against a hand-written masked PPO gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.entropy.high_entropy import high_entropy_mask, high_entropy_tokens
from rljax.objectives.kl import kl_loss
from rljax.objectives.surrogate import ppo_clip

MASK = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
ENTROPY = np.array(
    [[0.1, 2.0, 0.5, 1.5, 9.0], [0.05, 3.0, 0.7, 9.0, 9.0], [1.1, 0.2, 0.9, 2.5, 0.3]],
    np.float32,
)
ADV = np.array([[1.0] * 5, [-1.0] * 5, [0.5] * 5], np.float32)
OLD = np.full((3, 5), -1.0, np.float32)


def make(is_weight=None):
    return make_batch(
        prompt_tokens=np.zeros((3, 1)),
        prompt_mask=np.ones((3, 1)),
        completion_tokens=np.zeros((3, 5)),
        completion_mask=MASK,
        group_id=np.array([0, 0, 0]),
        rewards=np.zeros(3),
        old_logprobs=OLD,
        advantages=ADV * MASK,
        extras={} if is_weight is None else {"is_weight": is_weight},
    )


@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.8, 1.0])
def test_mask_is_numpys_quantile_over_valid_tokens(fraction):
    threshold = np.quantile(ENTROPY[MASK].astype(np.float64), 1 - fraction)
    expected = MASK & (ENTROPY >= threshold)
    np.testing.assert_array_equal(high_entropy_mask(ENTROPY, MASK, fraction), expected)
    # Padding's large entropies (9.0) neither count in the quantile nor get kept.
    assert not np.asarray(high_entropy_mask(ENTROPY, MASK, fraction))[~MASK].any()


def test_hand_mask_top_fifth():
    # The 12 valid entropies sorted: 0.05 0.1 0.2 0.3 0.5 0.7 0.9 1.1 1.5 2.0 2.5 3.0. The 0.8
    # quantile sits at position 0.8 * 11 = 8.8: 1.5 + 0.8 * (2.0 - 1.5) = 1.9, so 2.0, 2.5
    # and 3.0 are kept.
    keep = np.asarray(high_entropy_mask(ENTROPY, MASK, 0.2))
    assert keep.sum() == 3 and keep[0, 1] and keep[1, 1] and keep[2, 3]


def test_wrapped_ppo_gradient_is_the_masked_gradient_over_all_tokens():
    obj = high_entropy_tokens(ppo_clip(), 0.5)
    new = jnp.asarray(OLD)
    (loss, metrics), grad = jax.value_and_grad(obj, has_aux=True)(new, jnp.asarray(ENTROPY), make())
    keep = np.asarray(high_entropy_mask(ENTROPY, MASK, 0.5))
    # On-policy PPO, token mean over all 12 valid tokens, masked terms dropped: -A keep / 12.
    np.testing.assert_allclose(grad, -ADV * keep / 12, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(loss, -(ADV * keep).sum() / 12, rtol=1e-6)
    np.testing.assert_allclose(metrics["entropy_mask/kept_frac"], keep.sum() / 12)
    assert 0 < keep.sum() < 12


def test_mask_multiplies_a_rollout_correction_weight():
    weight = np.full((3, 5), 0.5, np.float32)
    obj = high_entropy_tokens(ppo_clip(), 0.5)
    grad = jax.grad(lambda lp: obj(lp, jnp.asarray(ENTROPY), make(weight))[0])(jnp.asarray(OLD))
    keep = np.asarray(high_entropy_mask(ENTROPY, MASK, 0.5))
    np.testing.assert_allclose(grad, -0.5 * ADV * keep / 12, rtol=1e-6, atol=1e-8)


def test_entropy_does_not_get_a_gradient_through_the_mask():
    obj = high_entropy_tokens(ppo_clip(), 0.5)
    grad = jax.grad(lambda e: obj(jnp.asarray(OLD), e, make())[0])(jnp.asarray(ENTROPY))
    np.testing.assert_array_equal(grad, 0.0)


def test_errors():
    with pytest.raises(ValueError, match="fraction=0"):
        high_entropy_tokens(ppo_clip(), 0.0)
    with pytest.raises(ValueError, match="does not apply"):
        high_entropy_tokens(kl_loss(0.1), 0.2)

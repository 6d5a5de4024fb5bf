"""Tests for rljax.filters.overlong: DAPO overlong filtering and soft overlong punishment."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.core.transform import Context
from rljax.filters.overlong import (
    overlong_filter,
    overlong_punishment,
    soft_overlong_penalty,
    truncated_mask,
)

EOS = 2
CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
# Budget T = 5. Rows: ends in EOS early; fills the budget without EOS (truncated); ends in
# EOS exactly at the budget (not truncated); fills the budget ending in a second stop token 3;
# empty completion.
TOKENS = np.array(
    [[5, 6, 2, 0, 0], [5, 6, 7, 8, 9], [5, 6, 7, 8, 2], [5, 6, 7, 8, 3], [0, 0, 0, 0, 0]]
)
MASK = np.array(
    [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], bool
)


def make(rewards=(1.0, 0.0, 1.0, 0.5, 0.0)):
    return make_batch(
        prompt_tokens=np.zeros((5, 1)),
        prompt_mask=np.ones((5, 1)),
        completion_tokens=TOKENS,
        completion_mask=MASK,
        group_id=np.arange(5),
        rewards=np.array(rewards),
    )


def reference_penalty(length, l_max, l_cache):
    # DAPO's R_length, written case by case.
    if length <= l_max - l_cache:
        return 0.0
    if length <= l_max:
        return ((l_max - l_cache) - length) / l_cache
    return -1.0


def test_truncated_mask():
    out = truncated_mask(jnp.array(TOKENS), jnp.array(MASK), EOS)
    np.testing.assert_array_equal(out, [False, True, False, True, False])
    out = truncated_mask(jnp.array(TOKENS), jnp.array(MASK), (EOS, 3))
    np.testing.assert_array_equal(out, [False, True, False, False, False])


def test_overlong_filter_under_jit():
    t = overlong_filter(EOS)
    batch = make()
    out, state, metrics = jax.jit(t.apply)(batch, t.init(), CTX)
    keep = np.array([1, 0, 1, 0, 1], np.float32)[:, None]
    np.testing.assert_array_equal(out.loss_weights, MASK * keep)
    np.testing.assert_allclose(metrics["overlong_filter/truncated_frac"], 2 / 5)
    np.testing.assert_array_equal(out.rewards, batch.rewards)
    assert state == ()


def test_soft_penalty_hand_values_and_reference():
    # L_max = 20, L_cache = 4: no penalty up to 16, linear to -1 at 20, -1 beyond.
    lengths = np.array([0, 10, 16, 17, 18, 20, 21, 40])
    out = jax.jit(soft_overlong_penalty, static_argnums=(1, 2))(jnp.array(lengths), 20, 4)
    np.testing.assert_allclose(out, [0, 0, 0, -0.25, -0.5, -1.0, -1.0, -1.0], rtol=1e-6)
    ref = [reference_penalty(n, 20, 4) for n in lengths]
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    np.testing.assert_allclose(
        soft_overlong_penalty(jnp.array(lengths), 20, 4, penalty_factor=0.5), 0.5 * np.array(ref)
    )


def test_overlong_punishment_transform():
    # T = 5 and L_cache = 2: no penalty up to 3 tokens; lengths are 3, 5, 5, 5, 0.
    t = overlong_punishment(cache_len=2)
    batch = make()
    out, _, metrics = jax.jit(t.apply)(batch, t.init(), CTX)
    penalty = np.array([0.0, -1.0, -1.0, -1.0, 0.0])
    np.testing.assert_allclose(out.rewards, np.asarray(batch.rewards) + penalty, rtol=1e-6)
    np.testing.assert_allclose(metrics["overlong_punishment/penalty_mean"], penalty.mean())
    np.testing.assert_allclose(metrics["overlong_punishment/penalized_frac"], 3 / 5)
    np.testing.assert_array_equal(out.loss_weights, batch.loss_weights)
    # An explicit L_max = 6 > T with L_cache = 4: no penalty up to 2 tokens;
    # L = 3 -> (2 - 3) / 4 = -0.25, L = 5 -> (2 - 5) / 4 = -0.75, L = 0 -> 0.
    out, _, _ = overlong_punishment(cache_len=4, max_len=6).apply(batch, (), CTX)
    np.testing.assert_allclose(
        out.rewards - batch.rewards, [-0.25, -0.75, -0.75, -0.75, 0.0], rtol=1e-6
    )


def test_errors():
    with pytest.raises(ValueError, match="eos_id"):
        overlong_filter(-1)
    with pytest.raises(ValueError, match="eos_id"):
        overlong_filter(())
    with pytest.raises(ValueError, match="cache_len=0"):
        overlong_punishment(cache_len=0)
    with pytest.raises(ValueError, match="cache_len=8"):
        overlong_punishment(cache_len=8, max_len=4)
    with pytest.raises(ValueError, match="max_len=0"):
        overlong_punishment(cache_len=2, max_len=0)
    with pytest.raises(ValueError, match="cache_len=6"):
        overlong_punishment(cache_len=6).apply(make(), (), CTX)  # 6 > T = 5
    with pytest.raises(ValueError, match=r"needs \[B\] rewards"):
        overlong_punishment(cache_len=2).apply(make().replace(rewards=jnp.zeros((5, 2))), (), CTX)

"""Tests for rljax.core.aggregation against hand values and a loop-based numpy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.core.aggregation import (
    AGGREGATION_MODES,
    aggregate,
    aggregation_denominator,
    masked_mean,
    masked_row_mean,
)

LOSS = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
MASK = np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], np.float32)


def reference(loss, w, mode, max_len=None):
    """Loop-based numpy reference of the four modes."""
    b, t = loss.shape
    total, total_w, seq_sums, seq_means = 0.0, 0.0, [], []
    for i in range(b):
        s, sw = 0.0, 0.0
        for j in range(t):
            if w[i, j] != 0:
                s += loss[i, j] * w[i, j]
                sw += w[i, j]
        total += s
        total_w += sw
        if sw > 0:
            seq_sums.append(s)
            seq_means.append(s / sw)
    if mode == "token-mean":
        return total / total_w if total_w > 0 else 0.0
    if mode == "seq-mean-token-sum":
        return sum(seq_sums) / len(seq_sums) if seq_sums else 0.0
    if mode == "seq-mean-token-mean":
        return sum(seq_means) / len(seq_means) if seq_means else 0.0
    return total / (b * (max_len or t))


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 7.0 / 3.0),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-sum", 3.5),  # ((1 + 2) + 4) / 2 sequences
        ("seq-mean-token-mean", 2.75),  # (1.5 + 4) / 2 sequences
        ("seq-mean-token-sum-norm", 7.0 / 6.0),  # 7 / (B=2 * T=3)
    ],
)
def test_hand_values(mode, expected):
    np.testing.assert_allclose(
        aggregate(jnp.array(LOSS), jnp.array(MASK), mode), expected, rtol=1e-6
    )


def test_dr_grpo_constant_normaliser():
    out = aggregate(jnp.array(LOSS), jnp.array(MASK), "seq-mean-token-sum-norm", max_len=10)
    np.testing.assert_allclose(out, 7.0 / 20.0, rtol=1e-6)


def test_fully_masked_sequence():
    loss = np.concatenate([LOSS, [[7.0, 8.0, 9.0]]]).astype(np.float32)
    mask = np.concatenate([MASK, [[0.0, 0.0, 0.0]]]).astype(np.float32)
    # seq-mean modes count only sequences with weight; the Dr. GRPO normaliser keeps B = 3.
    expected = {
        "token-mean": 7 / 3,
        "seq-mean-token-sum": 3.5,
        "seq-mean-token-mean": 2.75,
        "seq-mean-token-sum-norm": 7 / 9,
    }
    for mode, value in expected.items():
        np.testing.assert_allclose(
            aggregate(jnp.array(loss), jnp.array(mask), mode), value, rtol=1e-6
        )


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_all_zero_weights_give_zero_and_finite_grad(mode):
    loss = jnp.array(LOSS)
    zeros = jnp.zeros_like(loss)
    value, grad = jax.value_and_grad(lambda x: aggregate(x, zeros, mode))(loss)
    assert value == 0.0
    assert np.all(np.isfinite(grad)) and np.all(grad == 0)


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_masked_inf_and_nan_are_ignored(mode):
    loss = jnp.array(LOSS).at[0, 2].set(jnp.inf).at[1, 1].set(jnp.nan)
    value, grad = jax.value_and_grad(lambda x: aggregate(x, jnp.array(MASK), mode))(loss)
    np.testing.assert_allclose(value, reference(LOSS, MASK, mode), rtol=1e-6)
    assert np.all(np.isfinite(grad))


def test_jit():
    f = jax.jit(aggregate, static_argnames=("mode", "max_len"))
    out = f(jnp.array(LOSS), jnp.array(MASK), mode="seq-mean-token-mean")
    np.testing.assert_allclose(out, 2.75, rtol=1e-6)


def test_errors():
    loss, mask = jnp.array(LOSS), jnp.array(MASK)
    with pytest.raises(ValueError, match="valid modes.*token-mean"):
        aggregate(loss, mask, "mean")
    with pytest.raises(ValueError, match="only used by 'seq-mean-token-sum-norm'"):
        aggregate(loss, mask, "token-mean", max_len=8)
    with pytest.raises(ValueError, match="must be positive"):
        aggregate(loss, mask, "seq-mean-token-sum-norm", max_len=0)
    with pytest.raises(AssertionError):
        aggregate(loss, mask[:, :2], "token-mean")


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.floats(-10, 10, width=32), min_size=12, max_size=12),
    st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.0]), min_size=12, max_size=12),
    st.sampled_from(AGGREGATION_MODES),
)
def test_matches_reference_on_random_weights(loss, weights, mode):
    loss = np.array(loss, np.float32).reshape(3, 4)
    weights = np.array(weights, np.float32).reshape(3, 4)
    out = aggregate(jnp.array(loss), jnp.array(weights), mode)
    assert np.isfinite(out)
    np.testing.assert_allclose(out, reference(loss, weights, mode), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_denominator_weighted_microbatches_equal_the_whole_batch(mode):
    rng = np.random.default_rng(3)
    loss = rng.normal(size=(6, 5)).astype(np.float32)
    weights = (rng.random((6, 5)) > 0.4).astype(np.float32)
    weights[2] = 0.0  # a fully masked row
    max_len = 5 if mode == "seq-mean-token-sum-norm" else None
    whole = float(aggregate(jnp.asarray(loss), jnp.asarray(weights), mode, max_len))
    parts = [(slice(0, 2),), (slice(2, 3),), (slice(3, 6),)]
    num = den = 0.0
    for (rows,) in parts:
        d = float(aggregation_denominator(jnp.asarray(weights[rows]), mode))
        num += (
            float(aggregate(jnp.asarray(loss[rows]), jnp.asarray(weights[rows]), mode, max_len)) * d
        )
        den += d
    np.testing.assert_allclose(num / den, whole, rtol=1e-5)
    # And the value itself: token count, sequences with weight, or all rows.
    live_rows = sum(1 for row in weights if row.sum() > 0)
    want = {
        "token-mean": weights.sum(),
        "seq-mean-token-sum": live_rows,
        "seq-mean-token-mean": live_rows,
        "seq-mean-token-sum-norm": 6,
    }[mode]
    assert float(aggregation_denominator(jnp.asarray(weights), mode)) == want


def test_masked_mean_hand_values_ignore_masked_nan_and_empty_mask_is_zero():
    x = jnp.array([[1.0, 2.0, jnp.nan], [4.0, jnp.inf, 6.0]])
    mask = jnp.array([[True, True, False], [True, False, False]])
    np.testing.assert_allclose(float(masked_mean(x, mask)), 7.0 / 3.0, rtol=1e-6)
    assert float(masked_mean(x, jnp.zeros_like(mask))) == 0.0
    assert float(masked_mean(mask, mask)) == 1.0  # booleans average as 0/1


def test_masked_row_mean_is_each_rows_mean_over_its_valid_entries():
    x = np.array([[1.0, 2.0, 9.0], [4.0, np.nan, 7.0], [5.0, 5.0, 5.0]], np.float32)
    mask = np.array([[1, 1, 0], [1, 0, 1], [0, 0, 0]], bool)
    # Hand: (1 + 2) / 2, (4 + 7) / 2; an empty row gives 0; masked NaN never counts.
    np.testing.assert_allclose(masked_row_mean(jnp.asarray(x), jnp.asarray(mask)), [1.5, 5.5, 0.0])

"""Tests for rljax.advantages.remax against a loop-based numpy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.advantages.remax import greedy_baseline_advantages, remax_advantages
from rljax.core.batch import make_batch
from rljax.core.transform import Context

REWARDS = np.array([1.0, 0.0, 0.0, 1.0, 0.5, 2.0, 0.0, -1.0], np.float32)
# One greedy reward per prompt (groups of 4), repeated for every sample of the prompt.
GREEDY = np.array([1.0] * 4 + [0.5] * 4, np.float32)
CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
MASK = np.array(
    [[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0]], bool
)


def reference(rewards, baseline):
    return np.array([float(r) - float(b) for r, b in zip(rewards, baseline)])


def make(rewards, mask, baseline, g=4, key="baseline_reward"):
    b, t = mask.shape
    return make_batch(
        prompt_tokens=np.zeros((b, 1)),
        prompt_mask=np.ones((b, 1)),
        completion_tokens=np.zeros((b, t)),
        completion_mask=mask,
        group_id=np.arange(b) // g,
        rewards=rewards,
        extras={} if baseline is None else {key: baseline},
    )


def test_matches_reference_and_jit():
    out = remax_advantages(jnp.array(REWARDS), jnp.array(GREEDY))
    np.testing.assert_allclose(out, reference(REWARDS, GREEDY), rtol=1e-6)
    out = jax.jit(remax_advantages)(jnp.array(REWARDS), jnp.array(GREEDY))
    np.testing.assert_allclose(out, reference(REWARDS, GREEDY), rtol=1e-6)


def test_transform_writes_token_advantages_and_metrics():
    t = greedy_baseline_advantages()
    batch, state, metrics = jax.jit(t.apply)(make(REWARDS, MASK, GREEDY), t.init(), CTX)
    seq = reference(REWARDS, GREEDY)
    expected = np.zeros(MASK.shape)
    valid = []
    for i in range(MASK.shape[0]):
        for j in range(MASK.shape[1]):
            if MASK[i, j]:
                expected[i, j] = seq[i]
                valid.append(seq[i])
    np.testing.assert_allclose(batch.advantages, expected, rtol=1e-6)
    assert state == ()
    np.testing.assert_allclose(metrics["remax/advantages/mean"], np.mean(valid), atol=1e-6)
    np.testing.assert_allclose(metrics["remax/advantages/std"], np.std(valid), rtol=1e-5)
    np.testing.assert_allclose(metrics["remax/baseline_mean"], 0.75)
    # Beats greedy: sample 5 (2.0 > 0.5) only.
    np.testing.assert_allclose(metrics["remax/beats_greedy_frac"], 1 / 8)
    assert not any(k.startswith("advantages/") for k in metrics)


def test_custom_key():
    t = greedy_baseline_advantages("greedy")
    batch, _, _ = t.apply(make(REWARDS, MASK, GREEDY, key="greedy"), (), CTX)
    np.testing.assert_allclose(batch.advantages[:, 0], reference(REWARDS, GREEDY) * MASK[:, 0])


def test_errors():
    t = greedy_baseline_advantages()
    with pytest.raises(ValueError, match=r"extras\['baseline_reward'\].*greedy"):
        t.apply(make(REWARDS, MASK, None), (), CTX)
    with pytest.raises(ValueError, match=r"shape \(2,\), expected \[B\]"):
        t.apply(
            make(REWARDS, MASK, None).replace(extras={"baseline_reward": jnp.zeros(2)}), (), CTX
        )
    with pytest.raises(ValueError, match=r"needs \[B\] rewards"):
        t.apply(make(REWARDS, MASK, GREEDY).replace(rewards=jnp.zeros((8, 2))), (), CTX)


APPLY = jax.jit(greedy_baseline_advantages().apply)
REWARD_VALUES = st.sampled_from([0.0, 0.1, 1.0, -0.3, 5.0])


@settings(max_examples=25, deadline=None)
@given(
    st.lists(REWARD_VALUES, min_size=8, max_size=8),
    st.lists(REWARD_VALUES, min_size=2, max_size=2),
    st.lists(st.booleans(), min_size=24, max_size=24),
    st.permutations(range(4)),
    st.permutations(range(4)),
)
def test_permutation_within_groups_permutes_advantages(rewards, greedy, mask, p0, p1):
    rewards = np.array(rewards, np.float32)
    greedy = np.repeat(np.array(greedy, np.float32), 4)
    mask = np.array(mask).reshape(8, 3)
    perm = np.concatenate([np.array(p0), 4 + np.array(p1)])
    adv = np.asarray(APPLY(make(rewards, mask, greedy), (), CTX)[0].advantages)
    adv_p = np.asarray(APPLY(make(rewards[perm], mask[perm], greedy[perm]), (), CTX)[0].advantages)
    np.testing.assert_array_equal(adv_p, adv[perm])
    assert np.all(np.isfinite(adv)) and np.all(adv[~mask] == 0)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(REWARD_VALUES, min_size=8, max_size=8), st.lists(st.booleans(), min_size=8, max_size=8)
)
def test_reward_equal_to_greedy_gives_zero_and_length_one_rows(rewards, mask):
    rewards = np.array(rewards, np.float32)
    mask = np.array(mask).reshape(8, 1)
    batch, _, metrics = APPLY(make(rewards, mask, rewards), (), CTX)
    np.testing.assert_array_equal(batch.advantages, 0.0)
    assert all(np.isfinite(v) for v in metrics.values())
    assert metrics["remax/beats_greedy_frac"] == 0.0

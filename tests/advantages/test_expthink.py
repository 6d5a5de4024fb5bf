"""Tests for rljax.advantages.expthink against loop-based numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.advantages.expthink import (
    NO_LENGTH,
    difficulty_adaptive_advantages,
    expthink_advantages,
    expthink_rewards,
)
from rljax.core.batch import make_batch
from rljax.core.transform import Context, chain

CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
T = 5


def make(rewards, lengths, prompt_id=None, g=2, t=T, extras=None):
    b = len(rewards)
    mask = np.arange(t)[None, :] < np.asarray(lengths)[:, None]
    extras = dict(extras or {})
    if prompt_id is not None:
        extras["prompt_id"] = np.asarray(prompt_id, np.int32)
    return make_batch(
        prompt_tokens=np.zeros((b, 1)),
        prompt_mask=np.ones((b, 1)),
        completion_tokens=np.zeros((b, t)),
        completion_mask=mask,
        group_id=np.arange(b) // g,
        rewards=rewards,
        extras=extras,
    )


def reference_rewards(rewards, lengths, ids, shortest, full=1.0, disc=0.5, thr=1.0):
    """Tiers and running-min update by explicit loops; `shortest` is a dict id -> L*."""
    out = []
    for r, n, q in zip(rewards, lengths, ids):
        if r < thr:
            out.append(0.0)
        elif q not in shortest or n <= shortest[q]:
            out.append(full)
        else:
            out.append(disc)
    new = dict(shortest)
    for r, n, q in zip(rewards, lengths, ids):
        if r >= thr and n > 0 and 0 <= q:
            new[q] = min(new.get(q, n), n)
    return np.array(out), new


def reference_advantages(rewards, correct, g):
    out = np.zeros(len(rewards))
    for start in range(0, len(rewards), g):
        idx = range(start, start + g)
        c = sum(bool(correct[i]) for i in idx)
        mean = sum(float(rewards[i]) for i in idx) / g
        for i in idx:
            out[i] = 0.0 if c == 0 else (float(rewards[i]) - mean) / max(c, 1)
    return out


REWARDS_T = expthink_rewards(capacity=4)
APPLY_REWARDS = jax.jit(REWARDS_T.apply)
ADV = jax.jit(difficulty_adaptive_advantages, static_argnums=(2,))
APPLY_ADV = jax.jit(expthink_advantages(4).apply)


def test_reward_tiers_by_hand():
    state = REWARDS_T.init()
    assert state.dtype == jnp.int32 and np.all(np.asarray(state) == NO_LENGTH)
    # Step 1: prompt 0 has no L* yet, so both correct answers (lengths 4, 2) get full credit;
    # prompt 1 has no correct answer. Afterwards L*_0 = 2, L*_1 unknown.
    batch = make([1.0, 1.0, 0.0, 0.0], [4, 2, 3, 1], prompt_id=[0, 0, 1, 1])
    out, state, m = APPLY_REWARDS(batch, state, CTX)
    np.testing.assert_array_equal(out.rewards, [1.0, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(out.extras["correct"], [True, True, False, False])
    np.testing.assert_array_equal(state, [2, NO_LENGTH, NO_LENGTH, NO_LENGTH])
    assert int(m["expthink/known_prompts"]) == 1
    np.testing.assert_allclose(m["expthink/mean_shortest_len"], 2.0)
    np.testing.assert_allclose(m["expthink/full_credit_frac"], 0.5)
    np.testing.assert_allclose(m["expthink/discount_frac"], 0.0)
    # Step 2: prompt 0: length 2 <= 2 -> 1, length 3 > 2 -> 0.5; prompt 1: first correct
    # (length 5) gets full credit, wrong (0.9 < 1) gets 0. L* = [2, 5].
    batch = make([1.0, 1.0, 1.0, 0.9], [2, 3, 5, 1], prompt_id=[0, 0, 1, 1])
    out, state, m = APPLY_REWARDS(batch, state, CTX)
    np.testing.assert_array_equal(out.rewards, [1.0, 0.5, 1.0, 0.0])
    np.testing.assert_array_equal(state, [2, 5, NO_LENGTH, NO_LENGTH])
    np.testing.assert_allclose(m["expthink/full_credit_frac"], 0.5)
    np.testing.assert_allclose(m["expthink/discount_frac"], 0.25)
    np.testing.assert_allclose(m["expthink/mean_shortest_len"], 3.5)
    # Step 3: a shorter correct answer (1) gets full credit and lowers L*_1; a longer one is
    # discounted against the old L*_1 = 5.
    batch = make([0.0, 0.0, 1.0, 1.0], [1, 1, 1, 6], prompt_id=[0, 0, 1, 1], t=6)
    out, state, _ = APPLY_REWARDS(batch, state, CTX)
    np.testing.assert_array_equal(out.rewards, [0.0, 0.0, 1.0, 0.5])
    np.testing.assert_array_equal(state, [2, 1, NO_LENGTH, NO_LENGTH])


def test_custom_tiers_and_threshold():
    t = expthink_rewards(capacity=2, full_credit=2.0, discount=0.25, correct_threshold=0.5)
    state = t.init().at[0].set(2)
    out, _, _ = jax.jit(t.apply)(make([0.5, 0.7, 0.4, 1.0], [2, 3, 1, 1], [0, 0, 1, 1]), state, CTX)
    np.testing.assert_array_equal(out.rewards, [2.0, 0.25, 0.0, 2.0])


def test_out_of_range_ids_are_unknown_and_dropped():
    batch = make([1.0, 1.0, 1.0, 0.0], [2, 3, 1, 1], prompt_id=[-1, 4, 7, 1])
    state = REWARDS_T.init().at[3].set(1)
    out, new_state, m = APPLY_REWARDS(batch, state, CTX)
    np.testing.assert_array_equal(out.rewards, [1.0, 1.0, 1.0, 0.0])
    np.testing.assert_array_equal(new_state, state)  # nothing written, slot 3 (= -1) untouched
    np.testing.assert_allclose(m["expthink/invalid_id_frac"], 0.75)


def test_fully_masked_correct_row_does_not_set_shortest():
    out, state, _ = APPLY_REWARDS(make([1.0, 1.0], [0, 3], [2, 2]), REWARDS_T.init(), CTX)
    np.testing.assert_array_equal(out.rewards, [1.0, 1.0])
    assert int(state[2]) == 3


def test_reward_errors():
    with pytest.raises(ValueError, match="capacity=0 must be a positive int"):
        expthink_rewards(0)
    with pytest.raises(ValueError, match="discount=1.5 and full_credit=1.0"):
        expthink_rewards(4, discount=1.5)
    with pytest.raises(ValueError, match="discount=-0.1"):
        expthink_rewards(4, discount=-0.1)
    state = REWARDS_T.init()
    with pytest.raises(ValueError, match=r"needs batch.extras\['prompt_id'\]"):
        REWARDS_T.apply(make([1.0, 0.0], [1, 1]), state, CTX)
    with pytest.raises(ValueError, match=r"extras\['prompt_id'\] has shape \(2, 1\)"):
        REWARDS_T.apply(make([1.0, 0.0], [1, 1], [[0], [1]]), state, CTX)
    with pytest.raises(ValueError, match="expected an integer dtype"):
        batch = make([1.0, 0.0], [1, 1], extras={"prompt_id": np.array([0.0, 1.0])})
        REWARDS_T.apply(batch, state, CTX)
    with pytest.raises(ValueError, match=r"needs \[B\] rewards"):
        REWARDS_T.apply(make(np.zeros((2, 2)), [1, 1], [0, 1]), state, CTX)


BATCHES = st.lists(
    st.tuples(
        st.lists(st.sampled_from([0.0, 1.0]), min_size=4, max_size=4),
        st.lists(st.integers(0, T), min_size=4, max_size=4),
        st.lists(st.integers(0, 3), min_size=4, max_size=4),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=25, deadline=None)
@given(BATCHES)
def test_shortest_never_increases_and_matches_reference(steps):
    state, shortest = REWARDS_T.init(), {}
    for rewards, lengths, ids in steps:
        before = np.asarray(state)
        out, state, m = APPLY_REWARDS(make(rewards, lengths, ids), state, CTX)
        expected, shortest = reference_rewards(rewards, lengths, ids, shortest)
        np.testing.assert_array_equal(out.rewards, expected)
        after = np.asarray(state)
        assert np.all(after <= before)
        np.testing.assert_array_equal(after, [shortest.get(q, NO_LENGTH) for q in range(4)])
        assert int(m["expthink/known_prompts"]) == len(shortest)
        assert all(np.isfinite(v) for v in m.values())


@pytest.mark.parametrize("g", [2, 4])
def test_advantages_match_reference(g):
    rewards = np.array([1.0, 0.5, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.5, 0.0], np.float32)
    correct = rewards > 0
    out = ADV(jnp.array(rewards), jnp.array(correct), g)
    np.testing.assert_allclose(out, reference_advantages(rewards, correct, g), atol=1e-6)


def test_advantages_hand_value_and_zero_correct_group():
    # Group [1, 0.5, 0, 0], two correct: mean 0.375, A = (r - 0.375) / 2.
    # Group [0.3, 0.1, 0, 0] marked all incorrect: exactly 0 despite unequal rewards.
    rewards = jnp.array([1.0, 0.5, 0.0, 0.0, 0.3, 0.1, 0.0, 0.0])
    correct = jnp.array([True, True, False, False, False, False, False, False])
    out = np.asarray(ADV(rewards, correct, 4))
    np.testing.assert_allclose(out[:4], [0.3125, 0.0625, -0.1875, -0.1875], rtol=1e-6)
    np.testing.assert_array_equal(out[4:], 0.0)


def test_advantage_magnitude_falls_with_number_correct():
    # Fixed reward pattern, c = 1..4 of the samples marked correct: |A| shrinks as 1/c.
    rewards = jnp.array([1.0, 0.6, 0.2, 0.0])
    mags = []
    for c in range(1, 5):
        correct = jnp.arange(4) < c
        mags.append(np.abs(np.asarray(ADV(rewards, correct, 4))))
    for lo, hi in zip(mags[1:], mags[:-1]):
        assert np.all(lo < hi)
    # Binary rewards, the natural case: the total step size of the group falls as c rises.
    totals = [
        np.abs(np.asarray(ADV((jnp.arange(4) < c).astype(jnp.float32), jnp.arange(4) < c, 4)))
        for c in range(1, 4)
    ]
    np.testing.assert_allclose([x.sum() for x in totals], [1.5, 1.0, 0.5], rtol=1e-6)


def test_advantage_errors():
    with pytest.raises(ValueError, match="group_size=1"):
        expthink_advantages(1)
    with pytest.raises(ValueError, match="group_size=3 does not divide batch 4"):
        difficulty_adaptive_advantages(jnp.zeros(4), jnp.zeros(4, bool), 3)
    t = expthink_advantages(2)
    batch = make([1.0, 0.0, 0.0, 1.0], [1, 1, 1, 1])
    with pytest.raises(ValueError, match="mixes group ids"):
        t.apply(batch.replace(group_id=jnp.array([0, 1, 0, 1])), (), CTX)
    with pytest.raises(ValueError, match=r"extras\['correct'\] has shape \(2,\)"):
        t.apply(batch.replace(extras={"correct": jnp.zeros(2, bool)}), (), CTX)


def test_transform_reads_correct_from_extras_or_rewards():
    rewards = np.array([1.0, 0.5, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0], np.float32)
    lengths = [3, 2, 0, 5, 1, 1, 2, 4]
    batch, state, m = APPLY_ADV(make(rewards, lengths, g=4), (), CTX)
    seq = reference_advantages(rewards, rewards > 0, 4)
    mask = np.arange(T)[None, :] < np.array(lengths)[:, None]
    np.testing.assert_allclose(batch.advantages, seq[:, None] * mask, atol=1e-6)
    assert state == ()
    np.testing.assert_allclose(m["expthink/mean_correct"], 2.5)
    # Marking only sample 0 correct in group 0 and nothing in group 1 changes the scale.
    correct = np.array([True, False, False, False, False, False, False, False])
    batch, _, m = APPLY_ADV(make(rewards, lengths, g=4, extras={"correct": correct}), (), CTX)
    seq = reference_advantages(rewards, correct, 4)
    np.testing.assert_allclose(batch.advantages, seq[:, None] * mask, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(batch.advantages)[4:], 0.0)
    np.testing.assert_allclose(m["expthink/no_correct_frac"], 0.5)


def test_chain_rewards_then_advantages_under_jit():
    t = chain(expthink_rewards(capacity=2), expthink_advantages(4))
    batch = make(
        [1.0, 1.0, 0.0, 1.0, 0.0] + [0.0] * 3, [2, 4, 1, 3, 1, 2, 3, 4], [0] * 4 + [1] * 4, g=4
    )
    out, state, m = jax.jit(t.apply)(batch, t.init(), CTX)
    # Prompt 0 had no L*: all three correct answers get 1; c = 3, mean 0.75.
    np.testing.assert_allclose(out.advantages[:4, 0], [0.25 / 3, 0.25 / 3, -0.25, 0.25 / 3])
    np.testing.assert_array_equal(out.advantages[4:], 0.0)
    np.testing.assert_array_equal(state[0], [2, NO_LENGTH])
    assert "expthink/full_credit_frac" in m and "expthink/advantages/mean" in m


REWARD_VALUES = st.sampled_from([0.0, 0.5, 1.0])


@settings(max_examples=25, deadline=None)
@given(
    st.lists(REWARD_VALUES, min_size=8, max_size=8),
    st.lists(st.integers(0, T), min_size=8, max_size=8),
    st.permutations(range(4)),
    st.permutations(range(4)),
)
def test_permutation_within_groups_permutes_advantages(rewards, lengths, p0, p1):
    rewards, lengths = np.array(rewards, np.float32), np.array(lengths)
    perm = np.concatenate([np.array(p0), 4 + np.array(p1)])
    adv = np.asarray(APPLY_ADV(make(rewards, lengths, g=4), (), CTX)[0].advantages)
    adv_p = np.asarray(APPLY_ADV(make(rewards[perm], lengths[perm], g=4), (), CTX)[0].advantages)
    np.testing.assert_allclose(adv_p, adv[perm], atol=1e-6)
    assert np.all(np.isfinite(adv))
    assert np.all(adv[np.arange(T)[None, :] >= lengths[:, None]] == 0)


@settings(max_examples=25, deadline=None)
@given(REWARD_VALUES, st.lists(st.integers(0, 1), min_size=8, max_size=8))
def test_all_equal_rewards_and_length_one_rows(value, lengths):
    # T = 1: every row is a length-1 response or fully masked.
    batch = make(np.full(8, value, np.float32), lengths, g=4, t=1)
    out, _, metrics = APPLY_ADV(batch, (), CTX)
    np.testing.assert_array_equal(out.advantages, 0.0)
    assert all(np.isfinite(v) for v in metrics.values())
    out, _, metrics = APPLY_REWARDS(
        make(np.full(8, value, np.float32), lengths, np.arange(8) % 4, g=4, t=1),
        REWARDS_T.init(),
        CTX,
    )
    assert all(np.isfinite(v) for v in metrics.values())

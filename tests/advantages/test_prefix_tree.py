"""Tests for rljax.advantages.prefix_tree (IBPO) against an explicit dict-trie reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.advantages.prefix_tree import implicit_process_advantages, prefix_tree_advantages
from rljax.core.batch import make_batch
from rljax.core.transform import Context

CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
T = 4


def trie_reference(tokens, lengths, rewards, g):
    """Builds a trie per group from nested dicts; each node keeps the rewards through it."""
    b = len(rewards)
    out = np.zeros((b, tokens.shape[1]))
    for start in range(0, b, g):
        root = {"rewards": [], "children": {}}
        for i in range(start, start + g):
            node = root
            node["rewards"].append(float(rewards[i]))
            for s in range(lengths[i]):
                node = node["children"].setdefault(
                    int(tokens[i, s]), {"rewards": [], "children": {}}
                )
                node["rewards"].append(float(rewards[i]))
        for i in range(start, start + g):
            node = root
            parent = np.mean(node["rewards"])
            for s in range(lengths[i]):
                node = node["children"][int(tokens[i, s])]
                value = np.mean(node["rewards"])
                out[i, s] = value - parent
                parent = value
    return out


def prefix_mask(lengths, t=T):
    return np.arange(t)[None, :] < np.asarray(lengths)[:, None]


def make(tokens, mask, rewards, g):
    b, t = mask.shape
    return make_batch(
        prompt_tokens=np.zeros((b, 1)),
        prompt_mask=np.ones((b, 1)),
        completion_tokens=tokens,
        completion_mask=mask,
        group_id=np.arange(b) // g,
        rewards=rewards,
    )


ADV = jax.jit(prefix_tree_advantages, static_argnums=(3,))
APPLY = jax.jit(implicit_process_advantages(4).apply)

# Two groups of 4. Group 0: "1 2 3", "1 2 4", "1 5", "1 2 3 6" (pad token 0 after the end).
TOKENS = np.array(
    [[1, 2, 3, 0], [1, 2, 4, 0], [1, 5, 0, 0], [1, 2, 3, 6], [7, 7, 7, 7], [7, 7, 7, 7],
     [8, 0, 0, 0], [7, 7, 0, 0]],
    np.int32,
)  # fmt: skip
LENGTHS = np.array([3, 3, 2, 4, 4, 4, 1, 2])
REWARDS = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.5, 2.0], np.float32)


def test_hand_values():
    out = np.asarray(ADV(TOKENS, prefix_mask(LENGTHS), REWARDS, 4))
    # Group 0, mean 0.5. Node "1": all 4 -> 0. "1 2": {0, 1, 3} mean 2/3 -> +1/6;
    # "1 5": {2} -> -0.5. "1 2 3": {0, 3} mean 1 -> +1/3; "1 2 4": {1} -> -2/3.
    # "1 2 3 6": {3} -> 0 (same value as its parent).
    np.testing.assert_allclose(out[0], [0, 1 / 6, 1 / 3, 0], atol=1e-6)
    np.testing.assert_allclose(out[1], [0, 1 / 6, -2 / 3, 0], atol=1e-6)
    np.testing.assert_allclose(out[2], [0, -0.5, 0, 0], atol=1e-6)
    np.testing.assert_allclose(out[3], [0, 1 / 6, 1 / 3, 0], atol=1e-6)
    # Group 1, mean 0.875. "7": {4, 5, 7} mean 1 -> +1/8; "8": {6} -> -3/8.
    # "7 7": {4, 5, 7} -> 0; "7 7 7": {4, 5} mean 0.5 -> -0.5; rows 4 and 5 identical.
    np.testing.assert_allclose(out[4], [0.125, 0, -0.5, 0], atol=1e-6)
    np.testing.assert_allclose(out[5], out[4], atol=0)
    np.testing.assert_allclose(out[6], [-0.375, 0, 0, 0], atol=1e-6)
    np.testing.assert_allclose(out[7], [0.125, 0, 0, 0], atol=1e-6)


@pytest.mark.parametrize("g", [2, 4, 8])
def test_matches_trie_reference(g):
    mask = prefix_mask(LENGTHS)
    out = ADV(TOKENS, mask, REWARDS, g)
    np.testing.assert_allclose(out, trie_reference(TOKENS, LENGTHS, REWARDS, g), atol=1e-6)


def test_shared_prefix_gets_exact_zero():
    tokens = np.array([[3, 1, 4, 1], [3, 1, 5, 9], [3, 1, 4, 2], [3, 1, 2, 6]], np.int32)
    rewards = np.array([0.3, 0.7, 0.1, 0.9], np.float32)
    out = np.asarray(ADV(tokens, np.ones((4, 4), bool), rewards, 4))
    np.testing.assert_array_equal(out[:, :2], 0.0)
    assert np.all(out[:, 2] != 0)


def test_holes_in_the_mask_keep_telescoping_and_finiteness():
    # Row 0 has a masked (e.g. tool-output) token at position 1; row 1 matches it there.
    tokens = np.array([[1, 9, 2, 3], [1, 8, 2, 4], [1, 2, 2, 3], [5, 5, 5, 5]], np.int32)
    mask = np.array([[1, 0, 1, 1], [1, 0, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]], bool)
    rewards = np.array([1.0, 0.0, 0.5, 0.25], np.float32)
    out = np.asarray(ADV(tokens, mask, rewards, 4))
    assert np.all(np.isfinite(out)) and np.all(out[~mask] == 0)
    np.testing.assert_allclose(out.sum(axis=1), rewards - rewards.mean(), atol=1e-6)
    # Rows 0 and 1 still share node "1 _ 2" with mean 0.5, then split.
    np.testing.assert_allclose(out[0], [0.5 - 0.4375, 0, 0, 0.5], atol=1e-6)


def test_errors():
    with pytest.raises(ValueError, match="group_size=1.*at least 2"):
        implicit_process_advantages(1)
    with pytest.raises(ValueError, match="group_size=3 does not divide batch 8"):
        prefix_tree_advantages(TOKENS, prefix_mask(LENGTHS), REWARDS, 3)
    t = implicit_process_advantages(4)
    batch = make(TOKENS, prefix_mask(LENGTHS), REWARDS, 4)
    with pytest.raises(ValueError, match="mixes group ids"):
        t.apply(batch.replace(group_id=jnp.arange(8) % 2), (), CTX)
    with pytest.raises(ValueError, match=r"needs \[B\] rewards"):
        t.apply(batch.replace(rewards=jnp.zeros((8, 2))), (), CTX)


def test_transform_writes_token_advantages_and_metrics():
    mask = prefix_mask(LENGTHS)
    batch, state, m = APPLY(make(TOKENS, mask, REWARDS, 4), (), CTX)
    ref = trie_reference(TOKENS, LENGTHS, REWARDS, 4)
    np.testing.assert_allclose(batch.advantages, ref, atol=1e-6)
    assert state == ()
    np.testing.assert_allclose(m["ibpo/advantages/mean"], ref[mask].mean(), atol=1e-6)
    np.testing.assert_allclose(m["ibpo/advantages/min"], -2 / 3, rtol=1e-5)
    # Branch tokens (the set through the node shrinks): group 0 "1 2" x3, "1 5", "1 2 3" x2,
    # "1 2 4", "1 2 3 6" (value unchanged, set {0, 3} -> {3}); group 1 "7" x3, "8",
    # "7 7 7" x2. 14 of 23 valid tokens.
    np.testing.assert_allclose(m["ibpo/branch_token_frac"], 14 / 23, rtol=1e-6)
    np.testing.assert_allclose(m["ibpo/zero_std_frac"], 0.0)


GROUP = st.tuples(
    st.lists(st.lists(st.integers(0, 2), min_size=T, max_size=T), min_size=4, max_size=4),
    st.lists(st.integers(0, T), min_size=4, max_size=4),
    st.lists(st.sampled_from([0.0, 0.5, 1.0, -2.0]), min_size=4, max_size=4),
)


@settings(max_examples=25, deadline=None)
@given(GROUP, GROUP, st.permutations(range(4)), st.permutations(range(4)))
def test_trie_reference_telescoping_and_permutation(g0, g1, p0, p1):
    tokens = np.array(g0[0] + g1[0], np.int32)
    lengths = np.array(g0[1] + g1[1])
    rewards = np.array(g0[2] + g1[2], np.float32)
    mask = prefix_mask(lengths)
    adv = np.asarray(APPLY(make(tokens, mask, rewards, 4), (), CTX)[0].advantages)
    np.testing.assert_allclose(adv, trie_reference(tokens, lengths, rewards, 4), atol=1e-5)
    assert np.all(np.isfinite(adv)) and np.all(adv[~mask] == 0)
    # Telescoping: the row sum is (mean reward of the responses that start with all of i,
    # valid through i's length) - group mean.
    for i in range(8):
        grp = list(range(4 * (i // 4), 4 * (i // 4) + 4))
        n = lengths[i]
        ext = [j for j in grp if lengths[j] >= n and np.all(tokens[j, :n] == tokens[i, :n])]
        if n > 0:
            expected = rewards[ext].mean() - rewards[grp].mean()
            np.testing.assert_allclose(adv[i].sum(), expected, atol=1e-5)
    perm = np.concatenate([np.array(p0), 4 + np.array(p1)])
    adv_p = np.asarray(
        APPLY(make(tokens[perm], mask[perm], rewards[perm], 4), (), CTX)[0].advantages
    )
    np.testing.assert_allclose(adv_p, adv[perm], atol=1e-6)


def test_unique_responses_telescope_to_reward_minus_mean():
    tokens = np.array([[1, 2, 3, 4], [1, 2, 5, 4], [1, 6, 6, 6], [2, 2, 2, 2]], np.int32)
    rewards = np.array([1.0, -1.0, 0.3, 0.6], np.float32)
    out = np.asarray(ADV(tokens, np.ones((4, 4), bool), rewards, 4))
    np.testing.assert_allclose(out.sum(axis=1), rewards - rewards.mean(), atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from([0.0, 1.0, -0.5]),
    st.lists(st.integers(0, 2), min_size=8, max_size=8),
    st.lists(st.integers(0, 1), min_size=8, max_size=8),
)
def test_all_equal_rewards_and_length_one_rows(value, tokens, lengths):
    # T = 1: every row is a length-1 response or fully masked.
    tokens = np.array(tokens, np.int32).reshape(8, 1)
    mask = prefix_mask(lengths, t=1)
    batch, _, m = APPLY(make(tokens, mask, np.full(8, value, np.float32), 4), (), CTX)
    np.testing.assert_array_equal(batch.advantages, 0.0)
    assert all(np.isfinite(v) for v in m.values())

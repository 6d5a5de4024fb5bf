"""Tests for rljax.advantages.agent_groups (Dr. MAS) against a dict-of-cells numpy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.advantages.agent_groups import agent_advantages, agent_normalized_advantages
from rljax.advantages.group import grpo_advantages
from rljax.core.batch import make_batch
from rljax.core.transform import Context

CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
REWARDS = np.array([1.0, 0.0, 0.3, 0.9, 0.5, 0.5, 2.0, -1.0, 0.0, 1.0, 1.0, 0.2], np.float32)
AGENTS = np.array([0, 1, 0, 1, 0, 0, 1, 1, 2, 0, 2, 1], np.int32)
MASK = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]] * 3, bool)


def reference(rewards, group_id, agent_id, g, eps=1e-6):
    """Pools rewards in a dict keyed by (group, agent), then normalises each cell."""
    cells = {}
    for i in range(len(rewards)):
        cells.setdefault((i // g, int(group_id[i]), int(agent_id[i])), []).append(i)
    out = np.zeros(len(rewards))
    for idx in cells.values():
        vals = np.array([float(rewards[i]) for i in idx])
        if len(vals) < 2 or np.all(vals == vals[0]):
            continue
        mean = vals.sum() / len(vals)
        std = np.sqrt(((vals - mean) ** 2).sum() / (len(vals) - 1))
        for i, v in zip(idx, vals):
            out[i] = (v - mean) / (std + eps)
    return out


def make(rewards, mask, g, agents, key="agent_id"):
    b, t = mask.shape
    return make_batch(
        prompt_tokens=np.zeros((b, 1)),
        prompt_mask=np.ones((b, 1)),
        completion_tokens=np.zeros((b, t)),
        completion_mask=mask,
        group_id=np.arange(b) // g,
        rewards=rewards,
        extras={key: np.asarray(agents, np.int32)},
    )


ADV = jax.jit(agent_normalized_advantages, static_argnums=(3,))
GRPO = jax.jit(grpo_advantages, static_argnums=(1,))
GROUPS = np.arange(12) // 6


@pytest.mark.parametrize("g", [2, 4, 6, 12])
def test_matches_reference(g):
    gid = np.arange(12) // g
    out = ADV(jnp.array(REWARDS), jnp.array(gid), jnp.array(AGENTS), g)
    np.testing.assert_allclose(out, reference(REWARDS, gid, AGENTS, g), rtol=1e-5, atol=1e-6)


def test_hand_value():
    # One group of 4: agent 0 has [1, 0] -> mean 0.5, std sqrt(0.5); agent 1 has [3, 3] -> 0.
    out = ADV(
        jnp.array([1.0, 3.0, 0.0, 3.0]), jnp.zeros(4, jnp.int32), jnp.array([0, 1, 0, 1]), 4, 0.0
    )
    np.testing.assert_allclose(out, [1 / np.sqrt(2), 0.0, -1 / np.sqrt(2), 0.0], rtol=1e-6)


def test_singleton_and_constant_cells_give_exact_zero():
    # G = 3. Group 0: agent 0 alone, agent 1 constant [0.1, 0.1]. Group 1: agent 2 alone,
    # agent 1 [1, 0] -> +-1/sqrt(2) / (1/sqrt(2) + eps).
    rewards = jnp.array([0.7, 0.1, 0.1, 5.0, 1.0, 0.0])
    agents = jnp.array([0, 1, 1, 2, 1, 1])
    out = np.asarray(ADV(rewards, jnp.arange(6) // 3, agents, 3))
    np.testing.assert_array_equal(out[:4], 0.0)
    np.testing.assert_allclose(out[4:], [1 / np.sqrt(2), -1 / np.sqrt(2)], rtol=1e-5)


def test_scaling_one_agent_leaves_the_other_unchanged():
    scaled = REWARDS.copy()
    scaled[AGENTS == 1] = 10.0 * scaled[AGENTS == 1] - 3.0
    base = np.asarray(ADV(jnp.array(REWARDS), jnp.array(GROUPS), jnp.array(AGENTS), 6))
    out = np.asarray(ADV(jnp.array(scaled), jnp.array(GROUPS), jnp.array(AGENTS), 6))
    np.testing.assert_array_equal(out[AGENTS != 1], base[AGENTS != 1])
    # The scaled agent itself is scale-invariant up to eps.
    np.testing.assert_allclose(out[AGENTS == 1], base[AGENTS == 1], rtol=1e-4)
    # Contrast: plain GRPO pools the agents, so scaling agent 1 moves agent 0's advantages.
    grpo_base = np.asarray(GRPO(jnp.array(REWARDS), 6))
    grpo_scaled = np.asarray(GRPO(jnp.array(scaled), 6))
    assert not np.allclose(grpo_scaled[AGENTS == 0], grpo_base[AGENTS == 0])


@pytest.mark.parametrize("g", [2, 6])
def test_one_agent_equals_grpo(g):
    out = ADV(jnp.array(REWARDS), jnp.arange(12) // g, jnp.zeros(12, jnp.int32), g)
    np.testing.assert_allclose(out, GRPO(jnp.array(REWARDS), g), rtol=1e-5, atol=1e-6)


def test_group_id_splits_cells_under_jit():
    # Under jit check_groups cannot see values; cells still never cross group ids.
    gid = jnp.array([0, 0, 1, 1])
    out = ADV(jnp.array([1.0, 0.0, 5.0, 2.0]), gid, jnp.zeros(4, jnp.int32), 4)
    expected = reference([1.0, 0.0, 5.0, 2.0], np.array([0, 0, 1, 1]), np.zeros(4), 4)
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_errors():
    with pytest.raises(ValueError, match="group_size=1.*at least 2"):
        agent_advantages(1)
    with pytest.raises(ValueError, match="group_size=5 does not divide batch 12"):
        agent_normalized_advantages(jnp.zeros(12), jnp.zeros(12), jnp.zeros(12), 5)
    t = agent_advantages(6)
    batch = make(REWARDS, MASK, 6, AGENTS)
    with pytest.raises(ValueError, match=r"needs batch.extras\['agent_id'\]"):
        t.apply(make(REWARDS, MASK, 6, AGENTS, key="agent"), (), CTX)
    with pytest.raises(ValueError, match=r"extras\['agent_id'\] has shape \(12, 2\)"):
        t.apply(batch.replace(extras={"agent_id": jnp.zeros((12, 2), jnp.int32)}), (), CTX)
    with pytest.raises(ValueError, match="expected an integer dtype"):
        t.apply(batch.replace(extras={"agent_id": jnp.zeros(12)}), (), CTX)
    with pytest.raises(ValueError, match="mixes group ids"):
        t.apply(batch.replace(group_id=jnp.arange(12) % 2), (), CTX)
    with pytest.raises(ValueError, match=r"needs \[B\] rewards"):
        t.apply(batch.replace(rewards=jnp.zeros((12, 2))), (), CTX)


APPLY = jax.jit(agent_advantages(6, agent_key="role").apply)


def test_transform_writes_token_advantages_and_metrics():
    batch, state, m = APPLY(make(REWARDS, MASK, 6, AGENTS, key="role"), (), CTX)
    seq = reference(REWARDS, GROUPS, AGENTS, 6)
    np.testing.assert_allclose(batch.advantages, seq[:, None] * MASK, rtol=1e-5, atol=1e-6)
    assert state == ()
    valid = (seq[:, None] * np.ones_like(MASK))[MASK]
    np.testing.assert_allclose(m["drmas/advantages/mean"], valid.mean(), atol=1e-6)
    np.testing.assert_allclose(m["drmas/advantages/max"], valid.max(), rtol=1e-5)
    # Cells: group 0 {a0: 0,2,4,5; a1: 1,3}; group 1 {a1: 6,7,11; a2: 8,10; a0: 9}.
    np.testing.assert_allclose(m["drmas/mean_cell_size"], (4 * 4 + 2 * 2 + 3 * 3 + 2 * 2 + 1) / 12)
    np.testing.assert_allclose(m["drmas/zero_adv_frac"], 1 / 12)  # sample 9 is alone


VALUES = st.sampled_from([0.0, 0.1, 1.0, -0.3, 5.0])


@settings(max_examples=25, deadline=None)
@given(
    st.lists(VALUES, min_size=12, max_size=12),
    st.lists(st.integers(0, 2), min_size=12, max_size=12),
    st.lists(st.booleans(), min_size=36, max_size=36),
    st.permutations(range(6)),
    st.permutations(range(6)),
)
def test_permutation_within_groups_permutes_advantages(rewards, agents, mask, p0, p1):
    rewards, agents = np.array(rewards, np.float32), np.array(agents)
    mask = np.array(mask).reshape(12, 3)
    perm = np.concatenate([np.array(p0), 6 + np.array(p1)])
    adv = np.asarray(APPLY(make(rewards, mask, 6, agents, "role"), (), CTX)[0].advantages)
    adv_p = np.asarray(
        APPLY(make(rewards[perm], mask[perm], 6, agents[perm], "role"), (), CTX)[0].advantages
    )
    np.testing.assert_allclose(adv_p, adv[perm], rtol=1e-5, atol=1e-5)
    assert np.all(np.isfinite(adv)) and np.all(adv[~mask] == 0)
    np.testing.assert_allclose(
        adv[:, 0][mask[:, 0]], reference(rewards, GROUPS, agents, 6)[mask[:, 0]], atol=1e-4
    )


@settings(max_examples=25, deadline=None)
@given(VALUES, st.lists(st.integers(0, 2), min_size=12, max_size=12))
def test_all_equal_rewards_and_length_one_rows(value, agents):
    # T = 1 with rows 0 and 5 fully masked.
    mask = np.ones((12, 1), bool)
    mask[[0, 5]] = False
    batch, _, m = APPLY(make(np.full(12, value, np.float32), mask, 6, agents, "role"), (), CTX)
    np.testing.assert_array_equal(batch.advantages, 0.0)
    assert all(np.isfinite(v) for v in m.values())
    assert m["drmas/zero_adv_frac"] == 1.0

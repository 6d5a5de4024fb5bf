"""Tests for rljax.advantages.gprl against loop-based numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.advantages.gprl import (
    DriftMonitorState,
    gpm_dimension_rewards,
    gprl_advantages,
    preference_advantages,
)
from rljax.core.batch import make_batch
from rljax.core.transform import Context

CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
J = np.array([[0.0, -1.0], [1.0, 0.0]])
REWARDS = np.array(
    [
        [1.0, 0.2],
        [0.0, 0.4],
        [0.5, 0.4],
        [2.0, -1.0],
        [0.0, 3.0],
        [1.0, 3.0],
        [0.3, 3.0],
        [0.0, 3.0],
    ],
    np.float32,
)
MASK = np.array(
    [[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0]], bool
)


def reference_dimension_rewards(emb, g):
    """r_i^l = mean_{j != i} v_i^T J v_j, with explicit loops and the explicit J matrix."""
    b, k, _ = emb.shape
    out = np.zeros((b, k))
    for start in range(0, b, g):
        for i in range(start, start + g):
            for lv in range(k):
                scores = [emb[i, lv] @ J @ emb[j, lv] for j in range(start, start + g) if j != i]
                out[i, lv] = np.mean(scores)
    return out


def reference_advantages(rewards, g, weights, eps=1e-6):
    """Per-dimension ddof=1 z-scores in each group, summed with weights normalised per row."""
    b, k = rewards.shape
    weights = np.broadcast_to(np.asarray(weights, np.float64), (b, k))
    out = np.zeros(b)
    for start in range(0, b, g):
        for lv in range(k):
            col = [float(rewards[i, lv]) for i in range(start, start + g)]
            if all(c == col[0] for c in col):
                continue
            mean = sum(col) / g
            std = (sum((c - mean) ** 2 for c in col) / (g - 1)) ** 0.5
            for i in range(start, start + g):
                lam = weights[i, lv] / weights[i].sum()
                out[i] += lam * (col[i - start] - mean) / (std + eps)
    return out


def make(rewards, mask, g, extras=None):
    b, t = mask.shape
    return make_batch(
        prompt_tokens=np.zeros((b, 1)),
        prompt_mask=np.ones((b, 1)),
        completion_tokens=np.zeros((b, t)),
        completion_mask=mask,
        group_id=np.arange(b) // g,
        rewards=rewards,
        extras=extras,
    )


DIM_REWARDS = jax.jit(gpm_dimension_rewards, static_argnums=(1,))
ADVANTAGES = jax.jit(gprl_advantages, static_argnums=(1,))


def test_dimension_rewards_hand_value():
    # v_0 = (1, 0), v_1 = (0, 1): v_0^T J v_1 = (1, 0) . (-1, 0) = -1, and s_10 = +1.
    emb = jnp.array([[[1.0, 0.0]], [[0.0, 1.0]]])
    np.testing.assert_allclose(gpm_dimension_rewards(emb, 2), [[-1.0], [1.0]])


@pytest.mark.parametrize("g", [2, 3, 6])
def test_dimension_rewards_match_reference(g):
    emb = np.random.default_rng(0).normal(size=(6, 3, 2)).astype(np.float32)
    out = DIM_REWARDS(jnp.array(emb), g)
    np.testing.assert_allclose(out, reference_dimension_rewards(emb, g), rtol=1e-5, atol=1e-5)


def test_identical_embeddings_give_exact_zero():
    emb = jnp.broadcast_to(jnp.array([0.3, -1.7]), (4, 2, 2))
    np.testing.assert_array_equal(gpm_dimension_rewards(emb, 4), 0.0)


@pytest.mark.parametrize("g", [2, 4])
def test_advantages_match_reference(g):
    uniform = np.ones(2)
    np.testing.assert_allclose(
        ADVANTAGES(jnp.array(REWARDS), g), reference_advantages(REWARDS, g, uniform), atol=1e-5
    )
    w = np.array([3.0, 1.0])
    np.testing.assert_allclose(
        ADVANTAGES(jnp.array(REWARDS), g, jnp.array(w)),
        reference_advantages(REWARDS, g, w),
        atol=1e-5,
    )
    w_rows = np.random.default_rng(1).uniform(0.1, 2.0, size=(8, 2))
    np.testing.assert_allclose(
        ADVANTAGES(jnp.array(REWARDS), g, jnp.array(w_rows, jnp.float32)),
        reference_advantages(REWARDS, g, w_rows),
        atol=1e-5,
    )


def test_hand_value_and_constant_dimension():
    # Group [0, 2] in dim 0: z = -/+ 1/sqrt(2) (ddof=1 std sqrt 2); dim 1 is constant -> 0.
    out = gprl_advantages(jnp.array([[0.0, 5.0], [2.0, 5.0]]), 2, jnp.array([1.0, 3.0]))
    np.testing.assert_allclose(out, [-0.25 / np.sqrt(2), 0.25 / np.sqrt(2)], rtol=1e-5)
    pop = gprl_advantages(jnp.array([[0.0, 5.0], [2.0, 5.0]]), 2, unbiased_std=False)
    np.testing.assert_allclose(pop, [-0.5, 0.5], rtol=1e-5)
    zero = gprl_advantages(jnp.array([[1.0, 2.0], [3.0, 4.0]]), 2, jnp.zeros(2))
    np.testing.assert_array_equal(zero, 0.0)


def test_errors():
    with pytest.raises(ValueError, match=r"expected \[B, K, 2\]"):
        gpm_dimension_rewards(jnp.zeros((4, 2, 3)), 2)
    with pytest.raises(ValueError, match="group_size=3 does not divide batch 4"):
        gpm_dimension_rewards(jnp.zeros((4, 2, 2)), 3)
    with pytest.raises(ValueError, match="group_size=1"):
        gprl_advantages(jnp.zeros((4, 2)), 1)
    with pytest.raises(ValueError, match="weights have shape"):
        gprl_advantages(jnp.zeros((4, 2)), 2, jnp.ones(3))
    with pytest.raises(ValueError, match="must be >= 0"):
        gprl_advantages(jnp.zeros((4, 2)), 2, jnp.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="num_dimensions=None"):
        preference_advantages(2)
    with pytest.raises(ValueError, match="drift_window=1"):
        preference_advantages(2, num_dimensions=2, drift_window=1)
    with pytest.raises(ValueError, match="drift_threshold=0.0"):
        preference_advantages(2, num_dimensions=2, drift_threshold=0.0)
    with pytest.raises(ValueError, match="drift_decay=1.5"):
        preference_advantages(2, num_dimensions=2, drift_decay=1.5)
    with pytest.raises(ValueError, match="clip_shrink=0.0"):
        preference_advantages(2, num_dimensions=2, clip_shrink=0.0)
    with pytest.raises(ValueError, match="num_dimensions=3 disagrees"):
        preference_advantages(2, weights=[1.0, 1.0], num_dimensions=3)
    t = preference_advantages(4, num_dimensions=2)
    with pytest.raises(ValueError, match=r"needs \[B, K\] rewards with K = 2"):
        t.apply(make(REWARDS[:, 0], MASK, 4), t.init(), CTX)
    bad = make(REWARDS, MASK, 4, extras={"dimension_weights": np.ones((8, 3))})
    with pytest.raises(ValueError, match=r"extras\['dimension_weights'\] has shape"):
        t.apply(bad, t.init(), CTX)
    with pytest.raises(ValueError, match="mixes group ids"):
        t.apply(make(REWARDS, MASK, 2), t.init(), CTX)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.sampled_from([-2.0, -0.5, 0.0, 0.3, 1.0, 2.5]), min_size=16, max_size=16),
    st.floats(0.05, 50.0),
    st.integers(0, 1),
)
def test_rescaling_one_dimension_keeps_advantages(values, factor, dim):
    rewards = np.array(values, np.float32).reshape(8, 2)
    scaled = rewards.copy()
    scaled[:, dim] *= np.float32(factor)
    w = jnp.array([0.7, 0.3])
    a = np.asarray(ADVANTAGES(jnp.array(rewards), 4, w))
    a_scaled = np.asarray(ADVANTAGES(jnp.array(scaled), 4, w))
    np.testing.assert_allclose(a_scaled, a, atol=2e-3)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-2, 2, width=32), min_size=24, max_size=24))
def test_skew_symmetry_makes_group_rewards_sum_to_zero(values):
    emb = jnp.array(np.array(values, np.float32).reshape(6, 2, 2))
    r = np.asarray(DIM_REWARDS(emb, 3))
    np.testing.assert_allclose(r.reshape(2, 3, 2).sum(axis=1), 0.0, atol=1e-5)


def test_transform_matches_reference_and_prefers_extras_weights():
    t = preference_advantages(4, weights=[1.0, 3.0])
    apply = jax.jit(t.apply)
    batch, state, metrics = apply(make(REWARDS, MASK, 4), t.init(), CTX)
    seq = reference_advantages(REWARDS, 4, [1.0, 3.0])
    np.testing.assert_allclose(batch.advantages, seq[:, None] * MASK, atol=1e-5)
    np.testing.assert_allclose(metrics["gprl/dim0_weight"], 0.25, rtol=1e-6)
    np.testing.assert_allclose(metrics["gprl/dim1_weight"], 0.75, rtol=1e-6)
    assert metrics["gprl/drift_alarm"] == 0.0
    np.testing.assert_array_equal(batch.extras["clip_scale"], np.ones(8))
    valid = seq[:, None].repeat(3, axis=1)[MASK]
    np.testing.assert_allclose(metrics["gprl/advantages/mean"], valid.mean(), atol=1e-6)
    np.testing.assert_allclose(metrics["gprl/advantages/std"], valid.std(), rtol=1e-5)
    np.testing.assert_allclose(metrics["gprl/advantages/max"], valid.max(), rtol=1e-5)
    assert isinstance(state, DriftMonitorState) and int(state.filled) == 1
    np.testing.assert_allclose(state.history[0], REWARDS.mean(axis=0), rtol=1e-6)

    w_rows = np.tile([[2.0, 1.0]], (8, 1)).astype(np.float32)
    batch, _, metrics = apply(
        make(REWARDS, MASK, 4, extras={"dimension_weights": w_rows}), t.init(), CTX
    )
    seq = reference_advantages(REWARDS, 4, w_rows)
    np.testing.assert_allclose(batch.advantages, seq[:, None] * MASK, atol=1e-5)
    np.testing.assert_allclose(metrics["gprl/dim0_weight"], 2 / 3, rtol=1e-6)


def run_monitor(t, dim_means, noise):
    """Applies `t` once per step to a batch whose per-dimension batch means are `dim_means[s]`."""
    apply = jax.jit(t.apply)
    state = t.init()
    out = []
    for means in dim_means:
        rewards = (np.asarray(means)[None, :] + noise).astype(np.float32)
        batch, state, metrics = apply(make(rewards, MASK[:4], 2), state, CTX)
        out.append((batch, state, metrics))
    return out


NOISE = np.array([[0.5, -0.2], [-0.5, 0.2], [0.1, 0.3], [-0.1, -0.3]])


def test_monitor_fires_when_one_dimension_alone_climbs():
    t = preference_advantages(2, num_dimensions=2, drift_window=4, clip_shrink=0.25)
    steps = run_monitor(t, [[0.1 * s, 1.0] for s in range(10)], NOISE)
    alarms = [float(m["gprl/drift_alarm"]) for _, _, m in steps]
    # The window fills at step 3 and restarts after each alarm: alarms at steps 3, 6, 9.
    assert alarms == [0, 0, 0, 1, 0, 0, 1, 0, 0, 1]
    batch, state, metrics = steps[3]
    # Multiplier of dim 0 halved and renormalised to mean 1: [2/3, 4/3].
    np.testing.assert_allclose(state.multipliers, [2 / 3, 4 / 3], rtol=1e-6)
    np.testing.assert_allclose(metrics["gprl/dim0_weight"], 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(batch.extras["clip_scale"], np.full(4, 0.25))
    np.testing.assert_allclose(steps[4][0].extras["clip_scale"], np.ones(4))
    # The step's advantages already use the new weights.
    rewards = (np.array([0.3, 1.0])[None, :] + NOISE).astype(np.float32)
    expected = reference_advantages(rewards, 2, [1 / 3, 2 / 3])
    np.testing.assert_allclose(batch.advantages, expected[:, None] * MASK[:4], atol=1e-5)
    np.testing.assert_allclose(steps[9][1].multipliers, [0.4 / 1.8, 3.2 / 1.8], rtol=1e-5)
    # A dimension that climbs while the other falls owns all the positive gain.
    steps = run_monitor(t, [[0.1 * s, 1.0 - 0.1 * s] for s in range(4)], NOISE)
    assert float(steps[3][2]["gprl/drift_alarm"]) == 1.0


def test_monitor_quiet_on_balanced_gains():
    t = preference_advantages(2, weights=[1.0, 1.0], drift_window=4)
    steps = run_monitor(t, [[0.1 * s, 2.0 + 0.1 * s] for s in range(10)], NOISE)
    assert all(float(m["gprl/drift_alarm"]) == 0.0 for _, _, m in steps)
    np.testing.assert_array_equal(steps[-1][1].multipliers, [1.0, 1.0])
    assert all(np.all(b.extras["clip_scale"] == 1.0) for b, _, _ in steps)
    # No gain at all: no alarm either.
    steps = run_monitor(t, [[1.0, 1.0]] * 5, NOISE)
    assert all(float(m["gprl/drift_alarm"]) == 0.0 for _, _, m in steps)


APPLY = jax.jit(preference_advantages(4, num_dimensions=2).apply)
INIT = preference_advantages(4, num_dimensions=2).init()
REWARD_VALUES = st.sampled_from([0.0, 0.1, 1.0, -0.3, 5.0])


@settings(max_examples=25, deadline=None)
@given(
    st.lists(REWARD_VALUES, min_size=16, max_size=16),
    st.lists(st.booleans(), min_size=24, max_size=24),
    st.permutations(range(4)),
    st.permutations(range(4)),
)
def test_permutation_within_groups_permutes_advantages(rewards, mask, p0, p1):
    rewards = np.array(rewards, np.float32).reshape(8, 2)
    mask = np.array(mask).reshape(8, 3)
    perm = np.concatenate([np.array(p0), 4 + np.array(p1)])
    adv = np.asarray(APPLY(make(rewards, mask, 4), INIT, CTX)[0].advantages)
    adv_p = np.asarray(APPLY(make(rewards[perm], mask[perm], 4), INIT, CTX)[0].advantages)
    np.testing.assert_allclose(adv_p, adv[perm], atol=1e-5)
    assert np.all(np.isfinite(adv)) and np.all(adv[~mask] == 0)


@settings(max_examples=25, deadline=None)
@given(REWARD_VALUES, REWARD_VALUES, st.lists(st.booleans(), min_size=8, max_size=8))
def test_all_equal_rewards_and_length_one_rows(v0, v1, mask):
    # T = 1: every row is a length-1 response or fully masked.
    mask = np.array(mask).reshape(8, 1)
    rewards = np.tile([[v0, v1]], (8, 1)).astype(np.float32)
    batch, _, metrics = APPLY(make(rewards, mask, 4), INIT, CTX)
    np.testing.assert_array_equal(batch.advantages, 0.0)
    assert all(np.isfinite(v) for v in metrics.values())

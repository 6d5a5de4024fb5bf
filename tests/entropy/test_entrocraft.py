"""Tests for rljax.entropy.entrocraft against hand values, a numpy port of the authors' rules
(lblaoke/entrocraft, verl/trainer/ppo/core_algos.py) and a tabular softmax bandit."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.advantages.group import group_advantages, grpo_advantages
from rljax.core.batch import make_batch
from rljax.core.transform import Context, stateless
from rljax.entropy.entrocraft import (
    batch_entropy,
    entrocraft_advantages,
    entropic_advantages,
    entropy_band,
    raw_reward_advantages,
)
from rljax.objectives.surrogate import ppo_clip

REWARDS = np.array([1.0, -1.0, -1.0, 1.0, 1.0, 1.0, -1.0, 1.0], np.float32)
MASK = np.array(
    [[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0]], bool
)
G = 4
CONSTANT = entropy_band("constant", (0.4, 0.4), (0.6, 0.6), 1)
LINEAR = entropy_band("linear", (0.6, 0.4), (0.7, 0.5), 10)


def ctx(step=0):
    return Context(step=jnp.int32(step), rng=jax.random.PRNGKey(0))


def make(rewards, mask, g, entropy):
    """A batch whose pre-update per-token entropy is `entropy` on every valid token."""
    b, t = mask.shape
    return make_batch(
        prompt_tokens=np.zeros((b, 1)),
        prompt_mask=np.ones((b, 1)),
        completion_tokens=np.zeros((b, t)),
        completion_mask=mask,
        group_id=np.arange(b) // g,
        rewards=rewards,
        extras={"old_entropy": np.where(mask, entropy, 0.0).astype(np.float32)},
    )


def grpo_reference(rewards, g):
    """(r - group mean) / (unbiased group std + 1e-6), by explicit loops (as torch.std)."""
    out = np.zeros(len(rewards))
    for start in range(0, len(rewards), g):
        group = [float(x) for x in rewards[start : start + g]]
        mean = sum(group) / g
        std = math.sqrt(sum((x - mean) ** 2 for x in group) / (g - 1))
        for i in range(g):
            out[start + i] = (group[i] - mean) / (std + 1e-6)
    return out


def repo_grpo_range(rewards, mask, g, entropy, lower, upper):
    """Numpy port of the authors' compute_grpo_range_outcome_advantage (RAFT++ / NSR / GRPO)."""
    scores = np.asarray(rewards, np.float64).copy()
    if entropy > upper:
        scores[scores < 0.0] = 0.0
    elif entropy < lower:
        scores[scores > 0.0] = 0.0
    else:
        scores = grpo_reference(scores, g)
    return scores[:, None] * mask


ENTROCRAFT = entrocraft_advantages(group_advantages(G), CONSTANT)
ENTROCRAFT_REWARD = entrocraft_advantages(group_advantages(G), CONSTANT, outside="reward")
LINEAR_APPLY_TRACES = []


def _linear_apply(batch, step):
    LINEAR_APPLY_TRACES.append(1)
    t = entrocraft_advantages(group_advantages(G), LINEAR)
    return t.apply(batch, (), ctx().replace(step=step))


LINEAR_APPLY = jax.jit(_linear_apply)


# ----- the schedule -----


@pytest.mark.parametrize(
    "kind, step, expected",
    [
        ("constant", 0, (0.6, 0.7)),
        ("constant", 7, (0.6, 0.7)),
        ("linear", 0, (0.6, 0.7)),
        ("linear", 2, (0.55, 0.65)),  # p = 1/4
        ("linear", 4, (0.5, 0.6)),  # p = 1/2
        ("linear", 8, (0.4, 0.5)),
        ("linear", 12, (0.4, 0.5)),  # past the end: clipped
        ("linear", -3, (0.6, 0.7)),  # before the start: clipped
        ("cosine", 0, (0.6, 0.7)),
        # p = 1/4: progress 0.5 (1 - cos(pi/4)) = 0.5 - sqrt(2)/4
        ("cosine", 2, (0.6 - 0.2 * (0.5 - math.sqrt(2) / 4), 0.7 - 0.2 * (0.5 - math.sqrt(2) / 4))),
        ("cosine", 4, (0.5, 0.6)),  # p = 1/2: progress 1/2
        ("cosine", 8, (0.4, 0.5)),
    ],
)
def test_band_hand_values(kind, step, expected):
    band = entropy_band(kind, (0.6, 0.4), (0.7, 0.5), 8)
    lo, up = band(jnp.int32(step))
    np.testing.assert_allclose([lo, up], expected, rtol=1e-6)
    lo_j, up_j = jax.jit(band)(jnp.int32(step))
    np.testing.assert_allclose([lo_j, up_j], expected, rtol=1e-6)
    assert lo.dtype == jnp.float32 and lo.shape == ()


def test_band_errors():
    with pytest.raises(ValueError, match="kind='exp'.*constant"):
        entropy_band("exp", (0.6, 0.4), (0.7, 0.5), 8)
    with pytest.raises(ValueError, match="total_steps=0"):
        entropy_band("linear", (0.6, 0.4), (0.7, 0.5), 0)
    with pytest.raises(ValueError, match="lower=0.8 > upper=0.7 at the start"):
        entropy_band("linear", (0.8, 0.4), (0.7, 0.5), 8)
    with pytest.raises(ValueError, match="lower=0.6 > upper=0.5 at the end"):
        entropy_band("cosine", (0.6, 0.6), (0.7, 0.5), 8)
    with pytest.raises(ValueError, match="pair"):
        entropy_band("linear", (0.6,), (0.7, 0.5), 8)
    # "constant" uses only the start values; its end values are not checked.
    lo, up = entropy_band("constant", (0.6, 0.9), (0.7, 0.5), 8)(jnp.int32(3))
    np.testing.assert_allclose([lo, up], [0.6, 0.7], rtol=1e-6)


# ----- the batch entropy and the raw-reward estimator -----


def test_batch_entropy_hand_value_and_errors():
    mask = np.array([[1, 1, 0], [1, 0, 0]], bool)
    ent = np.array([[0.2, 0.4, 9.0], [0.9, 9.0, 9.0]], np.float32)  # 9s sit on invalid tokens
    batch = make(np.zeros(2), mask, 2, 0.0).replace(extras={"old_entropy": jnp.asarray(ent)})
    np.testing.assert_allclose(batch_entropy(batch), (0.2 + 0.4 + 0.9) / 3, rtol=1e-6)
    empty = batch.replace(completion_mask=jnp.zeros((2, 3), bool))
    assert float(batch_entropy(empty)) == 0.0
    with pytest.raises(ValueError, match="old_entropy.*missing.*prepare"):
        batch_entropy(batch.replace(extras={}))
    with pytest.raises(ValueError, match=r"shape \(2, 2\), expected \[B, T\]"):
        batch_entropy(batch.replace(extras={"old_entropy": jnp.zeros((2, 2))}))


def test_raw_reward_advantages():
    batch = make(REWARDS, MASK, G, 0.5)
    out, state, metrics = raw_reward_advantages().apply(batch, (), ctx())
    np.testing.assert_array_equal(out.advantages, REWARDS[:, None] * MASK)
    assert state == ()
    assert "raw_reward/advantages/mean" in metrics
    with pytest.raises(ValueError, match=r"needs \[B\] rewards"):
        raw_reward_advantages().apply(batch.replace(rewards=jnp.zeros((8, 2))), (), ctx())


# ----- Entrocraft's rule -----


def test_above_band_keeps_positive_part():
    batch = make(REWARDS, MASK, G, 0.9)  # H = 0.9 > up = 0.6
    out, state, metrics = ENTROCRAFT.apply(batch, (), ctx())
    grpo = grpo_reference(REWARDS, G)[:, None] * MASK
    adv = np.asarray(out.advantages)
    assert (adv >= 0).all()
    np.testing.assert_allclose(adv, np.maximum(grpo, 0.0), rtol=1e-5, atol=1e-6)
    assert state == ()
    assert float(metrics["entrocraft/mode"]) == 1.0
    np.testing.assert_allclose(metrics["entrocraft/entropy"], 0.9, rtol=1e-6)
    np.testing.assert_allclose(
        [metrics["entrocraft/lower"], metrics["entrocraft/upper"]], [0.4, 0.6]
    )
    # Valid tokens of positive-advantage rows: rows 0 (2), 4 (1), 5 (2), 7 (1); row 3 is
    # positive but fully masked. 6 of the 13 valid tokens are kept.
    np.testing.assert_allclose(metrics["entrocraft/kept_frac"], 6 / 13, rtol=1e-6)
    assert "advantages/mean" in metrics  # inner's metrics are passed on


def test_below_band_keeps_negative_part():
    batch = make(REWARDS, MASK, G, 0.1)  # H = 0.1 < lo = 0.4
    out, _, metrics = ENTROCRAFT.apply(batch, (), ctx())
    grpo = grpo_reference(REWARDS, G)[:, None] * MASK
    adv = np.asarray(out.advantages)
    assert (adv <= 0).all()
    np.testing.assert_allclose(adv, np.minimum(grpo, 0.0), rtol=1e-5, atol=1e-6)
    assert float(metrics["entrocraft/mode"]) == -1.0
    # Negative rows: 1 (1 valid token), 2 (3), 6 (3): 7 of 13.
    np.testing.assert_allclose(metrics["entrocraft/kept_frac"], 7 / 13, rtol=1e-6)


@pytest.mark.parametrize("entropy", [0.4, 0.5, 0.6])  # the band's edges count as inside
def test_inside_band_equals_grpo_exactly(entropy):
    batch = make(REWARDS, MASK, G, entropy)
    out, _, metrics = ENTROCRAFT.apply(batch, (), ctx())
    expected = grpo_advantages(jnp.asarray(REWARDS), G)[:, None] * MASK
    np.testing.assert_array_equal(out.advantages, expected)
    assert float(metrics["entrocraft/mode"]) == 0.0


@pytest.mark.parametrize("entropy", [0.1, 0.5, 0.9])
def test_reward_mode_matches_repo_port(entropy):
    batch = make(REWARDS, MASK, G, entropy)
    out, _, _ = ENTROCRAFT_REWARD.apply(batch, (), ctx())
    expected = repo_grpo_range(REWARDS, MASK, G, entropy, 0.4, 0.6)
    np.testing.assert_allclose(out.advantages, expected, rtol=1e-5, atol=1e-6)


def test_reward_and_estimator_modes_differ_in_scale():
    # Above the band, "reward" keeps the raw +1 while "estimator" keeps GRPO's (1 - mean)/std.
    batch = make(REWARDS, MASK, G, 0.9)
    est = np.asarray(ENTROCRAFT.apply(batch, (), ctx())[0].advantages)
    raw = np.asarray(ENTROCRAFT_REWARD.apply(batch, (), ctx())[0].advantages)
    np.testing.assert_allclose(raw[0, 0], 1.0)
    np.testing.assert_allclose(est[0, 0], 1.0 / math.sqrt(4 / 3), rtol=1e-5)  # group 0: +-1 x2


def test_band_moves_with_traced_step():
    # H = 0.55 against lo 0.6 -> 0.4 and up 0.7 -> 0.5 over 10 steps: below, inside, above.
    batch = make(REWARDS, MASK, G, 0.55)
    grpo = grpo_reference(REWARDS, G)[:, None] * MASK
    cases = [(0, -1.0, np.minimum(grpo, 0.0)), (5, 0.0, grpo), (10, 1.0, np.maximum(grpo, 0.0))]
    for step, mode, expected in cases:
        out, _, metrics = LINEAR_APPLY(batch, jnp.int32(step))
        assert float(metrics["entrocraft/mode"]) == mode
        np.testing.assert_allclose(out.advantages, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics["entrocraft/lower"], 0.4, rtol=1e-6)
    assert len(LINEAR_APPLY_TRACES) == 1  # one compilation: the step is traced, not static


def test_entrocraft_keeps_inner_state():
    # The state is inner's, threaded through unchanged in structure.
    inner = entropic_advantages(raw_reward_advantages(), 0.5)
    t = entrocraft_advantages(inner, CONSTANT)
    state = t.init()
    _, new_state, metrics = t.apply(make(REWARDS, MASK, G, 0.9), state, ctx())
    np.testing.assert_allclose(new_state[0], 0.01 * (0.9 - 0.5), rtol=1e-5)
    assert "entropic/alpha" in metrics and "entrocraft/mode" in metrics


def test_filtered_branches_zero_invalid_tokens_of_an_unmasked_inner():
    # An inner estimator that writes advantages on padding too: the filtered branches still
    # give 0 on invalid tokens; inside the band inner's output passes through untouched.
    unmasked = stateless(lambda batch, c: (batch.replace(advantages=jnp.ones(MASK.shape)), {}))
    t = entrocraft_advantages(unmasked, CONSTANT)
    above, _, _ = t.apply(make(REWARDS, MASK, G, 0.9), (), ctx())
    np.testing.assert_array_equal(above.advantages, MASK.astype(np.float32))
    inside, _, _ = t.apply(make(REWARDS, MASK, G, 0.5), (), ctx())
    np.testing.assert_array_equal(inside.advantages, 1.0)


def test_entrocraft_errors():
    with pytest.raises(ValueError, match="outside='sign'"):
        entrocraft_advantages(group_advantages(G), CONSTANT, outside="sign")
    with pytest.raises(ValueError, match="selection='cov'"):
        entrocraft_advantages(group_advantages(G), CONSTANT, selection="cov")
    batch = make(REWARDS, MASK, G, 0.5)
    with pytest.raises(ValueError, match="old_entropy.*missing"):
        ENTROCRAFT.apply(batch.replace(extras={}), (), ctx())
    two_dim = entrocraft_advantages(raw_reward_advantages(), CONSTANT, outside="reward")
    with pytest.raises(ValueError, match=r"needs \[B\] rewards"):
        two_dim.apply(batch.replace(rewards=jnp.zeros((8, 2))), (), ctx())


# ----- the ENTROPIC baseline -----

ENTROPIC = entropic_advantages(raw_reward_advantages(), 0.5)
ENTROPIC_APPLY = jax.jit(ENTROPIC.apply)


def test_entropic_matches_repo_loop_over_three_steps():
    """Port of compute_entropic_outcome_advantage with the trainer carrying last_alpha."""
    last_alpha = 0.0
    state = ENTROPIC.init()
    for step, entropy in enumerate([0.9, 0.3, 0.62]):
        batch = make(REWARDS, MASK, G, entropy)
        out, state, metrics = ENTROPIC_APPLY(batch, state, ctx(step))
        scores = REWARDS.astype(np.float64)
        alpha = last_alpha + 1.0 * (entropy - 0.5)
        weights = np.ones_like(scores)
        weights[scores > 0.0] = 1.0 + alpha
        weights[scores < 0.0] = 1.0 - alpha
        expected = (scores * weights)[:, None] * MASK
        last_alpha = alpha - 0.99 * (entropy - 0.5)
        np.testing.assert_allclose(metrics["entropic/alpha"], alpha, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out.advantages, expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(state[0], last_alpha, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(metrics["entropic/entropy"], entropy, rtol=1e-6)
        np.testing.assert_allclose(metrics["entropic/target"], 0.5, rtol=1e-6)
        assert state[0].dtype == jnp.float32 and state[0].shape == ()


def test_entropic_gains_and_scheduled_target_hand_loop():
    kp, ki = 0.5, 0.2
    t = entropic_advantages(group_advantages(G), lambda step: 0.2 + 0.1 * step, kp, ki)
    state = t.init()
    s = 0.0
    grpo = grpo_reference(REWARDS, G)[:, None] * MASK
    for step, entropy in enumerate([0.9, 0.1, 0.6]):
        out, state, metrics = t.apply(make(REWARDS, MASK, G, entropy), state, ctx(step))
        e = entropy - (0.2 + 0.1 * step)
        alpha = s + kp * e
        expected = np.where(grpo > 0, (1 + alpha) * grpo, (1 - alpha) * grpo)
        s = alpha - (kp - ki) * e
        np.testing.assert_allclose(metrics["entropic/alpha"], alpha, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out.advantages, expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(state[0], s, rtol=1e-5, atol=1e-6)
    assert state[1] == ()  # inner's (empty) state


def test_entropic_weights_by_sign():
    # H above the target: positives weigh 1 + alpha > 1, negatives 1 - alpha < 1; zeros stay.
    rewards = np.array([1.0, -1.0, 0.0, 1.0], np.float32)
    mask = np.array([[1, 1], [1, 0], [1, 1], [0, 0]], bool)
    out, _, metrics = ENTROPIC.apply(make(rewards, mask, 2, 0.8), ENTROPIC.init(), ctx())
    alpha = 0.3
    np.testing.assert_allclose(metrics["entropic/alpha"], alpha, rtol=1e-5)
    adv = np.asarray(out.advantages)
    np.testing.assert_allclose(adv[0], [1 + alpha, 1 + alpha], rtol=1e-5)
    np.testing.assert_allclose(adv[1], [-(1 - alpha), 0.0], rtol=1e-5)
    np.testing.assert_array_equal(adv[2:], 0.0)  # zero reward, and a fully masked row
    # Below the target the weights swap.
    out, _, _ = ENTROPIC.apply(make(rewards, mask, 2, 0.2), ENTROPIC.init(), ctx())
    np.testing.assert_allclose(np.asarray(out.advantages)[:2, 0], [0.7, -1.3], rtol=1e-5)


def test_entropic_errors():
    with pytest.raises(ValueError, match="proportional_gain=-1"):
        entropic_advantages(raw_reward_advantages(), 0.5, proportional_gain=-1.0)
    with pytest.raises(ValueError, match="integral_gain=nan"):
        entropic_advantages(raw_reward_advantages(), 0.5, integral_gain=float("nan"))
    with pytest.raises(ValueError, match="target_entropy=-0.1"):
        entropic_advantages(raw_reward_advantages(), -0.1)
    with pytest.raises(ValueError, match="state"):
        ENTROPIC.apply(make(REWARDS, MASK, G, 0.5), (), ctx())


# ----- the softmax bandit -----

LOGITS = np.array([2.0, 0.5, 0.0, -0.5, -1.0], np.float32)
# A batch typical of a peaked policy (pi(0) ~ 0.67): 6 of 8 rows sample the mode; rewards are
# +-1 and independent of the action (the credit comes from the rest of the response). One
# positive row (3) and one negative row (7) sample rarer actions.
ACTIONS = np.array([0, 0, 0, 1, 0, 0, 0, 2])
BANDIT_REWARDS = np.array([1.0, -1.0, 1.0, 1.0, -1.0, 1.0, -1.0, -1.0], np.float32)
LR = 0.05


def _entropy(z):
    logp = jax.nn.log_softmax(z)
    return -(jnp.exp(logp) * logp).sum()


def _first_order_entropy_change(z, actions, advantages, lr):
    """-Cov_pi(log pi, z' - z) (Cui et al., arXiv 2505.22617) with the vanilla PG step on
    logits, z' - z = lr/B sum_i A_i (e_{a_i} - pi), in float64 numpy."""
    z = np.asarray(z, np.float64)
    pi = np.exp(z - z.max())
    pi /= pi.sum()
    logpi = np.log(pi)
    dz = np.zeros_like(z)
    for a, adv in zip(actions, advantages):
        dz += adv * (np.eye(len(z))[a] - pi)
    dz *= lr / len(actions)
    cov = np.sum(pi * (logpi - np.sum(pi * logpi)) * (dz - np.sum(pi * dz)))
    return -cov


def _bandit_step(
    outside, entropy_offset, selection="sign", actions=ACTIONS, rewards=BANDIT_REWARDS
):
    """One Entrocraft-filtered PPO-clip gradient step on the logits; returns (dH, predicted)."""
    z = jnp.asarray(LOGITS)
    h = float(_entropy(z))
    band = entropy_band("constant", (h + entropy_offset,) * 2, (h + entropy_offset,) * 2, 1)
    mask = np.ones((len(actions), 1), bool)
    batch = make(rewards, mask, len(actions), h)  # old_entropy = the policy's entropy
    logp_old = jax.nn.log_softmax(z)[actions][:, None]
    batch = batch.replace(old_logprobs=logp_old)
    t = entrocraft_advantages(group_advantages(len(actions)), band, outside, selection)
    batch, _, metrics = t.apply(batch, (), ctx())
    objective = ppo_clip()

    def loss(logits):
        new_logprobs = jax.nn.log_softmax(logits)[actions][:, None]
        return objective(new_logprobs, jnp.zeros_like(new_logprobs), batch)[0]

    z_new = z - LR * jax.grad(loss)(z)
    predicted = _first_order_entropy_change(LOGITS, actions, np.asarray(batch.advantages)[:, 0], LR)
    return float(_entropy(z_new)) - h, predicted, float(metrics["entrocraft/mode"])


@pytest.mark.parametrize("outside", ["estimator", "reward"])
def test_bandit_positive_only_lowers_and_negative_only_raises_entropy(outside):
    # Band below H: positive samples only; band above H: negative samples only.
    d_pos, pred_pos, mode_pos = _bandit_step(outside, -0.2)
    d_neg, pred_neg, mode_neg = _bandit_step(outside, +0.2)
    assert (mode_pos, mode_neg) == (1.0, -1.0)
    assert d_pos < 0 < d_neg
    # The realised change is the covariance law's first-order prediction, up to O(lr^2).
    np.testing.assert_allclose([d_pos, d_neg], [pred_pos, pred_neg], rtol=0.05, atol=1e-5)


# A batch where the sign rule fails: the successes are mostly the mode, one failure is the
# mode (a confident mistake), one success and one failure are rare actions. Pushing down only
# the failures then moves mass to the mode and lowers H; the covariance rule keeps the rare
# success and the confident failure (A * (log pi - mean) < 0) and raises H.
SHARP_ACTIONS = np.array([0, 0, 0, 0, 0, 0, 1, 2])
SHARP_REWARDS = np.array([1.0, 1.0, 1.0, 1.0, 1.0, -1.0, 1.0, -1.0], np.float32)


def test_bandit_covariance_selection_moves_entropy_toward_the_band_where_sign_rule_fails():
    sharp = dict(actions=SHARP_ACTIONS, rewards=SHARP_REWARDS)
    d_sign_below, _, _ = _bandit_step("estimator", +0.2, **sharp)
    d_up, pred_up, mode_up = _bandit_step("estimator", +0.2, "covariance", **sharp)
    d_down, pred_down, mode_down = _bandit_step("estimator", -0.2, "covariance", **sharp)
    assert (mode_up, mode_down) == (-1.0, 1.0)
    assert d_sign_below < 0  # the paper's negative-only branch lowers H on this batch
    assert d_down < 0 < d_up
    np.testing.assert_allclose([d_up, d_down], [pred_up, pred_down], rtol=0.05, atol=1e-5)


def test_covariance_selection_hand_case():
    # One row per token; l_bar = mean of the valid old log-probs = -1 (row 3 is masked out).
    logp = np.array([[-0.5], [-1.5], [-1.0], [-9.0]], np.float32)
    mask = np.array([[1], [1], [1], [0]], bool)
    rewards = np.array([1.0, 1.0, 0.0, 0.0], np.float32)
    batch = make(rewards, mask, 4, 0.0).replace(old_logprobs=logp)
    base, _, _ = group_advantages(4).apply(batch, (), ctx())
    a = np.asarray(base.advantages)[:, 0]  # rows 0, 1 positive; rows 2, 3 negative
    c = a * (logp[:, 0] + 1.0)  # contributions: row 0 > 0, row 1 < 0, row 2 = 0
    assert c[0] > 0 > c[1] and c[2] == 0
    for entropy, kept in ((1.0, [0]), (-1.0, [1])):  # above the band [0, 0]; below it
        band = entropy_band("constant", (0.0, 0.0), (0.0, 0.0), 1)
        t = entrocraft_advantages(group_advantages(4), band, selection="covariance")
        out, _, _ = t.apply(make(rewards, mask, 4, entropy).replace(old_logprobs=logp), (), ctx())
        expected = np.zeros(4, np.float32)
        expected[kept] = a[kept]
        np.testing.assert_allclose(np.asarray(out.advantages)[:, 0], expected, rtol=1e-6)


# ----- properties -----


@st.composite
def batches(draw):
    """B = 8, T = 3 (one shape, so eager ops compile once) with G in {2, 4, 8}, random rewards
    and masks (fully masked rows and length-1 responses included) and a random entropy."""
    g = draw(st.sampled_from([2, 4, 8]))
    b, t = 8, 3
    values = st.sampled_from([-1.0, 0.0, 0.5, 1.0])
    rewards = np.array(draw(st.lists(values, min_size=b, max_size=b)), np.float32)
    mask = np.array(draw(st.lists(st.booleans(), min_size=b * t, max_size=b * t))).reshape(b, t)
    entropy = draw(st.floats(0.0, 2.0))
    return g, rewards, mask, entropy


@settings(max_examples=25, deadline=None)
@given(
    data=batches(),
    lo=st.floats(0.0, 1.5),
    width=st.floats(0.0, 0.5),
    outside=st.sampled_from(["estimator", "reward"]),
    selection=st.sampled_from(["sign", "covariance"]),
    logp_seed=st.integers(0, 2**16),
)
def test_entrocraft_properties(data, lo, width, outside, selection, logp_seed):
    g, rewards, mask, entropy = data
    logp = -np.random.default_rng(logp_seed).exponential(1.0, mask.shape).astype(np.float32)
    band = entropy_band("constant", (lo, lo), (lo + width, lo + width), 1)
    t = entrocraft_advantages(group_advantages(g), band, outside, selection)
    out, _, metrics = t.apply(make(rewards, mask, g, entropy).replace(old_logprobs=logp), (), ctx())
    adv = np.asarray(out.advantages)
    assert adv.shape == mask.shape
    assert np.isfinite(adv).all()
    np.testing.assert_array_equal(adv[~mask], 0.0)
    mode = float(metrics["entrocraft/mode"])
    if selection == "sign":
        if mode > 0:
            assert (adv >= 0).all()
        if mode < 0:
            assert (adv <= 0).all()
    elif mode != 0:
        # The kept tokens' covariance with the old log-probs points back toward the band
        # (numpy reference of Cov(log pi, A) over the valid tokens).
        lv, av = logp[mask].astype(np.float64), adv[mask].astype(np.float64)
        cov = np.mean((lv - lv.mean()) * (av - av.mean())) if mask.any() else 0.0
        assert mode * cov >= -1e-6
    assert 0.0 <= float(metrics["entrocraft/kept_frac"]) <= 1.0


@settings(max_examples=25, deadline=None)
@given(data=batches(), target=st.floats(0.0, 2.0))
def test_entropic_properties(data, target):
    g, rewards, mask, entropy = data
    t = entropic_advantages(group_advantages(g), target)
    base, _, _ = group_advantages(g).apply(make(rewards, mask, g, entropy), (), ctx())
    out, state, _ = t.apply(make(rewards, mask, g, entropy), t.init(), ctx())
    adv = np.asarray(out.advantages)
    assert adv.shape == mask.shape
    assert np.isfinite(adv).all() and np.isfinite(float(state[0]))
    np.testing.assert_array_equal(adv[~mask], 0.0)
    # |alpha| = |H - H*| <= 2 here; with |alpha| < 1 the signs are kept.
    if abs(entropy - target) < 1:
        np.testing.assert_array_equal(np.sign(adv), np.sign(np.asarray(base.advantages)))

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.advantages.lead import (
    efficiency_rewards,
    lead_advantages,
    pooled_group_stats,
    psi_target_weights,
    target_lengths,
)
from rljax.core.batch import make_batch
from rljax.core.transform import Context

G = 4


def _batch(lengths, rewards, t=10):
    lengths = np.asarray(lengths)
    b = lengths.size
    mask = np.arange(t)[None, :] < lengths[:, None]
    return make_batch(
        np.zeros((b, 2), np.int32),
        np.ones((b, 2), bool),
        np.ones((b, t), np.int32),
        mask,
        np.repeat(np.arange(b // G), G),
        np.asarray(rewards, np.float32),
    )


def _ctx():
    return Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))


# An independent loop implementation of LEAD (spec section 9, the authors' verl code).
def _np_grpo(scores, groups):
    out = np.zeros_like(scores)
    for g in np.unique(groups):
        idx = groups == g
        s = scores[idx]
        out[idx] = (s - s.mean()) / (s.std(ddof=1) + 1e-6)
    return out


def _np_stats(scores, groups, include):
    means, variances = [], []
    for g in np.unique(groups):
        s = scores[(groups == g) & include]
        if s.size:
            means.append(s.mean())
            variances.append(s.var())
    if not means:
        return 0.0, 0.0
    means = np.asarray(means)
    return means.mean(), np.sqrt(np.mean(variances) + means.var() + 1e-8)


def _np_lead(lengths, rewards, weights, l_min, l_max, beta=0.95, w_min=0.3):
    lengths = np.asarray(lengths, np.float64)
    rewards = np.asarray(rewards, np.float64)
    groups = np.repeat(np.arange(lengths.size // G), G)
    correct = rewards >= 1.0
    lstar = np.empty_like(lengths)
    for g in np.unique(groups):
        idx = groups == g
        good = lengths[idx & correct]
        lstar[idx] = min(max(good.mean(), l_min), l_max) if good.size else l_max
    r_eff = np.maximum(-1.0, 1.0 - np.abs(lengths - lstar) / lstar)
    a_corr, a_eff = _np_grpo(rewards, groups), _np_grpo(r_eff, groups)
    mu_c, s_c = _np_stats(rewards, groups, np.ones_like(correct))
    mu_e, s_e = _np_stats(r_eff, groups, correct)
    cv = np.array([s_c / (abs(mu_c) + 1e-8), s_e / (abs(mu_e) + 1e-8)])
    cv = cv / (cv.sum() + 1e-8)
    pot = np.array([1 - min(max(mu_c, 0), 1), 1 - (min(max(mu_e, -1), 1) + 1) / 2])
    d = cv * pot
    weights = beta * np.asarray(weights) + (1 - beta) * d / (d.sum() + 1e-8)
    w_corr = max(weights[0], w_min)
    seq = w_corr * a_corr + (1 - w_corr) * a_eff
    tokens = np.repeat(seq, lengths.astype(int))  # one entry per valid token
    whitened = (seq - tokens.mean()) / np.sqrt(tokens.var(ddof=1) + 1e-8)
    return whitened, weights, lstar, w_corr


def test_target_lengths_clip_and_no_correct_case():
    lengths = jnp.asarray([2, 4, 9, 7, 2, 4, 9, 10, 3, 3, 3, 3, 5, 6, 7, 8], jnp.float32)
    correct = jnp.asarray([1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0], bool)
    got = np.asarray(target_lengths(lengths, correct, G, l_min=5.0, l_max=8.0))
    # group means of the correct lengths: 3 -> l_min, 9.5 -> l_max, none -> l_max, 6.5 inside
    np.testing.assert_allclose(got, np.repeat([5.0, 8.0, 8.0, 6.5], G))


def test_target_lengths_rejects_bad_bounds():
    with pytest.raises(ValueError, match="l_min"):
        target_lengths(jnp.ones(4), jnp.ones(4, bool), G, l_min=9.0, l_max=8.0)


def test_efficiency_reward_is_one_at_target_and_floored():
    lengths = jnp.asarray([7.0, 3.0, 14.0, 21.0, 40.0, 0.0])
    targets = jnp.full(6, 7.0)
    got = np.asarray(efficiency_rewards(lengths, targets, jnp.ones(6, bool)))
    assert got[0] == 1.0  # exactly at l = L*
    np.testing.assert_allclose(got[1:], [1 - 4 / 7, 0.0, -1.0, -1.0, 0.0], atol=1e-6)


def test_efficiency_reward_asymmetric_mode():
    lengths = jnp.asarray([2.0, 5.0, 12.0, 5.0, 12.0, 30.0])
    targets = jnp.full(6, 10.0)
    correct = jnp.asarray([1, 1, 1, 0, 0, 0], bool)
    got = efficiency_rewards(lengths, targets, correct, "max_asym", asym_min_length=3.0)
    # correct: too short -> 0, max(0, 1 - l/L*); incorrect: clip(1 - l/L*, -1, 0)
    np.testing.assert_allclose(got, [0.0, 0.5, 0.0, 0.0, -0.2, -1.0], atol=1e-6)
    with pytest.raises(ValueError, match="mode"):
        efficiency_rewards(lengths, targets, correct, "upper_only")


def test_pooled_group_stats_law_of_total_variance():
    scores = jnp.asarray([1.0, 0.0, 1.0, 1.0, 0.2, 0.6, 0.0, 0.9])
    mu, sigma = pooled_group_stats(scores, jnp.ones(8, bool), 2)
    means = np.array([0.5, 1.0, 0.4, 0.45])
    variances = np.array([0.25, 0.0, 0.04, 0.2025])
    assert np.isclose(mu, means.mean())
    assert np.isclose(sigma, np.sqrt(variances.mean() + means.var() + 1e-8))
    # only included samples count; a group with none is skipped; no group at all -> (0, 0)
    include = jnp.asarray([1, 0, 0, 0, 1, 1, 0, 0], bool)
    mu, sigma = pooled_group_stats(scores, include, 2)
    assert np.isclose(mu, (1.0 + 0.4) / 2)
    assert np.isclose(sigma, np.sqrt(0.02 + 0.09 + 1e-8))
    mu, sigma = pooled_group_stats(scores, jnp.zeros(8, bool), 2)
    assert float(mu) == 0.0 and float(sigma) == 0.0


def test_psi_target_weights_hand_case():
    # cv = (1, 0.5) -> (2/3, 1/3); potentials (0.5, 0.25); D = (1/3, 1/12) -> (0.8, 0.2)
    got = psi_target_weights(0.5, 0.5, 0.5, 0.25)
    np.testing.assert_allclose(got, [0.8, 0.2], atol=1e-6)


def test_weights_obey_floor_and_sum_to_one():
    # Every sample correct: mu_corr = 1 leaves correctness no potential, target w_corr = 0.
    lengths = [2, 4, 6, 8, 3, 3, 5, 9]
    t = lead_advantages(G, l_min=2.0, l_max=8.0)
    apply = jax.jit(t.apply)
    state = jnp.asarray([0.0, 1.0], jnp.float32)
    _, new_state, m = apply(_batch(lengths, np.ones(8)), state, _ctx())
    assert float(m["lead/target_w_corr"]) < 1e-6
    assert float(new_state[0]) < 0.3  # the stored EMA falls below the floor ...
    assert float(m["lead/w_corr"]) == pytest.approx(0.3)  # ... the weight used does not
    assert float(m["lead/w_corr"] + m["lead/w_eff"]) == pytest.approx(1.0)
    # Above the floor the EMA weight is used as it is.
    _, _, m = apply(_batch(lengths, [1, 0, 1, 0, 0, 1, 1, 0]), t.init(), _ctx())
    assert float(m["lead/w_corr"]) > 0.3
    assert float(m["lead/w_corr"] + m["lead/w_eff"]) == pytest.approx(1.0)


def test_ema_over_three_steps_and_advantages_match_numpy():
    rng = np.random.default_rng(0)
    t = lead_advantages(G, l_min=3.0, l_max=8.0)
    apply = jax.jit(t.apply)
    state, weights = t.init(), np.array([0.5, 0.5])
    for step in range(3):
        lengths = rng.integers(1, 11, size=12)
        rewards = rng.integers(0, 2, size=12).astype(np.float32)
        if step == 1:
            rewards[8:] = 0.0  # a group with no correct rollout: L* = l_max
        batch = _batch(lengths, rewards)
        out, state, m = apply(batch, state, _ctx())
        want, weights, lstar, w_corr = _np_lead(lengths, rewards, weights, 3.0, 8.0)
        np.testing.assert_allclose(np.asarray(state), weights, rtol=1e-5, atol=1e-6)
        assert float(m["lead/w_corr"]) == pytest.approx(w_corr, rel=1e-5)
        assert float(m["lead/target_len_mean"]) == pytest.approx(lstar[::G].mean(), rel=1e-6)
        mask = np.asarray(batch.completion_mask)
        np.testing.assert_allclose(
            np.asarray(out.advantages), np.where(mask, want[:, None], 0.0), rtol=1e-4, atol=1e-5
        )
    assert not np.allclose(weights, 0.5)  # the state did move


def test_lead_advantages_rejects_bad_settings():
    with pytest.raises(ValueError, match="group_size"):
        lead_advantages(1)
    with pytest.raises(ValueError, match="beta"):
        lead_advantages(G, beta=1.0)
    with pytest.raises(ValueError, match="w_min"):
        lead_advantages(G, w_min=1.5)
    with pytest.raises(ValueError, match="mode"):
        lead_advantages(G, mode="sym")

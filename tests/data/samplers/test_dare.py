"""DARE: SNIS estimates, ESS fallback, Beta-peaked sampling, tiers, exact resume."""

import numpy as np
import pytest

from rljax.data.samplers.dare import (
    DARESelector,
    DARESettings,
    rollout_tiers,
    selection_logits,
    selection_probs,
    snis_success,
)


def _copy(state):
    return {k: np.array(v, copy=True) for k, v in state.items()}


def test_snis_matches_per_prompt_reference():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 4, size=40)
    ids[ids == 3] = 0  # prompt 3 has no records
    log_r = rng.normal(0, 3, size=40)
    rewards = rng.choice([0.0, 1.0, -1.0], size=40)
    rates, ess = snis_success(ids, log_r, rewards, 5, clip=2.0, ess_threshold=2.0)
    for q in range(5):
        sel = ids == q
        if not sel.any():
            assert rates[q] == 0.5 and ess[q] == 0.0
            continue
        w = np.exp(np.clip(log_r[sel], -2.0, 2.0))
        hit = (rewards[sel] > 0).astype(float)
        ref_ess = w.sum() ** 2 / (w**2).sum()
        ref = hit.mean() if ref_ess < 2 else min(max((w * hit).sum() / w.sum(), 0.0), 1.0)
        np.testing.assert_allclose(ess[q], ref_ess, rtol=1e-12)
        np.testing.assert_allclose(rates[q], ref, rtol=1e-12)


def test_snis_hand_case_and_ess_fallback():
    # Prompt 0: weights e^1 and e^0 (no clipping at C = 5), rewards 1 and 0.
    rates, ess = snis_success([0, 0], [1.0, 0.0], [1.0, 0.0], 1, clip=5.0, ess_threshold=1.0)
    e = np.e
    np.testing.assert_allclose(rates[0], e / (e + 1))
    np.testing.assert_allclose(ess[0], (e + 1) ** 2 / (e**2 + 1))
    # Same records but ESS (about 1.6) < 2: the raw mean 0.5 is used.
    rates, _ = snis_success([0, 0], [1.0, 0.0], [1.0, 0.0], 1, clip=5.0, ess_threshold=2.0)
    assert rates[0] == 0.5
    # Clipping: log w = 100 and 0 at C = 1 give weights e and 1.
    rates, _ = snis_success([0, 0], [100.0, 0.0], [1.0, 0.0], 1, clip=1.0, ess_threshold=1.0)
    np.testing.assert_allclose(rates[0], e / (e + 1))


def test_logits_peak_at_half_and_formula():
    x = np.linspace(0.0, 1.0, 101)
    logits = selection_logits(x, kappa=20.0, eps=1e-6)
    assert np.argmax(logits) == 50
    np.testing.assert_allclose(logits[30], 10 * np.log(0.3) + 10 * np.log(0.7))
    assert np.isfinite(logits).all()  # x = 0 and 1 are clipped away from log 0


def test_first_pick_frequencies_match_softmax():
    rates = np.array([0.1, 0.3, 0.5, 0.7, 0.95])
    settings = DARESettings(kappa=2.0)
    sel = DARESelector(settings, num_prompts=5, seed=3)
    p = selection_probs(rates, settings.kappa)
    n = 8000
    first = np.array([sel.select(step, 2, rates)[0] for step in range(n)])
    counts = np.bincount(first, minlength=5)
    chi2 = ((counts - n * p) ** 2 / (n * p)).sum()
    assert chi2 < 18.47  # chi-square, 4 dof, p = 0.001
    picks = [sel.select(s, 3, rates) for s in range(50)]
    assert all(len(set(x.tolist())) == 3 for x in picks)  # without replacement


def test_tiers():
    rates = np.array([0.95, 0.71, 0.7, 0.5, 0.2, 0.19, 0.0])  # failure 0.05 .. 1.0
    np.testing.assert_array_equal(rollout_tiers(rates), [4, 4, 8, 8, 8, 16, 16])
    sel = DARESelector(DARESettings(), 7, seed=0)
    np.testing.assert_array_equal(sel.rollouts([6, 0], rates), [16, 4])


def test_fifo_capacity_and_estimate_uses_current_sums():
    sel = DARESelector(DARESettings(capacity=3, ess_threshold=1.0), 2, seed=0)
    sel.add([0, 0], [-5.0, -5.0], [1.0, 0.0])
    sel.add([1, 0], [-1.0, -2.0], [1.0, 1.0])
    rec = sel.records()
    np.testing.assert_array_equal(rec["prompt_id"], [0, 1, 0])  # the oldest dropped
    # Current sums equal to behaviour sums: weights 1, so the plain mean.
    rates = sel.estimate(rec["behaviour_logprob_sum"])
    np.testing.assert_allclose(rates, [0.5, 1.0])
    with pytest.raises(ValueError, match="records"):
        sel.estimate([0.0])


def test_resume_is_exact():
    def run(sel, steps):
        out = []
        for step in steps:
            cur = -np.arange(len(sel), dtype=float) * 0.1
            rates = sel.estimate(cur) if len(sel) else np.full(10, 0.5)
            ids = sel.select(step, 3, rates)
            out.append(ids)
            g = sel.rollouts(ids, rates)
            pid = np.repeat(ids, g)
            sel.add(pid, -np.ones(len(pid)), (pid * 7 + step) % 3 == 0)
        return out

    settings = DARESettings(capacity=40)
    straight = DARESelector(settings, 10, seed=5)
    run(straight, range(6))
    saved = _copy(straight.state())
    a = run(straight, range(6, 12))
    resumed = DARESelector(settings, 10, seed=5)
    resumed.load(saved)
    b = run(resumed, range(6, 12))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    empty = DARESelector(settings, 10, seed=5)
    assert empty.state() == {}
    empty.load({})
    assert len(empty) == 0

"""Accuracy-gated curriculum: level probabilities, EMA gating, sampling, exact resume."""

import numpy as np
import pytest

from rljax.data.samplers.curriculum import AccuracyCurriculum, CurriculumSettings, level_probs

LEVELS = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2])


def test_level_probs_hand_values():
    np.testing.assert_allclose(level_probs(0, 3, 0.2), [1.0, 0.0, 0.0])
    np.testing.assert_allclose(level_probs(1, 3, 0.2), [0.2, 0.8, 0.0])
    np.testing.assert_allclose(level_probs(2, 3, 0.2), [0.1, 0.1, 0.8])


def test_ema_gates_the_frontier():
    s = CurriculumSettings(threshold=0.7, decay=0.5, review=0.2, min_updates=2)
    cur = AccuracyCurriculum(s, LEVELS, seed=0)
    cur.update([0, 1], [1.0, 1.0])  # ema0 = 0.5; one update: no advance
    assert cur.frontier == 0 and cur.ema[0] == 0.5
    cur.update([2], [0.8])  # ema0 = 0.25 + 0.4 = 0.65 < 0.7
    np.testing.assert_allclose(cur.ema[0], 0.65)
    assert cur.frontier == 0
    cur.update([0], [1.0])  # ema0 = 0.825 >= 0.7 after 3 updates
    np.testing.assert_allclose(cur.ema[0], 0.825)
    assert cur.frontier == 1
    np.testing.assert_allclose(cur.probs(), [0.2, 0.8, 0.0])
    # Two levels in one batch: each gets one EMA step with its own mean.
    cur.update([0, 3, 4], [0.0, 1.0, 0.5])
    np.testing.assert_allclose(cur.ema[:2], [0.4125, 0.375])
    assert cur.frontier == 1  # level 1 has 1 update < min_updates


def test_min_updates_blocks_early_advance():
    s = CurriculumSettings(threshold=0.5, decay=0.0, review=0.0, min_updates=3)
    cur = AccuracyCurriculum(s, LEVELS, seed=0)
    cur.update([0], [1.0])
    cur.update([0], [1.0])
    assert cur.frontier == 0
    cur.update([0], [1.0])
    assert cur.frontier == 1


def test_sampling_follows_level_probs():
    s = CurriculumSettings(review=0.3)
    cur = AccuracyCurriculum(s, LEVELS, seed=1)
    cur.load({"frontier": 2, "ema": np.zeros(3), "updates": np.zeros(3, int)})
    ids = np.concatenate([cur.select(step, 100) for step in range(60)])
    freq = np.bincount(LEVELS[ids], minlength=3) / len(ids)
    np.testing.assert_allclose(freq, [0.15, 0.15, 0.7], atol=0.02)
    # Uniform within a level: level 2 has four prompts.
    within = np.bincount(ids[LEVELS[ids] == 2], minlength=9)[5:] / (LEVELS[ids] == 2).sum()
    np.testing.assert_allclose(within, 0.25, atol=0.02)
    fresh = AccuracyCurriculum(s, LEVELS, seed=1)
    assert set(LEVELS[fresh.select(0, 50)].tolist()) == {0}  # frontier 0: easy only


def test_resume_is_exact_and_errors():
    def run(cur, steps):
        out = []
        for step in steps:
            ids = cur.select(step, 6)
            out.append(ids)
            cur.update(ids, (ids % 3 != 2).astype(float) * 0.9)
        return out

    s = CurriculumSettings(threshold=0.5, decay=0.6, min_updates=2)
    straight = AccuracyCurriculum(s, LEVELS, seed=3)
    run(straight, range(4))
    saved = straight.state()
    a = run(straight, range(4, 12))
    resumed = AccuracyCurriculum(s, LEVELS, seed=3)
    resumed.load(saved)
    b = run(resumed, range(4, 12))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert straight.frontier == resumed.frontier
    with pytest.raises(ValueError, match="no prompts"):
        AccuracyCurriculum(s, [0, 2], seed=0)
    with pytest.raises(ValueError, match="levels"):
        resumed.load({"frontier": 0, "ema": np.zeros(2), "updates": np.zeros(2)})

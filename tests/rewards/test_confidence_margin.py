import numpy as np
import pytest

from rljax.rewards.confidence_margin import confidence_margin, confidence_margin_rewards

CONF = np.array([[0.2, 0.4, 0.9, 0.7], [0.5, 0.6, 0.7, 0.8], [0.1, 0.2, 0.3, 0.4]])
STEPS = np.array([[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]], bool)


def test_margin_hand_case_and_undefined_rows():
    margin, defined = confidence_margin(CONF, STEPS)
    # row 0: mean(0.9, 0.7) - mean(0.2, 0.4) = 0.5; all-correct and all-wrong rows: undefined
    np.testing.assert_allclose(margin, [0.5, 0.0, 0.0])
    np.testing.assert_array_equal(defined, [True, False, False])


def test_margin_respects_the_mask():
    mask = np.array([[1, 0, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]], bool)
    margin, defined = confidence_margin(CONF, STEPS, mask)
    np.testing.assert_allclose(margin, [0.9 - 0.2, 0.0, 0.0])
    # masking away the only wrong budget leaves nothing to rank against
    mask = np.array([[0, 1, 1, 1]], bool)
    margin, defined = confidence_margin(CONF[:1], np.array([[0, 1, 1, 1]], bool), mask)
    assert margin[0] == 0.0 and not defined[0]
    margin, _ = confidence_margin(CONF[:1], np.array([[0, 1, 1, 1]], bool))
    assert margin[0] == pytest.approx((0.4 + 0.9 + 0.7) / 3 - 0.2)


def test_reward_hand_cases():
    r = confidence_margin_rewards(np.array([1, 1, 0]), CONF, STEPS, margin_coef=0.5)
    # correct + 0.5 * 0.5; all-correct / all-wrong trajectories: no margin term
    np.testing.assert_allclose(r, [1.25, 1.0, 0.0])
    r = confidence_margin_rewards(np.array([0]), CONF[:1], STEPS[:1], margin_clip=0.2)
    assert r[0] == pytest.approx(0.5 * 0.2)
    r = confidence_margin_rewards(np.array([True]), CONF[:1], ~STEPS[:1], correct_reward=2.0)
    assert r[0] == pytest.approx(2.0 - 0.5 * 0.5)  # confident where wrong: negative margin


def test_widening_the_margin_raises_the_reward():
    rng = np.random.default_rng(0)
    steps = rng.integers(0, 2, size=(64, 6)).astype(bool)
    steps[:, 0], steps[:, 1] = True, False  # every row has both kinds
    conf = rng.uniform(0.2, 0.8, size=(64, 6))
    final = rng.integers(0, 2, size=64)
    wider = np.clip(conf + np.where(steps, 0.1, -0.1), 0.0, 1.0)
    base = confidence_margin_rewards(final, conf, steps)
    assert (confidence_margin_rewards(final, wider, steps) > base).all()
    # shifting every confidence by the same amount leaves the margin unchanged
    shifted = confidence_margin_rewards(final, conf + 0.1, steps)
    np.testing.assert_allclose(shifted, base)


def test_rejects_bad_input():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        confidence_margin(np.array([[1.2, 0.5]]), np.array([[1, 0]]))
    with pytest.raises(ValueError, match="step_correct"):
        confidence_margin(CONF, STEPS[:, :3])
    with pytest.raises(ValueError, match="margin_coef"):
        confidence_margin_rewards(np.ones(3), CONF, STEPS, margin_coef=-1.0)
    with pytest.raises(ValueError, match="final_correct"):
        confidence_margin_rewards(np.ones(2), CONF, STEPS)

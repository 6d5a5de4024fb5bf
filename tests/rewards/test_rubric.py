"""Rubric rewards on hand-computed cases; judge failures are contained and counted."""

import logging

import numpy as np
import pytest

from rljax.rewards.rubric import (
    RUBRIC_FAILURE_KINDS,
    RubricItem,
    keyword_judge,
    rubric_reward,
    rubric_rewards,
)

RUBRIC = [
    RubricItem('names "photosynthesis"', 2.0),
    RubricItem('mentions "light" and "chlorophyll"', 1.0),
    RubricItem('claims "animals" do it', -1.0),  # a pitfall
    RubricItem('says "thanks"', 0.0),  # scored, not counted
]


def test_keyword_judge():
    assert keyword_judge("q", "Light hits CHLOROPHYLL", 'has "light" and "chlorophyll"') == 1.0
    assert keyword_judge("q", "light only", 'has "light" and "chlorophyll"') == 0.5
    with pytest.raises(ValueError, match="quotes no term"):
        keyword_judge("q", "r", "no quoted terms")


@pytest.mark.parametrize(
    "response,reward,scores",
    [
        # (2 * 1 + 1 * 1) / (2 + 1) = 1
        ("Photosynthesis uses light and chlorophyll.", 1.0, [1, 1, 0, 0]),
        # (2 * 1 + 1 * 0.5 - 1 * 1) / 3 = 0.5
        ("Photosynthesis needs light; animals do it too. Thanks", 0.5, [1, 0.5, 1, 1]),
        # (0 + 0 - 1) / 3
        ("animals", -1 / 3, [0, 0, 1, 0]),
    ],
)
def test_hand_computed(response, reward, scores):
    got, vector, failures = rubric_reward(keyword_judge, "How do plants eat?", response, RUBRIC)
    assert got == pytest.approx(reward)
    np.testing.assert_allclose(vector, scores)
    assert failures == dict.fromkeys(RUBRIC_FAILURE_KINDS, 0)


def test_judge_failures_score_zero_and_are_counted(caplog):
    def judge(question, response, item_text):
        if item_text == "e":
            return 1 / 0
        return {"a": 1.0, "b": 1.5, "c": None, "d": float("nan")}[item_text]

    rubric = [RubricItem(t, 1.0) for t in "abcde"]
    with caplog.at_level(logging.WARNING, logger="rljax.rewards.rubric"):
        rewards, scores, failures = rubric_rewards(judge, ["q"] * 2, ["r1", "r2"], [rubric] * 2)
    np.testing.assert_allclose(scores, [[1, 0, 0, 0, 0]] * 2)
    np.testing.assert_allclose(rewards, [0.2, 0.2])
    assert failures == {
        "exception": 2,
        "wrong_type": 2,
        "non_finite": 2,
        "timeout": 0,
        "exit": 0,
        "out_of_range": 2,
    }
    assert len(caplog.records) == 4  # one warning per kind
    assert any("ZeroDivisionError" in r.getMessage() for r in caplog.records)


def test_bad_rubrics_raise():
    with pytest.raises(ValueError, match="at least one positive"):
        rubric_reward(keyword_judge, "q", "r", [RubricItem('"x"', -1.0)])
    with pytest.raises(ValueError, match="pad the shorter"):
        rubric_rewards(keyword_judge, ["q", "q"], ["r", "r"], [RUBRIC, RUBRIC[:2]])
    with pytest.raises(ValueError, match="2 questions, 1 responses"):
        rubric_rewards(keyword_judge, ["q", "q"], ["r"], [RUBRIC])

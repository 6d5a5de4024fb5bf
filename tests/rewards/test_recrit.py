import numpy as np
import pytest

from rljax.rewards.recrit import (
    QUADRANTS,
    TransitionWeights,
    quadrant_counts,
    recrit_rewards,
    transition_quadrants,
)

# initial -> after criticism: wrong->right, right->wrong, right->right, wrong->wrong
TWO_TURN = np.array([[0, 1], [1, 0], [1, 1], [0, 0]], bool)


def test_two_turn_quadrants_and_default_rewards():
    names = [QUADRANTS[q] for q in transition_quadrants(TWO_TURN)[:, 0]]
    assert names == ["correction", "sycophancy", "robustness", "boundary"]
    # the authors' weights: +1 correction, -1 sycophancy, +0.6 robustness, -0.1 boundary
    np.testing.assert_allclose(recrit_rewards(TWO_TURN), [1.0, -1.0, 0.6, -0.1])


def test_reward_ordering_of_the_quadrants():
    r = recrit_rewards(TWO_TURN)
    correction, sycophancy, robustness, boundary = r
    assert correction > robustness > 0 > boundary > sycophancy
    assert abs(boundary) < abs(sycophancy)  # persistent errors are a weak signal


def test_custom_weights():
    w = TransitionWeights(correction=2.0, robustness=0.5, sycophancy=3.0, boundary=0.0)
    np.testing.assert_allclose(recrit_rewards(TWO_TURN.astype(int), w), [2.0, -3.0, 0.5, 0.0])


def test_multi_turn_reward_is_the_mean_over_turn_pairs():
    # right -> wrong -> right: sycophancy then correction; wrong x3: two boundaries
    c = np.array([[1, 0, 1], [0, 0, 0], [1, 1, 0]], bool)
    np.testing.assert_allclose(recrit_rewards(c), [0.0, -0.1, (0.6 - 1.0) / 2])


def test_quadrant_counts():
    c = np.array([[0, 1], [0, 1], [1, 1], [1, 0], [0, 1]], bool)
    assert quadrant_counts(c) == {"boundary": 0, "correction": 3, "sycophancy": 1, "robustness": 1}
    counts = quadrant_counts(np.array([[1, 0, 0], [1, 1, 1]], bool))
    assert counts == {"boundary": 1, "correction": 0, "sycophancy": 1, "robustness": 2}


def test_rejects_bad_input():
    with pytest.raises(ValueError, match="N >= 2"):
        recrit_rewards(np.ones((3, 1), bool))
    with pytest.raises(ValueError, match="0/1"):
        recrit_rewards(np.array([[0.5, 1.0]]))
    with pytest.raises(ValueError, match="sycophancy"):
        TransitionWeights(sycophancy=-1.0)

"""CRPS and its leave-one-out credit against brute-force references (spec section 12)."""

import numpy as np
import pytest

from rljax.rewards.crps import crps, crps_credit, group_crps_rewards


def _crps_by_integral(x: np.ndarray, y: float) -> float:
    """Integral of (F_N(t) - 1{t >= y})^2 dt on a fine midpoint grid (the CRPS definition)."""
    lo, hi = min(x.min(), y) - 1.0, max(x.max(), y) + 1.0
    h = 1e-4
    t = np.arange(lo, hi, h) + h / 2
    cdf = (x[None, :] <= t[:, None]).mean(axis=1)
    return float(((cdf - (t >= y)) ** 2).sum() * h)


def _fair_crps_by_pairs(x: np.ndarray, y: float) -> float:
    """E|X - y| - (1/2) E|X - X'| over ordered pairs of distinct samples, written as loops."""
    n = len(x)
    pairs = [abs(x[i] - x[j]) for i in range(n) for j in range(n) if i != j]
    return float(np.mean(np.abs(x - y)) - 0.5 * np.mean(pairs))


def test_single_point_is_absolute_error():
    assert crps(np.array([3.0]), 5.5) == pytest.approx(2.5)
    assert crps(np.array([3.0]), 5.5, fair=True) == pytest.approx(2.5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_crps_matches_the_integral_definition(seed):
    rng = np.random.default_rng(seed)
    x = np.round(rng.normal(size=7), 3)
    y = float(rng.normal())
    assert crps(x, y) == pytest.approx(_crps_by_integral(x, y), abs=2e-3)
    assert crps(x, y) >= 0.0


def test_fair_crps_formula():
    x = np.array([1.0, 4.0, 4.0, -2.0])
    assert crps(x, 2.0, fair=True) == pytest.approx(_fair_crps_by_pairs(x, 2.0))
    # hand value: mean|x - y| = 9/4, sum_{i,j}|x_i - x_j| = 42, 42 / (2 * 4 * 3) = 7/4
    assert crps(x, 2.0, fair=True) == pytest.approx(0.5)
    assert crps(x, 2.0) == pytest.approx(9 / 4 - 42 / 32)


def test_crps_rejects_empty():
    with pytest.raises(ValueError, match="non-empty 1-D"):
        crps(np.array([]), 1.0)


@pytest.mark.parametrize("fair", [False, True])
def test_credit_is_leave_one_out_crps(fair):
    values = [1.0, None, 4.0, 2.5, 10.0]
    got = crps_credit(values, 3.0, penalty=-7.0, fair=fair)
    x = np.array([1.0, 4.0, 2.5, 10.0])
    full = crps(x, 3.0, fair=fair)
    want = [crps(np.delete(x, k), 3.0, fair=fair) - full for k in range(4)]
    np.testing.assert_allclose(got[[0, 2, 3, 4]], want, rtol=1e-12)
    assert got[1] == -7.0


def test_sample_near_the_answer_gets_positive_credit():
    r = crps_credit([0.0, 10.0, 5.1, 9.0], 5.0)
    assert r[2] > 0 and r[2] == r.max()


def test_duplicate_in_collapsed_set_gets_less_than_in_spread_set():
    y = 5.0
    collapsed = crps_credit([2.0, 2.0, 2.0, 2.0], y)
    spread = crps_credit([2.0, 4.0, 6.0, 8.0], y)
    assert collapsed[0] < spread[0]


def test_degenerate_groups():
    np.testing.assert_array_equal(crps_credit([None, None], 1.0, penalty=-2.0), [-2.0, -2.0])
    np.testing.assert_array_equal(crps_credit([None, 3.0, float("inf")], 1.0), [-1.0, 0.0, -1.0])


def test_group_rewards_match_per_group_credit():
    completions = ["\\boxed{4}", "I think 6", "no idea", "it is 5", "7", "\\boxed{x}"]
    answers = ["5"] * 3 + ["\\frac{14}{2}"] * 3
    got = group_crps_rewards(completions, answers, group_size=3, penalty=-3.0, fair=True)
    want = np.concatenate(
        [
            crps_credit([4.0, 6.0, None], 5.0, penalty=-3.0, fair=True),
            crps_credit([5.0, 7.0, None], 7.0, penalty=-3.0, fair=True),
        ]
    )
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_group_rewards_reject_bad_layout():
    with pytest.raises(ValueError, match="does not divide batch 3"):
        group_crps_rewards(["1", "2", "3"], ["1"] * 3, group_size=2)
    with pytest.raises(ValueError, match="group 0 has different answers"):
        group_crps_rewards(["1", "2"], ["1", "2"], group_size=2)
    with pytest.raises(ValueError, match="is not a number"):
        group_crps_rewards(["1", "2"], ["x", "x"], group_size=2)

"""GaussianMixtureTask: targets follow the stated mixture, prompt/answer agree, reward formula."""

import json
import math
import re

import numpy as np
import pytest

from rljax.data.tasks import GaussianMixtureTask, Task, get_task

_COMPONENT = re.compile(
    r"with probability (\d\.\d\d), a normal distribution with mean (-?\d+\.\d\d) and "
    r"standard deviation (\d+\.\d\d)"
)


def _mixture_cdf(y, weights, means, stds):
    return sum(
        w * 0.5 * (1 + math.erf((y - m) / (s * math.sqrt(2))))
        for w, m, s in zip(weights, means, stds)
    )


def test_is_a_task_and_registered():
    task = get_task("gaussian_mixture", num_components=3, seed=1)
    assert isinstance(task, Task)
    assert task == GaussianMixtureTask(num_components=3, seed=1)


def test_prompt_states_the_answer_mixture():
    task = GaussianMixtureTask(num_components=4, mean_range=5.0, min_std=0.2, max_std=1.0)
    for i in range(50):
        ex = task.example(i, "train")
        weights, means, stds = task.mixture(ex["answer"])
        stated = np.array(_COMPONENT.findall(ex["prompt"]), dtype=float)
        assert stated.shape == (4, 3)
        np.testing.assert_allclose(stated, np.stack([weights, means, stds], axis=1))
        assert math.isclose(weights.sum(), 1.0) and weights.min() >= 0.01
        assert np.abs(means).max() <= 5.0 and 0.195 <= stds.min() and stds.max() <= 1.005
    single = GaussianMixtureTask(num_components=1).example(0, "train")["prompt"]
    assert "mixture of 1 normal distribution:" in single


def test_targets_follow_the_mixture():
    """Standardised targets have mean 0 and variance 1 (analytic mixture moments), and the
    probability integral transform F(y) of each target under its own mixture is uniform."""
    task = GaussianMixtureTask(num_components=3, seed=4)
    z, pit = [], []
    for i in range(1000):
        answer = task.example(i, "train")["answer"]
        w, m, s = task.mixture(answer)
        y = task.target(answer)
        mean = float(w @ m)
        var = float(w @ (s**2 + m**2)) - mean**2
        z.append((y - mean) / math.sqrt(var))
        pit.append(_mixture_cdf(y, w, m, s))
    z, pit = np.array(z), np.array(pit)
    assert abs(z.mean()) < 0.13  # standard error 1/sqrt(1000) ~ 0.032
    assert abs(z.var() - 1.0) < 0.2
    assert abs(pit.mean() - 0.5) < 0.04  # standard error ~ 0.009
    counts = np.histogram(pit, bins=10, range=(0.0, 1.0))[0]
    assert counts.min() > 60 and counts.max() < 140  # 100 expected per decile, sd ~ 9.5


def test_reward_is_exp_of_absolute_error():
    answer = json.dumps(dict(weights=[1.0], means=[0.0], stds=[1.0], y=2.5))
    task = GaussianMixtureTask()
    assert task.reward("I guess 2.5", answer) == 1.0
    assert math.isclose(task.reward("about 1 or so: 3", answer), math.exp(-0.5))
    assert math.isclose(task.reward("-1.5", answer), math.exp(-4.0))
    wide = GaussianMixtureTask(reward_scale=2.0)
    assert math.isclose(wide.reward("3", answer), math.exp(-0.25))
    assert task.reward("no idea", answer) == 0.0
    assert task.target(answer) == 2.5 and task.sft_target(answer) == "2.50"
    ex = task.example(0, "train")
    assert task.reward(task.sft_target(ex["answer"]), ex["answer"]) > math.exp(-0.01)


def test_deterministic_and_splits_disjoint():
    task = GaussianMixtureTask()
    assert task.example(2, "test") == GaussianMixtureTask().example(2, "test")
    first = [task.example(i, "train")["answer"] for i in range(5)]
    assert first != [GaussianMixtureTask(seed=1).example(i, "train")["answer"] for i in range(5)]
    train = {task.example(i, "train")["prompt"] for i in range(300)}
    test = {task.example(i, "test")["prompt"] for i in range(50)}
    assert all(task.in_test_split(p) for p in test)
    assert not any(task.in_test_split(p) for p in train)
    assert len(test) == 50 and not train & test
    assert task.split_size("train") is None and task.split_size("test") == 500
    with pytest.raises(ValueError, match="split='val'"):
        task.example(0, "val")


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_components=0),
        dict(num_components=11),
        dict(mean_range=0.0),
        dict(min_std=0.0),
        dict(min_std=2.0, max_std=1.0),
        dict(reward_scale=0.0),
        dict(test_fraction=0.0),
        dict(seed=-1),
        dict(test_size=0),
    ],
)
def test_bad_config_raises(kwargs):
    with pytest.raises(ValueError):
        GaussianMixtureTask(**kwargs)


def test_crps_mode_scores_a_group_by_leave_one_out_credit():
    # X = {1, 2}, y = 1.5: CRPS(X) = mean|x - y| - mean|x_i - x_j| / 2 = 0.5 - 0.25 = 0.25;
    # without either sample CRPS = 0.5, so each gets credit 0.25; no number gets the penalty.
    task = GaussianMixtureTask(reward_mode="crps", crps_penalty=-2.0)
    answer = json.dumps({"weights": [1.0], "means": [0.0], "stds": [1.0], "y": 1.5})
    got = task.group_rewards(["Y = 1", "2", "no idea"], answer)
    np.testing.assert_allclose(got, [0.25, 0.25, -2.0])
    distance = GaussianMixtureTask(reward_scale=2.0).group_rewards(["1", "x"], answer)
    np.testing.assert_allclose(distance, [np.exp(-0.25), 0.0])
    with pytest.raises(ValueError, match="reward_mode='mse'"):
        GaussianMixtureTask(reward_mode="mse")

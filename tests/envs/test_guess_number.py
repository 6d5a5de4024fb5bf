"""GuessNumber: binary search wins in the hand-computed number of turns, feedback, integer
parsing, and reproducible task generation."""

import re

import numpy as np
import pytest

from rljax.envs import GuessNumber, Step, guess_number_tasks, run_episode
from rljax.envs.guess_number import GuessNumberTask, guess_number_expert


class BinarySearch:
    """A scripted policy: bisects [low, high] using the feedback to its previous guess."""

    def __init__(self, low: int, high: int):
        self.low, self.high, self.guess = low, high, None

    def __call__(self, observations: list[str]) -> str:
        if observations[-1] == "higher":
            self.low = self.guess + 1
        elif observations[-1] == "lower":
            self.high = self.guess - 1
        self.guess = (self.low + self.high) // 2
        return f"My guess is {self.guess}"


@pytest.mark.parametrize(
    "secret, guesses",
    [
        # [1,100]: 50 lower -> [1,49]: 25 higher -> [26,49]: 37 correct.
        (37, [50, 25, 37]),
        # [1,100]: 50, 25, 12, 6, 3 all lower -> [1,2]: 1 correct.
        (1, [50, 25, 12, 6, 3, 1]),
        (50, [50]),
    ],
)
def test_binary_search_wins_in_hand_computed_turns(secret, guesses):
    task = {"secret": secret, "low": 1, "high": 100}
    result = run_episode(GuessNumber, task, BinarySearch(1, 100), max_turns=10, time_limit_s=5)
    assert result.failure is None and result.total_reward == 1.0
    assert [step.info["guess"] for _, step in result.turns] == guesses
    assert [step.reward for _, step in result.turns] == [0.0] * (len(guesses) - 1) + [1.0]
    assert result.turns[-1][1].observation == "correct" and result.turns[-1][1].done


def test_binary_search_wins_every_secret_within_log2_turns():
    for task in guess_number_tasks(50, low=0, high=99, seed=3):
        result = run_episode(GuessNumber, task, BinarySearch(0, 99), max_turns=7, time_limit_s=5)
        assert result.failure is None and result.total_reward == 1.0  # ceil(log2(101)) = 7


def test_feedback_and_last_integer_is_the_guess():
    env = GuessNumber()
    assert env.reset({"secret": 7, "low": 0, "high": 10}) == "Guess an integer from 0 to 10."
    assert env.step("not 9 but 3") == ("higher", 0.0, False, {"guess": 3})
    assert env.step("9") == ("lower", 0.0, False, {"guess": 9})
    assert env.step("no idea") == ("no number found", 0.0, False, {})
    assert env.step("it is 7.") == ("correct", 1.0, True, {"guess": 7})
    with pytest.raises(RuntimeError, match="reset"):
        env.step("7")


def test_no_number_counts_as_a_turn():
    task = {"secret": 5, "low": 0, "high": 9}
    result = run_episode(GuessNumber, task, lambda obs: "hmm", max_turns=3, time_limit_s=5)
    assert result.failure == "turn_limit" and len(result.turns) == 3
    assert all(step.observation == "no number found" for _, step in result.turns)


def test_secret_outside_range_is_rejected():
    with pytest.raises(ValueError, match="outside"):
        GuessNumber().reset({"secret": 11, "low": 0, "high": 10})


def test_tasks_are_reproducible_and_in_range():
    tasks = guess_number_tasks(200, low=-5, high=5, seed=0)
    assert tasks == guess_number_tasks(200, low=-5, high=5, seed=0)
    assert tasks != guess_number_tasks(200, low=-5, high=5, seed=1)
    assert {t["secret"] for t in tasks} == set(range(-5, 6))
    assert all(t["low"] == -5 and t["high"] == 5 for t in tasks)
    with pytest.raises(ValueError, match="low <= high"):
        guess_number_tasks(1, low=3, high=2, seed=0)


def test_show_range_states_what_the_feedback_leaves():
    env = GuessNumber(show_range=True)
    assert env.reset({"secret": 11, "low": 1, "high": 15}) == "Guess an integer from 1 to 15."
    # 8 < 11: [9, 15]; 13 > 11: [9, 12]; 5 tells nothing new: still [9, 12].
    answers = [env.step(guess).observation for guess in ("8", "13", "5")]
    assert answers == ["higher, 9 to 15", "lower, 9 to 12", "higher, 9 to 12"]
    assert env.step("11") == Step("correct", 1.0, True, {"guess": 11})


def test_task_examples_experts_and_rewards():
    task = GuessNumberTask(low=1, high=15, max_turns=4)
    train = [task.example(i, "train") for i in range(200)]
    test = [task.example(i, "test") for i in range(200)]
    assert train[:5] == [task.example(i, "train") for i in range(5)]  # deterministic
    assert [e["answer"] for e in train] != [e["answer"] for e in test]
    secrets = {int(e["answer"]) for e in train}
    assert secrets == set(range(1, 16))  # every secret of the range drawn
    assert train[0]["prompt"] == "Guess an integer from 1 to 15."
    assert task.env_task("7") == {"secret": 7, "low": 1, "high": 15}
    assert (task.reward("my guess: 7", "7"), task.reward("8", "7"), task.reward("", "7")) == (
        1.0,
        0.0,
        0.0,
    )
    assert task.split_size("train") is None and task.split_size("test") == 256
    # Bisecting wins every secret within ceil(log2(15 + 1)) = 4 turns.
    for secret in range(1, 16):
        bisect = guess_number_expert("bisect", np.random.default_rng(0))
        result = run_episode(
            task.make_env, task.env_task(str(secret)), bisect, max_turns=4, time_limit_s=5
        )
        assert result.failure is None and result.total_reward == 1.0, secret
    # The random expert guesses inside the stated range, and loses some games in 4 turns.
    rng = np.random.default_rng(1)
    wins = 0
    for example in train[:100]:
        guesses = []

        def player(observations, policy=task.expert_policy(rng), guesses=guesses):
            guesses.append((observations[-1], int(policy(observations))))
            return str(guesses[-1][1])

        result = run_episode(
            task.make_env, task.env_task(example["answer"]), player, max_turns=4, time_limit_s=5
        )
        wins += result.failure is None
        for observation, guess in guesses:
            low, high = (int(n) for n in re.findall(r"\d+", observation)[-2:])
            assert low <= guess <= high
    assert 40 <= wins <= 85


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(low=5, high=1), "need low <= high"),
        (dict(max_turns=0), "max_turns"),
        (dict(expert="oracle"), "expert kind 'oracle'"),
    ],
)
def test_task_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GuessNumberTask(**kwargs)

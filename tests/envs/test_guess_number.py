"""GuessNumber: binary search wins in the hand-computed number of turns, feedback, integer
parsing, and reproducible task generation."""

import pytest

from rljax.envs import GuessNumber, guess_number_tasks, run_episode


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

"""Gymnasium text environments played through rljax: the adapter (seeded resets, rewards,
termination and truncation, garbage contained), the `gymnasium` task, and a short run of the
driver on it."""

from __future__ import annotations

import string

import gymnasium
import numpy as np
import pytest

from rljax.config import default_config
from rljax.data.tasks import get_task
from rljax.envs import run_episode
from rljax.envs.gymnasium_env import GymnasiumText, gymnasium_factory
from rljax.train.episodes import is_episodic
from rljax.train.loop import train

_TEXT = gymnasium.spaces.Text(64, charset=string.printable)


class DigitGame(gymnasium.Env):
    """Guess a digit from 1 to 9 drawn at reset; "higher"/"lower" after a wrong guess, reward
    1 and terminated after the right one. `bad="number"` answers with an int observation."""

    observation_space = _TEXT
    action_space = _TEXT

    def __init__(self, bad: str = ""):
        self.bad = bad
        self.secret = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.secret = int(self.np_random.integers(1, 10))
        return "Guess a digit from 1 to 9.", {}

    def step(self, action):
        digits = [int(c) for c in action if c.isdigit()]
        guess = digits[-1] if digits else 0
        if guess == self.secret:
            return "right", 1.0, True, False, {}
        if self.bad == "number":
            return 7, 0.0, False, False, {}
        return ("higher" if guess < self.secret else "lower"), 0.0, False, False, {"guess": guess}


GAME = "rljax-test/DigitGame-v0"
gymnasium.register(GAME, entry_point=DigitGame, max_episode_steps=3)


def bisect(observations: list[str]) -> str:
    """Plays DigitGame by bisection from its feedback (4 guesses at most)."""
    low, high = 1, 9
    guess = 5
    for observation in observations[1:]:
        if observation == "higher":
            low = guess + 1
        elif observation == "lower":
            high = guess - 1
        guess = (low + high) // 2
    return str(guess)


def test_seeded_reset_and_a_won_episode():
    make = gymnasium_factory(GAME, max_episode_steps=4)
    result = run_episode(make, {"seed": 3}, bisect, max_turns=6, time_limit_s=5.0)
    secret = int(result.turns[-1][0])
    env = gymnasium.make(GAME)
    env.reset(seed=3)
    assert secret == env.unwrapped.secret  # the same seed draws the same game
    assert result.failure is None and result.success and result.total_reward == 1.0
    assert result.turns[-1][1].observation == "right"
    assert all(step.info["truncated"] is False for _, step in result.turns)
    for action, step in result.turns[:-1]:
        assert step.observation == ("higher" if int(action) < secret else "lower")
        assert step.info["guess"] == int(action)


def test_truncation_ends_the_episode_as_a_failure():
    """The registered max_episode_steps=3 truncates: done, kept rewards, not a success."""
    result = run_episode(
        gymnasium_factory(GAME), {"seed": 0}, lambda obs: "0", max_turns=6, time_limit_s=5.0
    )
    assert len(result.turns) == 3 and result.failure is None and not result.success
    last = result.turns[-1][1]
    assert last.done and last.info == {"truncated": True, "success": False, "guess": 0}


@pytest.mark.filterwarnings("ignore:.*not within the observation space")
def test_non_text_observations_and_bad_tasks_are_contained():
    garbage = run_episode(
        gymnasium_factory(GAME, bad="number"),
        {"seed": 0},
        lambda obs: "0",
        max_turns=3,
        time_limit_s=5.0,
    )
    assert garbage.failure == "garbage" and "observation is int" in garbage.error
    assert garbage.total_reward == 0.0
    unseeded = run_episode(gymnasium_factory(GAME), {}, bisect, max_turns=3, time_limit_s=5.0)
    assert unseeded.failure == "raised" and "needs a 'seed'" in unseeded.error


def test_unknown_ids_and_kwargs_fail_before_training():
    with pytest.raises(ValueError, match="rljax-test/DigitGam-v0"):
        gymnasium_factory("rljax-test/DigitGam-v0")
    with pytest.raises(ValueError, match="unexpected keyword"):
        gymnasium_factory(GAME, colour="red")
    with pytest.raises(ValueError, match="env_id is empty"):
        get_task("gymnasium")


def test_gymnasium_task_examples_are_seeds():
    task = get_task("gymnasium", env_id=GAME, max_turns=4, seed=1, test_size=5)
    assert is_episodic(task) and task.split_size("test") == 5 and task.split_size("train") is None
    train_seeds = [task.example(i, "train")["answer"] for i in range(20)]
    test_seeds = [task.example(i, "test")["answer"] for i in range(5)]
    assert len(set(train_seeds + test_seeds)) == 25  # distinct draws, deterministic
    assert train_seeds == [task.example(i, "train")["answer"] for i in range(20)]
    example = task.example(0, "train")
    assert example["prompt"] == "Guess a digit from 1 to 9."
    env = task.make_env()
    assert isinstance(env, GymnasiumText)
    env.reset(task.env_task(example["answer"]))
    secret = env.env.unwrapped.secret
    assert task.reward(str(secret), example["answer"]) == 1.0
    assert task.reward(str(secret % 9 + 1), example["answer"]) == 0.0
    with pytest.raises(ValueError, match="sft.steps=0"):
        task.expert_policy(np.random.default_rng(0))


def test_the_driver_trains_on_a_gymnasium_task(tmp_path):
    """Two GRPO steps and an evaluation of a tiny model on DigitGame, from config keys alone."""
    config = default_config()
    config.run_dir = str(tmp_path / "run")
    config.model.update(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
    config.task.update(name="gymnasium", env_id=GAME, max_turns=3, max_prompt_len=32)
    config.task.update(eval_size=8, test_size=8)
    config.env.update(chat_format="plain", workers=2)
    config.sft.steps = 0
    config.rollout.update(max_new_tokens=24, n_samples=2, slots=8)
    config.train.update(steps=2, prompts_per_step=8, eval_every=2, checkpoint_every=2)
    records = {r["step"]: r for r in train(config)}
    for step in (1, 2):
        assert records[step]["env/episodes"] == 16.0
        assert 0.0 <= records[step]["env/success"] <= 1.0
        assert np.isfinite(records[step]["loss"])
    assert 0.0 <= records[2]["eval/accuracy"] <= 1.0 and "eval/failed/garbage" in records[2]

"""Training on episodic tasks (`rljax.train.episodes`): scripted SFT rows decode back to the
expert's games, group prompts, evaluation metrics, the multi-turn batch through the turn-level
presets, ReMax's greedy-episode baseline and HeaPA's selection on episodes, and the features
episodes refuse with a one-line error naming the keys."""

from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.algorithms import turn_grpo, turn_ppo
from rljax.config import default_config
from rljax.core import keys
from rljax.core.batch import make_batch
from rljax.core.transform import Context
from rljax.data.tasks import TASKS, AdditionTask, ToolArithmeticTask, get_task
from rljax.envs import EpisodeResult, GuessNumber, Step, run_episode
from rljax.envs.chat import CHAT_FORMATS
from rljax.envs.guess_number import GuessNumberTask
from rljax.models.tokenizer import ByteTokenizer
from rljax.train.builders import build_policy
from rljax.train.collection import build_episode_collector, greedy_decoder
from rljax.train.episodes import (
    EpisodeSettings,
    episode_eval_metrics,
    episode_prompts,
    is_episodic,
    scripted_episode_rows,
    sft_batches,
)
from rljax.train.loop import train

TOKENIZER = ByteTokenizer()
CHAT = CHAT_FORMATS["plain"]


def runs(mask):
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def test_guess_number_is_registered_and_episodic():
    task = get_task("guess_number", seed=3, max_turns=5)
    assert isinstance(task, GuessNumberTask) and task.max_turns == 5
    assert is_episodic(task) and not is_episodic(AdditionTask())
    tool = get_task("tool_arithmetic", max_turns=4, expert="tool")
    assert isinstance(tool, ToolArithmeticTask) and is_episodic(tool) and tool.max_turns == 4


def test_scripted_rows_replay_the_experts_games():
    task = GuessNumberTask(expert="bisect")
    settings = EpisodeSettings(CHAT, prompt_len=32)
    rows = scripted_episode_rows(task, TOKENIZER, settings, 72, 20, seed=0)
    assert rows["completion_tokens"].shape == (20, 72) and rows["prompt_tokens"].shape == (20, 32)
    prompt = TOKENIZER.encode("Guess an integer from 1 to 15.\n")
    for i in range(20):
        np.testing.assert_array_equal(rows["prompt_tokens"][i][rows["prompt_mask"][i]], prompt)
        secret = int(task.example(i, "train")["answer"])
        tokens = rows["completion_tokens"][i]
        turns = [tokens[a:b] for a, b in runs(rows["completion_mask"][i])]
        answers = [tokens[a:b] for a, b in runs(rows["env_mask"][i])]
        # Replay the decoded guesses: every turn ends with EOS, the answers are the game's.
        env = GuessNumber(show_range=True)
        env.reset(task.env_task(str(secret)))
        for k, turn in enumerate(turns):
            assert turn[-1] == TOKENIZER.eos_id
            step = env.step(TOKENIZER.decode(turn))
            if k + 1 < len(turns):
                np.testing.assert_array_equal(
                    answers[k], TOKENIZER.encode(CHAT.render_observation(step.observation))
                )
        assert step.done and len(answers) == len(turns) - 1 <= 3  # bisecting wins in 4
    batches = sft_batches(rows, 8, seed=0)
    first, second = next(batches), next(batches)
    assert first["env_mask"].shape == (8, 72)
    assert not np.array_equal(first["completion_tokens"], second["completion_tokens"])
    with pytest.raises(ValueError, match="more than the 20 scripted episodes"):
        next(sft_batches(rows, 21, seed=0))


def test_episode_prompts_share_one_observation_per_group():
    tokens, mask = episode_prompts(["ab", None, "cd", "cd"], 2, TOKENIZER, CHAT, 4)
    pad = TOKENIZER.pad_id
    np.testing.assert_array_equal(tokens, [[pad, 97, 98, 10], [pad, 99, 100, 10]])
    np.testing.assert_array_equal(mask, [[False, True, True, True]] * 2)
    with pytest.raises(ValueError, match="started with different observations"):
        episode_prompts(["ab", "cd"], 2, TOKENIZER, CHAT, 4)
    with pytest.raises(ValueError, match="task.max_prompt_len=2"):
        episode_prompts(["ab"], 1, TOKENIZER, CHAT, 2)


def test_eval_metrics_count_wins_turns_and_failures():
    step = lambda reward, done: Step("o", reward, done, {})  # noqa: E731
    results = [
        EpisodeResult([("a", step(0.0, False)), ("b", step(1.0, True))], 1.0, None, None),
        EpisodeResult([("a", step(0.0, False))] * 4, 0.0, "turn_limit", None),
        EpisodeResult([], 0.0, "timeout", "reset ran past time_limit_s=1"),
    ]
    metrics = episode_eval_metrics(results)
    assert metrics["eval/accuracy"] == pytest.approx(1 / 3)
    assert metrics["eval/reward"] == pytest.approx(1 / 3)
    assert metrics["eval/mean_turns"] == pytest.approx(2.0)
    # An episode that ended done on a wrong final answer says so in its last step's info.
    wrong = EpisodeResult([("a", Step("", 0.0, True, {"success": False}))], 0.0, None, None)
    metrics = episode_eval_metrics([*results, wrong])
    assert metrics["eval/accuracy"] == pytest.approx(1 / 4)
    assert metrics["eval/mean_turns"] == pytest.approx(7 / 4)
    assert metrics["eval/failed/turn_limit"] == 1 and metrics["eval/failed/timeout"] == 1


def test_turn_presets_on_a_multi_turn_batch():
    """turn_grpo's advantages on a hand-built batch of two groups of two episodes, against the
    numbers worked out by hand; observation tokens and padding get 0."""
    # Row layout: P = policy, E = environment, . = padding.
    # row 0: P P E P .  (2 turns, turn rewards [0, 1])    row 1: P E P P .  (2 turns, [0, 0])
    # row 2: P P . . .  (1 turn, [1])                     row 3: P E E P P  (2 turns, [0, 1])
    policy = np.array([[1, 1, 0, 1, 0], [1, 0, 1, 1, 0], [1, 1, 0, 0, 0], [1, 0, 0, 1, 1]], bool)
    env = np.array([[0, 0, 1, 0, 0], [0, 1, 0, 0, 0], [0] * 5, [0, 1, 1, 0, 0]], bool)
    turn_rewards = np.array([[0, 1], [0, 0], [1, 0], [0, 1]], np.float32)
    batch = make_batch(
        np.zeros((4, 1)),
        np.ones((4, 1)),
        np.zeros((4, 5)),
        policy,
        [0, 0, 1, 1],
        turn_rewards.sum(axis=1),
        extras={
            "env_mask": jnp.asarray(env),
            "turn_rewards": jnp.asarray(turn_rewards),
            "num_turns": jnp.asarray([2, 2, 1, 2], jnp.float32),
        },
    )
    algorithm = turn_grpo(group_size=2, normalize_std=False)
    keys.check_algorithm(algorithm)
    out, _, _ = algorithm.transform.apply(
        batch, algorithm.transform.init(), Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
    )
    # Group 0: turn 0 returns (gamma 1) are 1 and 0 -> baseline 0.5 -> +0.5, -0.5; turn 1
    # returns 1 and 0 -> +0.5, -0.5. Group 1: turn 0 returns 1 and 1 -> 0, 0; turn 1 is
    # reached by row 3 only -> 0.
    want = np.array(
        [[0.5, 0.5, 0, 0.5, 0], [-0.5, 0, -0.5, -0.5, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]]
    )
    np.testing.assert_allclose(out.advantages, want, atol=1e-6)
    keys.check_algorithm(turn_ppo())


def test_unsupported_features_are_named():
    config = default_config()
    config.task.name = "guess_number"
    config.rollout.engine = "static"
    config.lope.num_perturbed = 2
    plain = types.SimpleNamespace(
        collection=None, greedy_baseline=False, needs_reward_components=False
    )
    with pytest.raises(ValueError, match=r"\['rollout.engine', 'lope.num_perturbed'\]"):
        build_episode_collector(
            config, GuessNumberTask(), TOKENIZER, iter(()), plain, None, None, None
        )
    config.rollout.engine, config.lope.num_perturbed = "continuous", 0
    components = types.SimpleNamespace(**{**vars(plain), "needs_reward_components": True})
    with pytest.raises(ValueError, match=r"\['algorithm.reward_components'\]"):
        build_episode_collector(
            config, GuessNumberTask(), TOKENIZER, iter(()), components, None, None, None
        )
    config.prompt_selection.name = "dare"
    with pytest.raises(ValueError, match=r"\['prompt_selection.name'\]"):
        build_episode_collector(
            config, GuessNumberTask(), TOKENIZER, iter(()), plain, None, None, None
        )


class ByteSumEnv:
    """One turn; the reward is a function of the action's bytes, varied for any text."""

    def reset(self, task):
        return f"Say {task['secret']}."

    def step(self, action):
        return Step("", sum(action.encode()) % 5 / 4, True, {})


ENDS = tuple(range(128, 256))


@dataclasses.dataclass(frozen=True)
class ByteSumTask(GuessNumberTask):
    """GuessNumber's examples played by `ByteSumEnv` for one turn."""

    max_turns: int = 1

    def example(self, index, split):
        example = super().example(index, split)
        return {**example, "prompt": f"Say {example['answer']}."}

    def make_env(self):
        return ByteSumEnv()

    def expert_policy(self, rng):
        """Says the number of its prompt (so that a warm start makes greedy turns differ)."""
        return lambda observations: observations[0].split()[1].rstrip(".")


def test_remax_baseline_and_heapa_selection_on_episodes(tmp_path, monkeypatch):
    """ReMax's baseline is each example's greedy episode by the current policy, the same reward
    as a greedy completion from the non-episodic decoder scored by the environment; HeaPA's
    pool is fed each group's episode rewards (its cold prompts run out)."""
    monkeypatch.setitem(TASKS, "byte_sum", ByteSumTask)
    config = default_config()
    config.run_dir = str(tmp_path / "run")
    config.model.update(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
    config.task.update(name="byte_sum", max_prompt_len=16, eval_size=8)
    config.env.update(chat_format="plain", workers=2)
    config.sft.update(steps=30, batch_size=16, learning_rate=1e-2)
    config.algorithm.name = "remax"
    config.prompt_selection.update(name="heapa", pool_size=16)
    # Half the bytes end a turn too, so that every greedy turn ends within the budget.
    config.rollout.update(max_new_tokens=12, n_samples=2, slots=16, extra_eos_ids=ENDS)
    config.train.update(steps=2, prompts_per_step=8, eval_every=2, checkpoint_every=2)
    tokenizer, _, graphdef, _ = build_policy(config)
    greedy = greedy_decoder(graphdef, config, tokenizer)
    checked = []

    def wrap(inner):
        collect = inner.collect

        def collect_and_check(state, step):
            collection = collect(state, step)
            rows = collection.fresh[0].rows
            out = greedy(state, rows["prompt_tokens"][::2], rows["prompt_mask"][::2])
            reference = []
            for tokens, mask in zip(np.asarray(out.completion_tokens), out.completion_mask):
                turn = tokens[np.asarray(mask)]
                ended = turn[-1] in (tokenizer.eos_id, *ENDS)  # else: out of budget
                text = tokenizer.decode(turn)
                reference.append(ByteSumEnv().step(text).reward if ended else 0.0)
            baseline = np.asarray(rows["baseline_reward"]).reshape(-1, 2)
            np.testing.assert_allclose(baseline, np.repeat(reference, 2).reshape(-1, 2), 1e-6)
            checked.append(reference)
            return collection

        inner.collect = collect_and_check
        return inner

    records = {r["step"]: r for r in train(config, wrap_collector=wrap)}
    assert len(checked) == 2 and max(len(set(r)) for r in checked) > 1  # varied, each matched
    assert records[1]["selection/cold"] == 8.0 and records[2]["selection/cold"] == 0.0
    assert np.isfinite(records[2]["loss"])


def test_run_episode_with_the_task_and_expert():
    task = GuessNumberTask(expert="bisect", max_turns=4)
    result = run_episode(
        task.make_env,
        task.env_task("15"),
        task.expert_policy(np.random.default_rng(0)),
        max_turns=4,
        time_limit_s=5,
    )
    # [1, 15]: 8 higher -> [9, 15]: 12 higher -> [13, 15]: 14 higher -> [15, 15]: 15.
    assert [s.info["guess"] for _, s in result.turns] == [8, 12, 14, 15]
    assert result.failure is None

"""SkyRL-Gym environments played through rljax: the adapter on SkyRL's own GSM8K environments,
and the `skyrl_gym` task over rows in SkyRL's data layout (JSONL and parquet)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rljax.data.tasks import get_task
from rljax.envs import run_episode
from rljax.envs.skyrl_gym_env import SkyRLGymText, conversation_text
from rljax.train.episodes import is_episodic


def row(question: str, answer: str, env_class: str = "gsm8k_multi_turn") -> dict:
    """A row as SkyRL's GSM8K preprocessing writes it (two turns for the multi-turn env)."""
    return {
        "data_source": "tiny",
        "prompt": [
            {"role": "system", "content": "Answer as '#### N'."},
            {"role": "user", "content": question},
        ],
        "env_class": env_class,
        "reward_spec": {"method": "rule", "ground_truth": answer},
        "extra_info": {"max_turns": 2},
    }


ROWS = [row(f"What is {a} + {b}?", str(a + b)) for a in range(6) for b in range(5)]


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_multi_turn_gsm8k_episode():
    """A wrong then a right answer: the multi-turn env's format credit (0.2 / max_turns = 0.1
    for a well-formed wrong answer), its follow-up message, then 1.0 and done."""
    result = run_episode(
        SkyRLGymText,
        row("What is 6 * 7?", "42"),
        lambda obs: ["I think #### 41", "#### 42"][len(obs) - 1],
        max_turns=4,
        time_limit_s=10.0,
    )
    assert result.failure is None and result.success
    (_, first), (_, last) = result.turns
    assert first.reward == pytest.approx(0.1) and not first.done
    assert (
        first.observation
        == "Now provide only the final numeric answer in the exact format: '#### ANSWER'."
    )
    assert last.reward == 1.0 and last.done and last.observation == ""
    assert result.total_reward == pytest.approx(1.1)


def test_first_observation_is_the_prompt_and_bad_rows_are_contained():
    env = SkyRLGymText()
    assert env.reset(row("What is 1 + 1?", "2")) == "Answer as '#### N'.\n\nWhat is 1 + 1?"
    broken = {k: v for k, v in row("q", "1").items() if k != "env_class"}
    result = run_episode(SkyRLGymText, broken, lambda obs: "", max_turns=2, time_limit_s=10.0)
    assert result.failure == "raised" and "env_class" in result.error
    no_truth = {**row("q", "1"), "reward_spec": {}}
    result = run_episode(SkyRLGymText, no_truth, lambda obs: "", max_turns=2, time_limit_s=10.0)
    assert result.failure == "raised" and result.total_reward == 0.0
    with pytest.raises(TypeError, match="content"):
        conversation_text([{"role": "user"}])


def test_skyrl_task_from_jsonl_splits_and_plays(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", ROWS)
    task = get_task("skyrl_gym", train_path=path, test_fraction=0.3, seed=0)
    assert is_episodic(task)
    train, test = task.split_size("train"), task.split_size("test")
    assert train + test == len(ROWS) and train > 0 and test > 0
    prompts = {
        task.example(i, s)["prompt"] for s in ("train", "test") for i in range(task.split_size(s))
    }
    assert len(prompts) == len(ROWS)  # disjoint splits covering every row
    example = task.example(2, "test")
    assert example["answer"] == "test:2" and example["prompt"].startswith("Answer as")
    truth = task.env_task(example["answer"])["reward_spec"]["ground_truth"]
    a, b = (int(x) for x in example["prompt"].split("What is ")[1].rstrip("?").split(" + "))
    assert truth == str(a + b)
    assert task.reward(f"#### {truth}", example["answer"]) == 1.0
    assert task.reward(f"#### {int(truth) + 1}", example["answer"]) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="sft.steps=0"):
        task.expert_policy(np.random.default_rng(0))


def test_skyrl_task_reads_parquet_and_a_test_file(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS[:10]), path)
    test = write_jsonl(tmp_path / "test.jsonl", ROWS[10:13])
    task = get_task("skyrl_gym", train_path=str(path), test_path=test)
    assert task.split_size("train") == 10 and task.split_size("test") == 3
    assert task.example(1, "train")["prompt"] == conversation_text(ROWS[1]["prompt"])
    assert task.reward("#### 1", "train:1") == 1.0  # 0 + 1


def test_skyrl_task_names_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="task.train_path"):
        get_task("skyrl_gym", train_path=str(tmp_path / "missing.jsonl"))
    bad = write_jsonl(tmp_path / "bad.jsonl", [ROWS[0], {"prompt": "x"}])
    with pytest.raises(ValueError, match=r"bad.jsonl line 2 has no \['env_class'\]"):
        get_task("skyrl_gym", train_path=bad)
    one = write_jsonl(tmp_path / "one.jsonl", ROWS[:1])
    with pytest.raises(ValueError, match="split of .* is empty"):
        get_task("skyrl_gym", train_path=one)

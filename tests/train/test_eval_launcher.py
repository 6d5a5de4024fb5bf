"""Sampled evaluation: the pass@k estimator, `sample_eval` and `episodic_sample_eval` on a tiny
model, and the launcher.

The estimator is checked against an enumeration of all k-subsets; `sample_eval` against its
own counts (avg@n, pass@1, pass@n follow from them) and near-zero temperature sampling
against greedy decoding; the launcher end to end on a checkpoint of a freshly initialised
TrainState (no training) whose policy was edited to stop at once, so its greedy completions
show that the checkpoint was the model evaluated.
"""

import itertools
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from configs.grpo_addition import get_config
from rljax.envs import Step
from rljax.train.builders import (
    build_algorithm,
    build_optimizer,
    build_policy,
    build_train_state,
    prompt_format,
)
from rljax.train.checkpoint import Checkpointer
from rljax.train.episodes import episodic_sample_eval
from rljax.train.evaluation import pass_at_k, restore_policy, sample_eval
from rljax.train.prompts import Prompts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = {
    "model.d_model": 16,
    "model.n_layers": 1,
    "model.n_heads": 2,
    "model.n_kv_heads": 1,
    "model.d_ff": 32,
    "train.prompts_per_step": 2,
    "rollout.max_new_tokens": 3,
}


def tiny_config(run_dir="unused", seed=0):
    config = get_config()
    config.run_dir, config.seed = str(run_dir), seed
    for key, value in TINY.items():
        section, name = key.split(".")
        config[section][name] = value
    return config


def prompts_of(config, tokenizer):
    fmt = prompt_format(config, tokenizer)
    return Prompts(tokenizer, config.task.max_prompt_len, 32, *fmt)


@pytest.mark.parametrize("n", range(1, 7))
def test_pass_at_k_is_the_share_of_k_subsets_holding_a_correct_sample(n):
    for c, k in itertools.product(range(n + 1), range(1, n + 1)):
        # samples 0..c-1 are the correct ones
        subsets = list(itertools.combinations(range(n), k))
        brute = sum(any(i < c for i in s) for s in subsets) / len(subsets)
        got = pass_at_k(np.array([c]), n, k)
        np.testing.assert_allclose(got, [brute], rtol=0, atol=1e-12, err_msg=f"{n=} {c=} {k=}")


def test_pass_at_k_stays_exact_where_the_binomials_are_huge():
    n, k, counts = 1000, 300, np.array([0, 1, 5, 700, 701, 1000])
    want = [1 - math.comb(n - c, k) / math.comb(n, k) for c in counts]  # exact integers
    np.testing.assert_allclose(pass_at_k(counts, n, k), want, rtol=1e-9, atol=1e-12)


def test_pass_at_k_rejects_k_outside_1_to_n_and_impossible_counts():
    with pytest.raises(ValueError, match=r"k=5 must be in \[1, n=4\]"):
        pass_at_k(np.array([1]), 4, 5)
    with pytest.raises(ValueError, match=r"k=0"):
        pass_at_k(np.array([1]), 4, 0)
    with pytest.raises(ValueError, match=r"counts must be in \[0, n=4\]; got 0..5"):
        pass_at_k(np.array([0, 5]), 4, 2)


class ParityTask:
    """Five problems; a completion is right when the sum of its UTF-8 bytes is even, so an
    untrained model at temperature 1 is right about half the time."""

    splits = ("test",)

    def split_size(self, split):
        return 5

    def example(self, index, split):
        return {"prompt": f"{index}+{index}=", "answer": str(2 * index)}

    def reward(self, completion, answer):
        return float(sum(completion.encode()) % 2 == 0)

    def sft_target(self, answer):
        return answer


def test_sample_eval_counts_agree_and_cold_sampling_matches_greedy():
    config = tiny_config()
    tokenizer, _, graphdef, params = build_policy(config)
    task, prompts = ParityTask(), prompts_of(config, tokenizer)
    # 5 problems in batches of 2: the last batch is padded and its padding dropped.
    report = sample_eval(graphdef, params, task, prompts, config, 4, [4, 1, 2], num_problems=5)
    counts = np.array([p["correct"] for p in report["problems"]])
    assert [p["index"] for p in report["problems"]] == [0, 1, 2, 3, 4]
    assert 0 < counts.sum() < 20, "the parity task should give mixed outcomes"
    assert sorted(report["pass_at_k"]) == ["1", "2", "4"]
    assert report["avg_at_n"] == pytest.approx(counts.sum() / 20)
    assert report["mean_reward"] == pytest.approx(counts.sum() / 20)  # rewards are 0/1
    assert report["pass_at_k"]["1"] == pytest.approx(report["avg_at_n"])
    assert report["pass_at_k"]["4"] == pytest.approx(np.mean(counts >= 1))
    pass2 = np.mean([1 - math.comb(4 - c, 2) / math.comb(4, 2) for c in counts])
    assert report["pass_at_k"]["2"] == pytest.approx(pass2)
    greedy = [p["greedy_correct"] for p in report["problems"]]
    assert report["greedy_accuracy"] == pytest.approx(np.mean(greedy))
    for p in report["problems"]:  # the greedy text is what the task scored
        assert p["greedy_correct"] == (task.reward(p["greedy_completion"], "") == 1.0)
    assert 1 <= report["mean_completion_length"] <= 3

    # At a temperature near 0 every sample is the greedy completion.
    cold = sample_eval(
        graphdef, params, task, prompts, config, 4, [1], temperature=1e-4, num_problems=5
    )
    assert [p["correct"] for p in cold["problems"]] == [4 * g for g in greedy]
    assert cold["mean_completion_length"] == cold["greedy_mean_completion_length"]
    with pytest.raises(ValueError, match=r"k=8 must be in \[1, n=4\]"):
        sample_eval(graphdef, params, task, prompts, config, 4, [1, 8], num_problems=5)


class ParityTurns:
    """Two tries: a turn whose UTF-8 bytes sum to an even number wins (reward 1, done);
    otherwise the answer is "again"."""

    def reset(self, task):
        return f"{task['index']}:"

    def step(self, action):
        won = sum(action.encode()) % 2 == 0
        return Step("" if won else "again", float(won), won, {})


class ParityTurnsTask(ParityTask):
    """ParityTask's five problems played as ParityTurns episodes."""

    max_turns = 2

    def example(self, index, split):
        return {"prompt": f"{index}:", "answer": str(index)}

    def make_env(self):
        return ParityTurns()

    def env_task(self, answer):
        return {"index": int(answer)}

    def expert_policy(self, rng):
        return lambda observations: "00"


def test_episodic_sample_eval_counts_episodes_and_cold_sampling_matches_greedy():
    config = tiny_config()
    # Half the bytes end a turn too, so that the untrained model's turns end in the budget.
    config.rollout.update(max_new_tokens=16, extra_eos_ids=tuple(range(128, 256)))
    tokenizer, _, graphdef, params = build_policy(config)
    task, prompts = ParityTurnsTask(), prompts_of(config, tokenizer)
    report = episodic_sample_eval(
        graphdef, params, task, prompts, config, 4, [4, 1, 2], num_problems=5
    )
    counts = np.array([p["correct"] for p in report["problems"]])
    assert [p["index"] for p in report["problems"]] == [0, 1, 2, 3, 4]
    assert 0 < counts.sum() < 20, "the parity episodes should give mixed outcomes"
    assert report["avg_at_n"] == pytest.approx(counts.sum() / 20)
    assert report["mean_reward"] == pytest.approx(counts.sum() / 20)  # 1 for a win, else 0
    assert report["pass_at_k"]["1"] == pytest.approx(report["avg_at_n"])
    assert report["pass_at_k"]["4"] == pytest.approx(np.mean(counts >= 1))
    pass2 = np.mean([1 - math.comb(4 - c, 2) / math.comb(4, 2) for c in counts])
    assert report["pass_at_k"]["2"] == pytest.approx(pass2)
    assert 1.0 <= report["mean_turns"] <= 2.0
    lost = (
        report["failures"]["sampled"]["turn_limit"] + report["failures"]["sampled"]["token_budget"]
    )
    assert lost == 20 - counts.sum()  # an episode that does not win runs out of turns or budget
    greedy = [p["greedy_correct"] for p in report["problems"]]
    assert report["greedy_accuracy"] == pytest.approx(np.mean(greedy))

    # At a temperature near 0 every sampled episode is the greedy one.
    cold = episodic_sample_eval(
        graphdef, params, task, prompts, config, 4, [1], temperature=1e-4, num_problems=5
    )
    assert [p["correct"] for p in cold["problems"]] == [4 * g for g in greedy]
    assert cold["mean_turns"] == cold["greedy_mean_turns"]
    with pytest.raises(ValueError, match="num_problems=6 must be at least 1 and at most the 5"):
        episodic_sample_eval(graphdef, params, task, prompts, config, 4, [1], num_problems=6)


def test_restore_policy_without_checkpoints_names_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no checkpoint in {tmp_path}/checkpoints"):
        restore_policy(tiny_config(tmp_path))


def launch(run_dir, *extra):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device
    flags = [f"--config.{key}={value}" for key, value in TINY.items()]
    command = [sys.executable, "-m", "launchers.eval", "--config=configs/grpo_addition.py"]
    return subprocess.run(
        [*command, f"--config.run_dir={run_dir}", *flags, *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_launcher_evaluates_the_newest_checkpoint_into_a_json_report(tmp_path):
    # A checkpoint at step 3 of a freshly initialised TrainState. An untrained model with tied
    # embeddings repeats the prompt's last token "=" greedily; the checkpoint's policy has the
    # EOS embedding set to 3x the one of "=", so it ends every greedy answer at once.
    config = tiny_config(tmp_path)
    tokenizer, model_config, _, params = build_policy(config)
    embed = params["embed"][...]
    params["embed"][...] = embed.at[tokenizer.eos_id].set(3 * embed[tokenizer.encode("=")[-1]])
    algorithm = build_algorithm(config, model_config.vocab_size)
    state, _ = build_train_state(
        config, model_config, params, algorithm, build_optimizer(config.train)
    )
    checkpointer = Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
    checkpointer.save(3, state, {"position": 0})
    checkpointer.close()

    done = launch(tmp_path, "--n_samples=4", "--k=1,2,4,8", "--num_problems=5")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "pass@[8] left out" in done.stderr
    report = json.loads((tmp_path / "eval_step3.json").read_text())
    assert f"report: {tmp_path}/eval_step3.json" in done.stdout
    assert report["step"] == 3 and report["n_samples"] == 4 and report["num_problems"] == 5
    assert report["split"] == "test" and report["temperature"] == 1.0
    assert sorted(report["pass_at_k"]) == ["1", "2", "4"]
    counts = np.array([p["correct"] for p in report["problems"]])
    assert len(counts) == 5 and ((0 <= counts) & (counts <= 4)).all()
    assert report["avg_at_n"] == pytest.approx(counts.mean() / 4)
    assert report["pass_at_k"]["1"] == pytest.approx(report["avg_at_n"])
    assert report["pass_at_k"]["4"] == pytest.approx(np.mean(counts >= 1))
    assert [p["greedy_completion"] for p in report["problems"]] == [""] * 5  # the checkpoint's
    assert report["greedy_mean_completion_length"] == 1.0  # the EOS alone
    for line in ("pass@1", "pass@4", "avg@4", "greedy", "length"):
        assert line in done.stdout


def test_launcher_without_a_checkpoint_stops_with_one_line_naming_the_directory(tmp_path):
    missing = launch(tmp_path)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().splitlines()[-1] == (
        f"error: no checkpoint in {tmp_path}/checkpoints; train with this config and "
        "run_dir first, or evaluate the untrained model with step 0 (--step=0)"
    )

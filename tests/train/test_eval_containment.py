"""Held-out evaluation scores through the run's contained scorer: a reward that raises, returns
garbage, sleeps past the timeout or calls sys.exit is counted in eval/reward_failures_*; a run
on the default process pool survives rewards that call sys.exit or os._exit."""

import dataclasses
import os
import sys
import time

import pytest

from configs.grpo_addition import get_config
from rljax.data import AdditionTask
from rljax.data.tasks import TASKS
from rljax.rewards import FAILURE_KINDS, pool
from rljax.rewards.pool import close_shared_pools
from rljax.train.builders import build_policy
from rljax.train.evaluation import greedy_eval
from rljax.train.loop import train
from rljax.train.prompts import Prompts, prompt_format


class HostileTask:
    """Eight problems; problem i's reward misbehaves as `MODES[i]` says ("ok" scores 1)."""

    MODES = ("raise", "none", "str", "list", "sleep", "sys.exit", "1e39", "ok")
    splits = ("test",)

    def split_size(self, split):
        return len(self.MODES)

    def example(self, index, split):
        return {"prompt": f"{index}+0=", "answer": self.MODES[index]}

    def reward(self, completion, answer):
        if answer == "raise":
            raise RuntimeError("boom")
        if answer == "sleep":
            time.sleep(2.0)  # a process worker is killed at 0.5 s; inline discards it after
        if answer == "sys.exit":
            sys.exit(3)
        values = {"none": None, "str": "1", "list": [1.0], "1e39": 1e39}
        return values.get(answer, 1.0)  # "ok", and "sleep" once it is late

    def sft_target(self, answer):
        return answer


@pytest.mark.parametrize("kind", ["process", "inline"])
def test_a_hostile_reward_during_evaluation_is_counted_not_fatal(kind):
    config = get_config()
    config.model.update(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
    config.rollout.max_new_tokens = 2
    config.train.prompts_per_step = 4  # two batches
    config.task.eval_size = len(HostileTask.MODES)
    config.reward.update(kind=kind, workers=2, timeout_s=0.5)
    tokenizer, _, graphdef, params = build_policy(config)
    prompts = Prompts(tokenizer, config.task.max_prompt_len, 32, *prompt_format(config, tokenizer))
    try:
        metrics = greedy_eval(graphdef, params, HostileTask(), prompts, config)
    finally:
        close_shared_pools()  # the run's driver does this at its end
    assert metrics["eval/accuracy"] == metrics["eval/reward"] == 1 / 8  # only "ok"
    failures = {k: metrics[f"eval/reward_failures_{k}"] for k in FAILURE_KINDS}
    want = dict(exception=1, wrong_type=3, timeout=1, exit=1, out_of_range=1)
    assert failures == dict(dict.fromkeys(FAILURE_KINDS, 0.0), **want)


@dataclasses.dataclass(frozen=True)
class ExitingTask(AdditionTask):
    """Addition whose reward calls sys.exit(3) on sums divisible by 3 and os._exit(7) on the
    others divisible by 4 (a module-level class: the pool's workers unpickle it)."""

    def reward(self, completion, answer):
        if int(answer) % 3 == 0:
            sys.exit(3)
        if int(answer) % 4 == 0:
            os._exit(7)
        return super().reward(completion, answer)


def test_a_run_survives_rewards_that_exit_and_closes_its_workers(tmp_path, monkeypatch):
    monkeypatch.setitem(TASKS, "exiting", ExitingTask)
    config = get_config()
    config.model.update(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
    config.sft.steps = 0
    config.task.update(name="exiting", eval_size=8)
    config.rollout.n_samples = 2
    config.train.update(steps=2, prompts_per_step=8, eval_every=2, checkpoint_every=2)
    config.run_dir = str(tmp_path / "run")
    records = train(config)  # the default reward.kind="process"
    last = records[-1]
    assert last["step"] == 2 and os.path.isdir(tmp_path / "run" / "checkpoints" / "2")
    assert sum(r.get("reward/failures_exit", 0) for r in records) > 0
    assert last["eval/reward_failures_exit"] > 0
    assert not pool._SHARED  # pylint: disable=protected-access  # the driver closed them

"""Held-out evaluation scores through the run's contained scorer: a reward that raises, returns
garbage, sleeps past the timeout or calls sys.exit is counted in eval/reward_failures_*."""

import sys
import time

import pytest

from configs.grpo_addition import get_config
from rljax.rewards import FAILURE_KINDS
from rljax.rewards.pool import close_shared_pools
from rljax.train.builders import build_policy
from rljax.train.evaluation import greedy_eval
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

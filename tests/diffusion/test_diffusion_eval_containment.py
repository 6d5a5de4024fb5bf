"""A diffusion run's greedy evaluation scores through the run's contained scorer: a reward that
raises, returns garbage, sleeps past the timeout or calls sys.exit is counted, not fatal."""

import sys
import time

from rljax.diffusion.engine import diffusion_greedy_eval
from rljax.rewards import FAILURE_KINDS
from rljax.rewards.pool import close_shared_pools
from rljax.train.prompts import Prompts


class HostileTask:
    """Four problems; problem i's reward misbehaves as `MODES[i]` says."""

    MODES = ("raise", "list", "sleep", "sys.exit")
    splits = ("test",)

    def split_size(self, split):
        return len(self.MODES)

    def example(self, index, split):
        return {"prompt": f"{index}+0=", "answer": self.MODES[index]}

    def reward(self, completion, answer):
        if answer == "raise":
            raise RuntimeError("boom")
        if answer == "sleep":
            time.sleep(30.0)  # killed at 0.5 s
        if answer == "sys.exit":
            sys.exit(3)
        return [1.0]

    def sft_target(self, answer):
        return answer


def test_a_hostile_reward_during_diffusion_evaluation_is_counted_not_fatal(run):
    config = run.config.copy_and_resolve_references()
    config.reward.update(kind="process", workers=2, timeout_s=0.5)
    prompts = Prompts.from_config(config, run.tokenizer)
    start = time.monotonic()
    try:
        metrics = diffusion_greedy_eval(run.graphdef, run.params, HostileTask(), prompts, config)
    finally:
        close_shared_pools()  # the run's driver does this at its end
    assert time.monotonic() - start < 25  # the 30 s sleep was cut off
    assert metrics["eval/accuracy"] == metrics["eval/reward"] == 0.0
    failures = {k: metrics[f"eval/reward_failures_{k}"] for k in FAILURE_KINDS}
    want = dict(exception=1, wrong_type=1, timeout=1, exit=1)
    assert failures == dict(dict.fromkeys(FAILURE_KINDS, 0.0), **want)

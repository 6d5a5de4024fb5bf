"""GDPO on the addition task's reward components, against GRPO on the exact reward and GRPO on
the components' weighted sum (the GDPO paper's baseline), from one 200-step SFT start.

The components (`AdditionTask.reward_components`): correct, the answer's digits in place,
the right length; weights 1, 0.5, 0.5. A short SFT leaves the exact reward sparse, which is
where partial credit should help, and where normalising each component on its own (GDPO)
should differ from normalising their sum.

  python -m benchmarks.reward_components --method=gdpo --seed=0   # one run, into runs/
  python -m benchmarks.reward_components --summary                # the table, from runs/
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
from absl import app, flags

from configs.gdpo_addition import get_config
from rljax.advantages.group import group_advantages
from rljax.algorithms import Algorithm, PPOSettings
from rljax.algorithms.base import ppo_preset
from rljax.core import keys
from rljax.core.transform import chain, stateless
from rljax.train.builders import register_algorithm

METHODS = ("grpo", "grpo_summed", "gdpo")
SEEDS = (0, 1)
STEPS, SFT_STEPS, EVAL_EVERY = 150, 200, 50
WEIGHTS = (1.0, 0.5, 0.5)
RESULTS = os.path.join(os.path.dirname(__file__), "results", "reward_components.json")

flags.DEFINE_enum("method", "gdpo", METHODS, "which method to train")
flags.DEFINE_integer("seed", 0, "the run's seed")
flags.DEFINE_bool("summary", False, "tabulate the finished runs instead of training")


def grpo_summed(group_size: int, ppo: PPOSettings = PPOSettings()) -> Algorithm:
    """GRPO on the weighted sum of the reward components: sum first, normalise after."""

    def summed(batch, ctx):
        del ctx
        total = batch.extras["reward_components"] @ jnp.asarray(WEIGHTS, jnp.float32)
        return batch.replace(rewards=total), {}

    transform = stateless(summed, {keys.REWARD_COMPONENTS}, {keys.REWARDS})
    return ppo_preset(chain(transform, group_advantages(group_size)), ppo)


def run_dir(method: str, seed: int) -> str:
    return os.path.join("runs", f"reward_components_{method}_s{seed}")


def config_for(method: str, seed: int):
    config = get_config()
    config.run_dir = run_dir(method, seed)
    config.seed = seed
    config.sft.steps = SFT_STEPS
    config.train.update(steps=STEPS, eval_every=EVAL_EVERY, checkpoint_every=STEPS)
    if method == "grpo":
        config.algorithm.update(name="grpo", reward_components=False)
        del config.algorithm["reward_components"], config.algorithm["weights"]
    elif method == "grpo_summed":
        config.algorithm = type(config.algorithm)(dict(name="grpo_summed"))
    return config


def _mean(records: list[dict], key: str) -> float | None:
    return sum(r[key] for r in records) / len(records) if key in records[0] else None


def summary() -> dict:
    """Held-out greedy accuracy at each evaluation and the mean sampled accuracy and
    components over the last 10 steps, per method and seed."""
    out = {}
    for method in METHODS:
        for seed in SEEDS:
            path = os.path.join(run_dir(method, seed), "metrics.jsonl")
            if not os.path.exists(path):
                continue
            records = [json.loads(line) for line in open(path)]
            last = [r for r in records if r["step"] > STEPS - 10]
            out[f"{method}/seed{seed}"] = {
                "eval_accuracy": {
                    r["step"]: r["eval/accuracy"] for r in records if "eval/accuracy" in r
                },
                "sampled_accuracy_last10": _mean(last, "accuracy"),
                "digits_last10": _mean(last, "reward/digits"),
                "length_last10": _mean(last, "reward/length"),
            }
    return out


def main(argv):
    del argv
    if flags.FLAGS.summary:
        results = summary()
        with open(RESULTS, "w") as f:
            json.dump(results, f, indent=1)
        print(json.dumps(results, indent=1))
        return
    from rljax.train.loop import train

    register_algorithm("grpo_summed", grpo_summed)
    train(config_for(flags.FLAGS.method, flags.FLAGS.seed))


if __name__ == "__main__":
    app.run(main)

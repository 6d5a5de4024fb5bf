"""The host-side samplers on the addition task, side by side: uniform prompts, HeaPA, DARE and
the curriculum (prompt selection), FreshPER (group replay) and LoPE (all-fail rescue).

Each run is the `make train` recipe (SFT warm start, then GRPO) with one sampler on; the
selectors draw from the same pool of the train split's first prompts. Writes a summary and the
per-step curves to a JSON file and prints the summary.

Usage: python -m scripts.compare_samplers [--steps 200] [--pool 512] [--only dare,lope] [--out FILE]
"""

import argparse
import json
import tempfile

import numpy as np

from configs.grpo_addition import get_config
from rljax.train.loop import train

# name -> (prompt_selection.name, replay.name, lope.num_perturbed)
VARIANTS = {
    "uniform": ("none", "none", 0),
    "heapa": ("heapa", "none", 0),
    "dare": ("dare", "none", 0),
    "curriculum": ("curriculum", "none", 0),
    "fresh_per": ("none", "fresh_per", 0),
    "lope": ("none", "none", 4),
}


def run(variant: str, steps: int, pool: int) -> list[dict]:
    selection, replay, perturbed = VARIANTS[variant]
    config = get_config()
    config.task.update(max_digits=3, max_prompt_len=10)  # three levels for the curriculum
    config.train.steps = steps
    config.train.eval_every = max(steps // 4, 1)
    config.train.checkpoint_every = steps
    config.prompt_selection.update(name=selection, pool_size=pool if selection != "none" else 0)
    config.replay.name = replay
    config.lope.num_perturbed = perturbed
    config.run_dir = tempfile.mkdtemp(prefix=f"rljax_sampler_{variant}_")
    return train(config)


def summary(records: list[dict]) -> dict:
    evals = [(r["step"], r["eval/accuracy"]) for r in records if "eval/accuracy" in r]
    rl = [r for r in records if r["step"] > 0 and "reward/mean" in r]
    return {
        "eval_accuracy": evals,
        "batch_reward_first_last_20": [
            float(np.mean([r["reward/mean"] for r in rl[:20]])),
            float(np.mean([r["reward/mean"] for r in rl[-20:]])),
        ],
        "informative_groups": float(np.mean([1 - r["advantages/zero_std_frac"] for r in rl])),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--pool", type=int, default=512)
    parser.add_argument("--only", default=",".join(VARIANTS), help="comma-separated variants")
    parser.add_argument("--out", default="benchmarks/results/samplers.json")
    args = parser.parse_args()
    results = {v: run(v, args.steps, args.pool) for v in args.only.split(",")}
    table = {v: summary(r) for v, r in results.items()}
    keys = (
        "step",
        "reward/mean",
        "entropy",
        "eval/accuracy",
        "selection/frontier",
        "lope/rescued_groups",
    )
    curves = {s: [{k: r[k] for k in keys if k in r} for r in rs] for s, rs in results.items()}
    with open(args.out, "w") as f:
        json.dump({"summary": table, "curves": curves}, f)
    print(json.dumps(table, indent=1))

"""Diffusion-LM RL algorithms on the tiny addition recipe (`configs/diffusion_lm.py`), compared.

Each (algorithm, seed) is one run of the driver (`rljax.train.train`: SFT warm start, then RL,
with its metrics.jsonl and checkpoints under `--runs`). The SFT stage depends only on the seed
(model init, data order, masks), so every algorithm of a seed starts RL from the same SFT
policy, whose held-out accuracy is the step-0 evaluation. Writes the per-step held-out
accuracy of every run, the config, the wall times and the machine to a JSON file. Accuracies
are greedy exact-match rates on `task.eval_size` held-out problems; their standard error is
sqrt(p (1 - p) / n).

Usage: python -m scripts.compare_diffusion [--algorithms diffu_grpo,rldf] [--seeds 0,1]
  [--steps N] [--sft-steps N] [--runs runs/compare_diffusion]
  [--out benchmarks/results/diffusion.json]
"""

import argparse
import json
import os
import platform
import shutil
import time

import jax
import numpy as np

from configs.diffusion_lm import get_config
from rljax.config import validate_config
from rljax.train import train


def standard_error(accuracy: float, n: int) -> float:
    """Binomial standard error of an accuracy measured on n problems."""
    return float(np.sqrt(accuracy * (1.0 - accuracy) / n))


def machine() -> dict:
    """What the numbers were measured on."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
    }


def compare(config, algorithms: list[str], seeds: list[int], runs_dir: str) -> dict:
    """Every (algorithm, seed) run of `config`; the JSON-ready results."""
    n = config.task.eval_size
    runs, sft = {}, {}
    for seed in seeds:
        for algorithm in algorithms:
            run_dir = os.path.join(runs_dir, f"{algorithm}_seed{seed}")
            shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run, not a resume
            run_config = config.copy_and_resolve_references()
            run_config.update(seed=seed, run_dir=run_dir)
            run_config.algorithm.name = algorithm
            start = time.time()
            records = train(run_config)
            seconds = time.time() - start
            curve = [[r["step"], r["eval/accuracy"]] for r in records if "eval/accuracy" in r]
            sft_accuracy, final = curve[0][1], curve[-1][1]
            sft[seed] = sft_accuracy  # the same for every algorithm of the seed
            runs[f"{algorithm}/seed{seed}"] = {
                "algorithm": algorithm,
                "seed": seed,
                "eval_accuracy": curve,
                "final_accuracy": final,
                "final_standard_error": standard_error(final, n),
                "reward_mean": [r["reward/mean"] for r in records if "reward/mean" in r],
                "wall_seconds": seconds,
            }
            print(
                f"{algorithm} seed {seed}: held-out {sft_accuracy:.3f} (SFT) -> {final:.3f} +- "
                f"{standard_error(final, n):.3f} ({seconds:.0f} s)",
                flush=True,
            )
    summary = {}
    for algorithm in algorithms:
        finals = [r["final_accuracy"] for r in runs.values() if r["algorithm"] == algorithm]
        mean = float(np.mean(finals))
        summary[algorithm] = {
            "final_accuracy_per_seed": finals,
            "final_accuracy_mean": mean,
            # Eval noise of the seed mean (binomial, len(seeds) * n problems).
            "final_standard_error": standard_error(mean, n * len(finals)),
            "gain_over_sft": mean - float(np.mean(list(sft.values()))),
        }
    return {
        "summary": {"sft_accuracy_per_seed": sft, "eval_size": n, **summary},
        "runs": runs,
        "config": config.to_dict(),
        "seeds": seeds,
        "machine": machine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", default="diffu_grpo,rldf", help="comma-separated")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds")
    parser.add_argument("--steps", type=int, default=None, help="RL steps (config default)")
    parser.add_argument("--sft-steps", type=int, default=None, help="SFT steps (config default)")
    parser.add_argument("--runs", default="runs/compare_diffusion", help="run directories")
    parser.add_argument("--out", default="benchmarks/results/diffusion.json")
    args = parser.parse_args()
    config = get_config()
    if args.steps is not None:
        config.train.steps = args.steps
    if args.sft_steps is not None:
        config.sft.steps = args.sft_steps
    validate_config(config)  # before the first run: a bad override fails at once
    algorithms = args.algorithms.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    results = compare(config, algorithms, seeds, args.runs)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results["summary"], indent=1))


if __name__ == "__main__":
    main()

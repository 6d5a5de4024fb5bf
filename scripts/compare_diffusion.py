"""diffu-GRPO vs RLDF on the tiny diffusion-LM addition recipe, from one shared SFT checkpoint.

Runs the SFT warm start of `configs/diffusion_lm.py` once, then RL with each method from that
same checkpoint for each seed (the seed sets the RL prompt order, the rollout and mask keys;
the SFT policy and the held-out prompts are shared), and writes the per-step held-out accuracy
of every run, the config, the wall times and the machine to a JSON file. Accuracies are greedy
exact-match rates on `eval_size` held-out problems; their standard error is sqrt(p (1 - p) / n).

Usage: python -m scripts.compare_diffusion [--seeds 0,1] [--steps N] [--sft-steps N]
  [--out benchmarks/results/diffusion.json]
"""

import argparse
import dataclasses
import json
import os
import platform
import time

import jax
import numpy as np

from configs.diffusion_lm import get_config
from rljax.diffusion.train import ALGORITHMS, DiffusionRLConfig, rl_stage, sft_stage


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


def compare(config: DiffusionRLConfig, seeds: list[int]) -> dict:
    """SFT once, then every (algorithm, seed) RL run from it; the JSON-ready results."""
    n = config.eval_size
    start = time.time()
    setup, sft_params, sft_records = sft_stage(config)
    sft_seconds = time.time() - start
    sft_accuracy = sft_records[-1]["eval/accuracy"]
    print(
        f"SFT: held-out {sft_accuracy:.3f} +- {standard_error(sft_accuracy, n):.3f} "
        f"({sft_seconds:.0f} s)",
        flush=True,
    )
    runs = {}
    for algorithm in ALGORITHMS:
        for seed in seeds:
            start = time.time()
            rl_config = dataclasses.replace(config, algorithm=algorithm, seed=seed)
            _, records = rl_stage(setup, sft_params, rl_config)
            curve = [[0, sft_accuracy]] + [
                [r["step"], r["eval/accuracy"]] for r in records if "eval/accuracy" in r
            ]
            final = curve[-1][1]
            runs[f"{algorithm}/seed{seed}"] = {
                "algorithm": algorithm,
                "seed": seed,
                "eval_accuracy": curve,
                "final_accuracy": final,
                "final_standard_error": standard_error(final, n),
                "reward_mean": [r["reward/mean"] for r in records],
                "wall_seconds": time.time() - start,
            }
            print(
                f"{algorithm} seed {seed}: held-out {sft_accuracy:.3f} -> {final:.3f} +- "
                f"{standard_error(final, n):.3f} ({time.time() - start:.0f} s)",
                flush=True,
            )
    summary = {}
    for algorithm in ALGORITHMS:
        finals = [r["final_accuracy"] for r in runs.values() if r["algorithm"] == algorithm]
        mean = float(np.mean(finals))
        summary[algorithm] = {
            "final_accuracy_per_seed": finals,
            "final_accuracy_mean": mean,
            # Eval noise of the seed mean (binomial, len(seeds) * n problems).
            "final_standard_error": standard_error(mean, n * len(finals)),
            "gain_over_sft": mean - sft_accuracy,
        }
    return {
        "summary": {
            "sft_accuracy": sft_accuracy,
            "sft_standard_error": standard_error(sft_accuracy, n),
            "eval_size": n,
            **summary,
        },
        "sft": {"records": sft_records, "wall_seconds": sft_seconds},
        "runs": runs,
        "config": dataclasses.asdict(config),
        "seeds": seeds,
        "machine": machine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1", help="comma-separated RL seeds")
    parser.add_argument("--steps", type=int, default=None, help="RL steps (config default)")
    parser.add_argument("--sft-steps", type=int, default=None, help="SFT steps (config default)")
    parser.add_argument("--out", default="benchmarks/results/diffusion.json")
    args = parser.parse_args()
    config = DiffusionRLConfig(**get_config().to_dict())
    overrides = {"steps": args.steps, "sft_steps": args.sft_steps}
    config = dataclasses.replace(config, **{k: v for k, v in overrides.items() if v is not None})
    seeds = [int(s) for s in args.seeds.split(",")]
    results = compare(config, seeds)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results["summary"], indent=1))


if __name__ == "__main__":
    main()

"""The on-policy saving of `train.old_logprobs="auto"`: prepare + update, "auto" vs "recompute".

One GRPO step (`steps.prepare` then `steps.update`, one epoch, one minibatch) on a fixed batch
of random tokens (every token real) for the d512 x 8-layer model of `benchmarks.update`.
"recompute" runs the pre-update policy's forward pass in prepare; on-policy "auto" takes the old
log-probs from the update's own forward pass (detached), so prepare runs no policy pass. The two
modes alternate, each repeat timing both, and the reported ratio is the median over repeats of
recompute time / auto time (a busy machine slows both sides of a pair alike). The losses and
parameters after the step agree to float32 rounding (checked here too; tested in
tests/train/test_old_policy.py).

  python -m benchmarks.old_logprobs            # the README numbers (a few minutes on 2 cores)
  python -m benchmarks.old_logprobs --quick    # tiny sizes, a smoke test

Writes a JSON report (default benchmarks/results/old_logprobs.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import optax

from benchmarks.rollout import cpu_model
from benchmarks.update import SIZES, Case, grpo_batch
from rljax.algorithms import grpo
from rljax.core.state import init_train_state
from rljax.models.transformer import create_model
from rljax.train.steps import RolloutConfig, UpdateConfig, make_steps

MODES = ("recompute", "auto")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, a smoke test")
    parser.add_argument("--repeats", type=int, default=5, help="timed (recompute, auto) pairs")
    parser.add_argument("--out", default="benchmarks/results/old_logprobs.json")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    size = "tiny" if args.quick else "large"
    shape = (
        dict(batch=4, prompt=8, completion=16)
        if args.quick
        else dict(batch=8, prompt=64, completion=128)
    )
    cfg = SIZES[size]
    case = Case(size, **shape, update=UpdateConfig())
    graphdef, params = create_model(cfg, seed=0)
    algorithm = grpo(group_size=4)
    optimizer = optax.adamw(1e-5)
    rollout = RolloutConfig(max_new_tokens=case.completion, n_samples=4, eos_id=-1, pad_id=0)
    batch = grpo_batch(case, cfg.vocab_size)
    state = init_train_state(params, optimizer, algorithm.transform, jax.random.PRNGKey(0))
    steps = {
        mode: make_steps(
            graphdef,
            optimizer,
            algorithm,
            rollout,
            UpdateConfig(vocab_chunk=min(8192, cfg.vocab_size), old_logprobs=mode),
        )
        for mode in MODES
    }

    def step(mode: str):
        fresh = jax.tree.map(jnp.copy, state)  # the update donates its state
        jax.block_until_ready(fresh)
        start = time.perf_counter()
        prepared_state, prepared, _ = steps[mode].prepare(fresh, batch)
        new_state, metrics = steps[mode].update(prepared_state, prepared)
        jax.block_until_ready((new_state.params, metrics))
        return time.perf_counter() - start, new_state, metrics

    results = {mode: step(mode) for mode in MODES}  # compile + warm up
    loss = {mode: float(results[mode][2]["loss"]) for mode in MODES}
    max_param_diff = max(
        float(jnp.abs(a - b).max())
        for a, b in zip(
            jax.tree.leaves(results["auto"][1].params),
            jax.tree.leaves(results["recompute"][1].params),
        )
    )
    times = {mode: [] for mode in MODES}
    for i in range(args.repeats):
        order = MODES if i % 2 == 0 else MODES[::-1]  # alternate which goes first
        for mode in order:
            times[mode].append(step(mode)[0])
    ratios = [r / a for r, a in zip(times["recompute"], times["auto"])]
    report = {
        "what": "GRPO prepare + update, one epoch x one minibatch, train.old_logprobs",
        "model": {
            "size": size,
            "d_model": cfg.d_model,
            "n_layers": cfg.n_layers,
            "vocab_size": cfg.vocab_size,
        },
        "batch": shape,
        "seconds": {mode: times[mode] for mode in MODES},
        "median_seconds": {mode: statistics.median(times[mode]) for mode in MODES},
        "recompute_over_auto_median": statistics.median(ratios),
        "ratios": ratios,
        "loss": loss,
        "max_abs_param_diff": max_param_diff,
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "loadavg_1m_at_end": os.getloadavg()[0],
            "platform": platform.platform(),
            "jax": jax.__version__,
            "backend": jax.default_backend(),
        },
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    print(
        f"{size}: recompute {report['median_seconds']['recompute']:.2f} s, "
        f"auto {report['median_seconds']['auto']:.2f} s, "
        f"ratio {report['recompute_over_auto_median']:.2f}x "
        f"(loss {loss['recompute']:.6f} vs {loss['auto']:.6f}, "
        f"max |param diff| {max_param_diff:.2e}); wrote {args.out}"
    )


if __name__ == "__main__":
    main()

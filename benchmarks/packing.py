"""Sequence packing in the update step: time with and without, on ragged completions.

RL completions vary in length; rows padded to the longest waste the trainer's compute on
padding. This times `steps.update` (with its forward passes packed into
ceil(pack_ratio x rows) rows, `train.pack_ratio`) against the unpacked update on the same batch,
side by side in one process, alternating, median of repeats. The batch's completion lengths
are uniform in [T/8, T] (seeded), prompts of varied length too.

  python -m benchmarks.packing

Writes benchmarks/results/packing.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import numpy as np
import optax

from benchmarks.rollout import machine
from rljax.algorithms import grpo
from rljax.core.batch import make_batch
from rljax.core.state import init_train_state
from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model
from rljax.train.packing import pack_plan
from rljax.train.steps import RolloutConfig, UpdateConfig, make_steps

GROUP = 4


def ragged_batch(rows: int, prompt: int, completion: int, vocab: int, seed: int = 0):
    """A GRPO batch whose prompt lengths are uniform in [P/4, P] and completion lengths in
    [T/8, T]."""
    rng = np.random.default_rng(seed)
    plen = rng.integers(prompt // 4, prompt + 1, rows)
    clen = rng.integers(completion // 8, completion + 1, rows)
    prompt_mask = np.arange(prompt)[None, :] >= prompt - plen[:, None]
    completion_mask = np.arange(completion)[None, :] < clen[:, None]
    return make_batch(
        np.where(prompt_mask, rng.integers(3, vocab, (rows, prompt)), 0),
        prompt_mask,
        np.where(completion_mask, rng.integers(3, vocab, (rows, completion)), 0),
        completion_mask,
        np.arange(rows) // GROUP,
        rng.integers(0, 2, rows).astype(np.float32),
    )


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--completion", type=int, default=512)
    p.add_argument("--pack_ratio", type=float, default=0.75)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "packing.json")
    )
    args = p.parse_args(argv)
    cfg = TransformerConfig(
        vocab_size=8192,
        d_model=256,
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        d_ff=704,
        tie_embeddings=True,
    )
    graphdef, params = create_model(cfg, seed=0)
    algorithm, optimizer = grpo(group_size=GROUP), optax.adamw(1e-6)
    batch = ragged_batch(args.rows, args.prompt, args.completion, cfg.vocab_size)
    valid = np.concatenate([batch.prompt_mask, batch.completion_mask], axis=1)
    updates, states = {}, {}
    for ratio in (0.0, args.pack_ratio):
        state = init_train_state(params, optimizer, algorithm.transform, jax.random.key(0))
        rollout = RolloutConfig(args.completion, GROUP, eos_id=-1, pad_id=0)
        steps = make_steps(graphdef, optimizer, algorithm, rollout, UpdateConfig(pack_ratio=ratio))
        state, prepared, _ = steps.prepare(state, batch)
        updates[ratio] = (steps.update.lower(state, prepared).compile(), prepared)
        states[ratio] = state
    fits = bool(pack_plan(valid, int(np.ceil(args.pack_ratio * args.rows))).fits)
    times = {ratio: [] for ratio in updates}
    for _ in range(args.repeats):
        for ratio, (update, prepared) in updates.items():
            start = time.perf_counter()
            states[ratio], metrics = update(states[ratio], prepared)
            jax.block_until_ready(metrics["loss"])
            times[ratio].append(time.perf_counter() - start)
    median = {ratio: statistics.median(t) for ratio, t in times.items()}
    report = dict(
        benchmark="packing",
        args=vars(args),
        padding_frac=float(1 - valid.mean()),
        fits=fits,
        times_s={str(k): v for k, v in times.items()},
        median_s={str(k): v for k, v in median.items()},
        speedup=median[0.0] / median[args.pack_ratio],
        machine=machine(),
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"padding {report['padding_frac']:.0%} of the batch; packed rows fit: {fits}")
    print("| update | median s |\n|---|---|")
    for ratio, s in median.items():
        print(f"| pack_ratio={ratio} | {s:.3f} |")
    print(f"speedup {report['speedup']:.2f}x")
    return report


if __name__ == "__main__":
    main()

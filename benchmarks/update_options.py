"""The SmolLM2 recipe's update compiled with and without the XLA:CPU dot fusions, alternating.

One process builds the recipe's update twice (`configs/grpo_smollm2_arith.py` shapes: 32 rows of
72 prompt + 48 completion positions after trimming, 4 micro-batches, AdamW, GRPO, float32) from
the registry checkpoint: once with `rljax.train.compile_options.update_compiler_options("cpu")`
(what `make_steps` uses) and once with XLA's defaults. It then times the two in turn for
`--rounds` rounds, each timing next to the matmul probe of `perf/mfu`, so a busy machine moves
both sides alike. Random tokens, all real; random rewards. Like the launcher, it restarts
itself with huge pages (`rljax/launch/huge_pages.py`).

  .venv/bin/rljax fetch smollm2                    # the checkpoint, once
  python -m benchmarks.update_options             # about 6 minutes on 2 cores

Writes benchmarks/results/update_options.json and prints the medians and their ratio.
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
from rljax.launch.huge_pages import restart_with_huge_pages
from rljax.metrics.flops import MatmulProbe, model_flops
from rljax.models import load_gguf
from rljax.models.fetch import fetch_smollm2
from rljax.train import steps as steps_module
from rljax.train.compile_options import update_compiler_options
from rljax.train.steps import RolloutConfig, UpdateConfig, make_steps

ROWS, PROMPT, COMPLETION, GROUP, MICROBATCHES = 32, 72, 48, 4, 4


def compiled_update(cfg, graphdef, params, options, batch):
    """(compiled update, prepared state, prepared batch) with the given compile options."""
    original = steps_module.update_compiler_options
    steps_module.update_compiler_options = lambda platform: options
    try:
        algorithm, optimizer = grpo(group_size=GROUP), optax.adamw(5e-6)
        steps = make_steps(
            graphdef,
            optimizer,
            algorithm,
            RolloutConfig(COMPLETION, GROUP, eos_id=-1, pad_id=0),
            UpdateConfig(microbatches=MICROBATCHES),
        )
    finally:
        steps_module.update_compiler_options = original
    state = init_train_state(params, optimizer, algorithm.transform, jax.random.key(0))
    state, batch, _ = steps.prepare(state, batch)
    return steps.update.lower(state, batch).compile(), state, batch


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "update_options.json")
    )
    args = p.parse_args(argv)
    cfg, graphdef, params = load_gguf(fetch_smollm2(), dtype="float32")
    rng = np.random.default_rng(0)
    batch = make_batch(
        rng.integers(1, cfg.vocab_size, (ROWS, PROMPT)),
        np.ones((ROWS, PROMPT), bool),
        rng.integers(1, cfg.vocab_size, (ROWS, COMPLETION)),
        np.ones((ROWS, COMPLETION), bool),
        np.repeat(np.arange(ROWS // GROUP), GROUP),
        rng.random(ROWS),
    )
    sides = {"dot_fusions": update_compiler_options("cpu"), "xla_default": None}
    if sides["dot_fusions"] is None:
        raise SystemExit("this jaxlib's CPU compiler does not take the dot-fusion option")
    runs = {
        name: list(compiled_update(cfg, graphdef, params, o, batch)) for name, o in sides.items()
    }
    probe = MatmulProbe(ROWS // MICROBATCHES * (PROMPT + COMPLETION), cfg.d_model)
    flops = model_flops(cfg, ROWS, PROMPT, COMPLETION)["model"]
    times = {name: [] for name in runs}
    mfu = {name: [] for name in runs}
    for _ in range(args.rounds + 1):  # the first round warms up and is dropped
        for name, run in runs.items():
            peak = probe.flops_per_s()
            start = time.perf_counter()
            run[1], metrics = run[0](run[1], run[2])
            jax.block_until_ready(metrics["loss"])
            times[name].append(time.perf_counter() - start)
            mfu[name].append(flops / times[name][-1] / peak)
    report = dict(
        benchmark="update_options",
        options=sides["dot_fusions"],
        shape=dict(rows=ROWS, prompt=PROMPT, completion=COMPLETION, microbatches=MICROBATCHES),
        seconds={k: v[1:] for k, v in times.items()},
        mfu={k: v[1:] for k, v in mfu.items()},
        median_s={k: statistics.median(v[1:]) for k, v in times.items()},
        median_mfu={k: statistics.median(v[1:]) for k, v in mfu.items()},
        load_average=os.getloadavg(),
        machine=machine(),
    )
    report["speedup"] = report["median_s"]["xla_default"] / report["median_s"]["dot_fusions"]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    for name in runs:
        print(
            f"{name:12s} median {report['median_s'][name]:.2f} s, "
            f"MFU {report['median_mfu'][name]:.3f}"
        )
    print(f"speedup {report['speedup']:.3f}x; wrote {args.out}")
    return report


if __name__ == "__main__":
    restart_with_huge_pages()  # as the launcher runs: XLA:CPU's buffers on huge pages
    main()

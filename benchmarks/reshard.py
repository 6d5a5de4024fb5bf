"""Weight resharding from the trainer's mesh to the sampler's, timed (`mesh.sampler_devices`).

The trainer keeps the policy FSDP-sharded over its devices; the sampler gets a replicated copy
on its own devices every step (`rljax.train.sampler_mesh.SamplerDevices.reshard`). This times
that move for a few model sizes, as bytes moved per second, on this machine's (fake, CPU)
devices; on accelerators it is an interconnect copy.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m benchmarks.reshard

Writes benchmarks/results/reshard.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import jax
import optax

from benchmarks.rollout import machine
from rljax.algorithms import grpo
from rljax.core.state import init_train_state
from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model
from rljax.parallel.mesh import make_mesh
from rljax.parallel.rules import mesh_shardings, shard_params
from rljax.train.sampler_mesh import SamplerDevices
from rljax.train.steps import RolloutConfig

SIZES = {"d256x4": (256, 4, 704), "d512x8": (512, 8, 1408), "d1024x8": (1024, 8, 2816)}


def time_reshard(d_model: int, layers: int, d_ff: int, sampler: int, repeats: int) -> dict:
    """Median seconds of `reshard` for one model size, and the bytes of its parameters."""
    cfg = TransformerConfig(
        vocab_size=32000,
        d_model=d_model,
        n_layers=layers,
        n_heads=d_model // 64,
        n_kv_heads=max(d_model // 256, 1),
        d_ff=d_ff,
        tie_embeddings=True,
    )
    devices = jax.devices()
    graphdef, params = create_model(cfg, seed=0)
    trainer = make_mesh(1, -1, devices=devices[sampler:])
    params = shard_params(params, trainer)
    algorithm, optimizer = grpo(group_size=2), optax.adam(1e-3)
    state = init_train_state(params, optimizer, algorithm.transform, jax.random.PRNGKey(0))
    state = jax.device_put(state, mesh_shardings(state, trainer))
    rollout = RolloutConfig(max_new_tokens=1, n_samples=2, eos_id=1, pad_id=0)
    side = SamplerDevices(
        graphdef, optimizer, algorithm, rollout, make_mesh(-1, devices=devices[:sampler]), params
    )
    side.reshard(state)  # warm-up
    seconds = statistics.median(side.reshard(state)[1] for _ in range(repeats))
    size = sum(x.nbytes for x in jax.tree.leaves(params))
    return dict(param_bytes=size, seconds=seconds, gb_per_s=size / seconds / 1e9)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sampler_devices", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "reshard.json")
    )
    args = p.parse_args(argv)
    if len(jax.devices()) <= args.sampler_devices:
        raise SystemExit(
            f"{len(jax.devices())} devices; run with "
            "XLA_FLAGS=--xla_force_host_platform_device_count=8"
        )
    results = {
        name: time_reshard(*shape, args.sampler_devices, args.repeats)
        for name, shape in SIZES.items()
    }
    report = dict(benchmark="reshard", args=vars(args), results=results, machine=machine())
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print("| model | params MB | reshard s | GB/s |\n|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['param_bytes'] / 1e6:.0f} | {r['seconds']:.4f} | {r['gb_per_s']:.2f} |"
        )
    return report


if __name__ == "__main__":
    main()

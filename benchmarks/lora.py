"""LoRA on SmolLM2-135M-shaped models: the sampler merged vs unmerged, full vs LoRA updates, and
a short GRPO run with the LoRA recipe.

Parts (`--parts`, default all):
  sampler  rollout time with the adapters merged into the weights inside the jitted rollout
           (`lora.merge`, what the trainer's sampler does) vs applied unmerged
           (`lora.unmerged`: x W + scale (x A) B in every targeted projection), for a tiny and
           a SmolLM2-135M-shaped model with random weights; runs alternate, and the ratio is
           the median of per-pair ratios unmerged / merged.
  update   trainable parameters, peak memory of the update step (XLA's buffer assignment of
           the compiled step, as benchmarks/memory.py: argument + output - alias + temp) and
           update step time, full fine-tuning vs LoRA rank 16 on q/k/v/o, alternating, on the
           SmolLM2-135M shape with random weights (the shapes, not the values, set the cost).
  grpo     `configs/grpo_smollm2_arith_lora.py` (the real SmolLM2-135M-Instruct GGUF) for a
           few steps through the launcher; the per-step mean reward from its metrics file.

  python -m benchmarks.lora                      # all parts (tens of minutes on 2 busy cores)
  python -m benchmarks.lora --parts sampler --quick

Writes benchmarks/results/lora_smollm2.json (parts not run keep their previous entry). Run the
SmolLM2 parts one at a time: the update part holds the full model's weights and Adam moments
(~9 GB resident on CPU with compilation) and the GRPO run ~13 GB; together, on a shared 23 GB
machine, both were killed for memory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.update import machine
from rljax.algorithms import grpo
from rljax.core.batch import make_batch
from rljax.core.state import init_train_state
from rljax.models import lora
from rljax.models.config import TransformerConfig
from rljax.models.transformer import abstract_model
from rljax.rollout.sampler import generate
from rljax.train.steps import RolloutConfig, UpdateConfig, make_steps

SMOLLM2 = TransformerConfig(
    vocab_size=49152,
    d_model=576,
    n_layers=30,
    n_heads=9,
    n_kv_heads=3,
    d_ff=1536,
    tie_embeddings=True,
    rope_theta=100000.0,
)
TINY = TransformerConfig(
    vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, tie_embeddings=True
)
RANK, ALPHA, TARGETS = 16, 32.0, ("q", "k", "v", "o")
GROUP = 4
OUT = os.path.join(os.path.dirname(__file__), "results", "lora_smollm2.json")


def random_base(cfg: TransformerConfig, seed: int = 0):
    """(graphdef, params) of `cfg` with N(0, 0.02) weights (numpy; faster than create_model)."""
    graphdef, params = abstract_model(cfg)
    rng = np.random.default_rng(seed)
    params = jax.tree.map(
        lambda s: jnp.asarray((0.02 * rng.standard_normal(s.shape)).astype(np.float32)), params
    )
    return graphdef, params


def trained_adapters(base, seed: int = 1):
    """Rank-16 q/k/v/o adapters with A and B both random (as after some training)."""
    adapters = lora.init_adapters(base, RANK, TARGETS, jax.random.PRNGKey(seed))
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), len(jax.tree.leaves(adapters))))
    return jax.tree.map(lambda x: 0.02 * jax.random.normal(next(keys), x.shape), adapters)


def sampler(cfg: TransformerConfig, batch: int, prompt: int, new_tokens: int, repeats: int):
    """Rollout seconds, merged vs unmerged adapters (module docstring)."""
    graphdef, base = random_base(cfg)
    adapters, scale = trained_adapters(base), jnp.float32(ALPHA / RANK)
    tokens = jnp.asarray(np.random.default_rng(0).integers(2, cfg.vocab_size, (batch, prompt)))
    mask = jnp.ones((batch, prompt), bool)
    kwargs = dict(max_new_tokens=new_tokens, eos_id=-1, pad_id=0)

    def rollout(params_of):
        def run(base, adapters, key):
            params = params_of(base, adapters, scale)
            return generate(graphdef, params, tokens, mask, key, **kwargs).completion_tokens

        return jax.jit(run)

    fns = {"merged": rollout(lora.merge), "unmerged": rollout(lora.unmerged)}
    compile_s = {}
    for name, fn in fns.items():
        start = time.perf_counter()
        jax.block_until_ready(fn(base, adapters, jax.random.PRNGKey(0)))
        compile_s[name] = time.perf_counter() - start
    times = {name: [] for name in fns}
    for i in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(base, adapters, jax.random.PRNGKey(i)))
            times[name].append(time.perf_counter() - start)
    ratios = [u / m for u, m in zip(times["unmerged"], times["merged"])]
    return dict(
        model=dict(d_model=cfg.d_model, n_layers=cfg.n_layers, vocab=cfg.vocab_size),
        batch=batch,
        prompt_tokens=prompt,
        new_tokens=new_tokens,
        first_call_s=compile_s,
        merged_s=statistics.median(times["merged"]),
        unmerged_s=statistics.median(times["unmerged"]),
        unmerged_over_merged=statistics.median(ratios),
        times=times,
    )


def _update_setup(cfg: TransformerConfig, use_lora: bool, rows: int, prompt: int, completion: int):
    """(steps, state, batch) of a GRPO update on random weights: full fine-tuning, or rank-16
    q/k/v/o adapters over the frozen base."""
    graphdef, base = random_base(cfg)
    algorithm, optimizer = grpo(group_size=GROUP), optax.adamw(1e-5)
    params, frozen = base, None
    if use_lora:
        frozen = lora.frozen_base(base, RANK, ALPHA)
        params = lora.init_adapters(base, RANK, TARGETS, jax.random.PRNGKey(0))
    state = init_train_state(
        params, optimizer, algorithm.transform, jax.random.PRNGKey(0), base=frozen
    )
    rollout = RolloutConfig(completion, GROUP, eos_id=-1, pad_id=0)
    steps = make_steps(graphdef, optimizer, algorithm, rollout, UpdateConfig(vocab_chunk=16384))
    rng = np.random.default_rng(0)
    tokens = lambda n: jnp.asarray(rng.integers(2, cfg.vocab_size, (rows, n)), jnp.int32)  # noqa: E731
    ones = lambda n: jnp.ones((rows, n), bool)  # noqa: E731
    ids = jnp.arange(rows) // GROUP
    rewards = jnp.asarray(rng.integers(0, 2, rows), jnp.float32)
    batch = make_batch(
        tokens(prompt), ones(prompt), tokens(completion), ones(completion), ids, rewards
    )
    state, batch, _ = steps.prepare(state, batch)
    return steps, state, batch


def update(cfg: TransformerConfig, rows: int, prompt: int, completion: int, repeats: int):
    """Trainable parameters, peak update memory and update seconds, full vs LoRA."""
    setups = {
        name: _update_setup(cfg, name == "lora", rows, prompt, completion)
        for name in ("full", "lora")
    }
    out = {}
    for name, (steps, state, batch) in setups.items():
        start = time.perf_counter()
        compiled = steps.update.lower(state, batch).compile()  # timed below: no second compile
        compile_s = time.perf_counter() - start
        stats = compiled.memory_analysis()
        peak = (
            stats.argument_size_in_bytes
            + stats.output_size_in_bytes
            - stats.alias_size_in_bytes
            + stats.temp_size_in_bytes
        )
        state = jax.block_until_ready(compiled(state, batch)[0])  # the old one is donated
        setups[name] = (compiled, state, batch)
        out[name] = dict(
            trainable_params=lora.count(state.params),
            optimizer_state_params=lora.count(state.opt_state),
            peak_bytes=peak,
            argument_bytes=stats.argument_size_in_bytes,
            temp_bytes=stats.temp_size_in_bytes,
            compile_s=compile_s,
            times=[],
        )
    for _ in range(repeats):
        for name, (compiled, state, batch) in setups.items():
            start = time.perf_counter()
            state = jax.block_until_ready(compiled(state, batch)[0])
            out[name]["times"].append(time.perf_counter() - start)
            setups[name] = (compiled, state, batch)
    for row in out.values():
        row["update_s"] = statistics.median(row["times"])
    pairs = zip(out["lora"]["times"], out["full"]["times"])
    return dict(
        model=dict(d_model=cfg.d_model, n_layers=cfg.n_layers, vocab=cfg.vocab_size),
        rows=rows,
        prompt_tokens=prompt,
        completion_tokens=completion,
        adapters=dict(rank=RANK, alpha=ALPHA, targets=TARGETS),
        **out,
        lora_over_full_time=statistics.median(lo / fu for lo, fu in pairs),
        lora_over_full_peak=out["lora"]["peak_bytes"] / out["full"]["peak_bytes"],
    )


def grpo_run(steps: int) -> dict:
    """`configs/grpo_smollm2_arith_lora.py` for `steps` steps through the launcher: the
    per-step mean reward and step time from its metrics.jsonl."""
    with tempfile.TemporaryDirectory() as run_dir:
        command = [
            sys.executable,
            "-m",
            "launchers.train",
            "--config=configs/grpo_smollm2_arith_lora.py",
            f"--config.run_dir={run_dir}",
            f"--config.train.steps={steps}",
        ]
        start = time.perf_counter()
        subprocess.run(command, check=True)
        wall = time.perf_counter() - start
        with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as fh:
            records = [json.loads(line) for line in fh]
    per_step = [r for r in records if "reward/mean" in r]
    rewards = [r["reward/mean"] for r in per_step]
    half = len(rewards) // 2
    return dict(
        config="configs/grpo_smollm2_arith_lora.py",
        steps=steps,
        wall_s=wall,
        reward_mean=rewards,
        first_half_mean=statistics.mean(rewards[:half]),
        second_half_mean=statistics.mean(rewards[half:]),
        kl_to_ref=[r.get("kl_to_ref") for r in per_step],
        trainable_params=per_step[-1].get("lora/trainable_params"),
        base_params=per_step[-1].get("lora/base_params"),
        step_s=[r.get("time/step_s") for r in per_step],
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="sampler,update,grpo", help="comma-separated parts")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--grpo-steps", type=int, default=10)
    p.add_argument("--out", default=OUT)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    parts = args.parts.split(",")
    report = {}
    if os.path.isfile(args.out):
        with open(args.out, encoding="utf-8") as fh:
            report = json.load(fh)
    if "sampler" in parts:
        shapes = [(TINY, 8, 16, 32)] + ([] if args.quick else [(SMOLLM2, 8, 32, 48)])
        report["sampler"] = [sampler(cfg, *shape, args.repeats) for cfg, *shape in shapes]
        for row in report["sampler"]:
            print(
                f"sampler d{row['model']['d_model']} x{row['model']['n_layers']}: merged "
                f"{row['merged_s']:.3f} s, unmerged {row['unmerged_s']:.3f} s, ratio "
                f"{row['unmerged_over_merged']:.2f}"
            )
    if "update" in parts:
        cfg, shape = (TINY, (8, 16, 16)) if args.quick else (SMOLLM2, (8, 64, 48))
        report["update"] = row = update(cfg, *shape, args.repeats)
        print(
            f"update: trainable {row['full']['trainable_params']} -> "
            f"{row['lora']['trainable_params']}, peak {row['full']['peak_bytes'] / 2**20:.0f} -> "
            f"{row['lora']['peak_bytes'] / 2**20:.0f} MiB, time {row['full']['update_s']:.2f} -> "
            f"{row['lora']['update_s']:.2f} s (ratio {row['lora_over_full_time']:.2f})"
        )
    if "grpo" in parts:
        report["grpo"] = row = grpo_run(args.grpo_steps)
        print(f"grpo: reward/mean per step {row['reward_mean']}")
    report["machine"] = machine()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=2)
    return report


if __name__ == "__main__":
    main()

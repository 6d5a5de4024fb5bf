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

Writes benchmarks/results/lora_smollm2.json (parts not run keep their previous entry).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.update import machine
from rljax.models import lora
from rljax.models.config import TransformerConfig
from rljax.models.transformer import abstract_model
from rljax.rollout.sampler import generate

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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="sampler,update,grpo", help="comma-separated parts")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    p.add_argument("--repeats", type=int, default=5)
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
    report["machine"] = machine()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=2)
    return report


if __name__ == "__main__":
    main()

"""Peak memory of the update step as the completion length T doubles, from XLA's buffer assignment.

Nothing runs: `steps.update` is lowered on abstract arguments (shapes only) and compiled, and
`compiled.memory_analysis()` gives the buffer sizes XLA assigned on this backend:
  peak = argument + output - alias + temp
(`alias` is the donated train state, counted once; JAX 0.10's `peak_memory_in_bytes` is also
recorded). The numbers are deterministic for a given JAX version and backend.

Settings, each for T = 256, 512, 1024, 2048 with a fixed small model and batch:
  - vocab_chunk = vocab (the [B, T, V] logits exist at once) vs a small vocab_chunk;
  - microbatches 1 vs 4 at the small vocab_chunk.
The growth ratio peak(2T) / peak(T) is 2 for memory linear in T and 4 for quadratic; the
exponent log(ratio) / log(2) reads the same way. The two terms that can dominate are computed
alongside: the attention scores the model keeps for the backward pass, n_layers x
[B / micro, n_heads, S, S] float32 (S = P + T, quadratic), and one chunk of logits,
[B / micro, T, vocab_chunk] float32 (linear in T).

  python -m benchmarks.memory            # the README numbers (about 2 minutes on 2 cores)
  python -m benchmarks.memory --quick    # tiny sizes, a smoke test

Writes a JSON report (default benchmarks/results/memory.json) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import optax

from benchmarks.rollout import machine
from rljax.algorithms import grpo
from rljax.core.batch import make_batch
from rljax.core.state import init_train_state
from rljax.models.config import TransformerConfig
from rljax.models.transformer import abstract_model
from rljax.train.steps import RolloutConfig, UpdateConfig, make_steps

GROUP_SIZE = 4
FULL = dict(
    model=TransformerConfig(
        vocab_size=32000,
        d_model=256,
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        d_ff=704,
        tie_embeddings=True,
    ),
    batch=8,
    prompt=64,
    lengths=(256, 512, 1024, 2048),
    small_chunk=2048,
    attention_chunk=256,
)
QUICK = dict(
    model=TransformerConfig(
        vocab_size=512,
        d_model=32,
        n_layers=1,
        n_heads=2,
        n_kv_heads=1,
        d_ff=64,
        tie_embeddings=True,
    ),
    batch=4,
    prompt=8,
    lengths=(16, 32),
    small_chunk=128,
    attention_chunk=8,
)


def growth(lengths: Sequence[int], peaks: Sequence[float]) -> list[dict]:
    """Memory growth between consecutive lengths.

    Args:
      lengths: increasing completion lengths T_0 < T_1 < ...
      peaks: the memory at each length.

    Returns:
      one dict per step i -> i + 1 with "from", "to", "ratio" = peaks[i+1] / peaks[i] and
      "exponent" = log(ratio) / log(T_{i+1} / T_i) (1: linear, 2: quadratic).
    """
    if len(lengths) != len(peaks) or len(lengths) < 2:
        raise ValueError(
            f"need two or more (length, peak) pairs of equal count, got {len(lengths)} lengths "
            f"and {len(peaks)} peaks"
        )
    out = []
    for t0, t1, m0, m1 in zip(lengths, lengths[1:], peaks, peaks[1:]):
        ratio = m1 / m0
        exponent = math.log(ratio) / math.log(t1 / t0)
        out.append({"from": t0, "to": t1, "ratio": ratio, "exponent": exponent})
    return out


def attention_scores_bytes(cfg: TransformerConfig, rows: int, seq: int) -> int:
    """n_layers x [rows, n_heads, seq, seq] float32: the softmax outputs kept for the backward."""
    return 4 * cfg.n_layers * rows * cfg.n_heads * seq * seq


def logits_chunk_bytes(cfg: TransformerConfig, rows: int, completion: int, chunk: int) -> int:
    """One [rows, completion, chunk] float32 block of logits (chunk capped at the vocabulary)."""
    return 4 * rows * completion * min(chunk, cfg.vocab_size)


def update_memory(cfg: TransformerConfig, batch: int, prompt: int, completion: int, update) -> dict:
    """Buffer sizes of the compiled `steps.update` for one shape, from abstract arguments.

    Returns:
      dict of the `memory_analysis()` byte counts ("argument", "output", "alias", "temp",
      "peak" = argument + output - alias + temp, "xla_peak") and "compile_s".
    """
    graphdef, params = abstract_model(cfg)
    algorithm, optimizer = grpo(group_size=GROUP_SIZE), optax.adamw(1e-6)
    state = jax.eval_shape(
        lambda p: init_train_state(p, optimizer, algorithm.transform, jax.random.key(0)), params
    )
    rollout = RolloutConfig(completion, GROUP_SIZE, eos_id=-1, pad_id=0)
    steps = make_steps(graphdef, optimizer, algorithm, rollout, update)

    def fresh_batch():
        tokens = lambda n: jnp.ones((batch, n), jnp.int32)
        mask = lambda n: jnp.ones((batch, n), bool)
        ids = jnp.arange(batch) // GROUP_SIZE
        return make_batch(
            tokens(prompt), mask(prompt), tokens(completion), mask(completion), ids, ids * 0.0
        )

    batch_shape = jax.eval_shape(steps.prepare, state, jax.eval_shape(fresh_batch))[1]
    start = time.perf_counter()
    stats = steps.update.lower(state, batch_shape).compile().memory_analysis()
    compile_s = time.perf_counter() - start
    out = dict(
        argument=stats.argument_size_in_bytes,
        output=stats.output_size_in_bytes,
        alias=stats.alias_size_in_bytes,
        temp=stats.temp_size_in_bytes,
        xla_peak=getattr(stats, "peak_memory_in_bytes", None),
        compile_s=compile_s,
    )
    out["peak"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    p.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "memory.json")
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    setup = QUICK if args.quick else FULL
    cfg, batch, prompt, small = (setup[k] for k in ("model", "batch", "prompt", "small_chunk"))
    remat = dataclasses.replace(cfg, remat="block")
    chunked = dataclasses.replace(cfg, attention_chunk=setup["attention_chunk"])
    settings = {
        "no_chunking": (cfg, UpdateConfig(vocab_chunk=cfg.vocab_size)),
        f"chunk_{small}": (cfg, UpdateConfig(vocab_chunk=small)),
        f"chunk_{small}_micro_4": (cfg, UpdateConfig(vocab_chunk=small, microbatches=4)),
        f"chunk_{small}_remat": (remat, UpdateConfig(vocab_chunk=small)),
        f"chunk_{small}_attn_{chunked.attention_chunk}": (chunked, UpdateConfig(vocab_chunk=small)),
    }
    results = {}
    for name, (model, update) in settings.items():
        rows = batch // update.microbatches
        points = []
        for t in setup["lengths"]:
            point = dict(completion_tokens=t, **update_memory(model, batch, prompt, t, update))
            point["attention_scores_bytes"] = attention_scores_bytes(cfg, rows, prompt + t)
            point["logits_chunk_bytes"] = logits_chunk_bytes(cfg, rows, t, update.vocab_chunk)
            points.append(point)
        results[name] = dict(
            remat=model.remat,
            attention_chunk=model.attention_chunk,
            vocab_chunk=update.vocab_chunk,
            microbatches=update.microbatches,
            points=points,
            growth=growth(setup["lengths"], [p["peak"] for p in points]),
        )
    report = dict(
        benchmark="memory",
        args=vars(args),
        model=cfg.__dict__,
        batch=batch,
        prompt_tokens=prompt,
        results=results,
        machine=machine(),
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)

    mib = lambda n: f"{n / 2**20:.0f}"
    print(
        f"\nupdate-step memory: d_model {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} "
        f"heads, vocab {cfg.vocab_size}, batch {batch}, prompt {prompt}, float32"
    )
    print(
        "| setting | T | peak MiB | temp MiB | x vs T/2 | attention scores MiB | logits chunk MiB |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        ratios = ["-"] + [f"{g['ratio']:.2f}" for g in r["growth"]]
        for p, ratio in zip(r["points"], ratios):
            print(
                f"| {name} | {p['completion_tokens']} | {mib(p['peak'])} | {mib(p['temp'])} "
                f"| {ratio} | {mib(p['attention_scores_bytes'])} "
                f"| {mib(p['logits_chunk_bytes'])} |"
            )
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()

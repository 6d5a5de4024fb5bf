"""Update-step throughput and model FLOP utilisation (MFU) against this machine's own matmul speed.

A GRPO batch of fixed shape (random prompt and completion tokens, every token real, random
rewards) is built with `make_batch`, scored once by `steps.prepare`, and `steps.update` (one
epoch, one minibatch: one forward + backward over prompt + completion, the chunked-vocabulary
log-probs of the completion, and AdamW) is timed for each model size and update setting.

Model FLOPs and the reference matmul are `rljax.metrics.flops` (the same numbers as a run's
`perf/mfu`): 6 N D for the decoder blocks, the full S x S attention square and the head on
the T completion positions; MFU counts model FLOPs only (no recompute).

The reference throughput is measured in the same run: a jitted float32 matmul
[B * S, d_model] x [d_model, 4 * d_model], the shape of an MLP projection of the model. Matmul
and update timings alternate, and the MFU ratio is the median over repeats of
(model FLOPs / update time) / (matmul FLOPs / matmul time), so a busy machine moves both.

For the larger model a breakdown times the update's parts alone with the same shapes: trunk
forward + backward (blocks and attention), attention core alone, vocabulary head forward +
backward (with its rematerialisation) and the AdamW update.

  python -m benchmarks.update            # the README numbers (about 4 minutes on 2 cores)
  python -m benchmarks.update --quick    # tiny sizes, a smoke test

Writes a JSON report (default benchmarks/results/update.json) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.rollout import machine
from rljax.algorithms import grpo
from rljax.core.batch import make_batch
from rljax.core.state import init_train_state
from rljax.metrics.flops import MatmulProbe, model_flops
from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model
from rljax.train.logprobs import policy_states, token_stats
from rljax.train.steps import RolloutConfig, UpdateConfig, make_steps

GROUP_SIZE = 4
VOCAB = 32000
SIZES = {
    "small": TransformerConfig(
        vocab_size=VOCAB,
        d_model=256,
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        d_ff=704,
        tie_embeddings=True,
    ),
    "large": TransformerConfig(
        vocab_size=VOCAB,
        d_model=512,
        n_layers=8,
        n_heads=8,
        n_kv_heads=2,
        d_ff=1408,
        tie_embeddings=True,
    ),
    "tiny": TransformerConfig(
        vocab_size=512,
        d_model=32,
        n_layers=1,
        n_heads=2,
        n_kv_heads=1,
        d_ff=64,
        tie_embeddings=True,
    ),  # --quick only
}


@dataclasses.dataclass(frozen=True)
class Case:
    """One measured setting: a model size, batch shape and update configuration."""

    size: str
    batch: int
    prompt: int
    completion: int
    update: UpdateConfig


def cases(quick: bool) -> list[Case]:
    """The settings of a run: both sizes at the default update config, then cheap fixes."""
    if quick:
        return [Case("tiny", 4, 8, 16, UpdateConfig(vocab_chunk=256, microbatches=2))]
    shape = dict(batch=8, prompt=64, completion=128)
    return [
        Case("small", **shape, update=UpdateConfig()),
        Case("large", **shape, update=UpdateConfig()),
        Case("large", **shape, update=UpdateConfig(vocab_chunk=VOCAB)),
        Case("large", **shape, update=UpdateConfig(vocab_chunk=2048)),
        Case("large", **shape, update=UpdateConfig(microbatches=2)),
    ]


def timed(fn, *args) -> float:
    """Seconds of one call of `fn(*args)`, waiting for its results."""
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def grpo_batch(case: Case, vocab: int):
    """A GRPO batch of fixed shape: random tokens (all real), groups of 4, random rewards."""
    rng = np.random.default_rng(0)
    b, p, t = case.batch, case.prompt, case.completion
    return make_batch(
        rng.integers(1, vocab, (b, p)),
        np.ones((b, p), bool),
        rng.integers(1, vocab, (b, t)),
        np.ones((b, t), bool),
        np.repeat(np.arange(b // GROUP_SIZE), GROUP_SIZE),
        rng.random(b),
    )


def bench_case(case: Case, repeats: int) -> dict:
    """Compiles and times `steps.update` for one case, alternating with the matmul probe."""
    cfg = SIZES[case.size]
    graphdef, params = create_model(cfg, seed=0)
    algorithm, optimizer = grpo(group_size=GROUP_SIZE), optax.adamw(1e-6)
    state = init_train_state(params, optimizer, algorithm.transform, jax.random.key(0))
    rollout = RolloutConfig(case.completion, GROUP_SIZE, eos_id=-1, pad_id=0)
    steps = make_steps(graphdef, optimizer, algorithm, rollout, case.update)
    state, batch, _ = steps.prepare(state, grpo_batch(case, cfg.vocab_size))

    start = time.perf_counter()
    update = steps.update.lower(state, batch).compile()
    compile_s = time.perf_counter() - start
    probe = MatmulProbe(case.batch * (case.prompt + case.completion), cfg.d_model)
    flops = model_flops(cfg, case.batch, case.prompt, case.completion)

    holder = {"state": state}  # update donates its input state: carry the new one along

    def step():
        holder["state"], metrics = update(holder["state"], batch)
        return metrics["loss"]

    first_s = timed(step)
    times, matmul, mfu = [], [], []
    for _ in range(repeats):
        matmul.append(probe.flops_per_s())
        times.append(timed(step))
        mfu.append(flops["model"] / times[-1] / matmul[-1])
    median_s = statistics.median(times)
    tokens = case.batch * (case.prompt + case.completion)
    return dict(
        size=case.size,
        model=dataclasses.asdict(cfg),
        batch=case.batch,
        prompt_tokens=case.prompt,
        completion_tokens=case.completion,
        update=dataclasses.asdict(case.update),
        compile_s=compile_s,
        first_run_s=first_s,
        times_s=times,
        median_s=median_s,
        completion_tokens_per_s=case.batch * case.completion / median_s,
        total_tokens_per_s=tokens / median_s,
        flops=flops,
        model_flops_per_s=flops["model"] / median_s,
        matmul_flops_per_s=matmul,
        matmul_median_flops_per_s=statistics.median(matmul),
        mfu_vs_matmul=statistics.median(mfu),
    )


def breakdown(case: Case, repeats: int) -> dict:
    """Median seconds of the update's parts alone (same shapes), with their FLOP rates.

    Returns:
      {part: {"median_s", "flops", "flops_per_s"}} for "trunk" (decoder forward + backward,
      attention included), "attention_core" (QK^T, masked softmax, PV forward + backward with
      the model's shapes), "head" (chunked log-probs + entropy forward + backward) and
      "optimizer" (AdamW on the model's parameters), and "matmul_flops_per_s".
    """
    cfg = SIZES[case.size]
    graphdef, params = create_model(cfg, seed=0)
    batch = grpo_batch(case, cfg.vocab_size)
    b, s, t = case.batch, case.prompt + case.completion, case.completion
    flops = model_flops(cfg, b, case.prompt, t)
    key = jax.random.split(jax.random.key(2), 4)

    def trunk_loss(p):
        hidden = policy_states(
            graphdef,
            p,
            batch.prompt_tokens,
            batch.prompt_mask,
            batch.completion_tokens,
            batch.completion_mask,
        ).completion_hidden
        return jnp.sum(hidden)

    hidden = 0.1 * jax.random.normal(key[0], (b, t, cfg.d_model), jnp.float32)
    head = 0.02 * jax.random.normal(key[1], (cfg.d_model, cfg.vocab_size), jnp.float32)

    def head_loss(x, w):
        out = token_stats(x, w, batch.completion_tokens, case.update.vocab_chunk)
        return jnp.sum(out.logprobs) + 0.01 * jnp.sum(out.entropy)

    groups = cfg.n_heads // cfg.n_kv_heads
    hd = cfg.resolved_head_dim
    q = jax.random.normal(key[2], (b, s, cfg.n_kv_heads, groups, hd), jnp.float32)
    kv = jax.random.normal(key[3], (2, b, s, cfg.n_kv_heads, hd), jnp.float32)
    allowed = jnp.tril(jnp.ones((s, s), bool))[None]

    def attention_loss(q, kv):
        scores = jnp.einsum("btkgd,bskd->bkgts", q, kv[0]) / math.sqrt(hd)
        scores = jnp.where(allowed[:, None, None], scores, -1e30)
        out = jnp.einsum("bkgts,bskd->btkgd", jax.nn.softmax(scores, axis=-1), kv[1])
        return jnp.sum(out) * cfg.n_layers  # one layer's work, reported for all layers below

    optimizer = optax.adamw(1e-6)
    opt_state = optimizer.init(params)
    grads = jax.tree.map(jnp.ones_like, params)

    def adamw(p, o):
        updates, o = optimizer.update(grads, o, p)
        return optax.apply_updates(p, updates), o

    parts = {
        "trunk": (jax.jit(jax.grad(trunk_loss)), (params,), flops["trunk"] + flops["attention"]),
        "attention_core": (
            jax.jit(jax.grad(attention_loss, argnums=(0, 1))),
            (q, kv),
            flops["attention"] // cfg.n_layers,
        ),
        "head": (
            jax.jit(jax.grad(head_loss, argnums=(0, 1))),
            (hidden, head),
            flops["hardware"] - flops["trunk"] - flops["attention"],
        ),
        "optimizer": (jax.jit(adamw), (params, opt_state), 0),
    }
    probe = MatmulProbe(b * s, cfg.d_model)
    out = {"matmul_flops_per_s": probe.flops_per_s()}
    for name, (fn, args, part_flops) in parts.items():
        timed(fn, *args)  # compile
        median_s = statistics.median(timed(fn, *args) for _ in range(repeats))
        if name == "attention_core":
            median_s *= cfg.n_layers
            part_flops *= cfg.n_layers
        out[name] = dict(median_s=median_s, flops=part_flops, flops_per_s=part_flops / median_s)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    p.add_argument("--repeats", type=int, default=None, help="default 3 (1 with --quick)")
    p.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "update.json")
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    results = [bench_case(case, repeats) for case in cases(args.quick)]
    largest = max(cases(args.quick), key=lambda c: SIZES[c.size].d_model)
    report = dict(
        benchmark="update",
        args=vars(args),
        repeats=repeats,
        results=results,
        breakdown=dict(size=largest.size, parts=breakdown(largest, repeats)),
        machine=machine(),
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)

    print(
        "\n| model | vocab_chunk | micro | median s | completion tok/s | total tok/s "
        "| model GFLOP/s | matmul GFLOP/s | MFU vs matmul |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        m = r["model"]
        print(
            f"| {r['size']} (d {m['d_model']}, {m['n_layers']} layers) "
            f"| {r['update']['vocab_chunk']} | {r['update']['microbatches']} "
            f"| {r['median_s']:.2f} | {r['completion_tokens_per_s']:.0f} "
            f"| {r['total_tokens_per_s']:.0f} | {r['model_flops_per_s'] / 1e9:.1f} "
            f"| {r['matmul_median_flops_per_s'] / 1e9:.1f} | {100 * r['mfu_vs_matmul']:.0f}% |"
        )
    parts = report["breakdown"]["parts"]
    total = sum(v["median_s"] for k, v in parts.items() if k not in ("matmul_flops_per_s",))
    print(f"\nbreakdown ({largest.size}, parts timed alone; attention_core is inside trunk):")
    print("| part | median s | GFLOP/s | vs matmul |")
    print("|---|---|---|---|")
    for name, v in parts.items():
        if name == "matmul_flops_per_s":
            continue
        ratio = v["flops_per_s"] / parts["matmul_flops_per_s"]
        print(
            f"| {name} | {v['median_s']:.3f} | {v['flops_per_s'] / 1e9:.1f} | {100 * ratio:.0f}% |"
        )
    print(f"(trunk + head + optimizer = {total - parts['attention_core']['median_s']:.2f} s)")
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()

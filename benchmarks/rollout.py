"""Rollout throughput: the rljax sampler against HF transformers `generate`, side by side.

Both run the same random Qwen2-shaped weights (built in torch, saved as safetensors, loaded by
`rljax.models.load_hf_checkpoint`), the same batch of prompts, prompt and generation lengths,
dtype and sampling (temperature 1, no top-k/top-p, no early stop), on this machine's CPU.
rljax's compile time is reported separately and excluded from its tokens/s.

  python -m benchmarks.rollout                  # the README numbers
  python -m benchmarks.rollout --layers 2 --repeats 1 --new_tokens 16   # a quick look

Writes a JSON report (default benchmarks/results/rollout.json) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d_model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv_heads", type=int, default=2)
    p.add_argument("--d_ff", type=int, default=1408)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt_tokens", type=int, default=64)
    p.add_argument("--new_tokens", type=int, default=128)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip_hf", action="store_true", help="time rljax only")
    p.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "rollout.json")
    )
    return p.parse_args()


def build_checkpoint(shape, path: str):
    """A random float32 Qwen2ForCausalLM of `shape` (vocab, d_model, layers, heads, kv_heads,
    d_ff) saved as safetensors in `path`; returns the torch model."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=shape.vocab,
        hidden_size=shape.d_model,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        intermediate_size=shape.d_ff,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    )
    model = transformers.Qwen2ForCausalLM(config).float().eval()
    model.save_pretrained(path, safe_serialization=True)
    return model


def time_it(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def bench_rljax(args, path, prompts, mask) -> dict:
    from rljax.models.hf import load_hf_checkpoint
    from rljax.rollout.sampler import generate

    _, graphdef, params = load_hf_checkpoint(path, dtype=args.dtype)
    tokens, mask = jnp.asarray(prompts), jnp.asarray(mask)
    keys = iter(jax.random.split(jax.random.key(0), args.repeats + 1))

    def run():
        out = generate(
            graphdef,
            params,
            tokens,
            mask,
            next(keys),
            max_new_tokens=args.new_tokens,
            eos_id=-1,
            pad_id=0,
        )
        jax.block_until_ready(out.completion_tokens)
        return out

    start = time.perf_counter()
    out = run()
    compile_s = time.perf_counter() - start
    assert int(out.completion_mask.sum()) == args.batch * args.new_tokens
    times = time_it(run, args.repeats)
    return dict(compile_plus_first_run_s=compile_s, times_s=times)


def bench_hf(args, model, prompts, mask) -> dict:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    ids, attn = torch.from_numpy(prompts).long(), torch.from_numpy(mask).long()

    def run():
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=attn,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                pad_token_id=0,
                use_cache=True,
            )
        assert out.shape == (args.batch, args.prompt_tokens + args.new_tokens)

    run()  # warm-up
    return dict(times_s=time_it(run, args.repeats))


def machine() -> dict:
    """What a results file records of the machine it ran on."""
    return dict(
        platform=platform.platform(),
        processor=cpu_model(),
        cpus=os.cpu_count(),
        jax=jax.__version__,
        backend=jax.default_backend(),
    )


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> None:
    args = parse_args()
    rng = np.random.default_rng(0)
    prompts = rng.integers(1, args.vocab, (args.batch, args.prompt_tokens)).astype(np.int32)
    lengths = rng.integers(args.prompt_tokens // 2, args.prompt_tokens + 1, args.batch)
    mask = np.arange(args.prompt_tokens)[None, :] >= (args.prompt_tokens - lengths)[:, None]
    prompts = np.where(mask, prompts, 0)  # left-padded prompts of different lengths
    generated = args.batch * args.new_tokens

    import torch

    with tempfile.TemporaryDirectory() as path:
        model = build_checkpoint(args, path).to(getattr(torch, args.dtype))
        results = {"rljax": bench_rljax(args, path, prompts, mask)}
        if not args.skip_hf:
            results["hf_transformers"] = bench_hf(args, model, prompts, mask)

    for r in results.values():
        r["median_s"] = statistics.median(r["times_s"])
        r["tokens_per_s"] = generated / r["median_s"]
    report = dict(
        benchmark="rollout",
        args=vars(args),
        results=results,
        machine=machine(),
    )
    if "hf_transformers" in results:
        report["speedup_rljax_over_hf"] = (
            results["rljax"]["tokens_per_s"] / results["hf_transformers"]["tokens_per_s"]
        )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)

    print(
        f"\nrollout: {args.layers} layers, d_model {args.d_model}, vocab {args.vocab}, "
        f"batch {args.batch}, {args.prompt_tokens}+{args.new_tokens} tokens, {args.dtype}"
    )
    print(f"{'engine':<18}{'median s':>10}{'tokens/s':>12}")
    for name, r in results.items():
        print(f"{name:<18}{r['median_s']:>10.3f}{r['tokens_per_s']:>12.1f}")
    if "speedup_rljax_over_hf" in report:
        print(f"rljax / HF tokens/s: {report['speedup_rljax_over_hf']:.2f}x")
    print(f"rljax compile + first run: {results['rljax']['compile_plus_first_run_s']:.1f} s")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

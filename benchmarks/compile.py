"""Compile time of the rollout and GRPO update steps against depth, per model variant and Tunix.

For each layer count (default 4, 8, 16, 32, 64) of a small Llama/Qwen-style model (d_model 128,
4 heads, 2 kv heads, d_ff 256, vocab 512), one fresh Python process builds the step and times
`jax.jit(...).lower(...)` (tracing) and `.compile()` (XLA) of it, executing nothing:
- rollout: the sampler's jitted `rljax.rollout.sampler.generate` with the settings
  `build_rollout_config` reads from the run config (B / G prompts of P tokens, G samples each,
  T new tokens);
- update: `steps.update` of a GRPO run config as the driver builds it (`build_algorithm`,
  `build_optimizer`, `build_train_state`, the causal kind's `make_steps` on the trainer's
  mesh) on B rows of P + T tokens; its input shapes come from `jax.eval_shape` of
  `steps.prepare`, so nothing else compiles first.
Each process sees the devices of a plain run (on a CPU, one: a forced host device count in
XLA_FLAGS, as the test suite sets, is dropped).
The model is `scratch_model_config(config.model)` with the vocabulary and each variant's
overrides replaced. Every process runs with JAX's persistent compilation cache off
(`jax_enable_compilation_cache=False`, no `JAX_COMPILATION_CACHE_DIR`), so no point reuses
another's programs. Points alternate (repeat -> layers -> step -> variant, Tunix last), so a load
change on a shared machine hits every setting; the median over repeats is reported.

Variants (`--variants`) are `TransformerConfig` overrides, `key=value[,key=value]` ("default":
none), e.g. `--variants scan_layers=True scan_layers=False`. A variant naming a field that
`TransformerConfig` lacks (an older checkout) is skipped with a note; the others run.

Tunix (`--tunix-python VENV/bin/python`, a venv with `google-tunix`): `benchmarks/tunix_compile.py`
runs there, one fresh process per point, and compiles Tunix's GRPO policy update for the same
model shape (see its docstring for what exactly); it joins the update column of the table.

  python -m benchmarks.compile                                     # the README numbers
  python -m benchmarks.compile --layers 4 8 --repeats 1            # a quick look
  python -m benchmarks.compile --tunix-python /work/venvs/tunix/bin/python

Writes a JSON report (default benchmarks/results/compile.json) and a Markdown table beside it
(same name, .md), and prints the table.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = ("rollout", "update")
TUNIX = "tunix"


@dataclasses.dataclass(frozen=True)
class Shape:
    """The model and batch shape of every point (the layer count varies)."""

    d_model: int
    heads: int
    kv_heads: int
    d_ff: int
    vocab: int
    prompt: int  # P prompt tokens
    completion: int  # T completion tokens
    batch: int  # B rows: B / group prompts x group samples
    group: int  # G samples per prompt (GRPO's group size)


def parse_variant(text: str) -> dict[str, Any]:
    """`"a=1,b=False"` -> {"a": 1, "b": False}; "default" -> {}. Values are Python literals,
    or strings when they do not parse as one."""
    if text == "default":
        return {}
    out = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--variants item {item!r} is not key=value; e.g. scan_layers=False")
        try:
            out[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            out[key.strip()] = value.strip()
    return out


def unknown_fields(overrides: dict[str, Any]) -> list[str]:
    """The override keys that are not fields of this checkout's `TransformerConfig`."""
    from rljax.models.config import TransformerConfig

    names = {f.name for f in dataclasses.fields(TransformerConfig)}
    return sorted(set(overrides) - names)


def run_config(shape: Shape, layers: int):
    """The validated GRPO run config of one point (`model.*`, rollout and batch sizes)."""
    from rljax.config import default_config, validate_config

    config = default_config()
    config.algorithm.name = "grpo"
    config.model.update(
        d_model=shape.d_model,
        n_layers=layers,
        n_heads=shape.heads,
        n_kv_heads=shape.kv_heads,
        d_ff=shape.d_ff,
    )
    config.task.max_prompt_len = shape.prompt
    config.rollout.update(max_new_tokens=shape.completion, n_samples=shape.group)
    config.train.prompts_per_step = shape.batch // shape.group
    config.train.compilation_cache = ""
    return validate_config(config)


def measure(step: str, layers: int, overrides: dict[str, Any], shape: Shape) -> dict[str, float]:
    """Seconds to lower (trace) and compile one step, in this process; nothing is executed.

    Returns:
      {"lower_s", "compile_s", "total_s", "load_1min", "params"} (the model's parameter count).
    """
    import jax
    import numpy as np

    jax.config.update("jax_enable_compilation_cache", False)
    from rljax.core.batch import make_batch
    from rljax.models.tokenizer import ByteTokenizer
    from rljax.models.transformer import create_model
    from rljax.parallel.rules import mesh_shardings
    from rljax.rollout.sampler import generate
    from rljax.train.builders import (
        build_mesh,
        build_optimizer,
        build_rollout_config,
        scratch_model_config,
    )
    from rljax.train.kinds import CAUSAL

    load = os.getloadavg()[0]
    config = run_config(shape, layers)
    model_config = dataclasses.replace(
        scratch_model_config(config.model), vocab_size=shape.vocab, **overrides
    )
    graphdef, params = create_model(model_config, seed=config.seed)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    tokenizer = ByteTokenizer()  # its eos/pad ids only; the vocabulary is the model's
    rng = np.random.default_rng(0)
    prompts = shape.batch // shape.group
    if step == "rollout":
        rc = build_rollout_config(config, tokenizer)
        tokens = rng.integers(1, shape.vocab, (prompts, shape.prompt)).astype(np.int32)
        args = (graphdef, params, tokens, np.ones(tokens.shape, bool), jax.random.key(0))
        kwargs = dict(
            max_new_tokens=rc.max_new_tokens,
            eos_id=rc.eos_id,
            pad_id=rc.pad_id,
            n_samples=rc.n_samples,
            sampling=rc.sampling,
        )
        fn = generate
    elif step == "update":
        algorithm = CAUSAL.build_algorithm(config, model_config)
        optimizer = build_optimizer(config.train)
        state, critic = CAUSAL.build_train_state(config, model_config, params, algorithm, optimizer)
        mesh = build_mesh(config)
        shardings = mesh_shardings(state, mesh)
        state = jax.device_put(state, shardings)
        steps = CAUSAL.make_steps(
            config, tokenizer, graphdef, optimizer, algorithm, mesh, shardings, critic
        )
        b, p, t = shape.batch, shape.prompt, shape.completion
        batch = make_batch(
            rng.integers(1, shape.vocab, (b, p)),
            np.ones((b, p), bool),
            rng.integers(1, shape.vocab, (b, t)),
            np.ones((b, t), bool),
            np.repeat(np.arange(prompts), shape.group),
            rng.random(b),
        )
        state, batch, _ = jax.eval_shape(steps.prepare, state, batch)
        fn, args, kwargs = steps.update, (state, batch), {}
    else:
        raise ValueError(f"step {step!r} is unknown; choose from {STEPS}")
    start = time.perf_counter()
    lowered = fn.lower(*args, **kwargs)
    traced = time.perf_counter()
    lowered.compile()
    done = time.perf_counter()
    return dict(
        lower_s=traced - start,
        compile_s=done - traced,
        total_s=done - start,
        load_1min=load,
        params=n_params,
    )


def run_point(cmd: list[str], timeout_s: float) -> dict[str, Any]:
    """Runs one measuring process; its JSON (last stdout line) or {"error": one line}."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    # One CPU device, as a plain run has: a forced device count (the test suite's) would make
    # the trainer's mesh split the B / G prompts over devices.
    flags = env.get("XLA_FLAGS", "").split()
    env["XLA_FLAGS"] = " ".join(f for f in flags if "force_host_platform_device_count" not in f)
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return dict(error=f"timed out after {timeout_s:.0f} s")
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        errors = [line for line in proc.stderr.splitlines() if "Error" in line]
        tail = (errors or proc.stderr.strip().splitlines() or ["no output"])[-1]
        return dict(error=f"exit {proc.returncode}: {tail}")
    return json.loads(lines[-1])


def shape_flags(shape: Shape) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in dataclasses.asdict(shape).items()]


def median_of(runs: list[dict[str, Any]], key: str = "total_s") -> float | None:
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None


def summarize(points: dict[str, dict[int, list[dict]]], layers: list[int]) -> dict[str, Any]:
    """Medians per column and layer count, and their ratios to the first layer count.

    Args:
      points: {column ("update/default", "update/tunix", ...): {layers: [runs]}}.

    Returns:
      {column: {layers: {"median_s", "median_lower_s", "median_compile_s", "over_first",
      "runs", "errors"}}}; over_first is median / median at layers[0] (None where missing).
    """
    out: dict[str, Any] = {}
    for column, by_layers in points.items():
        first = median_of(by_layers.get(layers[0], []))
        rows = {}
        for n in layers:
            runs = by_layers.get(n, [])
            m = median_of(runs)
            rows[n] = dict(
                median_s=m,
                median_lower_s=median_of(runs, "lower_s"),
                median_compile_s=median_of(runs, "compile_s"),
                over_first=m / first if m is not None and first else None,
                runs=[r["total_s"] for r in runs if "total_s" in r],
                errors=[r["error"] for r in runs if "error" in r],
                params=next((r["params"] for r in runs if "params" in r), None),
            )
        out[column] = rows
    return out


def markdown(report: dict[str, Any]) -> str:
    """The table: per step and column, median seconds (x its time at the first layer count),
    then each variant against the step's first and each rljax update against Tunix's."""
    layers, summary = report["layers"], report["summary"]
    first_n = layers[0]
    s = report["shape"]
    lines = [
        f"Compile time (lower + compile, s; median of {report['repeats']}, a fresh process "
        f"each, no compilation cache) of d_model {s['d_model']}, {s['heads']}/{s['kv_heads']} "
        f"heads, d_ff {s['d_ff']}, vocab {s['vocab']}, {s['batch']} rows x ({s['prompt']} + "
        f"{s['completion']}) tokens; {report['machine']['processor']}, "
        f"{report['machine']['cpus']} cores, load average {report['load_average']['start'][0]:.2f}"
        f" at the start, {report['load_average']['end'][0]:.2f} at the end.",
        "",
    ]
    columns = list(summary)
    header = ["layers"] + [f"{c} s (x {first_n} layers)" for c in columns]
    versus = []  # each variant against the step's first; rljax's update against Tunix's
    for step in STEPS:
        own = [c for c in columns if c.startswith(step + "/") and c != f"{step}/{TUNIX}"]
        versus += [(c, own[0]) for c in own[1:]]
        if f"{step}/{TUNIX}" in columns:
            versus += [(c, f"{step}/{TUNIX}") for c in own]
    header += [f"{a} / {b}" for a, b in versus]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def cell(c: str, n: int) -> str:
        row = summary[c][str(n)]
        if row["median_s"] is None:
            return "; ".join(row["errors"]) or "-"
        if row["over_first"] is None:  # no time at the first layer count
            return f"{row['median_s']:.1f}"
        return f"{row['median_s']:.1f} ({row['over_first']:.2f}x)"

    def ratio(a: str, b: str, n: int) -> str:
        ra, rb = summary[a][str(n)], summary[b][str(n)]
        if ra["median_s"] is None or rb["median_s"] is None:
            return "-"
        return f"{ra['median_s'] / rb['median_s']:.2f}"

    for n in layers:
        row = [str(n)] + [cell(c, n) for c in columns] + [ratio(a, b, n) for a, b in versus]
        lines.append("| " + " | ".join(row) + " |")
    if report["skipped_variants"]:
        lines += [""] + [f"Skipped: {v}" for v in report["skipped_variants"]]
    if report.get("tunix_settings"):
        lines += ["", f"Tunix: {report['tunix_settings']}"]
    return "\n".join(lines) + "\n"


def write_report(
    args: argparse.Namespace,
    argv: list[str] | None,
    shape: Shape,
    variants: list[str],
    skipped: list[str],
    points: dict[str, dict[int, list[dict]]],
    load_start: tuple[float, float, float],
    started: float,
) -> dict[str, Any]:
    """Writes the JSON report and its Markdown table for the points so far (a run stopped
    early keeps what it measured); returns the report as read back from JSON."""
    tunix_settings = None
    for runs in points.get(f"update/{TUNIX}", {}).values():
        for r in runs:
            tunix_settings = tunix_settings or r.get("settings")
    report = dict(
        benchmark="compile",
        command=" ".join(["python -m benchmarks.compile", *(argv or sys.argv[1:])]),
        shape=dataclasses.asdict(shape),
        layers=args.layers,
        repeats=args.repeats,
        variants=variants,
        skipped_variants=skipped,
        compilation_cache="off in every measuring process",
        summary=summarize(points, args.layers),
        tunix_settings=tunix_settings,
        tunix_versions=next(
            (
                r["versions"]
                for rs in points.get(f"update/{TUNIX}", {}).values()
                for r in rs
                if "versions" in r
            ),
            None,
        ),
        machine=machine(),
        load_average=dict(start=load_start, end=os.getloadavg()),
        wall_s=time.perf_counter() - started,
    )
    report = json.loads(json.dumps(report))  # int layer keys -> str, as they are read back
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(markdown(report))
    return report


def machine() -> dict[str, Any]:
    import jax

    from benchmarks.rollout import cpu_model

    return dict(
        platform=platform.platform(),
        processor=cpu_model(),
        cpus=len(os.sched_getaffinity(0)),
        python=platform.python_version(),
        jax=jax.__version__,
        backend=jax.default_backend(),
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    p.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS))
    p.add_argument(
        "--variants",
        nargs="+",
        default=["default"],
        help='TransformerConfig overrides to compare, each "key=value[,key=value]" or "default"',
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--d-ff", type=int, default=256)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens P")
    p.add_argument("--completion", type=int, default=32, help="completion tokens T")
    p.add_argument("--batch", type=int, default=4, help="rows B (prompts x group)")
    p.add_argument("--group", type=int, default=4, help="samples per prompt G")
    p.add_argument("--tunix-python", default="", help="python of a venv with google-tunix")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per point")
    p.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "compile.json")
    )
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)  # one point, as JSON
    return p.parse_args(argv)


def shape_of(args: argparse.Namespace) -> Shape:
    if args.batch % args.group:
        raise ValueError(f"--batch {args.batch} is not a multiple of --group {args.group}")
    return Shape(
        **{f.name: getattr(args, f.name) for f in dataclasses.fields(Shape)},
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    shape = shape_of(args)
    if args.worker:
        job = json.loads(args.worker)
        result = measure(job["step"], job["layers"], job["overrides"], shape)
        print(json.dumps(result))
        return result

    variants, skipped = [], []
    for text in args.variants:
        missing = unknown_fields(parse_variant(text))
        if missing:
            skipped.append(f"{text}: TransformerConfig has no field {', '.join(missing)}")
        else:
            variants.append(text)
    if not variants:
        raise ValueError(f"no --variants left to run ({'; '.join(skipped)}); add 'default'")
    tunix_script = os.path.join(ROOT, "benchmarks", "tunix_compile.py")
    load_start = os.getloadavg()
    points: dict[str, dict[int, list[dict]]] = {}
    started = time.perf_counter()
    for repeat in range(args.repeats):
        for n in args.layers:
            jobs = []
            for step in args.steps:
                order = variants if repeat % 2 == 0 else variants[::-1]
                for text in order:
                    job = dict(step=step, layers=n, overrides=parse_variant(text))
                    cmd = [sys.executable, "-m", "benchmarks.compile", "--worker", json.dumps(job)]
                    jobs.append((f"{step}/{text}", cmd + shape_flags(shape)))
            if args.tunix_python and "update" in args.steps:
                cmd = [args.tunix_python, tunix_script, f"--layers={n}"] + shape_flags(shape)
                jobs.append((f"update/{TUNIX}", cmd))
            for column, cmd in jobs:
                result = run_point(cmd, args.timeout)
                points.setdefault(column, {}).setdefault(n, []).append(result)
                write_report(args, argv, shape, variants, skipped, points, load_start, started)
                took = result.get("total_s", result.get("error"))
                print(
                    f"[{time.perf_counter() - started:.0f} s] repeat {repeat} {n} layers "
                    f"{column}: {took}",
                    flush=True,
                )

    report = write_report(args, argv, shape, variants, skipped, points, load_start, started)
    table = markdown(report)
    print("\n" + table)
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()

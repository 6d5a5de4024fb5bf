"""Mean and standard error over seeds of the small-model anchor (scripts/reproduce_small_models.sh).

Reads ROOT/{model}_{algorithm}_s{seed}/ for every run the script made: the held-out greedy
accuracy at each eval step from metrics.jsonl (`eval/accuracy`), and from the newest
`eval_step{N}.json` (`rljax eval`, 8 samples per problem) greedy accuracy, pass@1 and pass@8;
ROOT/{model}_step0.json is the model as loaded, the common starting point of its runs. Writes
`benchmarks/results/small_models.json` (every run's numbers, the summary, the machine),
`small_models.md` (the tables the README quotes) and `small_models.png` (accuracy per step:
the mean over seeds with a band of one standard error).

The standard error is the sample standard deviation over seeds (ddof=1) / sqrt(seeds): the
spread of the mean from run to run of the whole recipe, not the binomial error of one
evaluation (with 256 problems that alone is up to 3.1 points).

  .venv/bin/python -m benchmarks.small_models runs/small_models
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
RUN = re.compile(r"^(?P<model>[a-z0-9]+)_(?P<algorithm>[a-z_0-9]+)_s(?P<seed>\d+)$")
FINAL = ("greedy", "pass@1", "pass@8")


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """(mean, standard error of the mean); the error is nan for fewer than two values."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_se of no values")
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(variance / n)


def _eval_report(path: str) -> dict[str, float]:
    with open(path, encoding="utf-8") as f:
        report = json.load(f)
    return {
        "step": report["step"],
        "problems": report["num_problems"],
        "greedy": report["greedy_accuracy"],
        "pass@1": report["pass_at_k"]["1"],
        "pass@8": report["pass_at_k"]["8"],
    }


def read_run(path: str) -> dict[str, Any]:
    """One run's eval curve, final evaluation and wall time (its steps and evals)."""
    curve: dict[int, float] = {}
    wall = 0.0
    with open(os.path.join(path, "metrics.jsonl"), encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if "eval/accuracy" in record:
                curve[int(record["step"])] = float(record["eval/accuracy"])
            wall += record.get("time/step_s", 0.0) + record.get("time/eval_s", 0.0)
    reports = glob.glob(os.path.join(path, "eval_step*.json"))
    newest = max(
        reports, key=lambda p: int(re.findall(r"\d+", os.path.basename(p))[0]), default=None
    )
    final = _eval_report(newest) if newest else None
    return {"curve": curve, "final": final, "wall_s": wall}


def collect(root: str) -> dict[str, Any]:
    """Every run under `root`, by "model/algorithm", and each model's step-0 evaluation."""
    groups: dict[str, dict[int, Any]] = defaultdict(dict)
    for path in sorted(glob.glob(os.path.join(root, "*"))):
        match = RUN.match(os.path.basename(path))
        if match and os.path.isfile(os.path.join(path, "metrics.jsonl")):
            key = f"{match['model']}/{match['algorithm']}"
            groups[key][int(match["seed"])] = read_run(path)
    starts = {
        os.path.basename(p).removesuffix("_step0.json"): _eval_report(p)
        for p in glob.glob(os.path.join(root, "*_step0.json"))
    }
    return {"runs": dict(groups), "step0": starts}


def summarize(collected: dict[str, Any]) -> dict[str, Any]:
    """Per model/algorithm: mean and standard error over seeds at each eval step (step 0 from
    the model's starting evaluation) and of the final evaluation."""
    summary = {}
    for key, runs in collected["runs"].items():
        model = key.split("/")[0]
        steps = sorted(set.intersection(*(set(r["curve"]) for r in runs.values())))
        curve = {str(s): mean_se([r["curve"][s] for r in runs.values()]) for s in steps}
        start = collected["step0"].get(model)
        if start is not None:
            curve = {"0": (start["greedy"], math.nan), **curve}  # one evaluation, no spread
        finals = [r["final"] for r in runs.values() if r["final"] is not None]
        summary[key] = {
            "seeds": sorted(runs),
            "curve": curve,
            "final": {m: mean_se([f[m] for f in finals]) for m in FINAL} if finals else None,
            "final_step": finals[0]["step"] if finals else None,
            "start": start,
            "wall_s": mean_se([r["wall_s"] for r in runs.values()]),
        }
    return summary


def _cell(mean: float, se: float, scale: float = 100.0) -> str:
    if math.isnan(se):
        return f"{scale * mean:.1f}"
    return f"{scale * mean:.1f} ± {scale * se:.1f}"


def markdown(summary: dict[str, Any]) -> str:
    """Two tables: greedy accuracy (%) per eval step with each run's wall time (its steps and
    evaluations), and the final 8-sample evaluation where the runs have one."""
    steps = sorted({int(s) for entry in summary.values() for s in entry["curve"]})
    header = " | ".join(f"step {s}" for s in steps)
    lines = [
        f"| model / algorithm | seeds | {header} | wall per run (min) |",
        "|---|---|" + "---|" * (len(steps) + 1),
    ]
    for key, entry in sorted(summary.items()):
        cells = [_cell(*entry["curve"][str(s)]) if str(s) in entry["curve"] else "" for s in steps]
        cells.append(_cell(*entry["wall_s"], scale=1 / 60))
        lines.append(f"| {key} | {len(entry['seeds'])} | " + " | ".join(cells) + " |")
    evaluated = {k: e for k, e in summary.items() if e["final"] is not None}
    if evaluated:
        lines += [
            "",
            "| model / algorithm | step | greedy | pass@1 | pass@8 | start: greedy / pass@8 |",
            "|---|---|---|---|---|---|",
        ]
    for key, entry in sorted(evaluated.items()):
        start = entry["start"]
        begin = f"{100 * start['greedy']:.1f} / {100 * start['pass@8']:.1f}" if start else ""
        final = [_cell(*entry["final"][m]) for m in FINAL]
        lines.append(f"| {key} | {entry['final_step']} | " + " | ".join(final) + f" | {begin} |")
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], path: str) -> None:
    """Greedy accuracy per step: the mean over seeds, a band of +- one standard error."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, entry in sorted(summary.items()):
        steps = sorted(int(s) for s in entry["curve"])
        mean = [100 * entry["curve"][str(s)][0] for s in steps]
        se = [100 * entry["curve"][str(s)][1] for s in steps]
        se = [0.0 if math.isnan(e) else e for e in se]
        ax.plot(steps, mean, marker="o", label=f"{key} ({len(entry['seeds'])} seeds)")
        ax.fill_between(
            steps, [m - e for m, e in zip(mean, se)], [m + e for m, e in zip(mean, se)], alpha=0.2
        )
    ax.set_xlabel("RL step")
    ax.set_ylabel("held-out greedy accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _no_nan(tree: Any) -> Any:
    """`tree` with nan (a standard error of one seed) as None: strict JSON has no NaN."""
    if isinstance(tree, float) and math.isnan(tree):
        return None
    if isinstance(tree, dict):
        return {k: _no_nan(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_no_nan(v) for v in tree]
    return tree


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="the runs' parent directory (ROOT of the script)")
    parser.add_argument("--out", default=os.path.join(RESULTS, "small_models"), help="prefix")
    args = parser.parse_args(argv)
    collected = collect(args.root)
    if not collected["runs"]:
        raise SystemExit(f"no runs named MODEL_ALGORITHM_sSEED with metrics.jsonl in {args.root}")
    summary = summarize(collected)
    from benchmarks.compile import machine

    report = {
        "machine": {**machine(), "load_average": os.getloadavg()},
        "runs": collected,
        "summary": summary,
    }
    with open(f"{args.out}.json", "w", encoding="utf-8") as f:
        json.dump(_no_nan(report), f, indent=1, sort_keys=True)
    table = markdown(summary)
    with open(f"{args.out}.md", "w", encoding="utf-8") as f:
        f.write(table)
    plot(summary, f"{args.out}.png")
    print(table)


if __name__ == "__main__":
    main()

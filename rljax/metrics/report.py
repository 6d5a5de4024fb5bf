"""`rljax report`: a run's metrics.jsonl -> a PNG dashboard and a Markdown summary.

A run logs dozens of keys per step. Whether RL post-training is working shows in a few of
them: reward, accuracy (train batch and held-out), policy entropy, KL to the reference,
response length, the objective's clip fraction and the training-inference mismatch (TIM)
gap. The report draws those on one picture, one panel per series the run logged, and puts
the numbers worth quoting (held-out accuracy, last-N-step means, skipped updates, reward
failures, wall time, the config) on one Markdown page. It needs no server (unlike
TensorBoard) and no display: matplotlib draws through its Agg canvas without pyplot.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from rljax.metrics.writers import read_metrics

# The objectives' clip metrics: the share of tokens (sequences for GSPO, segments for
# segment_po) whose clipped term is taken (for DPPO: masked out of its trust region). A run
# logs the one of its objective.
CLIP_KEYS = (
    "pg/clip_frac",
    "gspo/clip_frac",
    "gspo_token/clip_frac",
    "cispo/clip_frac",
    "segment_po/clip_frac",
    "mu_grpo/clip_frac",
    "gmpo/clip_frac",
    "dppo/masked_frac",
)


class Panel(NamedTuple):
    """One dashboard panel: a title and its (metrics key, legend label) series."""

    title: str
    series: tuple[tuple[str, str], ...]


PANELS = (
    Panel("reward", (("reward/mean", "train batch"), ("eval/reward", "held-out"))),
    Panel("accuracy", (("accuracy", "train batch"), ("eval/accuracy", "held-out"))),
    Panel("entropy", (("entropy", "policy entropy"),)),
    Panel("KL to reference", (("kl_to_ref", "k3, per token"),)),
    Panel("response length", (("response_length/mean", "mean tokens"),)),
    Panel("clip fraction", tuple((key, key) for key in CLIP_KEYS)),
    Panel("TIM gap", (("mismatch/abs_gap_mean", "mean |logp train - logp sampler|"),)),
    Panel("TIM token KL", (("mismatch/token_kl", "sampler || trainer, per token"),)),
    Panel("SFT loss", (("sft/loss", "token NLL"),)),
)

# The rows of the Markdown's last-N table: (name, key); the clip row takes the run's CLIP_KEYS.
SUMMARY_ROWS = (
    ("reward", "reward/mean"),
    ("accuracy (train batch)", "accuracy"),
    ("entropy", "entropy"),
    ("KL to reference", "kl_to_ref"),
    ("response length", "response_length/mean"),
    *(("clip fraction", key) for key in CLIP_KEYS),
    ("TIM gap", "mismatch/abs_gap_mean"),
    ("TIM token KL", "mismatch/token_kl"),
)

_COLUMNS = 3
_PANEL_INCHES = (4.0, 3.0)
_DPI = 100


def moving_average(values: Sequence[float | None], window: int) -> np.ndarray:
    """Trailing moving average that skips missing values.

    Point i is the mean of the finite values among points max(0, i - window + 1) .. i; it is
    NaN (a gap in the plot) when none of them is finite. Interpretation: a trailing (causal)
    window, so the smoothed curve never uses later steps, and nulls (non-finite values the
    writer logged as null) are left out rather than counted as zero.

    Args:
      values: [N] a series in step order; None or NaN for a missing value.
      window: points per window, >= 1 (1 returns the series with None as NaN).

    Returns:
      [N] float64 smoothed series.
    """
    if window < 1:
        raise ValueError(f"window={window}; the moving average needs window >= 1")
    x = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    finite = np.isfinite(x)
    sums = np.concatenate([[0.0], np.cumsum(np.where(finite, x, 0.0))])
    counts = np.concatenate([[0], np.cumsum(finite)])
    hi = np.arange(1, len(x) + 1)
    lo = np.maximum(hi - window, 0)
    n = counts[hi] - counts[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (sums[hi] - sums[lo]) / n, np.nan)


def _series(records: list[dict[str, Any]], key: str) -> tuple[np.ndarray, list[float | None]]:
    """(steps, values) of the records that hold `key` (its value may be None)."""
    held = [r for r in records if key in r]
    return np.array([r["step"] for r in held]), [r[key] for r in held]


def _finite(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def _load(run_dir: str) -> list[dict[str, Any]]:
    """The run's records, with one-line errors for a missing dir, file or record."""
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"run dir {run_dir} does not exist")
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no metrics.jsonl in {run_dir}; point rljax report at a run_dir")
    try:
        records = read_metrics(run_dir)
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(
            f"{path} is not a metrics log (one JSON object with a step per line): {err!r}"
        ) from err
    if not records:
        raise ValueError(f"{path} holds no records; has the run logged a step yet?")
    return records


def _draw(records: list[dict[str, Any]], panels: list[Panel], title: str, path: str) -> None:
    """Draws the panels on a grid of _COLUMNS columns and saves it as a PNG at `path`."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError("rljax report draws with matplotlib: pip install matplotlib") from err

    rows = max(1, math.ceil(len(panels) / _COLUMNS))
    fig = Figure(figsize=(_PANEL_INCHES[0] * _COLUMNS, _PANEL_INCHES[1] * rows), dpi=_DPI)
    FigureCanvasAgg(fig)
    fig.suptitle(title, fontsize=10)
    axes = fig.subplots(rows, _COLUMNS, squeeze=False).ravel()
    for ax, panel in zip(axes, panels):
        for i, (key, label) in enumerate(panel.series):
            steps, values = _series(records, key)
            if not len(steps):
                continue
            y = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
            color = f"C{i}"
            if key.startswith("eval/"):  # a few evaluations, each over a whole eval set
                ax.plot(steps, y, "o-", color=color, markersize=3, linewidth=1, label=label)
                continue
            window = max(1, len(steps) // 10)
            ax.plot(steps, y, color=color, linewidth=0.6, alpha=0.45, label=label)
            if window > 1:
                smooth = moving_average(values, window)
                ax.plot(steps, smooth, color=color, linewidth=1.6, label=f"{label} (avg {window})")
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in axes[len(panels) :]:
        ax.set_axis_off()
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=_DPI)


def _fmt(x: float) -> str:
    return f"{x:.4g}"


# The phases a step's time splits into (`rljax.train.timing`), as (name, key).
PHASE_ROWS = (
    ("rollout", "time/rollout_s"),
    ("reward", "time/reward_s"),
    ("old log-probs", "time/old_logprobs_s"),
    ("update", "time/update_s"),
    ("other", "time/other_s"),
)
_BAR_WIDTH = 40


def _phase_chart(rl: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: mean seconds per phase over the steps after the first (the steady
    state; the first step alone when there is no other) as a text bar chart, and the first
    step's time and compile time apart."""
    if not any("time/update_s" in r for r in rl):
        return []
    steady = rl[1:] or rl
    means = {}
    for name, key in PHASE_ROWS:
        values = _finite([r.get(key) for r in steady if key in r])
        means[name] = float(np.mean(values)) if values else 0.0
    total = sum(means.values())
    which = f"steps {steady[0]['step']}-{steady[-1]['step']}" if len(steady) > 1 else "one step"
    lines = ["", "## Where the time goes", "", f"Mean seconds per phase over {which}:", ""]
    lines += ["```"]
    for name, mean in means.items():
        share = mean / total if total > 0 else 0.0
        bar = "#" * round(_BAR_WIDTH * share)
        lines.append(f"{name:<14} {bar:<{_BAR_WIDTH}} {mean:8.3f} s {100 * share:5.1f}%")
    lines += ["```", ""]
    first = rl[0]
    compile_s = _finite([r.get("time/compile_s") for r in steady if "time/compile_s" in r])
    lines.append(
        f"- First step (step {first['step']}): {_fmt(first.get('time/step_s') or 0.0)} s, of"
        f" which {_fmt(first.get('time/compile_s') or 0.0)} s compiling; later steps compile"
        f" {_fmt(float(np.mean(compile_s)) if compile_s else 0.0)} s on average"
    )
    return lines


def _markdown(records: list[dict[str, Any]], run_dir: str, last_n: int, missing: list[str]) -> str:
    rl = [r for r in records if r["step"] >= 1]
    sft = [r for r in records if r["step"] < 0 and "sft/loss" in r]
    lines = ["# Run report", "", f"- Run dir: `{run_dir}`"]
    if rl:
        lines.append(f"- RL steps run: {len(rl)} (steps {rl[0]['step']}-{rl[-1]['step']})")
    else:
        lines.append("- RL steps run: 0")
    if sft:
        # SFT update i of S is logged at step i - S, so the first logged step is -S.
        loss = sft[-1]["sft/loss"]
        shown = "n/a" if loss is None else _fmt(loss)
        lines.append(f"- SFT before RL: {-sft[0]['step']} steps, last logged loss {shown}")
    step_s = _finite([r["time/step_s"] for r in rl if "time/step_s" in r])
    if step_s:
        total = sum(step_s)
        clock = f"{int(total // 3600)}h {int(total % 3600 // 60):02d}m {total % 60:04.1f}s"
        lines.append(
            f"- Wall time: {clock} ({total:.1f} s, the sum of time/step_s over {len(step_s)}"
            " RL steps; SFT and evaluations are not counted)"
        )

    lines += ["", "## Held-out accuracy", ""]
    steps, values = _series(records, "eval/accuracy")
    evals = [(int(s), v) for s, v in zip(steps, values) if v is not None and math.isfinite(v)]
    if evals:
        best = max(evals, key=lambda e: e[1])  # max() keeps the first of equal values
        lines += ["| | step | accuracy |", "|---|---|---|"]
        for name, (step, value) in (("first", evals[0]), ("last", evals[-1]), ("best", best)):
            lines.append(f"| {name} | {step} | {_fmt(value)} |")
    else:
        lines.append("No finite eval/accuracy logged.")

    tail = rl[-last_n:]
    lines += ["", f"## Last {len(tail)} RL steps", ""]
    rows = []
    for name, key in SUMMARY_ROWS:
        _, values = _series(tail, key)
        if not values:
            continue
        finite = _finite(values)
        mean = _fmt(float(np.mean(finite))) if finite else "n/a"
        last = "n/a" if values[-1] is None else _fmt(values[-1])
        rows.append(f"| {name} | `{key}` | {mean} | {last} | {len(finite)} |")
    if rows:
        lines += ["| metric | key | mean | last | finite values |", "|---|---|---|---|---|", *rows]
    else:
        lines.append("None of the summary metrics was logged in these steps.")

    lines += _phase_chart(rl)

    if any("guard/skipped" in r for r in rl):
        _, shares = _series(rl, "guard/skipped")
        shares = _finite(shares)
        hit = sum(1 for s in shares if s > 0)
        lines += [
            "",
            "## Numerical guard",
            "",
            f"- Skipped updates: {hit} of {len(shares)} steps skipped optimizer steps;"
            f" {_fmt(sum(shares))} step-equivalents in all (the sum of guard/skipped, each"
            " step's share of optimizer steps skipped)",
        ]

    failure_keys = sorted({k for r in rl for k in r if k.startswith("reward/failures_")})
    if failure_keys:
        lines += ["", "## Reward failures", "", "| kind | count |", "|---|---|"]
        for key in failure_keys:
            _, counts = _series(rl, key)
            kind = key.removeprefix("reward/failures_")
            lines.append(f"| {kind} | {_fmt(sum(_finite(counts)))} |")

    if missing:
        lines += ["", "## Not logged", "", "Panels without data in this run: " + ", ".join(missing)]

    lines += ["", "## Config", ""]
    config = os.path.join(run_dir, "config.json")
    if os.path.isfile(config):
        with open(config, encoding="utf-8") as f:
            lines += ["```json", f.read().rstrip("\n"), "```"]
    else:
        lines.append("No config.json in the run dir.")
    return "\n".join(lines) + "\n"


def write_report(run_dir: str, out_dir: str | None = None, last_n: int = 10) -> tuple[str, str]:
    """Writes `report.png` (a dashboard) and `report.md` (a summary) for a training run.

    The PNG has one panel per entry of PANELS that the run logged (step on x; the raw series
    thin, a trailing moving average of max(1, n // 10) points thick; held-out evaluations as
    markers); panels with no data are left out and named in the Markdown. Values logged as
    null (non-finite) are gaps. The Markdown gives the run dir, steps run, the first, last
    and best held-out accuracy with their steps, the means over the last `last_n` RL steps of
    SUMMARY_ROWS (over their finite values), where the time goes (a bar chart of the mean
    seconds per step phase after the first step, and the first step's compile time), the
    guard's skipped updates, reward-function failures, the wall time (the sum of time/step_s)
    and the run's config.json.

    Args:
      run_dir: a run directory holding metrics.jsonl (the trainer's `config.run_dir`).
      out_dir: where the two files go; default run_dir.
      last_n: RL steps (step >= 1) averaged in the summary table.

    Returns:
      (png_path, md_path).

    Raises:
      FileNotFoundError: run_dir or its metrics.jsonl does not exist.
      ValueError: metrics.jsonl is empty or not a metrics log, or last_n < 1.
    """
    if last_n < 1:
        raise ValueError(f"last_n={last_n}; average over at least one step")
    run_dir = os.path.abspath(run_dir)
    records = _load(run_dir)
    out_dir = run_dir if out_dir is None else os.path.abspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    keys = {k for r in records for k in r}
    present = [p for p in PANELS if any(key in keys for key, _ in p.series)]
    missing = [p.title for p in PANELS if p not in present]
    png = os.path.join(out_dir, "report.png")
    md = os.path.join(out_dir, "report.md")
    _draw(records, present, run_dir, png)
    with open(md, "w", encoding="utf-8") as f:
        f.write(_markdown(records, run_dir, last_n, missing))
    return png, md

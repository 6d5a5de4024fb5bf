"""rljax report: the dashboard PNG, the Markdown numbers (recomputed here), the CLI and errors."""

import json
import math

import numpy as np
import pytest
from matplotlib import image

from rljax.cli import main
from rljax.metrics.report import moving_average, write_report

STEPS = 20
EVALS = {0: 0.25, 5: 0.4, 10: 0.6, 15: 0.6, 20: 0.55}  # best 0.6, first reached at step 10
SKIPPED = {4: 0.5, 12: 1.0}  # guard/skipped: the share of a step's optimizer steps skipped


def _run(path):
    """A hand-made run: SFT records, evals every 5 steps, nulls, no KL and no token-KL series."""
    rng = np.random.default_rng(0)
    records = [{"step": s, "sft/loss": 2.0 + s / 10} for s in (-20, -10, -1)]
    records.append({"step": 0, "eval/accuracy": EVALS[0], "eval/reward": 0.3})
    for step in range(1, STEPS + 1):
        record = {
            "step": step,
            "reward/mean": float(rng.uniform()),
            "accuracy": float(rng.uniform()),
            "entropy": None if step == 17 else float(rng.uniform(1, 2)),
            "response_length/mean": float(rng.integers(5, 50)),
            "pg/clip_frac": float(rng.uniform(0, 0.2)),
            "mismatch/abs_gap_mean": None if step == STEPS else float(rng.uniform(0, 0.01)),
            "guard/skipped": SKIPPED.get(step, 0.0),
            "reward/failures_timeout": float(step % 3 == 0),
            "time/step_s": float(rng.uniform(1, 3)),
        }
        if step in EVALS:
            record.update({"eval/accuracy": EVALS[step], "eval/reward": EVALS[step]})
        records.append(record)
    with open(path / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    with open(path / "config.json", "w") as f:
        json.dump({"algorithm": {"name": "grpo"}, "run_dir": str(path)}, f)
    return records


def test_moving_average_matches_a_loop_and_leaves_gaps():
    values = [1.0, None, 3.0, float("nan"), None, None, 8.0]
    got = moving_average(values, 2)
    expected = [1.0, 1.0, 3.0, 3.0, np.nan, np.nan, 8.0]  # windows of two, nulls left out
    np.testing.assert_allclose(got, expected)
    rng = np.random.default_rng(1)
    x = rng.normal(size=30)
    ref = [x[max(0, i - 4) : i + 1].mean() for i in range(30)]
    np.testing.assert_allclose(moving_average(list(x), 5), ref)
    with pytest.raises(ValueError, match="window=0"):
        moving_average(values, 0)


def test_report_png_and_markdown_numbers(tmp_path):
    records = _run(tmp_path)
    png, md = write_report(str(tmp_path), last_n=10)
    assert png == str(tmp_path / "report.png") and md == str(tmp_path / "report.md")

    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # Panels with data: reward, accuracy, entropy, length, clip, TIM gap, SFT loss (7 of 9):
    # three rows of three 4x3-inch panels at 100 dpi.
    assert image.imread(png).shape == (3 * 300, 3 * 400, 4)

    text = open(md).read()
    assert f"`{tmp_path}`" in text
    assert "RL steps run: 20 (steps 1-20)" in text
    assert "SFT before RL: 20 steps" in text
    assert "| first | 0 | 0.25 |" in text
    assert "| last | 20 | 0.55 |" in text
    assert "| best | 10 | 0.6 |" in text

    tail = [r for r in records if r["step"] >= 11]
    for key, name in [
        ("reward/mean", "reward"),
        ("entropy", "entropy"),
        ("response_length/mean", "response length"),
        ("pg/clip_frac", "clip fraction"),
    ]:
        values = [r[key] for r in tail if r[key] is not None]
        assert f"| {name} | `{key}` | {np.mean(values):.4g} | {tail[-1][key]:.4g} |" in text
    gaps = [r["mismatch/abs_gap_mean"] for r in tail[:-1]]  # the last step's gap is null
    assert f"| TIM gap | `mismatch/abs_gap_mean` | {np.mean(gaps):.4g} | n/a | 9 |" in text
    assert "kl_to_ref" not in text and "mismatch/token_kl" not in text
    assert "Panels without data in this run: KL to reference, TIM token KL" in text

    assert "Skipped updates: 2 of 20 steps" in text
    assert f"{sum(SKIPPED.values()):.4g} step-equivalents" in text
    assert "| timeout | 6 |" in text  # steps 3, 6, ..., 18
    total = math.fsum(r["time/step_s"] for r in records if r["step"] >= 1)
    assert f"({total:.1f} s, the sum of time/step_s over 20 RL steps" in text
    assert '"name": "grpo"' in text


def test_cli_writes_to_out_dir(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    _run(run)
    (run / "config.json").unlink()
    out = tmp_path / "out"
    assert main(["report", str(run), "--out", str(out), "--last-n", "3"]) == 0
    assert (out / "report.png").is_file()
    text = (out / "report.md").read_text()
    assert "## Last 3 RL steps" in text
    assert "No config.json in the run dir." in text
    assert str(out / "report.md") in capsys.readouterr().out


@pytest.mark.parametrize("case", ["no dir", "no metrics", "empty metrics", "not a log"])
def test_cli_errors_are_one_line_naming_the_path(tmp_path, capsys, case):
    run = tmp_path / "run"
    if case != "no dir":
        run.mkdir()
    if case == "empty metrics":
        (run / "metrics.jsonl").write_text("\n")
    if case == "not a log":
        (run / "metrics.jsonl").write_text('{"reward": 1.0}\n')
    assert main(["report", str(run)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(run) in err
    assert not (run / "report.png").exists()


def test_the_phase_chart_shows_the_steady_means_and_the_first_step(tmp_path):
    phases = {
        "time/rollout_s": 2.0,
        "time/reward_s": 0.5,
        "time/old_logprobs_s": 1.0,
        "time/update_s": 6.0,
        "time/other_s": 0.5,
    }
    first = {"step": 1, **{k: 10 * v for k, v in phases.items()}}
    first.update({"time/step_s": 100.0, "time/compile_s": 80.0})
    later = [{"step": s, **phases, "time/step_s": 10.0, "time/compile_s": 0.0} for s in (2, 3)]
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in [first, *later])
    _, md = write_report(str(tmp_path))
    text = open(md).read()
    assert "## Where the time goes" in text and "steps 2-3" in text
    rows = {line.split()[0]: line for line in text.splitlines() if line.endswith("%")}
    # The steady means (not the first step's) and their shares of the 10 s step.
    assert rows["update"].endswith("6.000 s  60.0%") and "#" * 24 + " " in rows["update"]
    assert rows["rollout"].endswith("2.000 s  20.0%")
    assert "First step (step 1): 100 s, of which 80 s compiling" in text

"""benchmarks/small_models.py on run directories written here: the mean and standard error of
three seeds against values computed by hand, the tables and the plot."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.small_models import collect, main, markdown, mean_se, summarize


def _run(root, name: str, curve: dict[int, float], final: dict[str, float] | None) -> None:
    run = root / name
    run.mkdir()
    with open(run / "metrics.jsonl", "w", encoding="utf-8") as f:
        for step in range(1, max(curve) + 1):
            record = {"step": step, "time/step_s": 30.0}
            if step in curve:
                record.update({"eval/accuracy": curve[step], "time/eval_s": 60.0})
            f.write(json.dumps(record) + "\n")
    if final is not None:
        _eval(run / f"eval_step{max(curve)}.json", max(curve), **final)


def _eval(path, step: int, greedy: float, p1: float, p8: float) -> None:
    report = {"step": step, "num_problems": 256, "greedy_accuracy": greedy,
              "pass_at_k": {"1": p1, "8": p8}}  # fmt: skip
    path.write_text(json.dumps(report))


def test_mean_se_by_hand():
    mean, se = mean_se([0.2, 0.3, 0.4])
    assert mean == pytest.approx(0.3)
    assert se == pytest.approx(0.1 / math.sqrt(3))  # sample sd 0.1 over sqrt(3 seeds)
    assert math.isnan(mean_se([0.5])[1])
    with pytest.raises(ValueError):
        mean_se([])


def test_seeds_average_per_step_with_the_models_start(tmp_path):
    _run(tmp_path, "smollm2_grpo_s0", {10: 0.25, 20: 0.30}, dict(greedy=0.30, p1=0.20, p8=0.50))
    _run(tmp_path, "smollm2_grpo_s1", {10: 0.27, 20: 0.34}, dict(greedy=0.34, p1=0.22, p8=0.58))
    _run(tmp_path, "smollm2_grpo_s2", {10: 0.26, 20: 0.32}, dict(greedy=0.32, p1=0.24, p8=0.54))
    _run(tmp_path, "smollm2_dapo_s0", {10: 0.5}, None)  # one seed, not yet evaluated
    (tmp_path / "notes").mkdir()  # not a run
    _eval(tmp_path / "smollm2_step0.json", 0, greedy=0.2, p1=0.15, p8=0.45)
    summary = summarize(collect(str(tmp_path)))
    assert sorted(summary) == ["smollm2/dapo", "smollm2/grpo"]
    grpo = summary["smollm2/grpo"]
    assert grpo["seeds"] == [0, 1, 2]
    assert grpo["curve"]["0"][0] == 0.2 and math.isnan(grpo["curve"]["0"][1])
    assert grpo["curve"]["20"][0] == pytest.approx(0.32)
    assert grpo["curve"]["20"][1] == pytest.approx(0.02 / math.sqrt(3))  # sd of .30 .34 .32
    assert grpo["final"]["pass@8"][0] == pytest.approx(0.54)
    assert grpo["final"]["pass@1"][1] == pytest.approx(0.02 / math.sqrt(3))
    assert grpo["wall_s"] == (20 * 30.0 + 2 * 60.0, 0.0)
    table = markdown(summary)
    assert "| smollm2/grpo | 3 | 20.0 | 26.0 ± 0.6 | 32.0 ± 1.2 | 12.0 ± 0.0 |" in table
    assert "| smollm2/dapo | 1 | 20.0 | 50.0 |  | 6.0 |" in table  # 10 steps of 30 s, 1 eval
    assert "| smollm2/grpo | 20 | 32.0 ± 1.2 | 22.0 ± 1.2 | 54.0 ± 2.3 | 20.0 / 45.0 |" in table
    assert "smollm2/dapo | 10" not in table  # no final evaluation yet


def test_main_writes_json_table_and_plot(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    _run(root, "gemma3_dr_grpo_s0", {5: 0.1}, dict(greedy=0.1, p1=0.1, p8=0.3))
    _run(root, "gemma3_dr_grpo_s1", {5: 0.2}, dict(greedy=0.2, p1=0.1, p8=0.4))
    out = str(tmp_path / "small_models")
    main([str(root), "--out", out])
    with open(f"{out}.json", encoding="utf-8") as f:
        report = json.load(f)
    assert report["summary"]["gemma3/dr_grpo"]["curve"]["5"][0] == pytest.approx(0.15)
    assert report["runs"]["step0"] == {}
    assert "cpus" in report["machine"]
    assert (tmp_path / "small_models.png").stat().st_size > 1000
    assert "gemma3/dr_grpo" in (tmp_path / "small_models.md").read_text()
    with pytest.raises(SystemExit, match="no runs"):
        main([str(tmp_path / "empty"), "--out", out])

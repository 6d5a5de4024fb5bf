"""benchmarks.overlap_recipe: what it reads from a finished run."""

import json

from benchmarks.overlap_recipe import run, summary


def test_summary_reads_the_rl_steps_and_the_evaluations(tmp_path):
    records = [
        {"step": -1, "sft/loss": 1.0},
        {"step": 0, "eval/accuracy": 0.5},
        *({"step": s, "time/step_s": 10.0 if s <= 5 else float(s)} for s in range(1, 10)),
        {"step": 10, "time/step_s": 1.0, "eval/accuracy": 0.75},
    ]
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    out = summary(str(tmp_path), 12.5)
    # Steps 6..10 (the first five compile): 6, 7, 8, 9, 1 -> median 7.
    assert out == {"wall_s": 12.5, "median_step_s": 7.0, "eval_accuracy": {0: 0.5, 10: 0.75}}


def test_a_finished_run_is_reused(tmp_path):
    (tmp_path / "wall_s.txt").write_text("321.5")
    assert run("sync", str(tmp_path)) == 321.5  # no training started

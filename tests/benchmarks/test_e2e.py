"""benchmarks/e2e.py on canned inputs: the worker-line and metrics.jsonl parsing, the medians of
its summary, the table, and the launcher overrides applied to the config (no peer, no model)."""

import json
import subprocess

import pytest
from ml_collections import ConfigDict

from benchmarks import e2e
from benchmarks.e2e_worker import left_padded


def step(n: int, total: float, **phases) -> dict:
    out = dict(kind="step", step=n, step_s=total, generation_s=0.0, reward_s=0.0)
    out.update(old_logprobs_s=0.0, update_s=0.0, other_s=0.0)
    out.update(phases)
    return out


def test_worker_lines_are_the_e2e_json_records_in_order():
    stdout = "\n".join(
        [
            "some library chatter",
            'E2E {"kind": "check", "logits_rel_err": 2e-06, "tokens_match": true}',
            "E2E not json but not a record either",
            'E2E {"kind": "step", "step": 1, "step_s": 60.5}',
            'E2E {"kind": "step", "step": 2, "step_s": 48.0}',
        ]
    )
    records = e2e.parse_worker_lines(stdout)
    assert [r["kind"] for r in records] == ["check", "step", "step"]
    assert records[2]["step_s"] == 48.0


def test_rljax_records_skip_the_eval_and_rename_the_phases(tmp_path):
    lines = [
        {"step": 0, "eval/accuracy": 0.3},
        {"step": 1, "time/step_s": 200.0, "time/rollout_s": 20.0, "time/update_s": 170.0,
         "time/reward_s": 0.1, "time/old_logprobs_s": 0.0, "time/other_s": 9.9,
         "time/compile_s": 150.0, "reward/mean": 0.25, "loss": 0.1},
        {"step": 2, "time/step_s": 40.0, "time/rollout_s": 10.0, "time/update_s": 29.0,
         "time/reward_s": 0.1, "time/old_logprobs_s": 0.0, "time/other_s": 0.9,
         "time/compile_s": 0.0, "time/eval_s": 30.0},
    ]  # fmt: skip
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    records = e2e.rljax_records(str(path))
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["generation_s"] == 20.0 and records[0]["compile_s"] == 150.0
    assert records[0]["reward_mean"] == 0.25 and "loss" not in records[0]
    assert "time/eval_s" not in records[1] and "eval_s" not in records[1]


def test_summary_takes_medians_of_later_steps_then_over_runs():
    runs = [
        {"steps": [step(1, 100.0, update_s=90.0), step(2, 40.0, update_s=30.0),
                   step(3, 44.0, update_s=34.0), step(4, 60.0, update_s=50.0)]},
        {"steps": [step(1, 80.0), step(2, 50.0, update_s=40.0), step(3, 50.0, update_s=40.0),
                   step(4, 50.0, update_s=40.0)]},
        {"error": "tunix worker failed (exit 1): boom", "steps": [step(1, 1.0)]},
    ]  # fmt: skip
    s = e2e.summarize(runs)
    assert s["steady_step_per_run_s"] == [44.0, 50.0]
    assert s["steady_step_s"] == 47.0  # median of the per-run medians
    assert s["first_step_s"] == 90.0 and s["first_step_per_run_s"] == [100.0, 80.0]
    assert s["phases_s"]["update_s"] == 37.0  # medians 34 and 40
    assert "first_step_compile_s" not in s  # only the rljax launcher reports compile time
    assert e2e.summarize([runs[2]]) == {}


def test_table_has_every_row_and_says_why_a_side_is_missing():
    rljax = e2e.summarize(
        [{"steps": [step(1, 200.0, compile_s=150.0), step(2, 40.0, generation_s=10.0,
                                                           update_s=29.0, reward_s=0.05,
                                                           other_s=0.95, compile_s=0.0)]}]
    )  # fmt: skip
    trl = e2e.summarize([{"steps": [step(1, 60.0), step(2, 48.0, update_s=35.0)]}])
    table = e2e.format_table(
        {"rljax": rljax, "trl": trl}, {"tunix": "skipped (no --tunix_python given)"}, 2
    )
    lines = table.splitlines()
    assert lines[0] == "| | rljax | TRL 1.16 | Tunix 0.1.7 |"
    assert lines[2] == "| steady step, median of steps 2..2 | 40.0 s | 48.0 s | - |"
    assert lines[3] == "| first step | 200.0 s; compiling 150.0 s | 60.0 s | - |"
    assert "| separate old-log-prob pass | none (0 s) | none (0 s) | - |" in lines
    assert "| update (forward + backward + optimizer) | 29.0 s | 35.0 s | - |" in lines
    assert "| host work / other | 1.00 s (reward 0.05) | 0.00 s (reward 0.00) | - |" in lines
    assert lines[-1] == "Tunix 0.1.7: skipped (no --tunix_python given)"


def test_flags_override_the_config_like_the_launcher():
    config = ConfigDict(dict(model=dict(dtype="bfloat16"), task=dict(max_prompt_len=96)))
    config.train = ConfigDict(dict(pack_ratio=0.0, steps=30))
    e2e.apply_flags(
        config,
        [
            "--config.model.dtype=float32",
            "--config.task.max_prompt_len=72",
            "--config.train.pack_ratio=0.9",
            "--not_a_config_flag",
        ],
    )
    assert config.model.dtype == "float32"
    assert config.task.max_prompt_len == 72 and config.train.pack_ratio == 0.9


def test_a_failed_process_is_one_line_with_its_last_error():
    proc = subprocess.CompletedProcess(
        ["x"], 1, stdout="", stderr="Traceback\n  File ...\nValueError: bad shape\nexiting\n"
    )
    assert e2e.failure("tunix worker", proc) == (
        "tunix worker failed (exit 1): ValueError: bad shape"
    )


@pytest.mark.parametrize("argv", [["--steps", "1"], ["--rounds", "0"]])
def test_too_few_steps_or_rounds_are_refused(argv):
    with pytest.raises(SystemExit):
        e2e.parse_args(argv)


def test_quick_is_two_steps_one_round():
    args = e2e.parse_args(["--quick"])
    assert (args.steps, args.rounds) == (2, 1)


def test_left_padded_puts_each_list_at_the_right_edge():
    tokens, mask = left_padded([[5, 6, 7], [9]])
    assert tokens.tolist() == [[5, 6, 7], [0, 0, 9]]
    assert mask.tolist() == [[True, True, True], [False, False, True]]

"""Evaluate a training run's checkpoint: pass@k, avg@n and greedy accuracy, as a JSON report.

  rljax eval --config=configs/grpo_addition.py --config.run_dir=runs/x \\
      [--step=N] [--n_samples=16] [--k=1,4,16] [--temperature=T] [--split=test] \\
      [--num_problems=P] [--out=PATH]

Use the training run's config file and overrides, so that model, task and prompt format
match. The policy comes from run_dir/checkpoints: the newest checkpoint, or --step=N;
--step=0 evaluates the model as the config builds it, untrained. Each problem gets
--n_samples samples at --temperature (default rollout.temperature; top_k/top_p from
rollout.*) and one greedy decode; on an episodic task (multi-turn agents) each is a whole
episode, correct when it succeeds, and the report counts turns and failed episodes instead of
completion lengths. A k above --n_samples is left out. The report (default
run_dir/eval_step{N}.json) holds pass@k, avg@n, greedy accuracy, mean completion length and
each problem's count of correct samples; a short table is printed. A missing checkpoint, a
typo in a key or a bad value stops the launcher with a one-line error (-v: the traceback).
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from rljax.config import validate_config
from rljax.launch.flags import begin, parse_flags
from rljax.train.builders import build_task
from rljax.train.compile_cache import enable_compilation_cache
from rljax.train.episodes import episodic_sample_eval, is_episodic
from rljax.train.evaluation import restore_policy, sample_eval
from rljax.train.prompts import Prompts

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to the training run's ml_collections config.", lock_config=True
)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: newest; 0: untrained).")
_N_SAMPLES = flags.DEFINE_integer("n_samples", 16, "Samples per problem (n of avg@n).")
_K = flags.DEFINE_list("k", ["1", "4", "16"], "The k of pass@k, comma-separated.")
_TEMPERATURE = flags.DEFINE_float(
    "temperature", None, "Sampling temperature (default: rollout.temperature)."
)
_SPLIT = flags.DEFINE_string("split", "test", "The task split to evaluate on.")
_NUM_PROBLEMS = flags.DEFINE_integer(
    "num_problems", None, "The split's first this many problems (default: task.eval_size)."
)
_OUT = flags.DEFINE_string("out", None, "Report path (default: run_dir/eval_step{N}.json).")


def run(config) -> tuple[dict, str]:
    """Restores the policy, evaluates it; returns (report, the path it was written to)."""
    try:
        ks = [int(k) for k in _K.value]
    except ValueError as err:
        raise ValueError(f"--k={','.join(_K.value)} must be integers, e.g. --k=1,4,16") from err
    dropped = [k for k in ks if k > _N_SAMPLES.value]
    if dropped:
        logging.warning("pass@%s left out: k > n_samples=%d", dropped, _N_SAMPLES.value)
    config = validate_config(config)
    enable_compilation_cache(config.train.compilation_cache)
    step, tokenizer, graphdef, params = restore_policy(config, _STEP.value)
    task = build_task(config)
    prompts = Prompts.from_config(config, tokenizer)
    evaluate = episodic_sample_eval if is_episodic(task) else sample_eval
    report = evaluate(
        graphdef,
        params,
        task,
        prompts,
        config,
        _N_SAMPLES.value,
        [k for k in ks if k <= _N_SAMPLES.value],
        temperature=_TEMPERATURE.value,
        split=_SPLIT.value,
        num_problems=_NUM_PROBLEMS.value,
    )
    report = {"run_dir": os.path.abspath(config.run_dir), "step": step, **report}
    out = _OUT.value or os.path.join(config.run_dir, f"eval_step{step}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    return report, out


def main(argv: list[str]) -> None:
    begin(argv)
    try:
        report, out = run(_CONFIG.value)
    except (ValueError, OSError) as err:  # bad settings, a missing or corrupted checkpoint
        if flags.FLAGS["verbosity"].present:
            raise
        sys.exit("error: " + " ".join(str(err).split()))
    n = report["n_samples"]
    print(
        f"step {report['step']}, {report['split']} split: {report['num_problems']} problems, "
        f"{n} samples each at temperature {report['temperature']:g}"
    )
    for k, value in report["pass_at_k"].items():
        print(f"  pass@{k:<6}{value:.3f}")
    print(f"  {'avg@' + str(n):<11}{report['avg_at_n']:.3f}")
    print(f"  {'greedy':<11}{report['greedy_accuracy']:.3f}")
    if "mean_turns" in report:  # an episodic task: pass@k and accuracy count successes
        print(
            f"  {'turns':<11}{report['mean_turns']:.2f} (greedy {report['greedy_mean_turns']:.2f})"
        )
    else:
        print(f"  {'length':<11}{report['mean_completion_length']:.1f} tokens")
    print(f"report: {out}")


def launch(argv: list[str] | None = None) -> None:
    """Parses `argv` (default sys.argv; argv[0] is the program's name) and evaluates; exits."""
    flags.mark_flag_as_required("config")
    app.run(main, argv=argv, flags_parser=parse_flags)

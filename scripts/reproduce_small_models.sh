#!/usr/bin/env bash
# The small-model anchor with error bars: every (model, algorithm, seed) of
# configs/small_models.py trained, its last checkpoint evaluated on 256 held-out problems
# (greedy accuracy and pass@8; the model as loaded too, as step 0), then mean +- standard
# error over the seeds per step
# (benchmarks/results/small_models.{json,md,png}). Each run's directory keeps its
# metrics.jsonl, report.md and eval json; a rerun resumes finished and killed runs alike.
#
#   bash scripts/reproduce_small_models.sh                 # the whole grid (hours on a CPU)
#   MODELS=smollm2 ALGORITHMS=grpo STEPS=12 EVAL_EVERY=6 bash scripts/reproduce_small_models.sh
#
# Environment: MODELS (smollm2 gemma3), ALGORITHMS (grpo dr_grpo dapo), SEEDS (0 1 2), STEPS
# (the recipes' 30), EVAL_EVERY (15), FINAL_EVAL (1; 0 skips the 8-sample evaluation of each
# run's last checkpoint, ~20 min per run on a 2-core CPU, leaving the greedy evaluations the
# runs log), ROOT (runs/small_models), EXTRA (more --config flags, e.g. a local GSM8K file:
# see configs/small_models.py).
set -euo pipefail
cd "$(dirname "$0")/.."
make install >/dev/null
RLJAX=.venv/bin/rljax
MODELS=${MODELS:-"smollm2 gemma3"}
ALGORITHMS=${ALGORITHMS:-"grpo dr_grpo dapo"}
SEEDS=${SEEDS:-"0 1 2"}
STEPS=${STEPS:-30}
EVAL_EVERY=${EVAL_EVERY:-15}
FINAL_EVAL=${FINAL_EVAL:-1}
ROOT=${ROOT:-runs/small_models}
EXTRA=${EXTRA:-}

for model in $MODELS; do
  # The starting point: the model as loaded (step 0; for Gemma 3 before its SFT warm start).
  base="$ROOT/${model}_step0.json"
  if [ ! -f "$base" ]; then
    # shellcheck disable=SC2086
    $RLJAX eval --config="configs/small_models.py:${model},grpo" --config.run_dir="$ROOT/${model}_step0" \
      --step=0 --n_samples=8 --k=1,8 --num_problems=256 --out="$base" $EXTRA
  fi
  for algorithm in $ALGORITHMS; do
    for seed in $SEEDS; do
      run="$ROOT/${model}_${algorithm}_s${seed}"
      flags=(--config="configs/small_models.py:${model},${algorithm}" --config.seed="$seed"
             --config.run_dir="$run" --config.train.steps="$STEPS"
             --config.train.eval_every="$EVAL_EVERY" --config.train.checkpoint_every="$EVAL_EVERY")
      # shellcheck disable=SC2086  # EXTRA is a list of flags
      $RLJAX train "${flags[@]}" $EXTRA
      if [ "$FINAL_EVAL" = 1 ]; then
        # shellcheck disable=SC2086
        $RLJAX eval "${flags[@]}" $EXTRA --n_samples=8 --k=1,8 --num_problems=256
      fi
      $RLJAX report "$run" >/dev/null
    done
  done
done
.venv/bin/python -m benchmarks.small_models "$ROOT"

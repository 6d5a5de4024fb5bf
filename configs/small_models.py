"""The small-model anchor: GRPO, Dr. GRPO or DAPO on SmolLM2-135M-Instruct or Gemma 3 270M
(both from the package registry), on GSM8K-format word problems, evaluated on 256 held-out
problems. `scripts/reproduce_small_models.sh` runs every (model, algorithm, seed) and
`python -m benchmarks.small_models` turns the run directories into mean +- standard error.

  rljax train --config=configs/small_models.py:smollm2,grpo --config.seed=1

The part after ":" is MODEL,ALGORITHM. The models' own recipes
(configs/grpo_smollm2_arith.py, configs/grpo_gemma3_arith.py) set the prompt format, lengths
and learning rate; only the algorithm and the evaluation size change here. For the real
GSM8K, point the task at your JSONL file: `--config.task.name=local
--config.task.train_path=gsm8k_train.jsonl --config.task.test_path=gsm8k_test.jsonl` (the
`local` task reads GSM8K's "question"/"answer" columns and grades the number after "####").
"""

from ml_collections import ConfigDict

from configs.grpo_gemma3_arith import get_config as _gemma3
from configs.grpo_smollm2_arith import get_config as _smollm2

MODELS = {"smollm2": _smollm2, "gemma3": _gemma3}
# Each method's settings at the recipes' budget: GRPO as in the recipes (std-normalised group
# advantages, token-mean, no KL); Dr. GRPO (no std normalisation, the generation budget as
# constant normaliser); DAPO (clip-higher, overlong punishment over the last 8 tokens of the
# budget, dynamic sampling with one refill round).
ALGORITHMS = {
    "grpo": None,
    "dr_grpo": dict(name="dr_grpo"),
    "dapo": dict(name="dapo", cache_len=8, clip_eps_low=0.2, clip_eps_high=0.28),
}
EVAL_PROBLEMS = 256


def get_config(spec: str = "smollm2,grpo") -> ConfigDict:
    model, _, algorithm = spec.partition(",")
    if model not in MODELS or algorithm not in ALGORITHMS:
        raise ValueError(
            f"configs/small_models.py:{spec}: use MODEL,ALGORITHM with MODEL in "
            f"{sorted(MODELS)} and ALGORITHM in {sorted(ALGORITHMS)}"
        )
    config = MODELS[model]()
    if ALGORITHMS[algorithm] is not None:  # both normalise by, or punish near, the budget
        budget = dict(max_len=config.rollout.max_new_tokens)
        config.algorithm = ConfigDict({**ALGORITHMS[algorithm], **budget})
    if algorithm == "dapo":
        config.rollout.max_refill_rounds = 1
    config.task.eval_size = EVAL_PROBLEMS
    config.run_dir = f"runs/small_models/{model}_{algorithm}"
    return config

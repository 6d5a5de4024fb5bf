"""On-policy distillation: a fresh, smaller student samples addition answers and the
`make train` model (configs/grpo_addition.py, after its 300 GRPO steps) grades every sampled
token; the per-token advantage is log pi_teacher - log pi_student (the reverse KL, negated).

  make train   # the teacher, in runs/grpo_addition
  python -m launchers.train --config=configs/on_policy_distillation_addition.py

The same student trained by GRPO alone from the same warm start, for comparison:

  python -m launchers.train --config=configs/on_policy_distillation_addition.py \\
    --config.algorithm.name=grpo --config.teacher.run_dir= --config.run_dir=runs/student_grpo
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/on_policy_distillation_addition"
    # Half the teacher's width, one layer instead of two: about a seventh of its parameters.
    config.model.update(d_model=64, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=192)
    config.algorithm = ConfigDict(dict(name="on_policy_distillation"))  # teacher_coef 1
    config.teacher.run_dir = "runs/grpo_addition"
    config.train.update(steps=100, eval_every=25)
    return config

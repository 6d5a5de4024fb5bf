"""On-policy distillation: a fresh, smaller student samples addition answers and the
`make train` model (configs/grpo_addition.py, after its 300 GRPO steps) grades every sampled
token; the per-token advantage is log pi_teacher - log pi_student (the reverse KL, negated),
centred on its batch mean.

  make train   # the teacher, in runs/grpo_addition
  python -m launchers.train --config=configs/on_policy_distillation_addition.py

The same student trained by GRPO alone from the same warm start, for comparison:

  python -m launchers.train --config=configs/on_policy_distillation_addition.py:grpo

Measured (README, "On-policy distillation, measured"): no faster than GRPO here.
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config(variant: str = "") -> ConfigDict:
    """The distillation run, or with `variant="grpo"` the GRPO baseline on the same student."""
    if variant not in ("", "grpo"):
        raise ValueError(f"variant={variant!r}: '' (distillation) or 'grpo' (the baseline)")
    config = _base()
    # Half the teacher's width: about a quarter of its parameters.
    config.model.update(d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=192)
    config.train.update(steps=200, learning_rate=3e-4, eval_every=25)
    if variant == "grpo":
        config.run_dir = "runs/student_grpo"
        config.algorithm = ConfigDict(dict(name="grpo"))
        return config
    config.run_dir = "runs/on_policy_distillation_addition"
    config.algorithm = ConfigDict(
        dict(name="on_policy_distillation", teacher_coef=1.0, center=True)
    )
    config.teacher.run_dir = "runs/grpo_addition"
    return config

"""On-policy distillation: a fresh, smaller student samples addition answers and the
`make train` model (configs/grpo_addition.py, after its 300 GRPO steps) grades every sampled
token; the per-token advantage is log pi_teacher - log pi_student (the reverse KL, negated),
centred on its batch mean.

  make train   # the teacher, in runs/grpo_addition
  python -m launchers.train --config=configs/on_policy_distillation_addition.py

The same student trained by GRPO alone from the same warm start, for comparison:

  python -m launchers.train --config=configs/on_policy_distillation_addition.py:grpo

Measured (README, "On-policy distillation, measured"): the one-sample advantage is no faster
than GRPO here; GKD's full-distribution loss (configs/gkd_addition.py) is.
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config(variant: str = "") -> ConfigDict:
    """The distillation run, or with `variant="grpo"` the GRPO baseline on the same student."""
    if variant not in ("", "grpo"):
        raise ValueError(f"variant={variant!r}: '' (distillation) or 'grpo' (the baseline)")
    config = _base()
    # Three quarters of the teacher's width (about 60% of its parameters), after a short
    # warm start: the student starts weak (0.02 held-out) but can learn.
    config.model.update(d_model=96, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=288)
    config.sft.steps = 200
    config.train.update(steps=600, learning_rate=3e-4, eval_every=50)
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

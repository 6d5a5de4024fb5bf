"""Prompt selection and replay samplers: host-side, numpy, with exact checkpointable state.

Each sampler's `state()` is a nested dict of numpy arrays and Python numbers (no empty arrays,
which orbax cannot save) for `Checkpointer.save(..., driver_state)`, and `load(state)` restores
it; randomness comes from `np.random.default_rng((seed, step))`, so a resumed run selects
exactly what a straight run does.
"""

from rljax.data.samplers.curriculum import AccuracyCurriculum, CurriculumSettings, level_probs
from rljax.data.samplers.dare import (
    DARESelector,
    DARESettings,
    rollout_tiers,
    selection_logits,
    selection_probs,
    snis_success,
)
from rljax.data.samplers.fresh_per import (
    FreshPERBuffer,
    FreshPERSettings,
    beta_schedule,
    fresh_priority,
    is_weights,
    sampling_probs,
)
from rljax.data.samplers.heapa import HeaPAPool, HeaPASettings
from rljax.data.samplers.lope import (
    LoPESettings,
    Merged,
    all_failed,
    lorem_prefix,
    merge,
    perturbed_prompts,
)

__all__ = [
    "AccuracyCurriculum",
    "CurriculumSettings",
    "level_probs",
    "DARESelector",
    "DARESettings",
    "rollout_tiers",
    "selection_logits",
    "selection_probs",
    "snis_success",
    "FreshPERBuffer",
    "FreshPERSettings",
    "beta_schedule",
    "fresh_priority",
    "is_weights",
    "sampling_probs",
    "HeaPAPool",
    "HeaPASettings",
    "LoPESettings",
    "Merged",
    "all_failed",
    "lorem_prefix",
    "merge",
    "perturbed_prompts",
]

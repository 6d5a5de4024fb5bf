"""Named algorithms: a transform chain plus an objective, a few lines each.

`Algorithm` bundles what the train steps need; `established` holds the presets every RL
framework has (GRPO, PPO, RLOO, DAPO, ...), `seed_methods` those of recent papers,
`entropy_control` those that steer the policy's entropy, `multi_turn` turn-level credit for
episodic tasks, `trust_region` the 2026 alternatives to PPO's clip (SAPO, GMPO, DPPO).
Settings that many presets share are typed: `PPOSettings` (PPO clip, KL loss, entropy bonus,
aggregation) and `Regularizers` (KL loss, entropy bonus, aggregation); each field is an
`algorithm.*` config key.
"""

from rljax.algorithms.base import Algorithm, PPOSettings, Regularizers
from rljax.algorithms.entropy_control import (
    adaptive_entropy,
    clip_cov,
    entrocraft,
    entropic,
    kl_cov,
    uec_rl,
)
from rljax.algorithms.established import (
    cispo,
    dapo,
    dr_grpo,
    gpg,
    grpo,
    gspo,
    opo,
    pass_at_k,
    ppo,
    reinforce_pp,
    remax,
    rloo,
)
from rljax.algorithms.multi_turn import turn_grpo, turn_ppo
from rljax.algorithms.seed_methods import (
    dgpo,
    dr_mas,
    edo,
    expthink,
    gdpo,
    gkd,
    gprl,
    ibpo,
    kernel_baseline,
    lead,
    maxrl,
    mu_grpo,
    on_policy_distillation,
    otb,
    power_distillation,
    segment_po,
)
from rljax.algorithms.trust_region import dppo, gmpo, ipo, sapo

__all__ = [
    "Algorithm",
    "PPOSettings",
    "Regularizers",
    "grpo",
    "dr_grpo",
    "dapo",
    "gspo",
    "cispo",
    "gpg",
    "rloo",
    "reinforce_pp",
    "opo",
    "pass_at_k",
    "ppo",
    "remax",
    "mu_grpo",
    "segment_po",
    "expthink",
    "lead",
    "dr_mas",
    "kernel_baseline",
    "ibpo",
    "gprl",
    "gdpo",
    "maxrl",
    "on_policy_distillation",
    "gkd",
    "dgpo",
    "otb",
    "power_distillation",
    "edo",
    "entrocraft",
    "entropic",
    "clip_cov",
    "kl_cov",
    "uec_rl",
    "adaptive_entropy",
    "turn_grpo",
    "turn_ppo",
    "sapo",
    "gmpo",
    "dppo",
    "ipo",
]

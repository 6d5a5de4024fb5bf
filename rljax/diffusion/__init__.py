"""Masked-diffusion language models (LLaDA-style): the policy, its block-wise sampler, likelihood
estimators, RL objectives, the algorithms that pair them, and the steps, collector and SFT
warm start that train them on the one driver (`rljax.train.train` with
`model.kind = "diffusion"`; `rljax.diffusion.engine`)."""

from rljax.diffusion.algorithms import (
    DIFFUSION_ALGORITHMS,
    DiffusionAlgorithm,
    DiffusionSettings,
    daca_progress,
)
from rljax.diffusion.block_size import (
    best_block_sizes,
    block_size_conflict_score,
    measure_rewards_by_size,
)
from rljax.diffusion.collect import DiffusionDraw, decode_texts
from rljax.diffusion.likelihood import (
    elbo_fixed_count,
    elbo_random_t,
    masked_token_logprobs,
    one_pass_estimate,
    rldf_logprobs,
    rldf_states,
    rldf_step_weights,
    rldf_timesteps,
    strata,
    stratified_estimate,
)
from rljax.diffusion.objectives import (
    daca_advantages,
    daca_weights,
    diffu_grpo_loss,
    rldf_loss,
    rspo_loss,
    stable_steps,
    wd1_loss,
)
from rljax.diffusion.policy import (
    DiffusionConfig,
    create_diffusion_model,
    diffusion_config,
    masked_logits,
)
from rljax.diffusion.sampler import (
    DiffusionRollout,
    diffusion_generate,
    diffusion_generate_per_row,
    num_transfer_tokens,
)
from rljax.diffusion.sft import sft_loss, sft_optimizer
from rljax.diffusion.steps import DiffusionRolloutConfig, make_diffusion_steps

__all__ = [
    "DiffusionConfig",
    "diffusion_config",
    "create_diffusion_model",
    "masked_logits",
    "DiffusionRollout",
    "diffusion_generate",
    "diffusion_generate_per_row",
    "num_transfer_tokens",
    "masked_token_logprobs",
    "one_pass_estimate",
    "elbo_random_t",
    "elbo_fixed_count",
    "strata",
    "stratified_estimate",
    "rldf_step_weights",
    "rldf_timesteps",
    "rldf_states",
    "rldf_logprobs",
    "diffu_grpo_loss",
    "wd1_loss",
    "rspo_loss",
    "rldf_loss",
    "stable_steps",
    "daca_weights",
    "daca_advantages",
    "best_block_sizes",
    "block_size_conflict_score",
    "measure_rewards_by_size",
    "DIFFUSION_ALGORITHMS",
    "DiffusionAlgorithm",
    "DiffusionSettings",
    "daca_progress",
    "DiffusionRolloutConfig",
    "make_diffusion_steps",
    "DiffusionDraw",
    "decode_texts",
    "sft_loss",
    "sft_optimizer",
]

"""Masked-diffusion language models (LLaDA-style): the policy and its block-wise sampler."""

from rljax.diffusion.policy import (
    DiffusionConfig,
    create_diffusion_model,
    diffusion_config,
    masked_logits,
)
from rljax.diffusion.sampler import DiffusionRollout, diffusion_generate, num_transfer_tokens

__all__ = [
    "DiffusionConfig",
    "diffusion_config",
    "create_diffusion_model",
    "masked_logits",
    "DiffusionRollout",
    "diffusion_generate",
    "num_transfer_tokens",
]

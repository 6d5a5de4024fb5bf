"""Rollouts: the jitted KV-cache sampler and next-token distributions (with CUTS)."""

from rljax.rollout.cuts import (
    cuts_logprobs,
    cuts_row_mask,
    num_cuts_samples,
    training_rollout_logprobs,
)
from rljax.rollout.sampler import Rollout, generate
from rljax.rollout.sampling import SamplingParams, process_logits, sample_token

__all__ = [
    "Rollout",
    "generate",
    "SamplingParams",
    "process_logits",
    "sample_token",
    "cuts_logprobs",
    "cuts_row_mask",
    "num_cuts_samples",
    "training_rollout_logprobs",
]

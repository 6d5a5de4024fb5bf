"""Rollouts: the jitted KV-cache sampler and next-token distributions."""

from rljax.rollout.sampler import Rollout, generate
from rljax.rollout.sampling import SamplingParams, process_logits, sample_token

__all__ = ["Rollout", "generate", "SamplingParams", "process_logits", "sample_token"]

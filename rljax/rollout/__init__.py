"""Rollouts: the continuous-batching engine (and its multi-turn episodes), the static KV-cache
sampler and next-token distributions (with CUTS)."""

from rljax.rollout.cuts import (
    cuts_logprobs,
    cuts_row_mask,
    num_cuts_samples,
    training_rollout_logprobs,
)
from rljax.rollout.engine import Engine, EngineConfig, engine_generate
from rljax.rollout.sampler import Rollout, generate
from rljax.rollout.sampling import SamplingParams, process_logits, sample_token
from rljax.rollout.stop import stop_strings
from rljax.rollout.turns import TurnHandler, generate_turns

__all__ = [
    "Engine",
    "EngineConfig",
    "engine_generate",
    "TurnHandler",
    "generate_turns",
    "stop_strings",
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

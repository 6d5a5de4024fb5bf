"""Training: log-probs, jitted steps, SFT warm start, checkpoints and the driver loop."""

from rljax.train.builders import build_policy, validate_config
from rljax.train.checkpoint import Checkpointer
from rljax.train.logprobs import completion_logprobs, token_logprobs_and_entropy
from rljax.train.loop import evaluate, train
from rljax.train.sft import make_sft_step, run_sft
from rljax.train.steps import RolloutConfig, Steps, UpdateConfig, make_steps

__all__ = [
    "Checkpointer",
    "build_policy",
    "completion_logprobs",
    "token_logprobs_and_entropy",
    "evaluate",
    "train",
    "validate_config",
    "make_sft_step",
    "run_sft",
    "RolloutConfig",
    "Steps",
    "UpdateConfig",
    "make_steps",
]

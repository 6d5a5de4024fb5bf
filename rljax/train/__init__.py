"""Training: log-probs, jitted steps, SFT warm start, checkpoints and the driver loop."""

from rljax.train.builders import (
    build_policy,
    build_train_state,
    preset_settings,
    register_algorithm,
)
from rljax.train.checkpoint import Checkpointer
from rljax.train.collector import Collection, Collector, GroupCollector, refill
from rljax.train.critic import critic_values, init_critic
from rljax.train.evaluation import (
    greedy_eval,
    pass_at_k,
    restore_checkpoint,
    restore_policy,
    sample_eval,
)
from rljax.train.export import export_run
from rljax.train.guard import SkipGuard
from rljax.train.host_batch import HostBatch
from rljax.train.kinds import PolicyKind, policy_kind
from rljax.train.logprobs import (
    completion_logprobs,
    policy_states,
    token_hellinger,
    token_logprobs_and_entropy,
    token_stats,
)
from rljax.train.loop import train
from rljax.train.sft import make_sft_step, run_sft
from rljax.train.statistics import StatisticInputs, register_token_statistic
from rljax.train.steps import BATCH_STATS, RolloutConfig, Steps, UpdateConfig, make_steps

__all__ = [
    "BATCH_STATS",
    "StatisticInputs",
    "register_token_statistic",
    "build_train_state",
    "Collection",
    "Collector",
    "GroupCollector",
    "HostBatch",
    "PolicyKind",
    "policy_kind",
    "refill",
    "critic_values",
    "init_critic",
    "policy_states",
    "token_hellinger",
    "token_stats",
    "Checkpointer",
    "build_policy",
    "register_algorithm",
    "preset_settings",
    "completion_logprobs",
    "token_logprobs_and_entropy",
    "greedy_eval",
    "pass_at_k",
    "restore_checkpoint",
    "restore_policy",
    "sample_eval",
    "export_run",
    "SkipGuard",
    "train",
    "make_sft_step",
    "run_sft",
    "RolloutConfig",
    "Steps",
    "UpdateConfig",
    "make_steps",
]

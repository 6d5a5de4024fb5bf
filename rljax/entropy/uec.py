"""UEC-RL's selection rules and the host-advantage transform.

"Unified Entropy Control for Reinforcement Learning" (UEC-RL, arXiv 2604.14646) explores more
on difficult prompts and stabilises with a replay of high-advantage samples. The repository
named in the paper is not public; the rules here follow the same authors' EFRame code
(arXiv 2506.22200, `verl/trainer/ray_trainer.py`), whose README names its environment UEC-RL:

- a prompt is hard when all its rewards are (about) zero; it gets `explore_samples` extra
  rollouts at `explore_temperature`, whose GRPO advantages are taken within those samples,
  and only the samples with |A| > `explore_keep_threshold` (rare successes) are kept;
- ordinary samples are kept when |A| > `keep_threshold` (groups without signal are dropped);
- truncated samples with A > 0 are dropped (a cut-off answer should not be reinforced);
- kept samples wait in a batch buffer until a full batch is there, then one update runs;
- samples of an updated batch with |A| > `replay_threshold` enter a FIFO replay buffer of
  `replay_capacity` batches; every `replay_every` steps the policy takes an extra update on
  replayed samples (the "stabiliser": replaying rare successes lowers entropy, see Entrocraft).

The advantages are computed on the host when the samples are selected, so the update reads
them from `batch.extras["sequence_advantage"]` (`host_advantages`). The driver that runs these
steps is `rljax.train.uec`.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rljax.advantages.sequence import sequence_advantages
from rljax.core import keys
from rljax.core.batch import Batch
from rljax.core.transform import Transform


@dataclasses.dataclass(frozen=True)
class UECSettings:
    """UEC-RL's exploration and replay settings (defaults: EFRame's published run).

    Attributes:
      explore_samples: extra rollouts per hard prompt (EFRame: 20).
      explore_temperature: sampling temperature of the extra rollouts (1.2).
      hard_reward_threshold: a prompt is hard when every one of its rewards is below this.
      keep_threshold: ordinary samples are kept when |A| exceeds it (0.05).
      explore_keep_threshold: extra samples are kept when |A| exceeds it (1.0).
      replay_threshold: samples of an updated batch with |A| above it are replayed (1.0).
      replay_capacity: replay buffer size in batches (2.0).
      replay_every: steps between replay updates (5).
      drop_truncated_positive: drop truncated samples with a positive advantage.
    """

    explore_samples: int = 20
    explore_temperature: float = 1.2
    hard_reward_threshold: float = 0.01
    keep_threshold: float = 0.05
    explore_keep_threshold: float = 1.0
    replay_threshold: float = 1.0
    replay_capacity: float = 2.0
    replay_every: int = 5
    drop_truncated_positive: bool = True

    def __post_init__(self):
        if self.explore_samples < 2:
            raise ValueError(
                f"explore_samples={self.explore_samples} must be >= 2: the extra rollouts' "
                "advantages are group-relative"
            )
        if self.explore_temperature <= 0:
            raise ValueError(f"explore_temperature={self.explore_temperature} must be > 0")
        if self.replay_capacity < 1:
            raise ValueError(
                f"replay_capacity={self.replay_capacity} batches must be >= 1 so one replay "
                "batch fits"
            )
        if self.replay_every < 1:
            raise ValueError(f"replay_every={self.replay_every} must be >= 1")
        for name in ("keep_threshold", "explore_keep_threshold", "replay_threshold"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")


def hard_prompts(rewards: np.ndarray, group_size: int, threshold: float) -> np.ndarray:
    """[N] bool: prompts all of whose `group_size` rewards are below `threshold`.

    Args:
      rewards: [N * G] rewards, laid out as N contiguous groups.
      group_size: G.
      threshold: the reward a sample must reach to count as solved.

    Raises:
      ValueError: if G does not divide the number of rewards.
    """
    rewards = np.asarray(rewards)
    if rewards.ndim != 1 or rewards.shape[0] % group_size:
        raise ValueError(
            f"rewards of shape {rewards.shape} are not [N * G] groups of group_size={group_size}"
        )
    return np.all(rewards.reshape(-1, group_size) < threshold, axis=1)


def truncated_rows(completion_tokens: np.ndarray, completion_mask: np.ndarray, eos_id: int):
    """[B] bool: completions that filled the generation budget without ending in EOS."""
    tokens, mask = np.asarray(completion_tokens), np.asarray(completion_mask)
    return mask[:, -1] & (tokens[:, -1] != eos_id)


def keep_samples(
    advantages: np.ndarray,
    truncated: np.ndarray,
    threshold: float,
    drop_truncated_positive: bool = True,
) -> np.ndarray:
    """[B] bool: samples with |A| > threshold, minus truncated ones with A > 0 if asked."""
    advantages = np.asarray(advantages)
    keep = np.abs(advantages) > threshold
    if drop_truncated_positive:
        keep &= ~(np.asarray(truncated) & (advantages > 0))
    return keep


def host_advantages(key: str = "sequence_advantage") -> Transform:
    """Transform writing advantages computed on the host: A[b, t] = extras[key][b] on valid tokens.

    For drivers that select samples by their advantage before the update (UEC-RL), so the
    advantage the update uses is the one the selection saw.

    Args:
      key: the [B] extras entry holding one advantage per sample.

    Returns:
      A stateless `Transform`. Metrics "advantages/{mean,std,min,max}" over valid tokens.
    """

    def fn(rewards: jax.Array, batch: Batch) -> jax.Array:
        del rewards
        if key not in batch.extras:
            raise ValueError(
                f"host_advantages needs batch.extras[{key!r}] ([B] advantages chosen on the "
                "host); the UEC-RL driver (rljax.train.uec) writes it"
            )
        adv = batch.extras[key]
        chex.assert_shape(adv, (batch.completion_mask.shape[0],))
        return adv.astype(jnp.float32)

    return sequence_advantages(
        "host_advantages",
        fn,
        zero_std=False,
        reads={keys.extra(key)},
        sequence_rewards=False,
    )

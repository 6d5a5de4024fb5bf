"""Sample-level training block sizes for diffusion-LM RL (Block-R1).

Block-R1 (benchmark and Block-R1-41K dataset, github.com/YanJiangJerry/Block-R1) observes
that the block size of the semi-autoregressive sampler sets the parallel decoding granularity
and so the rollouts RL learns from, that different domains (and samples) are helped by
different sizes, and trains each sample with its own "best-improved training block size". The
abstract gives no formula for that size nor for its Block Size Conflict Score, so this module
states the rules it implements (each marked "interpretation"):

- `measure_rewards_by_size`: the mean reward of G completions of each prompt sampled by the
  current policy at each candidate block size (one batched `diffusion_generate_per_row` call).
- `best_block_sizes`: per prompt, the candidate with the highest mean reward; ties go to the
  larger block size (more tokens decoded in parallel for the same reward).
- `block_size_conflict_score`: the share of samples whose best size is not the size a shared
  (per-domain, or global) block size would use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np
from flax import nnx

from rljax.diffusion.sampler import diffusion_generate_per_row


def best_block_sizes(rewards_by_size: np.ndarray, block_sizes: Sequence[int]) -> np.ndarray:
    """Index of each sample's best-improved training block size (Block-R1, interpretation).

    Interpretation: the best size of a sample is the candidate under which the policy's
    completions earn the highest mean reward; among equal rewards (e.g. a prompt solved, or
    failed, at every size) the larger block size wins, since it decodes more tokens per step
    for the same reward.

    Args:
      rewards_by_size: [N, S] mean reward of sample n under candidate size s.
      block_sizes: the S candidate sizes (distinct, any order).

    Returns:
      [N] int index into `block_sizes`.
    """
    rewards = np.asarray(rewards_by_size, np.float64)
    sizes = np.asarray(block_sizes)
    if rewards.ndim != 2 or rewards.shape[1] != sizes.size:
        raise ValueError(
            f"rewards_by_size has shape {rewards.shape}; expected [N, {sizes.size}], one column "
            f"per candidate block size {tuple(sizes.tolist())}"
        )
    if len(set(sizes.tolist())) != sizes.size:
        raise ValueError(f"block_sizes={tuple(sizes.tolist())} must be distinct")
    is_best = rewards == rewards.max(axis=1, keepdims=True)
    return np.argmax(np.where(is_best, sizes[None, :], -1), axis=1)


def _majority(values: np.ndarray) -> int:
    """The most frequent value; ties go to the larger value."""
    unique, counts = np.unique(values, return_counts=True)
    return int(unique[counts == counts.max()].max())


def block_size_conflict_score(best_sizes: np.ndarray, domains: np.ndarray | None = None) -> float:
    """Block Size Conflict Score: the share of samples a shared block size trains off-best.

    Interpretation (Block-R1 names the score, the abstract does not define it): each domain d
    trains at one block size m_d, its majority best size (ties to the larger size); the score
    is 1 - (1/N) sum_n 1[best_n == m_{domain(n)}], the share of samples trained at a size other
    than their own best. With `domains=None` all samples share one size (the mixture's
    majority): the conflict of training a multi-domain mixture at a single block size. With
    domain labels it is the conflict left after giving each domain its own size; the rest is
    what sample-level sizes resolve. 0 means no conflict; with K distinct best sizes in every
    domain it is at most 1 - 1/K.

    Args:
      best_sizes: [N] each sample's best block size (`best_block_sizes` mapped to sizes).
      domains: [N] domain labels of the samples, or None for one domain.

    Returns:
      The score in [0, 1).
    """
    best = np.asarray(best_sizes)
    if best.ndim != 1 or best.size == 0:
        raise ValueError(f"best_sizes has shape {best.shape}; expected a non-empty [N]")
    labels = np.zeros(best.shape, int) if domains is None else np.asarray(domains)
    if labels.shape != best.shape:
        raise ValueError(f"domains has shape {labels.shape}; expected {best.shape} like best_sizes")
    agree = 0
    for domain in np.unique(labels):
        in_domain = best[labels == domain]
        agree += int(np.sum(in_domain == _majority(in_domain)))
    return float(1.0 - agree / best.size)


def measure_rewards_by_size(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    prompt_tokens: np.ndarray,
    prompt_mask: np.ndarray,
    rng: jax.Array,
    reward_fn: Callable[[np.ndarray, np.ndarray], np.ndarray],
    *,
    block_sizes: Sequence[int],
    group_size: int,
    gen_length: int,
    num_steps: int,
    mask_id: int,
    temperature: float = 1.0,
    remasking: str = "low_confidence",
    eos_id: int | None = None,
) -> np.ndarray:
    """Mean reward [N, S] of `group_size` completions of each prompt at each candidate size.

    All N * S * group_size completions come from one `diffusion_generate_per_row` call with
    `num_steps` forward passes at every size; row (n * S + s) * group_size + g is sample g of
    prompt n at size block_sizes[s].

    Args:
      graphdef, params: the current policy.
      prompt_tokens, prompt_mask: [N, P] prompts (left-padded) and their mask.
      rng: key of the sampler.
      reward_fn: (completion_tokens [M, G] int, prompt_index [M] int) -> rewards [M].
      block_sizes: the S candidate sizes.
      group_size: completions per prompt and size.
      gen_length, num_steps, mask_id, temperature, remasking, eos_id: the sampler's
        (`diffusion_generate_per_row`).

    Returns:
      [N, S] float32 rewards averaged over the group.
    """
    n, s = np.shape(prompt_tokens)[0], len(block_sizes)
    repeat = s * group_size
    sizes = np.tile(np.repeat(np.asarray(block_sizes, np.int32), group_size), n)
    rollout = diffusion_generate_per_row(
        graphdef,
        params,
        np.repeat(np.asarray(prompt_tokens), repeat, axis=0),
        np.repeat(np.asarray(prompt_mask), repeat, axis=0),
        rng,
        sizes,
        gen_length=gen_length,
        num_steps=num_steps,
        mask_id=mask_id,
        temperature=temperature,
        remasking=remasking,
        eos_id=eos_id,
    )
    prompt_index = np.repeat(np.arange(n), repeat)
    rewards = np.asarray(reward_fn(np.asarray(rollout.completion_tokens), prompt_index))
    return rewards.reshape(n, s, group_size).mean(axis=2).astype(np.float32)

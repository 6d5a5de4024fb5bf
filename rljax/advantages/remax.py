"""ReMax: REINFORCE with the reward of the greedy completion as baseline."""

import chex
import jax
import jax.numpy as jnp

from rljax.advantages.sequence import sequence_advantages
from rljax.core import keys
from rljax.core.batch import Batch
from rljax.core.transform import Metrics, Transform

BASELINE_KEY = "baseline_reward"


def remax_advantages(rewards: jax.Array, baseline_rewards: jax.Array) -> jax.Array:
    """Greedy-baseline sequence advantages.

    A_i = r_i - r(greedy(x_i)), the reward of the sampled completion minus the
    reward of the greedy (argmax) completion of the same prompt ("ReMax: A Simple,
    Effective, and Efficient Reinforcement Learning Method for Aligning Large
    Language Models", Li et al. 2023, arXiv 2310.10505). Elementwise: no group
    layout is needed, and samples of one prompt share its greedy reward.

    Args:
      rewards: [B] sequence rewards of the sampled completions.
      baseline_rewards: [B] reward of the greedy completion of each sample's prompt.

    Returns:
      [B] advantages.
    """
    chex.assert_rank(rewards, 1)
    chex.assert_equal_shape([rewards, baseline_rewards])
    return rewards - baseline_rewards.astype(rewards.dtype)


def greedy_baseline_advantages(baseline_key: str = BASELINE_KEY) -> Transform:
    """Transform writing `batch.advantages = (r - extras[baseline_key])[:, None] * completion_mask`.

    ReMax ("ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method
    for Aligning Large Language Models", Li et al. 2023). The driver decodes each
    prompt greedily, scores the greedy completion with the same reward function
    and puts that score, repeated for every sample of the prompt, in
    `batch.extras[baseline_key]` ([B]).

    Args:
      baseline_key: the `batch.extras` key holding the [B] greedy rewards.

    Returns:
      A stateless `Transform`. Metrics: "remax/advantages/{mean,std,min,max}" over
      valid (completion_mask) tokens, "remax/baseline_mean" (mean greedy reward
      over samples) and "remax/beats_greedy_frac" (fraction of samples whose
      reward exceeds their greedy baseline).

    Raises:
      ValueError: at apply if rewards are not [B], or `batch.extras` lacks
        `baseline_key` or holds an array of the wrong shape there.
    """

    def fn(rewards: jax.Array, batch: Batch) -> tuple[jax.Array, Metrics]:
        if baseline_key not in batch.extras:
            raise ValueError(
                f"ReMax needs batch.extras[{baseline_key!r}]: the [B] reward of the greedy "
                "(argmax) completion of each sample's prompt; have the driver decode every "
                f"prompt greedily, score it, and put the scores there (extras has keys "
                f"{sorted(batch.extras)})"
            )
        baseline = jnp.asarray(batch.extras[baseline_key])
        if baseline.shape != rewards.shape:
            raise ValueError(
                f"batch.extras[{baseline_key!r}] has shape {baseline.shape}, expected [B] = "
                f"{rewards.shape}: one greedy reward per sample (repeat a prompt's score "
                "for each of its samples)"
            )
        adv = remax_advantages(rewards, baseline)
        return adv, {
            "remax/baseline_mean": jnp.mean(baseline.astype(jnp.float32)),
            "remax/beats_greedy_frac": jnp.mean((adv > 0).astype(jnp.float32)),
        }

    return sequence_advantages(
        "greedy_baseline_advantages",
        fn,
        prefix="remax",
        zero_std=False,
        reads={keys.extra(baseline_key)},
    )

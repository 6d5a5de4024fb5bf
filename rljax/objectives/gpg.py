"""GPG: the plain policy-gradient loss -A * log pi, with no ratio and no clip."""

import jax
import jax.numpy as jnp

from rljax.core import keys
from rljax.core.aggregation import check_aggregation_mode
from rljax.core.batch import Batch, check_groups
from rljax.core.objective import Objective
from rljax.core.transform import Context, Metrics, Transform, stateless
from rljax.objectives.policy_gradient import (
    PGInputs,
    policy_gradient_objective,
    reinforce,
)


def valid_group_scale(rewards: jax.Array, group_size: int) -> jax.Array:
    """GPG's batch-scaling correction alpha = B / B_valid.

    Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
    Reasoning", arXiv 2504.02546 (applied by the `valid_group_scaling` transform).

    B_valid counts the samples in groups whose rewards are not all equal (the groups
    with a learning signal; a group of all-equal rewards has zero group-relative
    advantage). alpha is 1 when no group is valid (the loss is then zero anyway).

    Args:
      rewards: [B] or [B, K] rewards, laid out as B/G contiguous groups; a
        [B, K] group is valid if any of its K dimensions varies.
      group_size: G, samples per prompt.

    Returns:
      A float32 scalar alpha >= 1.

    Raises:
      ValueError: if G < 1 or G does not divide B.
    """
    if rewards.ndim not in (1, 2):
        raise ValueError(f"rewards has shape {rewards.shape}, expected [B] or [B, K]")
    b = rewards.shape[0]
    if group_size < 1:
        raise ValueError(f"group_size={group_size} must be a positive int")
    if b % group_size:
        raise ValueError(f"group_size={group_size} does not divide batch {b}")
    groups = rewards.reshape(b // group_size, group_size, -1)
    varies = jnp.any(groups != groups[:, :1], axis=(1, 2))  # [B/G]
    b_valid = varies.sum() * group_size
    return jnp.where(b_valid > 0, b / jnp.maximum(b_valid, 1).astype(jnp.float32), 1.0).astype(
        jnp.float32
    )


def valid_group_scaling(group_size: int) -> Transform:
    """Transform multiplying `batch.advantages` by GPG's alpha = B / B_valid.

    Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
    Reasoning", arXiv 2504.02546: the paper's "accurate gradient estimation" multiplies the
    loss by alpha = B / B_valid (`valid_group_scale`), B_valid the number of samples in groups
    whose rewards vary, which undoes the dilution of the batch mean by zero-advantage
    (all-correct / all-wrong) groups. The `gpg` loss -A * log pi is linear in A, so scaling the
    advantages by the constant alpha is exactly equivalent to scaling the loss (value and
    gradient), for every aggregation mode. It lives in a transform because alpha reads the group
    layout: computed once on the whole batch in the prepare step, it stays exact when the update
    step shuffles rows into minibatches and micro-batches (inside the objective it would be
    computed per micro-batch, from rows of mixed groups). alpha is computed from
    `batch.rewards` and carries no gradient.

    Order in a chain: after the transform that writes the advantages
    (`group_advantages(G, normalize_std=False)`). Notes: verl's GPG advantage estimator instead
    uses alpha = B / (number of non-zero rewards); do not combine it with
    `rljax.filters.dynamic_sampling`, which already removes those groups from the token-mean
    denominator (the dilution would be corrected twice).

    Args:
      group_size: G, samples per prompt (>= 2).

    Returns:
      A stateless `Transform` editing `batch.advantages`. Metrics: "gpg/valid_group_scale",
      the alpha applied.

    Raises:
      ValueError: at construction if G < 2; at apply if G does not divide B or
        `batch.group_id` is not contiguous groups of G (see `check_groups`).
    """
    if group_size < 2:
        raise ValueError(
            f"valid_group_scaling needs group_size >= 2 (samples per prompt), got {group_size}"
        )

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        check_groups(batch.group_id, group_size)
        alpha = jax.lax.stop_gradient(valid_group_scale(batch.rewards, group_size))
        advantages = batch.advantages * alpha.astype(batch.advantages.dtype)
        return batch.replace(advantages=advantages), {"gpg/valid_group_scale": alpha}

    reads = {keys.GROUP_ID, keys.REWARDS, keys.ADVANTAGES}
    return stateless(fn, reads, {keys.ADVANTAGES})


def gpg(aggregation: str = "token-mean", max_len: int | None = None) -> Objective:
    """GPG's plain policy-gradient loss, -A * log pi, with no ratio and no clip.

    Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for
    Model Reasoning", arXiv 2504.02546.

    Per token, loss_t = -A_t * log pi_new(y_t), with A = `batch.advantages`: the
    REINFORCE gradient -A * grad log pi, with no importance ratio and no clipping,
    so it is exact only on-policy (one update per rollout). Aggregated with
    `batch.loss_weights`; the paper's loss is the token mean ("token-mean"). GPG's
    advantage is the group-centred reward r - mean_g(r) without std division
    (`group_advantages(G, normalize_std=False)`); its batch scaling B / B_valid is the
    transform `valid_group_scaling`, which scales the advantages. The objective reads no
    group layout, so it is correct on any subset of rows.

    The reported "gpg/loss" is a surrogate whose gradient is the policy gradient;
    its value scales with the log-probs and is not an objective value.

    Metrics ("gpg/..."): "loss"; "logprob_mean", token mean of new_logprobs over
    valid tokens.

    Args:
      aggregation: loss aggregation mode (see `rljax.core.aggregation.aggregate`).
      max_len: normaliser for "seq-mean-token-sum-norm".

    Returns:
      An `Objective`.

    Raises:
      ValueError: for an invalid aggregation or max_len.
    """
    check_aggregation_mode(aggregation, max_len)

    def surrogate(pg: PGInputs):
        per_token = reinforce(pg.logprobs, pg.advantages)
        return per_token, {"gpg/logprob_mean": pg.mean(pg.logprobs)}

    return policy_gradient_objective(
        "gpg", surrogate, aggregation, max_len, ratio=False, ratio_metrics=()
    )

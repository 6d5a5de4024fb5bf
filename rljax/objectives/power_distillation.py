"""Power-distribution self-distillation: SFT on self-normalised importance samples of p^alpha."""

import chex
import jax
import jax.numpy as jnp

from rljax.core import keys
from rljax.core.aggregation import aggregate, check_aggregation_mode
from rljax.core.batch import Batch, check_groups
from rljax.core.keys import declare_objective
from rljax.core.objective import Objective
from rljax.core.transform import Context, Metrics, Transform, stateless
from rljax.objectives.importance import apply_is_weight

TEACHERS = ("ref", "old")
PROPOSALS = ("old", "rollout")


def _check_alpha(alpha: float) -> None:
    if not alpha > 0:
        raise ValueError(
            f"alpha={alpha} must be > 0 (the power of p^alpha; alpha > 1 sharpens p, 1 keeps it)"
        )


def _check_group_size(group_size: int, b: int | None = None) -> None:
    if group_size < 1:
        raise ValueError(f"group_size={group_size} must be a positive int")
    if b is not None and b % group_size:
        raise ValueError(f"group_size={group_size} does not divide batch {b}")


def power_weights(
    teacher_seq_logp: jax.Array,
    proposal_seq_logp: jax.Array,
    alpha: float,
    group_size: int,
    valid: jax.Array | None = None,
) -> jax.Array:
    """Self-normalised importance weights of samples from q for the target p^alpha.

    The power distribution pi_alpha(y) ∝ p(y)^alpha (Karan & Du 2025, "Reasoning with Sampling:
    Your Language Model is Secretly a Reasoning Model"; power-distribution self-distillation,
    arXiv 2605.04542; scalable power sampling, arXiv 2601.21590). For samples y_i ~ q, the
    unnormalised log weight is log w_i = alpha * log p(y_i) - log q(y_i); the weights are
    normalised over the G samples of each group (a softmax over the group), so the unknown
    normaliser of p^alpha cancels. Samples with `valid` False get weight 0 and drop out of
    their group's normalisation; a group with no valid sample gets all-zero weights.

    Args:
      teacher_seq_logp: [B] log p(y_i), the sequence log-prob under the teacher.
      proposal_seq_logp: [B] log q(y_i), the sequence log-prob under the sampler.
      alpha: the power, > 0.
      group_size: G, samples per prompt; the batch is B/G contiguous groups.
      valid: optional [B] bool, the samples that take part (default all).

    Returns:
      [B] weights in [0, 1], summing to 1 over each group with a valid sample.

    Raises:
      ValueError: if alpha <= 0, G < 1 or G does not divide B.
    """
    chex.assert_rank(teacher_seq_logp, 1)
    chex.assert_equal_shape([teacher_seq_logp, proposal_seq_logp])
    b = teacher_seq_logp.shape[0]
    _check_alpha(alpha)
    _check_group_size(group_size, b)
    if valid is None:
        valid = jnp.ones((b,), bool)
    chex.assert_equal_shape([teacher_seq_logp, valid])
    shape = (b // group_size, group_size)
    log_w = (alpha * teacher_seq_logp - proposal_seq_logp).reshape(shape)
    valid = valid.astype(bool).reshape(shape)
    log_w = jnp.where(valid, log_w, -jnp.inf)
    top = jnp.max(log_w, axis=1, keepdims=True)  # per group; -inf for a group with none valid
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    unnorm = jnp.where(valid, jnp.exp(log_w - top), 0.0)
    total = unnorm.sum(axis=1, keepdims=True)
    return (unnorm / jnp.where(total > 0, total, 1.0)).reshape(b)


def power_weighting(
    group_size: int,
    alpha: float = 4.0,
    teacher: str = "ref",
    proposal: str = "old",
    length_normalize: bool = False,
) -> Transform:
    """Transform folding the SNIS weights of p^alpha into `batch.loss_weights` (one per row).

    Power-distribution self-distillation (Karan & Du 2025, "Reasoning with Sampling: Your
    Language Model is Secretly a Reasoning Model"; power-distribution self-distillation,
    arXiv 2605.04542; scalable power sampling, arXiv 2601.21590): SFT towards pi_alpha ∝ p^alpha
    with p the teacher. p^alpha sharpens p over whole sequences, unlike per-token low-temperature
    sampling: it favours prefixes with few but likely continuations. It is also the closed-form
    optimum of KL-regularised RL with reward log p_ref and KL coefficient beta = 1/(alpha - 1)
    (alpha > 1): argmax_pi E_pi[log p_ref] - beta KL(pi || p_ref) ∝ p_ref^(1 + 1/beta).

    Instead of drawing exact samples of p^alpha (e.g. by MCMC), the batch's own samples from the
    behaviour policy q are reweighted with self-normalised importance weights w_i within each
    group of G (`power_weights`, stop-gradient); sequence log-probs of the teacher and of q sum
    their token log-probs over `batch.completion_mask`. The target loss is weighted SFT,
      L = -(1 / N) sum_g sum_{i in g} w_i * s_i,
      s_i = sum_t lw_it * log pi_theta(y_it)       (over tokens with lw_it > 0),
    or s_i divided by sum_t lw_it with `length_normalize`, lw = `batch.loss_weights`. A row with
    no positive loss weight (removed by an earlier filter) takes no part in its group's
    normalisation, and N counts the groups with any such row (interpretation: a filtered sample
    is treated as not drawn). SNIS is biased for small G and its variance grows with alpha; watch
    "power/weight_ess".

    The group-level part is done here, on the whole batch, because the update step shuffles rows
    into micro-batches before the objective sees them. The transform writes
      lw'_it = lw_it * c * w_i            (/ sum_t lw_it with `length_normalize`),
      c = |S| / N,
    where S is the set of rows with any lw'_it > 0 (rows that take part and whose weight did not
    underflow to 0). Then `weighted_sft("seq-mean-token-sum")`, which is
    (1 / |S|) sum_{i in S} sum_t lw'_it * (-log pi_theta(y_it)), equals L exactly: the |S| cancel
    and rows outside S add 0 to L. Without filtering, |S| = G * N and c = G, i.e.
    lw' = lw * G * w_i. `aggregation_denominator` counts |S_m| per micro-batch, so gradient
    accumulation over shuffled micro-batches reproduces L (and its gradient) exactly. Other
    aggregation modes give a different (not SNIS-correct) normalisation. Negative loss weights
    are treated as 0. Run it after any filter that edits `loss_weights`.

    Metrics ("power/..."): "weight_ess", mean over the N counted groups of the effective sample
    size 1 / sum_i w_i^2 (in [1, G]); "max_weight", the largest weight in the batch.

    Args:
      group_size: G, samples per prompt (the SNIS normalisation runs over each group).
      alpha: the power, > 0 (> 1 sharpens).
      teacher: "ref" (p = batch.ref_logprobs, the frozen reference) or "old"
        (p = batch.old_logprobs, self-distillation of the pre-update policy).
      proposal: q, the policy that drew the samples: "old" (batch.old_logprobs) or "rollout"
        (batch.rollout_logprobs, the sampler's own log-probs).
      length_normalize: use the per-token mean log-prob of each sample instead of the sum.

    Returns:
      A stateless `Transform` editing `batch.loss_weights`; pair it with `weighted_sft()`.

    Raises:
      ValueError: for alpha <= 0, an unknown teacher or proposal, or G < 1; at apply time if G
        does not divide B or `batch.group_id` is not contiguous groups of G.
    """
    _check_alpha(alpha)
    _check_group_size(group_size)
    if teacher not in TEACHERS:
        raise ValueError(f"teacher={teacher!r} is not one of {list(TEACHERS)}")
    if proposal not in PROPOSALS:
        raise ValueError(f"proposal={proposal!r} is not one of {list(PROPOSALS)}")

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        mask = batch.completion_mask.astype(bool)
        chex.assert_rank(batch.loss_weights, 2)
        chex.assert_equal_shape([batch.loss_weights, mask])
        check_groups(batch.group_id, group_size)
        teacher_lp = batch.ref_logprobs if teacher == "ref" else batch.old_logprobs
        proposal_lp = batch.old_logprobs if proposal == "old" else batch.rollout_logprobs
        teacher_seq = jnp.where(mask, teacher_lp, 0.0).sum(axis=1)  # [B], over valid tokens
        proposal_seq = jnp.where(mask, proposal_lp, 0.0).sum(axis=1)  # [B], over valid tokens
        lw = batch.loss_weights
        lw = jnp.where(lw > 0, lw, 0.0)  # [B, T]
        takes_part = (lw > 0).any(axis=1)  # [B]
        weights = jax.lax.stop_gradient(
            power_weights(teacher_seq, proposal_seq, alpha, group_size, takes_part)
        )  # [B]
        row_scale = weights
        if length_normalize:
            lw_sum = lw.sum(axis=1)  # [B], over tokens
            row_scale = row_scale / jnp.where(lw_sum > 0, lw_sum, 1.0)
        new_lw = lw * row_scale[:, None]  # [B, T]
        n_rows = (new_lw.sum(axis=1) > 0).sum().astype(lw.dtype)  # |S|, as aggregate counts
        group_active = takes_part.reshape(-1, group_size).any(axis=1)  # [B/G]
        n_groups = jnp.maximum(group_active.sum(), 1).astype(lw.dtype)  # N
        new_lw = new_lw * (n_rows / n_groups)

        w_groups = weights.reshape(-1, group_size)
        sq = (w_groups**2).sum(axis=1)  # [B/G], over the group
        ess = jnp.where(group_active, 1.0 / jnp.where(group_active, sq, 1.0), 0.0)
        metrics = {
            "power/weight_ess": ess.sum() / n_groups,
            "power/max_weight": weights.max(),
        }
        return batch.replace(loss_weights=new_lw), metrics

    teacher_key = keys.REF_LOGPROBS if teacher == "ref" else keys.OLD_LOGPROBS
    proposal_key = keys.OLD_LOGPROBS if proposal == "old" else keys.ROLLOUT_LOGPROBS
    reads = {keys.COMPLETION_MASK, keys.LOSS_WEIGHTS, keys.GROUP_ID, teacher_key, proposal_key}
    return stateless(fn, reads, {keys.LOSS_WEIGHTS})


def weighted_sft(aggregation: str = "seq-mean-token-sum", max_len: int | None = None) -> Objective:
    """Weighted SFT: aggregate(-log pi_theta, batch.loss_weights), row-local.

    The objective half of power-distribution self-distillation (Karan & Du 2025, "Reasoning with
    Sampling: Your Language Model is Secretly a Reasoning Model"; arXiv 2605.04542): after
    `power_weighting` has folded the SNIS weights into `batch.loss_weights`, the default
    "seq-mean-token-sum" reproduces -(1 / #groups) sum_i w_i log pi_theta(y_i) exactly, also
    over shuffled micro-batches (see `power_weighting`). It reads no group layout, so it is
    correct on any subset of rows.

    Metrics: "power/loss".

    Args:
      aggregation: loss aggregation mode (see `rljax.core.aggregation.aggregate`); keep
        "seq-mean-token-sum" with `power_weighting`.
      max_len: normaliser for "seq-mean-token-sum-norm".

    Returns:
      An `Objective`.

    Raises:
      ValueError: for an invalid aggregation or max_len.
    """
    check_aggregation_mode(aggregation, max_len)

    def objective(new_logprobs: jax.Array, new_entropy: jax.Array, batch: Batch):
        del new_entropy
        chex.assert_rank(new_logprobs, 2)
        chex.assert_equal_shape([new_logprobs, batch.loss_weights])
        per_token = apply_is_weight(-new_logprobs, batch)
        loss = aggregate(per_token, batch.loss_weights, aggregation, max_len)
        return loss, {"power/loss": loss}

    return declare_objective(objective, {keys.LOSS_WEIGHTS}, keys.PG_OPTIONAL)

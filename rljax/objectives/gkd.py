"""GKD's generalized Jensen-Shannon divergence to a teacher, over the teacher's top-k tokens."""

import jax
import jax.numpy as jnp

from rljax.core import keys
from rljax.core.aggregation import aggregate, check_aggregation_mode
from rljax.core.batch import Batch
from rljax.core.keys import declare_objective
from rljax.core.objective import Objective

# Probabilities are floored here before a log (the "rest" bucket can be exactly 0).
_TINY = 1e-30


def with_rest(logprobs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The distribution over k tokens plus one bucket holding the rest of the vocabulary:
    (probabilities [..., k + 1], log-probabilities [..., k + 1]) from log-probs [..., k]."""
    probs = jnp.exp(logprobs)
    rest = jnp.maximum(1.0 - probs.sum(-1, keepdims=True), 0.0)
    probs = jnp.concatenate([probs, rest], axis=-1)
    return probs, jnp.concatenate([logprobs, jnp.log(jnp.maximum(rest, _TINY))], axis=-1)


def generalized_jsd_divergence(
    student_logprobs: jax.Array, teacher_logprobs: jax.Array, beta: float
) -> jax.Array:
    """Per-position generalized JSD between student and teacher over k shared tokens + rest.

    With p_S and p_T the student's and teacher's probabilities of the k tokens and of one
    bucket for all other tokens, and the mixture m = beta p_T + (1 - beta) p_S,

      JSD_beta = beta KL(p_T || m) + (1 - beta) KL(p_S || m)      0 < beta < 1,
      beta = 0: KL(p_T || p_S) (forward),  beta = 1: KL(p_S || p_T) (reverse),

    which is GKD's divergence (Agarwal et al. 2024, arXiv 2306.13649) in TRL's convention
    (`GKDTrainer.generalized_jsd_loss`: beta weighs the teacher; the endpoints are the KLs,
    as the scaled JSD itself vanishes there). When the k tokens are the whole vocabulary it
    is the full divergence; otherwise the rest bucket keeps both sides proper distributions,
    so the value is a lower bound of the full one (merging outcomes never raises an
    f-divergence), rather than a sum over k tokens that ignores the missing mass.

    Args:
      student_logprobs: [..., k] log p_S of the k tokens.
      teacher_logprobs: [..., k] log p_T of the same tokens.
      beta: in [0, 1].

    Returns:
      [...] float32, >= 0 up to rounding.
    """
    ps, log_ps = with_rest(student_logprobs)
    pt, log_pt = with_rest(teacher_logprobs)
    if beta == 0.0:
        return (pt * (log_pt - log_ps)).sum(-1)
    if beta == 1.0:
        return (ps * (log_ps - log_pt)).sum(-1)
    log_m = jnp.log(jnp.maximum(beta * pt + (1.0 - beta) * ps, _TINY))
    kl_teacher = (pt * (log_pt - log_m)).sum(-1)
    kl_student = (ps * (log_ps - log_m)).sum(-1)
    return beta * kl_teacher + (1.0 - beta) * kl_student


def generalized_jsd(
    beta: float = 0.5,
    coef: float = 1.0,
    aggregation: str = "token-mean",
    max_len: int | None = None,
) -> Objective:
    """GKD's loss on the student's own samples: coef * aggregate(JSD_beta(student, teacher)).

    On-policy GKD (lambda = 1 in the paper): the student samples, and at every sampled
    position its next-token distribution is pulled toward the teacher's over the teacher's
    top-k tokens (`extras["teacher_topk_ids"]`, `teacher.top_k`), a supervised loss with a
    full-distribution signal per token instead of the one-sample reverse KL of
    `rljax.advantages.distillation`. The student's log-probs of those tokens come from the
    update's own forward pass (`extras["policy_topk_logprobs"]`, with gradients); no gradient
    flows through the sampling. Aggregated with `batch.loss_weights`.

    Args:
      beta: the interpolation, in [0, 1]: 0 forward KL, 1 reverse KL (`generalized_jsd_divergence`).
      coef: the loss's weight, > 0.
      aggregation: loss aggregation mode.
      max_len: normaliser for "seq-mean-token-sum-norm".

    Returns:
      An `Objective`. Metrics: "gkd/loss" (coef times the aggregated divergence),
      "gkd/jsd" (its token mean over valid tokens) and "gkd/teacher_mass" (the token mean of
      the teacher's probability on its top k: 1 means the divergence is the full one).
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"generalized_jsd beta={beta} must be in [0, 1]")
    if not coef > 0:
        raise ValueError(f"generalized_jsd coef={coef} must be > 0")
    check_aggregation_mode(aggregation, max_len)

    def objective(new_logprobs: jax.Array, new_entropy: jax.Array, batch: Batch):
        del new_logprobs, new_entropy
        student = batch.extras["policy_topk_logprobs"]
        teacher = batch.extras["teacher_topk_logprobs"]
        jsd = generalized_jsd_divergence(student, teacher, beta)
        loss = coef * aggregate(jsd, batch.loss_weights, aggregation, max_len)
        valid = batch.completion_mask.astype(jnp.float32)
        mass = jnp.exp(teacher).sum(-1)
        metrics = {
            "gkd/loss": loss,
            "gkd/jsd": aggregate(jax.lax.stop_gradient(jsd), valid, "token-mean"),
            "gkd/teacher_mass": aggregate(mass, valid, "token-mean"),
        }
        return loss, metrics

    # The ids are read by the update, which scores them for "policy_topk_logprobs"; declared
    # here so that the driver's teacher sends them.
    reads = {
        keys.POLICY_TOPK_LOGPROBS,
        keys.TEACHER_TOPK_LOGPROBS,
        keys.TEACHER_TOPK_IDS,
        keys.LOSS_WEIGHTS,
        keys.COMPLETION_MASK,
    }
    return declare_objective(objective, reads)

"""On-policy distillation's advantage: the per-token reverse KL to a teacher, negated."""

import jax
import jax.numpy as jnp

from rljax.advantages.sequence import masked_stats
from rljax.core import keys
from rljax.core.aggregation import masked_mean
from rljax.core.batch import Batch
from rljax.core.transform import Context, Metrics, Transform, stateless


def teacher_advantages(
    teacher_coef: float = 1.0, task_coef: float = 0.0, center: bool = False
) -> Transform:
    """Per-token advantages from a teacher's log-probs of the sampled tokens, mixable with the
    advantages of the task's rewards.

    On-policy distillation (Agarwal et al. 2024, "On-Policy Distillation of Language Models:
    Learning from Self-Generated Mistakes" (GKD), arXiv 2306.13649; Thinking Machines' "On-Policy
    Distillation", 2025; verl, TRL, slime and prime-rl's `opd`): the student samples, and each
    sampled token y_t is graded by how much likelier the teacher finds it,

      A_t = task_coef * A_task,t + teacher_coef * (log pi_T(y_t) - log pi_old(y_t)),

    on `batch.completion_mask` tokens (0 elsewhere), with log pi_old = `batch.old_logprobs`
    (the student before the update) and log pi_T = `extras["teacher_logprobs"]`. The teacher
    term is minus a one-sample estimate of the per-token reverse KL(pi_old || pi_T): a policy
    gradient on it lowers the reverse KL, which is mode-seeking (the student drops what the
    teacher would not say rather than spreading over everything it might), and each token is
    its own step (discount 0), so credit is dense. A_task is whatever `batch.advantages` holds
    when this runs (0 without a preceding estimator; GRPO's with `chain(group_advantages(G),
    teacher_advantages(...))`).

    With `center`, the teacher term's token mean over the batch is subtracted from it: a
    constant baseline, so the expected gradient is unchanged, but a student far from the
    teacher (every gap negative) no longer pushes down every token it sampled, which in a
    small batch mostly raises its entropy.

    Args:
      teacher_coef: weight of the teacher term, >= 0.
      task_coef: weight of the incoming (task) advantages, >= 0.
      center: subtract the teacher term's token mean over the batch.

    Returns:
      A stateless `Transform`. Metrics: "distill/reverse_kl" (the token mean of log pi_old -
      log pi_T over valid tokens) and "distill/advantages/{mean,std,min,max}".

    Raises:
      ValueError: for a negative coefficient, or both 0.
    """
    if teacher_coef < 0 or task_coef < 0 or teacher_coef == task_coef == 0:
        raise ValueError(
            f"teacher_coef={teacher_coef} and task_coef={task_coef} must be >= 0 and not both 0"
        )

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        mask = batch.completion_mask
        teacher = batch.extras["teacher_logprobs"]
        gap = jax.lax.stop_gradient(teacher - batch.old_logprobs)
        term = gap - masked_mean(gap, mask) if center else gap
        adv = task_coef * batch.advantages + teacher_coef * term
        adv = jnp.where(mask, adv, 0.0).astype(jnp.float32)
        metrics = {
            "distill/reverse_kl": masked_mean(-gap, mask),
            **masked_stats(adv, mask, "distill/advantages"),
        }
        return batch.replace(advantages=adv), metrics

    reads = {keys.TEACHER_LOGPROBS, keys.OLD_LOGPROBS, keys.COMPLETION_MASK}
    if task_coef:
        reads.add(keys.ADVANTAGES)
    return stateless(fn, reads, {keys.ADVANTAGES})

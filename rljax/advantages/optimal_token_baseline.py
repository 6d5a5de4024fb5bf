"""Optimal Token Baseline (OTB): a per-position baseline weighted by cumulative gradient energy.

arXiv 2602.07078 ("optimal token baseline"), as implemented in verl's
`compute_optimal_token_baseline_advantage` (code-derived, spec section 6 [CODE]).
"""

import chex
import jax
import jax.numpy as jnp

from rljax.advantages.group import masked_stats
from rljax.core import keys
from rljax.core.batch import Batch, check_groups, check_sequence_rewards
from rljax.core.transform import Context, Metrics, Transform, stateless

# Added to the baseline's denominator, as in verl.
_EPS = 1e-8
# |log rho| is clamped here before exp, as verl bounds its IS weights to [e^-20, e^20].
_MAX_LOG_RATIO = 20.0


ALIGNMENTS = ("position", "policy_token")


def _check_group_size(group_size: int) -> None:
    if group_size < 1:
        raise ValueError(f"group_size={group_size} must be a positive int")


def logit_gradient_proxy(old_logprobs: jax.Array, sum_sq_prob: jax.Array) -> jax.Array:
    """Squared norm of the logit gradient of log pi(y_t): w_t = 1 - 2 pi_t + sum_v pi_v^2.

    grad_z log softmax(z)_y = e_y - pi, whose squared norm is 1 - 2 pi_y + sum_v pi_v^2, the
    per-token variance proxy of the optimal token baseline (arXiv 2602.07078; verl's
    `compute_optimal_token_baseline_advantage`). Since sum_v pi_v^2 >= pi_y^2 the value is
    >= (1 - pi_y)^2 >= 0, and it is <= 2; it is clipped to [0, 2] against rounding.

    Args:
      old_logprobs: [B, T] log pi_old(y_t) of the sampled tokens.
      sum_sq_prob: [B, T] sum_v pi_old(v|s_t)^2 (= exp(lse(2z) - 2 lse(z)) for logits z).

    Returns:
      [B, T] w_t in [0, 2].
    """
    chex.assert_rank(old_logprobs, 2)
    chex.assert_equal_shape([old_logprobs, sum_sq_prob])
    return jnp.clip(1.0 - 2.0 * jnp.exp(old_logprobs) + sum_sq_prob, 0.0, 2.0)


def optimal_token_baseline(
    returns: jax.Array,
    token_weights: jax.Array,
    mask: jax.Array,
    group_size: int,
    handle_zero_tail: bool = False,
    align: str = "position",
) -> jax.Array:
    """Token advantages against the optimal per-position baseline of each prompt group.

    With W_t = sum_{u <= t} w_u m_u the cumulative variance proxy of a response, the baseline
    at position t of a group is B_t = sum_i G_it W_it m_it / (sum_i W_it m_it + 1e-8), the sum
    over the group's G samples (position-aligned), and A_t = (G_t - B_t) m_t; no std
    normalisation (arXiv 2602.07078, "optimal token baseline"; verl's
    `compute_optimal_token_baseline_advantage`). With equal W it is the mean return of the
    samples valid at t. With group_size == 1 there is no baseline: A = G m. With
    `handle_zero_tail`, the unique longest response of a group (length = number of valid
    tokens) gets baseline 0 at positions t >= the second-longest length, where no other sample
    is valid (verl's option; its default is False for single-turn, True for tool use).

    `align="policy_token"` is TIR-OTB (verl's `tir_optimal_token_baseline`, for multi-turn
    tool use): the group's samples are aligned by policy token, the k-th token the policy
    wrote in each, not by absolute position, so environment tokens between turns (masked
    out) neither shift one sample against another nor take part in W. On a single-turn batch
    (every mask a prefix) the two alignments are the same.

    Args:
      returns: [B, T] returns G_t (reward-to-go), laid out as B/G contiguous groups.
      token_weights: [B, T] per-token proxies w_t >= 0 (see `logit_gradient_proxy`).
      mask: [B, T] bool, the valid (completion) tokens.
      group_size: G, samples per prompt (>= 1).
      handle_zero_tail: zero the baseline on the unique longest response's tail.
      align: "position" or "policy_token".

    Returns:
      [B, T] advantages, 0 on invalid tokens.

    Raises:
      ValueError: if G < 1, G does not divide B, or `align` is unknown.
    """
    chex.assert_rank(returns, 2)
    chex.assert_equal_shape([returns, token_weights, mask])
    _check_group_size(group_size)
    if align not in ALIGNMENTS:
        raise ValueError(f"align={align!r} must be one of {list(ALIGNMENTS)}")
    if align == "policy_token":
        # Each row's valid tokens moved to its front, in order; the result moved back.
        order = jnp.argsort(~mask, axis=1, stable=True)
        take = lambda x: jnp.take_along_axis(x, order, axis=1)  # noqa: E731
        packed = optimal_token_baseline(
            take(returns), take(token_weights), take(mask), group_size, handle_zero_tail
        )
        return jnp.take_along_axis(packed, jnp.argsort(order, axis=1), axis=1)
    b, t = returns.shape
    if b % group_size:
        raise ValueError(f"group_size={group_size} does not divide batch {b}")
    m = mask.astype(returns.dtype)
    if group_size == 1:
        return returns * m
    cum_w = jnp.cumsum(token_weights * m, axis=1)  # W_t, over the positions u <= t
    shape = (b // group_size, group_size, t)
    g, w, mg = returns.reshape(shape), cum_w.reshape(shape), m.reshape(shape)
    num = (g * w * mg).sum(axis=1, keepdims=True)  # over the group's samples
    den = (w * mg).sum(axis=1, keepdims=True) + _EPS
    baseline = jnp.broadcast_to(num / den, shape)
    if handle_zero_tail:
        lengths = mg.sum(axis=2)  # [n, G]: valid tokens per response
        top2 = jax.lax.top_k(lengths, 2)[0]  # [n, 2]: longest and second-longest
        longest, second = top2[:, :1], top2[:, 1:]
        unique_longest = (lengths == longest) & (longest > second)  # ties give no unique one
        tail = jnp.arange(t)[None, None, :] >= second[:, :, None]
        baseline = jnp.where(unique_longest[:, :, None] & tail, 0.0, baseline)
    return ((g - baseline) * mg).reshape(b, t)


def optimal_token_baseline_advantages(
    group_size: int,
    use_is_weight: bool = False,
    handle_zero_tail: bool = False,
    is_cap: float | None = None,
    align: str = "position",
) -> Transform:
    """Transform writing `batch.advantages = optimal_token_baseline(G, w, mask)` (OTB).

    arXiv 2602.07078 ("optimal token baseline"); verl's
    `compute_optimal_token_baseline_advantage`.

    Returns G_t: the reward-to-go (reverse cumsum over valid tokens) of
    `batch.extras["token_rewards"]` ([B, T]) if present, else the [B] sequence reward on
    every valid token (a reward paid at the end has reward-to-go r everywhere). Weights:
    w_t = `logit_gradient_proxy(batch.old_logprobs, batch.extras["old_sum_sq_prob"])`; with
    `use_is_weight`, w_t is multiplied by rho_t^2, rho_t = exp(old_logprobs - rollout_logprobs)
    (the trainer/sampler mismatch ratio) clamped to [e^-20, e^20] and, if `is_cap` is given,
    truncated at it (verl's truncated rollout IS weights, whose threshold is typically 2).
    The advantages are constants (no gradient), as in verl's `no_grad`.

    Args:
      group_size: G, samples per prompt (>= 1; 1 means no baseline).
      use_is_weight: scale the proxy by the squared rollout IS weight.
      handle_zero_tail: see `optimal_token_baseline`.
      is_cap: optional upper bound (> 0) on rho_t before squaring.
      align: "position", or "policy_token" for TIR-OTB on multi-turn episodes (see
        `optimal_token_baseline`).

    Returns:
      A stateless `Transform`. Metrics: "otb/advantages/{mean,std,min,max}" and
      "otb/token_weight_mean" (mean w_t) over valid (completion_mask) tokens.

    Raises:
      ValueError: at construction if G < 1 or is_cap <= 0; at apply if
        extras["old_sum_sq_prob"] is missing or not [B, T], extras["token_rewards"] is not
        [B, T], rewards are not [B] (without token rewards), or `batch.group_id` is not
        contiguous groups of G.
    """
    _check_group_size(group_size)
    if is_cap is not None and not is_cap > 0:
        raise ValueError(f"is_cap={is_cap} must be > 0 (an upper bound on the IS ratio)")
    if align not in ALIGNMENTS:
        raise ValueError(f"align={align!r} must be one of {list(ALIGNMENTS)}")

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        mask = batch.completion_mask
        m = mask.astype(jnp.float32)
        check_groups(batch.group_id, group_size)
        if "old_sum_sq_prob" not in batch.extras:
            raise ValueError(
                "optimal_token_baseline_advantages needs batch.extras['old_sum_sq_prob'] ([B, T] "
                "sum_v pi_old(v)^2, from the trainer's prepare step); extras has keys "
                f"{sorted(batch.extras)}"
            )
        sum_sq = jnp.asarray(batch.extras["old_sum_sq_prob"], jnp.float32)
        if sum_sq.shape != mask.shape:
            raise ValueError(
                f"batch.extras['old_sum_sq_prob'] has shape {sum_sq.shape}, expected [B, T] = "
                f"{mask.shape}"
            )
        if "token_rewards" in batch.extras:
            token_rewards = jnp.asarray(batch.extras["token_rewards"], jnp.float32)
            if token_rewards.shape != mask.shape:
                raise ValueError(
                    f"batch.extras['token_rewards'] has shape {token_rewards.shape}, expected "
                    f"[B, T] = {mask.shape}"
                )
            # Reward-to-go: sum over the valid positions u >= t.
            returns = jnp.flip(jnp.cumsum(jnp.flip(token_rewards * m, 1), axis=1), 1)
        else:
            check_sequence_rewards(batch.rewards, "optimal_token_baseline_advantages")
            returns = batch.rewards.astype(jnp.float32)[:, None] * m
        w = logit_gradient_proxy(batch.old_logprobs, sum_sq)
        if use_is_weight:
            log_rho = jnp.clip(
                batch.old_logprobs - batch.rollout_logprobs, -_MAX_LOG_RATIO, _MAX_LOG_RATIO
            )
            rho = jnp.exp(log_rho)
            if is_cap is not None:
                rho = jnp.minimum(rho, is_cap)
            w = w * rho**2
        adv = optimal_token_baseline(returns, w, mask, group_size, handle_zero_tail, align)
        adv = jax.lax.stop_gradient(adv)
        metrics = masked_stats(adv, mask, "otb/advantages")
        n = jnp.maximum(mask.sum(), 1).astype(jnp.float32)
        metrics["otb/token_weight_mean"] = jnp.where(mask, w, 0.0).sum() / n
        return batch.replace(advantages=adv), metrics

    reads = {keys.REWARDS, keys.GROUP_ID, keys.COMPLETION_MASK, keys.OLD_LOGPROBS}
    reads |= {keys.OLD_SUM_SQ_PROB} | ({keys.ROLLOUT_LOGPROBS} if use_is_weight else set())
    return stateless(fn, reads, {keys.ADVANTAGES}, {keys.TOKEN_REWARDS})

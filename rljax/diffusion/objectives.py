"""RL objectives for masked-diffusion LMs, on likelihood estimates from `likelihood.py`.

A diffusion LM's log pi(o | q) is an estimate (one-pass, ELBO, stratified, RLDF states), so the
objectives take the estimates as arrays and stay independent of how they were made:

  `diffu_grpo_loss`   d1's GRPO: PPO-clip on per-token estimate ratios plus k3 KL to ref.
  `rldf_loss`         RLDF: the same surrogate over the scored tokens of k chosen noisy states.
  `wd1_loss`          wd1: group-softmax weighted likelihood, no ratio.
  `rspo_loss`         RSPO: regress beta (ELBO_theta - ELBO_ref) onto the advantage.
  `daca_weights`, `daca_advantages`, `stable_steps`  DACA-GRPO's Denoising Progress Scores.

Each returns (loss, metrics) like `rljax.objectives`, or arrays for the DACA helpers. Block-R1's
per-sample training block size (github.com/YanJiangJerry/Block-R1) is not here: its abstract
defines that size only as the outcome of building its dataset, not as a rule on a rollout.
"""

import chex
import jax
import jax.numpy as jnp

from rljax.core.aggregation import aggregate, check_aggregation_mode, masked_mean
from rljax.objectives.kl import kl_penalty

# |log ratio| is clamped here before exp, as in `rljax.objectives.surrogate.ppo_clip`.
_MAX_LOG_RATIO = 20.0


def diffu_grpo_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    ref_logprobs: jax.Array | None = None,
    eps: float = 0.2,
    beta: float = 0.04,
    aggregation: str = "token-mean",
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """diffu-GRPO loss of d1 (Zhao et al. 2025, arXiv 2504.12216) [CODE].

    Per token, with r = exp(logprobs - old_logprobs) from the SAME estimator masks:
      loss_t = -min(r A, clip(r, 1 - eps, 1 + eps) A) + beta k3(logprobs, ref_logprobs),
    k3 = exp(ref - logp) - 1 - (ref - logp) (`rljax.objectives.kl.kl_penalty`), aggregated over
    `mask` (default token mean). This is `ppo_clip(eps, eps)` plus `kl_loss(beta, "k3")` of
    `rljax.objectives` written on arrays; d1's defaults are eps = 0.2, beta = 0.04 (wd1's
    diffu-GRPO config). The log-ratio is clamped to [-20, 20] before exp.

    Args:
      logprobs: [B, T] per-token log-prob estimates under theta (differentiable).
      old_logprobs: [B, T] estimates under theta_old on the same masks.
      advantages: [B] sequence or [B, T] token advantages.
      mask: [B, T] bool or float token weights (scored, valid tokens).
      ref_logprobs: [B, T] estimates under ref on the same masks, or None for no KL term.
      eps: clip range, in [0, 1).
      beta: KL coefficient, >= 0 (ignored without `ref_logprobs`).
      aggregation: a mode of `rljax.core.aggregation.aggregate`.

    Returns:
      (loss, metrics): "pg/loss", "pg/clip_frac", "pg/ratio_mean" and, with a reference,
      "kl/mean" (token means over `mask`).
    """
    if not 0.0 <= eps < 1.0:
        raise ValueError(f"eps={eps} must be in [0, 1) so that 1 - eps > 0")
    if beta < 0:
        raise ValueError(f"beta={beta} must be >= 0")
    check_aggregation_mode(aggregation)
    chex.assert_rank([logprobs, old_logprobs, mask], 2)
    chex.assert_equal_shape([logprobs, old_logprobs, mask])
    if advantages.ndim == 1:
        advantages = jnp.broadcast_to(advantages[:, None], logprobs.shape)
    chex.assert_equal_shape([logprobs, advantages])
    log_ratio = jnp.clip(logprobs - old_logprobs, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = jnp.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - eps, 1.0 + eps)
    per_token = jnp.maximum(unclipped, clipped)
    valid = mask.astype(bool)
    metrics = {
        "pg/clip_frac": masked_mean(clipped > unclipped, valid),
        "pg/ratio_mean": masked_mean(ratio, valid),
    }
    if ref_logprobs is not None:
        kl = kl_penalty(logprobs, ref_logprobs, "k3")
        per_token = per_token + beta * kl
        metrics["kl/mean"] = masked_mean(kl, valid)
    loss = aggregate(per_token, mask.astype(jnp.float32), aggregation)
    metrics["pg/loss"] = loss
    return loss, metrics


def rldf_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    ref_logprobs: jax.Array | None,
    advantages: jax.Array,
    scored: jax.Array,
    eps: float = 0.2,
    beta: float = 0.01,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """RLDF loss over k noisy states per sample (arXiv 2605.25638) [CODE].

    Drift (`main_rl.py`, `configs/llada_math.yaml`): every chosen state s of sample b scores
    its clean tokens (`rldf_states`, `rldf_logprobs`); each scored token gets the sample's
    advantage, PPO clip 0.2, k3 KL with beta = 0.01, and the loss is normalised by the number
    of scored tokens over all states of the batch ("token" loss normalisation).

    Args:
      logprobs: [B, k, T] log p(clean token | state) under theta.
      old_logprobs: [B, k, T] the same under theta_old.
      ref_logprobs: [B, k, T] the same under ref, or None for no KL.
      advantages: [B] sequence advantages.
      scored: [B, k, T] bool scored positions (`rldf_states`).
      eps: clip range.
      beta: KL coefficient.

    Returns:
      (loss, metrics) as `diffu_grpo_loss`.
    """
    chex.assert_rank([logprobs, old_logprobs, scored], 3)
    chex.assert_equal_shape([logprobs, old_logprobs, scored])
    chex.assert_rank(advantages, 1)
    b, k, t = logprobs.shape
    flat = lambda x: x.reshape(b * k, t)  # noqa: E731
    return diffu_grpo_loss(
        flat(logprobs),
        flat(old_logprobs),
        jnp.repeat(advantages, k),
        flat(scored),
        None if ref_logprobs is None else flat(ref_logprobs),
        eps,
        beta,
        "token-mean",
    )


def _grouped(x: jax.Array, group_size: int) -> jax.Array:
    chex.assert_rank(x, 1)
    if group_size < 1 or x.shape[0] % group_size:
        raise ValueError(f"group_size={group_size} does not divide batch {x.shape[0]}")
    return x.reshape(-1, group_size)


def wd1_loss(
    seq_logprobs: jax.Array, advantages: jax.Array, group_size: int
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """wd1 weighted-likelihood loss (Tang et al. 2025, arXiv 2507.08838) [CODE].

    xiaohangt/wd1 `rev_grpo_trainer.py` `compute_loss`: per group of G samples of one prompt,
      L_group = -sum_i softmax(A)_i log pi(o_i) + sum_i softmax(-A)_i log pi(o_i),
    with log pi(o_i) the sequence estimate (wd1: the one-pass estimate summed over the
    completion, `one_pass_estimate(...).sum(-1)`). The code softmaxes over its per-step batch,
    which holds one group; here the softmax is per group and the group losses are averaged.
    No ratio to theta_old: the weights use the rollout advantages only.

    Args:
      seq_logprobs: [B] sequence log-prob estimates under theta (differentiable).
      advantages: [B] sequence advantages (wd1 uses GRPO's group-normalised ones).
      group_size: G; the batch is B/G contiguous groups.

    Returns:
      (loss, metrics): "wd1/loss", "wd1/pos_weight_max" (mean over groups of max softmax(A)).
    """
    chex.assert_equal_shape([seq_logprobs, advantages])
    logp = _grouped(seq_logprobs, group_size)
    adv = jax.lax.stop_gradient(_grouped(advantages, group_size))
    pos, neg = jax.nn.softmax(adv, axis=1), jax.nn.softmax(-adv, axis=1)
    loss = jnp.mean(jnp.sum((neg - pos) * logp, axis=1))
    return loss, {"wd1/loss": loss, "wd1/pos_weight_max": pos.max(axis=1).mean()}


def rspo_loss(
    elbo: jax.Array, ref_elbo: jax.Array, advantages: jax.Array, beta: float
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """RSPO: Relative Score Policy Optimization (arXiv 2605.10218) [interpretation].

    From the abstract: the advantage is the target of the relative log-ratio. With
    Delta = ELBO_theta(o) - ELBO_ref(o) (an estimate of log pi_theta/pi_ref, ref held fixed),
      loss = mean_b 1/2 (beta Delta_b - A_b)^2,
    so grad = -mean_b beta (A_b - beta Delta_b) grad Delta_b: the update follows the gap
    between the target and the current estimate instead of the raw advantage, and vanishes
    when beta Delta = A. The exact RSPO objective is not public; this is the spec's reading.
    Pass ELBOs computed on the same masks for theta and ref.

    Args:
      elbo: [B] sequence ELBO estimates under theta (differentiable).
      ref_elbo: [B] sequence ELBO estimates under ref (gradient stopped).
      advantages: [B] sequence advantages.
      beta: scale of the log-ratio, > 0.

    Returns:
      (loss, metrics): "rspo/loss", "rspo/log_ratio" (mean Delta), "rspo/gap" (mean |A - beta
      Delta|).
    """
    if beta <= 0:
        raise ValueError(f"beta={beta} must be > 0")
    chex.assert_rank([elbo, ref_elbo, advantages], 1)
    chex.assert_equal_shape([elbo, ref_elbo, advantages])
    delta = elbo - jax.lax.stop_gradient(ref_elbo)
    gap = beta * delta - jax.lax.stop_gradient(advantages)
    loss = 0.5 * jnp.mean(gap**2)
    return loss, {
        "rspo/loss": loss,
        "rspo/log_ratio": delta.mean(),
        "rspo/gap": jnp.abs(gap).mean(),
    }


def stable_steps(step_predictions: jax.Array, completion: jax.Array) -> jax.Array:
    """The denoising step from which each position's prediction stays the final token.

    DACA-GRPO (arXiv 2605.16342) reads per-token progress from the rollout's intermediate
    predictions at no extra forward cost. `step_predictions[:, s]` is the argmax the sampler
    held at step s for every position (the committed token once unmasked). The stable step of
    a position is the smallest s with step_predictions[:, s'] == completion for all s' >= s;
    S if even the last step's prediction differs. Without remasking it is at most the step at
    which the token was unmasked (its `step_map`).

    Args:
      step_predictions: [B, S, T] int32 predictions at each of S denoising steps.
      completion: [B, T] int32 final tokens.

    Returns:
      [B, T] int32 stable steps in [0, S].
    """
    chex.assert_rank(step_predictions, 3)
    chex.assert_rank(completion, 2)
    match = step_predictions == completion[:, None, :]
    # stays[:, s] is True when steps s..S-1 all match.
    stays = jnp.flip(jnp.cumprod(jnp.flip(match, axis=1), axis=1), axis=1).astype(bool)
    return (step_predictions.shape[1] - stays.sum(axis=1)).astype(jnp.int32)


def daca_weights(stable_step: jax.Array, mask: jax.Array, num_steps: int) -> jax.Array:
    """DACA-GRPO Denoising Progress Scores as token weights (arXiv 2605.16342) [interpretation].

    The abstract gives no formula; following the spec, a token that settles early in the
    denoising trajectory gets more credit:
      u_i = 1 - stable_step_i / num_steps        (in (0, 1] for a token stable before step S),
      w_i = u_i / mean_{j valid} u_j             (mean 1 over each sequence's valid tokens),
    so the sequence's total credit is unchanged. A row whose u are all 0 gets w = 1.
    `stable_step` is `stable_steps(...)` or, without intermediate predictions, the rollout's
    step_map (step of unmasking).

    Args:
      stable_step: [B, T] int32 step in [0, num_steps] at which each token became stable.
      mask: [B, T] bool, True on valid completion tokens.
      num_steps: S, the rollout's number of denoising steps.

    Returns:
      [B, T] float32 weights, 0 outside `mask`.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps={num_steps} must be >= 1")
    chex.assert_rank([stable_step, mask], 2)
    chex.assert_equal_shape([stable_step, mask])
    progress = jnp.where(mask, 1.0 - stable_step.astype(jnp.float32) / num_steps, 0.0)
    row_mean = progress.sum(axis=1, keepdims=True) / jnp.maximum(mask.sum(axis=1, keepdims=True), 1)
    ok = row_mean > 0
    weights = jnp.where(ok, progress / jnp.where(ok, row_mean, 1.0), 1.0)
    return jnp.where(mask, weights, 0.0)


def daca_advantages(advantages: jax.Array, weights: jax.Array) -> jax.Array:
    """DACA-GRPO token advantages A_i = w_i A (arXiv 2605.16342) [interpretation].

    Args:
      advantages: [B] sequence advantages (e.g. GRPO's).
      weights: [B, T] `daca_weights`.

    Returns:
      [B, T] float32 token advantages, for `diffu_grpo_loss` or any token-level objective.
    """
    chex.assert_rank([advantages, weights], [1, 2])
    return advantages[:, None].astype(jnp.float32) * weights

"""Estimators of log pi(completion | prompt) for a masked-diffusion LM (LLaDA, Dream).

A masked-diffusion LM has no tractable sequence likelihood: it only predicts the clean token at
each masked position of a partly masked input. RL objectives therefore run on estimates built
from one or a few forward passes on masked inputs. Each estimator here is a pure function of an
abstract `logits_fn` (any model) and returns per-token estimates [B, T] whose sum over T is the
sequence estimate, so it plugs into the token-level objectives of `rljax.objectives` and
`rljax.diffusion.objectives`:

  `one_pass_estimate`     d1 / diffu-GRPO and wd1: completion fully masked, prompt masked at
                          random, one pass (a mean-field estimate, not a bound).
  `elbo_random_t`         LLaDA's ELBO, t ~ U(eps, 1), each token masked with prob t, 1/t weight.
  `elbo_fixed_count`      the same ELBO, l ~ U{1..L} tokens masked, weight L/l.
  `stratified_estimate`   DACA-GRPO's stratified masking: K passes, each masks one stratum.
  `rldf_timesteps`, `rldf_states`, `rldf_logprobs`  RLDF's weighted timestep sampling, the
                          rollout's noisy states with (clipped) clean targets, and their scores.
  `masked_token_logprobs` the one forward pass all of them share: log p of the clean tokens
                          under a given mask.

Conventions shared by every function:
  - `logits_fn(tokens [N, P + T] int32) -> [N, P + T, V] float32` takes the prompt followed by
    the completion, with `mask_id` at masked positions, and returns logits (or log-probs: the
    estimators apply `log_softmax`, which leaves log-probs unchanged). At a masked position it
    predicts the clean token. It must be traceable by JAX (it is called inside `lax.map`); it
    closes over the model parameters, so gradients flow through the estimates.
  - Completion positions outside `completion_mask` (padding after EOS) are always fed as
    `mask_id`, never scored, and get estimate 0. A model whose padding is a real token
    (LLaDA pads with EOS) should mark those positions valid. Exception: `rldf_logprobs` feeds
    the rollout's state x_s exactly, after-EOS tokens included, and only scores valid ones.
  - Randomness comes only from `rng`. The ratio of pi_theta to pi_old (and the KL to ref) is
    meaningful only if all three are evaluated on the same masks: callers pass the SAME `rng`
    to the estimator for theta, theta_old and ref (d1 draws one mask seed per inner iteration
    and shares it across the three).
"""

from typing import Callable

import chex
import jax
import jax.numpy as jnp

# (tokens [N, P + T] int32) -> [N, P + T, V] float32 logits or log-probs.
LogitsFn = Callable[[jax.Array], jax.Array]


def _check_inputs(prompt: jax.Array, completion: jax.Array, completion_mask: jax.Array) -> None:
    chex.assert_rank([prompt, completion, completion_mask], 2)
    chex.assert_equal_shape([completion, completion_mask])
    if prompt.shape[0] != completion.shape[0]:
        raise ValueError(
            f"prompt has batch {prompt.shape[0]} but completion has batch {completion.shape[0]}"
        )


def masked_token_logprobs(
    logits_fn: LogitsFn,
    prompt: jax.Array,
    completion: jax.Array,
    completion_mask: jax.Array,
    completion_masked: jax.Array,
    prompt_masked: jax.Array | None,
    mask_id: int,
) -> jax.Array:
    """log p(clean completion token | masked input) at every completion position, one pass.

    The input is the prompt and completion with `mask_id` where `prompt_masked`,
    `completion_masked` or not `completion_mask`. The value at a position is meaningful for the
    estimators only where that position is masked; callers select those.

    Args:
      logits_fn: the model, see the module docstring.
      prompt: [B, P] int32 prompt tokens.
      completion: [B, T] int32 clean completion tokens.
      completion_mask: [B, T] bool, True on real completion tokens.
      completion_masked: [B, T] bool, completion positions to feed as `mask_id`.
      prompt_masked: [B, P] bool prompt positions to feed as `mask_id`, or None for none.
      mask_id: the MASK token id.

    Returns:
      [B, T] float32 log-probs of the clean completion tokens, 0 outside `completion_mask`.
    """
    _check_inputs(prompt, completion, completion_mask)
    chex.assert_equal_shape([completion, completion_masked])
    hide = completion_masked | ~completion_mask
    noisy_completion = jnp.where(hide, mask_id, completion)
    noisy_prompt = prompt if prompt_masked is None else jnp.where(prompt_masked, mask_id, prompt)
    tokens = jnp.concatenate([noisy_prompt, noisy_completion], axis=1).astype(jnp.int32)
    logits = logits_fn(tokens)
    p = prompt.shape[1]
    if logits.shape[:2] != tokens.shape:
        raise ValueError(
            f"logits_fn returned shape {logits.shape}, expected [B, P + T, V] with "
            f"[B, P + T] = {tokens.shape}"
        )
    logp = jax.nn.log_softmax(logits[:, p:].astype(jnp.float32), axis=-1)
    token_logp = jnp.take_along_axis(logp, completion[..., None].astype(jnp.int32), axis=-1)
    return jnp.where(completion_mask, token_logp[..., 0], 0.0)


def one_pass_estimate(
    logits_fn: LogitsFn,
    prompt: jax.Array,
    completion: jax.Array,
    completion_mask: jax.Array,
    rng: jax.Array,
    mask_id: int,
    p_mask_prompt: float = 0.15,
) -> jax.Array:
    """d1 / diffu-GRPO one-pass estimate of log pi(o_t | q) per token [CODE].

    Zhao et al. 2025, "d1: Scaling Reasoning in Diffusion LLMs via RL" (arXiv 2504.12216), and
    wd1 (arXiv 2507.08838, xiaohangt/wd1 `forward_process`): mask the whole completion, mask
    each prompt token independently with probability `p_mask_prompt`, run one forward pass and
    read log p of each clean completion token. The sequence estimate is the sum over tokens.
    The default 0.15 is d1's reported value; wd1's config uses 0.3. The prompt masking is the
    only randomness: pass the same `rng` for theta, theta_old and ref.

    Args:
      logits_fn: the model, see the module docstring.
      prompt: [B, P] int32 prompt tokens.
      completion: [B, T] int32 completion tokens.
      completion_mask: [B, T] bool, True on real completion tokens.
      rng: PRNG key of the prompt mask.
      mask_id: the MASK token id.
      p_mask_prompt: probability of masking each prompt token, in [0, 1].

    Returns:
      [B, T] float32 per-token log-prob estimates, 0 outside `completion_mask`.
    """
    if not 0.0 <= p_mask_prompt <= 1.0:
        raise ValueError(f"p_mask_prompt={p_mask_prompt} must be a probability in [0, 1]")
    prompt_masked = jax.random.uniform(rng, prompt.shape) < p_mask_prompt
    everything = jnp.ones(completion.shape, bool)
    return masked_token_logprobs(
        logits_fn, prompt, completion, completion_mask, everything, prompt_masked, mask_id
    )


def _mc_average(score_one: Callable[[jax.Array], jax.Array], rng: jax.Array, n: int) -> jax.Array:
    """Mean over n keys of score_one(key) -> [B, T], one forward pass at a time (lax.map)."""
    if n < 1:
        raise ValueError(f"num_samples={n} must be >= 1")
    return jax.lax.map(score_one, jax.random.split(rng, n)).mean(axis=0)


def elbo_random_t(
    logits_fn: LogitsFn,
    prompt: jax.Array,
    completion: jax.Array,
    completion_mask: jax.Array,
    rng: jax.Array,
    mask_id: int,
    num_samples: int = 1,
    eps: float = 1e-3,
) -> jax.Array:
    """LLaDA's ELBO of log pi(completion | prompt), random masking ratio, per token.

    Nie et al. 2025, "Large Language Diffusion Models" (arXiv 2502.09992), its training loss:
    per sample and row, t = (1 - eps) u + eps with u ~ U(0, 1), each valid completion token is
    masked independently with probability t, and token i contributes (1/t) 1[i masked]
    log p(x_i | x_t, prompt); averaged over `num_samples` masks. The prompt is never masked.
    For eps -> 0 the expectation is the ELBO
      sum_{S nonempty} w(S) sum_{i in S} log p(x_i | x with S masked),
      w(S) = int_0^1 t^(|S|-1) (1 - t)^(L-|S|) dt = 1 / (|S| C(L, |S|)),
    a lower bound of the model's log-likelihood. eps > 0 (LLaDA's code uses 1e-3) keeps the
    variance finite (the 1/t weight of single-token masks has infinite variance at eps = 0)
    at an O(eps) bias.

    Args:
      logits_fn: the model, see the module docstring.
      prompt: [B, P] int32 prompt tokens.
      completion: [B, T] int32 completion tokens.
      completion_mask: [B, T] bool, True on real completion tokens.
      rng: PRNG key; the same for theta, theta_old and ref.
      mask_id: the MASK token id.
      num_samples: Monte Carlo masks n (n forward passes, run one after another).
      eps: lower bound of the masking ratio, in [0, 1).

    Returns:
      [B, T] float32 per-token contributions; their sum over T is the ELBO estimate.
    """
    if not 0.0 <= eps < 1.0:
        raise ValueError(f"eps={eps} must be in [0, 1)")
    _check_inputs(prompt, completion, completion_mask)
    b = completion.shape[0]

    def score_one(key: jax.Array) -> jax.Array:
        key_t, key_mask = jax.random.split(key)
        t = (1.0 - eps) * jax.random.uniform(key_t, (b, 1)) + eps
        masked = jax.random.uniform(key_mask, completion.shape) < t
        logp = masked_token_logprobs(
            logits_fn, prompt, completion, completion_mask, masked, None, mask_id
        )
        return jnp.where(masked, logp / t, 0.0)

    return _mc_average(score_one, rng, num_samples)


def elbo_fixed_count(
    logits_fn: LogitsFn,
    prompt: jax.Array,
    completion: jax.Array,
    completion_mask: jax.Array,
    rng: jax.Array,
    mask_id: int,
    num_samples: int = 1,
) -> jax.Array:
    """LLaDA's lower-variance ELBO estimator: mask exactly l ~ U{1..L} tokens, weight L/l.

    Nie et al. 2025 (arXiv 2502.09992), the estimator LLaDA uses to evaluate likelihoods:
    with L the number of valid completion tokens of a row, draw l uniformly in {1..L}, mask a
    uniformly random subset of l valid tokens, and token i contributes
    (L/l) 1[i masked] log p(x_i | x_l, prompt); averaged over `num_samples` masks. A mask S has
    probability (1/L) / C(L, |S|), so the expectation is exactly the eps = 0 ELBO of
    `elbo_random_t` (weight 1 / (|S| C(L, |S|))). Rows with no valid token give 0.

    Args:
      logits_fn: the model, see the module docstring.
      prompt: [B, P] int32 prompt tokens.
      completion: [B, T] int32 completion tokens.
      completion_mask: [B, T] bool, True on real completion tokens.
      rng: PRNG key; the same for theta, theta_old and ref.
      mask_id: the MASK token id.
      num_samples: Monte Carlo masks n (n forward passes, run one after another).

    Returns:
      [B, T] float32 per-token contributions; their sum over T is the ELBO estimate.
    """
    _check_inputs(prompt, completion, completion_mask)
    b = completion.shape[0]
    n_valid = completion_mask.sum(axis=1, keepdims=True)

    def score_one(key: jax.Array) -> jax.Array:
        key_l, key_perm = jax.random.split(key)
        count = jax.random.randint(key_l, (b, 1), 1, jnp.maximum(n_valid, 1) + 1)
        # A uniform random subset of `count` valid positions: the `count` smallest keys.
        keys = jnp.where(completion_mask, jax.random.uniform(key_perm, completion.shape), 2.0)
        rank = jnp.argsort(jnp.argsort(keys, axis=1), axis=1)
        masked = (rank < count) & completion_mask
        logp = masked_token_logprobs(
            logits_fn, prompt, completion, completion_mask, masked, None, mask_id
        )
        weight = n_valid.astype(jnp.float32) / count.astype(jnp.float32)
        return jnp.where(masked, weight * logp, 0.0)

    return _mc_average(score_one, rng, num_samples)


def strata(completion_mask: jax.Array, num_strata: int, rng: jax.Array | None = None) -> jax.Array:
    """Assigns each valid completion position to one of K strata (DACA-GRPO).

    With r the rank of a position among the valid positions of its row, the stratum is
    r mod K, so strata sizes differ by at most one. The ranks follow a uniform random
    permutation of the valid positions when `rng` is given (interpretation: the abstract says
    "partitions token positions into strata" without the rule), and the left-to-right order
    (interleaved strata: position 0, K, 2K, ... together) when `rng` is None.

    Args:
      completion_mask: [B, T] bool, True on real completion tokens.
      num_strata: K >= 1.
      rng: PRNG key of the permutation, or None for interleaved strata.

    Returns:
      [B, T] int32 stratum of each position in [0, K); -1 outside `completion_mask`.
    """
    chex.assert_rank(completion_mask, 2)
    if num_strata < 1:
        raise ValueError(f"num_strata={num_strata} must be >= 1")
    if rng is None:
        rank = jnp.cumsum(completion_mask, axis=1) - 1
    else:
        keys = jnp.where(completion_mask, jax.random.uniform(rng, completion_mask.shape), 2.0)
        rank = jnp.argsort(jnp.argsort(keys, axis=1), axis=1)
    return jnp.where(completion_mask, rank % num_strata, -1).astype(jnp.int32)


def stratified_estimate(
    logits_fn: LogitsFn,
    prompt: jax.Array,
    completion: jax.Array,
    completion_mask: jax.Array,
    rng: jax.Array | None,
    mask_id: int,
    num_strata: int = 4,
) -> jax.Array:
    """DACA-GRPO's Stratified Masking Likelihood, per token (interpretation).

    arXiv 2605.16342 (abstract only): the valid completion positions are split into K strata
    (`strata`); K forward passes each mask exactly one stratum (the other strata stay clean,
    the prompt is never masked), and each token's estimate is its log p from the pass that
    masks it. Every valid position is masked exactly once, with about (K-1)/K of the
    completion as context, which reduces the mean-field bias of the one-pass estimator; K = 1
    is `one_pass_estimate` with `p_mask_prompt=0`.

    Args:
      logits_fn: the model, see the module docstring.
      prompt: [B, P] int32 prompt tokens.
      completion: [B, T] int32 completion tokens.
      completion_mask: [B, T] bool, True on real completion tokens.
      rng: PRNG key of the strata (the same for theta, theta_old and ref), or None for
        interleaved strata.
      mask_id: the MASK token id.
      num_strata: K >= 1 (K forward passes, run one after another).

    Returns:
      [B, T] float32 per-token log-prob estimates, 0 outside `completion_mask`.
    """
    stratum = strata(completion_mask, num_strata, rng)

    def score_one(k: jax.Array) -> jax.Array:
        masked = stratum == k
        logp = masked_token_logprobs(
            logits_fn, prompt, completion, completion_mask, masked, None, mask_id
        )
        return jnp.where(masked, logp, 0.0)

    return jax.lax.map(score_one, jnp.arange(num_strata)).sum(axis=0)


def rldf_step_weights(
    step_map: jax.Array, token_probs: jax.Array, completion_mask: jax.Array, num_steps: int
) -> tuple[jax.Array, jax.Array]:
    """RLDF's per-step surprisal w_s = -mean log p of the tokens decoded at step s [CODE].

    RLDF (arXiv 2605.25638; ant-research/Drift `trainer/masking_strategy.py`).

    Args:
      step_map: [B, T] int32 denoising step (0-based, in [0, num_steps)) at which each
        completion token was unmasked during the rollout.
      token_probs: [B, T] probability of each token when it was decoded.
      completion_mask: [B, T] bool, True on real completion tokens.
      num_steps: S, the rollout's number of denoising steps.

    Returns:
      (w [B, S] float32, decoded [B, S] bool): w is 0 where no valid token was decoded at
      that step, and `decoded` says which steps decoded at least one valid token.
    """
    chex.assert_rank([step_map, token_probs, completion_mask], 2)
    chex.assert_equal_shape([step_map, token_probs, completion_mask])
    at_step = (step_map[:, None, :] == jnp.arange(num_steps)[None, :, None]) & completion_mask[
        :, None, :
    ]  # [B, S, T]
    surprisal = -jnp.log(jnp.maximum(token_probs.astype(jnp.float32), 1e-30))
    count = at_step.sum(axis=2)
    total = jnp.where(at_step, surprisal[:, None, :], 0.0).sum(axis=2)
    decoded = count > 0
    w = jnp.where(decoded, total / jnp.maximum(count, 1), 0.0)
    return w, decoded


def rldf_timesteps(
    rng: jax.Array,
    step_map: jax.Array,
    token_probs: jax.Array,
    completion_mask: jax.Array,
    num_steps: int,
    k: int = 4,
    temperature: float = 1.0,
) -> jax.Array:
    """RLDF weighted timestep sampling: k denoising steps per sample [CODE].

    RLDF (arXiv 2605.25638; Drift `masking_strategy.py` sequential masking): step s is drawn
    with probability softmax(w / temperature)_s over the steps that decoded at least one valid
    token, w from `rldf_step_weights` (high surprisal, more likely). The k steps are drawn
    without replacement (Gumbel top-k) when the row has at least k such steps, and with
    replacement otherwise, as Drift does. Config: k = 4, temperature = 1.

    Args:
      rng: PRNG key.
      step_map: [B, T] int32 step at which each token was unmasked (see `rldf_step_weights`).
      token_probs: [B, T] probability of each token when it was decoded.
      completion_mask: [B, T] bool, True on real completion tokens.
      num_steps: S, the rollout's number of denoising steps.
      k: steps per sample, >= 1.
      temperature: softmax temperature, > 0.

    Returns:
      [B, k] int32 chosen steps. A row with no valid token gets arbitrary steps.
    """
    if k < 1:
        raise ValueError(f"k={k} must be >= 1")
    if not 0.0 < temperature < float("inf"):
        raise ValueError(f"temperature={temperature} must be positive and finite")
    w, decoded = rldf_step_weights(step_map, token_probs, completion_mask, num_steps)
    logits = jnp.where(decoded, w / temperature, -jnp.inf)
    key_top, key_rep = jax.random.split(rng)
    # Rows with no decoded step sample from uniform logits (their steps are then meaningless).
    safe_logits = jnp.where(decoded.any(axis=1, keepdims=True), logits, 0.0)
    with_replacement = jax.random.categorical(
        key_rep, safe_logits[:, None, :], shape=(logits.shape[0], k)
    ).astype(jnp.int32)
    if k > num_steps:
        return with_replacement
    _, without_replacement = jax.lax.top_k(logits + jax.random.gumbel(key_top, logits.shape), k)
    enough = decoded.sum(axis=1, keepdims=True) >= k
    return jnp.where(enough, without_replacement, with_replacement).astype(jnp.int32)


def rldf_states(
    step_map: jax.Array,
    steps: jax.Array,
    completion_mask: jax.Array,
    token_probs: jax.Array | None = None,
    threshold: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """RLDF noisy states x_s and their (clipped) clean-state targets [CODE].

    RLDF (arXiv 2605.25638; Drift `main_rl.py` L300-420). For a chosen step s the input masks
    exactly the tokens with step_map >= s, which reproduces the rollout's intermediate state at
    the start of step s. The clean-state target scores every masked valid token. The "clipped"
    clean state (`threshold` given) keeps in the target only the masked tokens with
    token_probs >= threshold, plus always the tokens decoded at s (step_map == s); the input
    is unchanged. Drift's config uses 0.6 (code default 0.2) and filters on exp(old log-prob)
    when the batch is reused for several iterations: pass those probabilities as `token_probs`.

    Args:
      step_map: [B, T] int32 step at which each completion token was unmasked.
      steps: [B, k] int32 chosen steps (`rldf_timesteps`).
      completion_mask: [B, T] bool, True on real completion tokens.
      token_probs: [B, T] token probabilities for the clipping filter; needed with `threshold`.
      threshold: clipping threshold in [0, 1], or None for the full clean state.

    Returns:
      (masked [B, k, T] bool, scored [B, k, T] bool): the completion positions fed as MASK, and
      the positions whose clean tokens are scored (a subset of masked & completion_mask).
    """
    chex.assert_rank([step_map, steps, completion_mask], 2)
    chex.assert_equal_shape([step_map, completion_mask])
    masked = step_map[:, None, :] >= steps[:, :, None]
    scored = masked & completion_mask[:, None, :]
    if threshold is None:
        return masked, scored
    if token_probs is None:
        raise ValueError("threshold is set but token_probs is None: pass the [B, T] probabilities")
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold={threshold} must be in [0, 1]")
    chex.assert_equal_shape([token_probs, step_map])
    current = step_map[:, None, :] == steps[:, :, None]
    keep = (token_probs[:, None, :] >= threshold) | current
    return masked, scored & keep


def rldf_logprobs(
    logits_fn: LogitsFn,
    prompt: jax.Array,
    completion: jax.Array,
    masked: jax.Array,
    scored: jax.Array,
    mask_id: int,
) -> jax.Array:
    """Scores the clean tokens of RLDF states: one forward pass per chosen step.

    The input of state j is the prompt and the completion with `mask_id` exactly where
    `masked[:, j]` (the rollout's x_s, tokens after EOS included); the validity of tokens
    enters only through `scored`.

    Args:
      logits_fn: the model, see the module docstring.
      prompt: [B, P] int32 prompt tokens.
      completion: [B, T] int32 completion tokens, every generated position.
      masked: [B, k, T] bool, the states' masked positions (`rldf_states`).
      scored: [B, k, T] bool, the scored positions (`rldf_states`).
      mask_id: the MASK token id.

    Returns:
      [B, k, T] float32 log p(clean token | state), 0 outside `scored`.
    """
    chex.assert_rank([masked, scored], 3)
    chex.assert_equal_shape([masked, scored])
    every_position = jnp.ones(completion.shape, bool)

    def score_one(state: tuple[jax.Array, jax.Array]) -> jax.Array:
        masked_j, scored_j = state
        logp = masked_token_logprobs(
            logits_fn, prompt, completion, every_position, masked_j, None, mask_id
        )
        return jnp.where(scored_j, logp, 0.0)

    out = jax.lax.map(score_one, (jnp.swapaxes(masked, 0, 1), jnp.swapaxes(scored, 0, 1)))
    return jnp.swapaxes(out, 0, 1)

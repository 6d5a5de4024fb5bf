"""Jitted autoregressive sampler with a preallocated KV cache and static shapes.

Prompts come left-padded ([B, P] tokens and mask), so every row's last prompt token sits in
slot P - 1 and the generated token t of every row goes to cache slot P + t. A row stops at its
first EOS (the EOS is part of the completion and masked in); after that it emits `pad_id` with a
False mask and its cache slots stay invalid. The loop exits early once every row has stopped.

With CUTS on (`SamplingParams.cuts_top_k > 0`), Mixed-CUTS decodes the first
round_half_up(n_samples * cuts_fraction) rows of every group with CUTS and the rest with the
standard distribution, in one program: a static per-row mask selects between the two
processed distributions (`rljax.rollout.cuts`).

For a mixture-of-experts policy the experts every token was routed to (prompt tokens in the
prefill, generated tokens as they are fed back) are recorded in `Rollout.routes`, so the
trainer can replay them (`rljax.models.moe`).
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models.transformer import init_cache, positions_from_mask
from rljax.rollout.cuts import cuts_row_mask
from rljax.rollout.sampling import SamplingParams, sample_token


@chex.dataclass
class Rollout:
    """Sampled completions; N = prompts * n_samples, rows of one prompt are adjacent.

    Attributes:
      prompt_tokens: [N, P] int32, left-padded.
      prompt_mask: [N, P] bool.
      completion_tokens: [N, T] int32, `pad_id` after the end.
      completion_mask: [N, T] bool, True for generated tokens up to and including EOS.
      sampling_logprobs: [N, T] float32 log-probs of the tokens under the distribution actually
        sampled from (after temperature/top-k/top-p; 0 for greedy; -log|C_t| on CUTS rows), 0
        where masked.
      policy_logprobs: [N, T] float32 log-probs under the unmodified policy (temperature 1).
      group_id: [N] int32, index of the prompt each row answers.
      cuts_rows: [N] bool, True on rows decoded with CUTS (all False with CUTS off); None when
        the producer did not record it (no CUTS rows). A trainer takes its rollout log-probs
        from `rljax.rollout.cuts.training_rollout_logprobs`.
      routes: MoE policies only (None for dense ones): [N, P + T, n_layers, k] int32, the
        experts each token of prompt + completion was routed to, aligned with
        concatenate([prompt_tokens, completion_tokens], axis=1). Padding positions (prompt
        padding and completion slots after the end) hold experts 0, 1, ..., k - 1; they are
        masked wherever they are used.
      env_mask: multi-turn episodes only (None otherwise): [N, T] bool, True on the tokens an
        environment appended between the policy's turns (`rljax.rollout.turns`); the policy's
        own tokens are `completion_mask`, disjoint from it.
      policy_versions: [N, T] int32, the weights' version that sampled each token, from a
        rollout engine run that took in-flight weight updates (`rljax.rollout.engine`); None
        otherwise (every token from the one set of weights).
    """

    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    completion_tokens: jax.Array
    completion_mask: jax.Array
    sampling_logprobs: jax.Array
    policy_logprobs: jax.Array
    group_id: jax.Array
    cuts_rows: jax.Array | None = None
    routes: jax.Array | None = None
    env_mask: jax.Array | None = None
    policy_versions: jax.Array | None = None


@functools.partial(
    jax.jit,
    static_argnames=("graphdef", "max_new_tokens", "eos_id", "pad_id", "n_samples", "sampling"),
)
def generate(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    rng: jax.Array,
    *,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    n_samples: int = 1,
    sampling: SamplingParams = SamplingParams(),
) -> Rollout:
    """Samples `n_samples` completions of up to `max_new_tokens` tokens for each prompt.

    Args:
      graphdef, params: the policy, from `rljax.models.create_model` or a checkpoint loader.
      prompt_tokens: [B, P] int, left-padded; every prompt must have at least one real token.
      prompt_mask: [B, P] bool, True on real prompt tokens.
      rng: PRNG key; the same key gives the same samples.
      max_new_tokens: generation budget T.
      eos_id: a row stops after emitting it.
      pad_id: written after a row has stopped.
      n_samples: completions per prompt (the group size of GRPO-style methods).
      sampling: temperature / top-k / top-p / greedy / CUTS.

    Returns:
      A `Rollout` with B * n_samples rows.
    """
    chex.assert_rank([prompt_tokens, prompt_mask], 2)
    chex.assert_equal_shape([prompt_tokens, prompt_mask])
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
    model = nnx.merge(graphdef, params)
    prompt_tokens = jnp.repeat(prompt_tokens.astype(jnp.int32), n_samples, axis=0)
    prompt_mask = jnp.repeat(prompt_mask.astype(bool), n_samples, axis=0)
    rows, prompt_len = prompt_tokens.shape
    if sampling.cuts_top_k:
        cuts_rows = cuts_row_mask(rows // n_samples, n_samples, sampling.cuts_fraction)
    else:
        cuts_rows = jnp.zeros((rows,), bool)

    config = model.config
    moe = config.num_experts > 0
    cache = init_cache(config, rows, prompt_len + max_new_tokens)
    positions = positions_from_mask(prompt_mask)
    hidden, cache, prompt_routes = model.hidden_states(
        prompt_tokens, positions, prompt_mask, cache, return_routes=True
    )
    logits = model.logits(hidden[:, -1])
    if moe:  # padding positions hold experts 0 .. k-1
        pad_routes = jnp.broadcast_to(
            jnp.arange(config.experts_per_token, dtype=jnp.int32),
            (rows, prompt_len + max_new_tokens, config.n_layers, config.experts_per_token),
        )
        keep = prompt_mask[:, :, None, None]
        routes = pad_routes.at[:, :prompt_len].set(jnp.where(keep, prompt_routes, pad_routes[0, 0]))

    shape = (rows, max_new_tokens)
    init = dict(
        t=jnp.zeros((), jnp.int32),
        cache=cache,
        logits=logits,
        position=positions[:, -1] + 1,
        done=jnp.zeros((rows,), bool),
        rng=rng,
        tokens=jnp.full(shape, pad_id, jnp.int32),
        mask=jnp.zeros(shape, bool),
        sampling_logprobs=jnp.zeros(shape, jnp.float32),
        policy_logprobs=jnp.zeros(shape, jnp.float32),
    )
    if moe:
        init["routes"] = routes

    def cond(carry):
        return (carry["t"] < max_new_tokens) & ~jnp.all(carry["done"])

    def body(carry):
        t, live = carry["t"], ~carry["done"]
        rng, key = jax.random.split(carry["rng"])
        token, sampling_lp, policy_lp = sample_token(key, carry["logits"], sampling, cuts_rows)
        token = jnp.where(live, token, pad_id)
        write = lambda buf, col: jax.lax.dynamic_update_slice(buf, col[:, None], (0, t))
        hidden, cache, step_routes = model.hidden_states(
            token[:, None],
            carry["position"][:, None],
            live[:, None],
            carry["cache"],
            return_routes=True,
        )
        extra = {}
        if moe:
            old = jax.lax.dynamic_slice_in_dim(carry["routes"], prompt_len + t, 1, axis=1)
            new = jnp.where(live[:, None, None, None], step_routes, old)
            extra["routes"] = jax.lax.dynamic_update_slice_in_dim(
                carry["routes"], new, prompt_len + t, axis=1
            )
        return dict(
            t=t + 1,
            cache=cache,
            logits=model.logits(hidden[:, 0]),
            position=carry["position"] + 1,
            done=carry["done"] | (token == eos_id),
            rng=rng,
            tokens=write(carry["tokens"], token),
            mask=write(carry["mask"], live),
            sampling_logprobs=write(carry["sampling_logprobs"], jnp.where(live, sampling_lp, 0.0)),
            policy_logprobs=write(carry["policy_logprobs"], jnp.where(live, policy_lp, 0.0)),
            **extra,
        )

    out = jax.lax.while_loop(cond, body, init)
    return Rollout(
        prompt_tokens=prompt_tokens,
        prompt_mask=prompt_mask,
        completion_tokens=out["tokens"],
        completion_mask=out["mask"],
        sampling_logprobs=out["sampling_logprobs"],
        policy_logprobs=out["policy_logprobs"],
        group_id=jnp.arange(rows, dtype=jnp.int32) // n_samples,
        cuts_rows=cuts_rows,
        routes=out["routes"] if moe else None,
    )

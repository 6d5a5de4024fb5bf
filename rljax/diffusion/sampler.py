"""Jitted block-wise semi-autoregressive sampler of a masked-diffusion LM (LLaDA's `generate`).

The completion of `gen_length` tokens starts fully masked and is split into blocks of
`block_size` tokens, denoised left to right. Inside the current block each of
`steps_per_block` steps runs one bidirectional forward pass over prompt + whole completion
(later blocks still masked), predicts every masked position of the block, and unmasks the k of
them with the highest confidence; k spreads the block's tokens evenly over its steps
(`num_transfer_tokens`). Earlier blocks are final; tokens once unmasked are never remasked.

The rollout records, per completion token, the global denoising step that unmasked it
(`step_map`, RLDF arXiv 2605.25638) and the probability the policy gave it then
(`token_probs`), so a trainer can rebuild every intermediate state x_s exactly: MASK where
step_map >= s, the final token elsewhere.

Choices (interpretation of LLaDA's reference code, stated here because they shape the output):
- Temperature > 0 samples the prediction by Gumbel-max on logits / temperature, equivalent to
  LLaDA's exp(logits) / (-log u) ** temperature; LLaDA does this in float64, we use float32.
  Temperature 0 is the argmax.
- "low_confidence" remasking scores a position by the untempered probability softmax(logits)
  of its predicted token; "random" scores by a uniform draw. Ties go to the leftmost position.
- `token_probs` is that untempered probability softmax(logits)[token] in both modes.
- EOS: like LLaDA the sampler always fills all `gen_length` positions. `completion_tokens` keep
  every generated token (the trainer needs them to replay intermediate states) and
  `completion_mask` is True up to and including the first `eos_id`, False after it (d1's
  completion mask); with `eos_id=None` it is all True.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from rljax.diffusion.policy import masked_logits

REMASKING = ("low_confidence", "random")


@chex.dataclass
class DiffusionRollout:
    """Completions of a masked-diffusion LM and how they were denoised.

    Attributes:
      prompt_tokens: [B, P] int32, left-padded.
      prompt_mask: [B, P] bool.
      completion_tokens: [B, G] int32, every generated token (also after EOS).
      completion_mask: [B, G] bool, True up to and including the first EOS (all True without
        `eos_id`).
      step_map: [B, G] int32, the global denoising step (block * steps_per_block + step in the
        block) at which each token was unmasked.
      token_probs: [B, G] float32, softmax(logits)[token] (temperature 1) at that step.
      block_ids: [B, G] int32, position // block_size.
    """

    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    completion_tokens: jax.Array
    completion_mask: jax.Array
    step_map: jax.Array
    token_probs: jax.Array
    block_ids: jax.Array


def num_transfer_tokens(n_masked: jax.Array, steps: int) -> jax.Array:
    """How many tokens each of `steps` steps unmasks (LLaDA's `get_num_transfer_tokens`).

    base = n // steps tokens per step, and the first n % steps steps take one more, so the
    counts sum to n: 7 tokens over 3 steps -> [3, 2, 2].

    Args:
      n_masked: [...] int, masked tokens in a block.
      steps: denoising steps for the block (>= 1).

    Returns:
      [..., steps] int32.
    """
    if steps < 1:
        raise ValueError(f"steps={steps} must be >= 1")
    n = jnp.asarray(n_masked, jnp.int32)[..., None]
    return (n // steps + (jnp.arange(steps) < n % steps)).astype(jnp.int32)


def _top_k_mask(scores: jax.Array, k: jax.Array) -> jax.Array:
    """[B, N] bool: the k highest scores per row (k traced), ties to the lower index."""
    order = jnp.argsort(-scores, axis=-1, stable=True)
    rank = jnp.argsort(order, axis=-1)
    return rank < k


@functools.partial(
    jax.jit,
    static_argnames=(
        "graphdef",
        "gen_length",
        "block_size",
        "steps_per_block",
        "mask_id",
        "temperature",
        "remasking",
        "eos_id",
    ),
)
def diffusion_generate(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    rng: jax.Array,
    *,
    gen_length: int,
    block_size: int,
    steps_per_block: int,
    mask_id: int,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
    eos_id: int | None = None,
) -> DiffusionRollout:
    """Denoises a `gen_length` completion of each prompt block by block (LLaDA, arXiv 2502.09992).

    Args:
      graphdef, params: a masked-diffusion LM (`create_diffusion_model`).
      prompt_tokens: [B, P] int, left-padded, never containing `mask_id`.
      prompt_mask: [B, P] bool, True on real prompt tokens.
      rng: PRNG key; the same key gives the same completions.
      gen_length: completion length G, a multiple of `block_size`.
      block_size: tokens per block.
      steps_per_block: denoising steps per block (forward passes per block); block_size /
        steps_per_block tokens are unmasked per step, the remainder on the first steps.
      mask_id: the reserved MASK id.
      temperature: 0 for the argmax prediction, > 0 for Gumbel-max sampling.
      remasking: "low_confidence" or "random" (which masked positions to unmask first).
      eos_id: None, or the id after whose first occurrence `completion_mask` is False.

    Returns:
      A `DiffusionRollout` with B rows; gen_length // block_size * steps_per_block forward
      passes were run.
    """
    chex.assert_rank([prompt_tokens, prompt_mask], 2)
    chex.assert_equal_shape([prompt_tokens, prompt_mask])
    if gen_length < 1 or block_size < 1 or gen_length % block_size:
        raise ValueError(
            f"gen_length={gen_length} must be a positive multiple of block_size={block_size}"
        )
    if steps_per_block < 1:
        raise ValueError(f"steps_per_block={steps_per_block} must be >= 1")
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 is the argmax)")
    if remasking not in REMASKING:
        raise ValueError(f"remasking={remasking!r} is unknown; choose one of {REMASKING}")

    rows, prompt_len = prompt_tokens.shape
    prompt_tokens = prompt_tokens.astype(jnp.int32)
    prompt_mask = prompt_mask.astype(bool)
    valid = jnp.concatenate([prompt_mask, jnp.ones((rows, gen_length), bool)], axis=1)
    # Every block starts fully masked, so the per-step counts are the same for all blocks.
    schedule = num_transfer_tokens(block_size, steps_per_block)
    n_steps = gen_length // block_size * steps_per_block

    def step(s, carry):
        block, i = s // steps_per_block, s % steps_per_block
        lo = block * block_size
        rng, noise_key, score_key = jax.random.split(carry["rng"], 3)
        tokens = jnp.concatenate([prompt_tokens, carry["tokens"]], axis=1)
        logits = masked_logits(
            graphdef,
            params,
            tokens,
            valid,
            mask_id=mask_id,
            start=prompt_len + lo,
            length=block_size,
        )  # [B, block_size, V]
        if temperature > 0:
            gumbel = jax.random.gumbel(noise_key, logits.shape, jnp.float32)
            pred = jnp.argmax(logits / temperature + gumbel, axis=-1)
        else:
            pred = jnp.argmax(logits, axis=-1)
        pred = pred.astype(jnp.int32)
        probs = jax.nn.softmax(logits, axis=-1)
        pred_prob = jnp.take_along_axis(probs, pred[..., None], axis=-1)[..., 0]
        if remasking == "low_confidence":
            confidence = pred_prob
        else:
            confidence = jax.random.uniform(score_key, pred_prob.shape)

        block_of = lambda x: jax.lax.dynamic_slice_in_dim(x, lo, block_size, axis=1)
        old_tokens, old_steps, old_probs = (
            block_of(carry[k]) for k in ("tokens", "steps", "probs")
        )
        masked = old_steps < 0
        chosen = masked & _top_k_mask(jnp.where(masked, confidence, -jnp.inf), schedule[i])
        put = lambda name, new, old: jax.lax.dynamic_update_slice_in_dim(
            carry[name], jnp.where(chosen, new, old), lo, axis=1
        )
        return dict(
            rng=rng,
            tokens=put("tokens", pred, old_tokens),
            steps=put("steps", s, old_steps),
            probs=put("probs", pred_prob, old_probs),
        )

    shape = (rows, gen_length)
    init = dict(
        rng=rng,
        tokens=jnp.full(shape, mask_id, jnp.int32),
        steps=jnp.full(shape, -1, jnp.int32),
        probs=jnp.zeros(shape, jnp.float32),
    )
    out = jax.lax.fori_loop(0, n_steps, step, init)
    block_ids = jnp.broadcast_to(jnp.arange(gen_length) // block_size, shape)
    return _rollout(prompt_tokens, prompt_mask, out, block_ids.astype(jnp.int32), eos_id)


def _rollout(prompt_tokens, prompt_mask, out: dict, block_ids, eos_id) -> DiffusionRollout:
    """The sampler's final state as a `DiffusionRollout`; `completion_mask` ends at the first
    EOS (inclusive) when `eos_id` is given."""
    completion = out["tokens"]
    if eos_id is None:
        completion_mask = jnp.ones(completion.shape, bool)
    else:
        position = jnp.arange(completion.shape[1])
        is_eos = completion == eos_id
        first = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1), position.size)
        completion_mask = position[None, :] <= first[:, None]
    return DiffusionRollout(
        prompt_tokens=prompt_tokens,
        prompt_mask=prompt_mask,
        completion_tokens=completion,
        completion_mask=completion_mask,
        step_map=out["steps"],
        token_probs=out["probs"],
        block_ids=block_ids,
    )


@functools.partial(
    jax.jit,
    static_argnames=(
        "graphdef",
        "gen_length",
        "num_steps",
        "mask_id",
        "temperature",
        "remasking",
        "eos_id",
    ),
)
def _generate_per_row(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    rng: jax.Array,
    block_sizes: jax.Array,
    *,
    gen_length: int,
    num_steps: int,
    mask_id: int,
    temperature: float,
    remasking: str,
    eos_id: int | None,
) -> DiffusionRollout:
    """`diffusion_generate_per_row` after the host-side checks; `block_sizes` is traced."""
    rows, prompt_len = prompt_tokens.shape
    prompt_tokens = prompt_tokens.astype(jnp.int32)
    prompt_mask = prompt_mask.astype(bool)
    valid = jnp.concatenate([prompt_mask, jnp.ones((rows, gen_length), bool)], axis=1)
    sizes = block_sizes.astype(jnp.int32)  # [B]
    steps_per_block = num_steps // (gen_length // sizes)  # [B]
    position = jnp.arange(gen_length)
    block_ids = (position[None, :] // sizes[:, None]).astype(jnp.int32)  # [B, G]
    # Row r's randomness depends only on (rng, r, step, position), not on the other rows.
    row_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(rng, jnp.arange(rows))

    def step(s, carry):
        block, i = s // steps_per_block, s % steps_per_block  # [B] each
        # Row r's current block holds its block_sizes[r] tokens; it unmasks num_transfer_tokens
        # (block_size, steps_per_block)[i] of them at this step.
        in_block = block_ids == block[:, None]
        k = sizes // steps_per_block + (i < sizes % steps_per_block)
        keys = jax.vmap(lambda key: jax.random.split(jax.random.fold_in(key, s)))(row_keys)
        tokens = jnp.concatenate([prompt_tokens, carry["tokens"]], axis=1)
        logits = masked_logits(
            graphdef, params, tokens, valid, mask_id=mask_id, start=prompt_len, length=gen_length
        )  # [B, G, V]
        if temperature > 0:
            draw = lambda key: jax.random.gumbel(key, logits.shape[1:], jnp.float32)
            pred = jnp.argmax(logits / temperature + jax.vmap(draw)(keys[:, 0]), axis=-1)
        else:
            pred = jnp.argmax(logits, axis=-1)
        pred = pred.astype(jnp.int32)
        probs = jax.nn.softmax(logits, axis=-1)
        pred_prob = jnp.take_along_axis(probs, pred[..., None], axis=-1)[..., 0]
        if remasking == "low_confidence":
            confidence = pred_prob
        else:
            draw = lambda key: jax.random.uniform(key, (gen_length,))
            confidence = jax.vmap(draw)(keys[:, 1])
        masked = (carry["steps"] < 0) & in_block
        chosen = masked & _top_k_mask(jnp.where(masked, confidence, -jnp.inf), k[:, None])
        return dict(
            tokens=jnp.where(chosen, pred, carry["tokens"]),
            steps=jnp.where(chosen, s, carry["steps"]),
            probs=jnp.where(chosen, pred_prob, carry["probs"]),
        )

    shape = (rows, gen_length)
    init = dict(
        tokens=jnp.full(shape, mask_id, jnp.int32),
        steps=jnp.full(shape, -1, jnp.int32),
        probs=jnp.zeros(shape, jnp.float32),
    )
    out = jax.lax.fori_loop(0, num_steps, step, init)
    return _rollout(prompt_tokens, prompt_mask, out, block_ids, eos_id)


def diffusion_generate_per_row(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    rng: jax.Array,
    block_sizes: jax.Array,
    *,
    gen_length: int,
    num_steps: int,
    mask_id: int,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
    eos_id: int | None = None,
) -> DiffusionRollout:
    """`diffusion_generate` with its own block size per row (Block-R1, sample-level block sizes).

    Block-R1 (github.com/YanJiangJerry/Block-R1) trains each sample with its own
    "best-improved" block size; this sampler lets one batch mix them. The sizes are data: one
    compiled program serves every assignment of sizes to rows.

    Step budget (interpretation: the abstract does not say how steps scale with the block
    size): every row runs the same `num_steps` forward passes (the batch shares each pass),
    split evenly over its gen_length / block_sizes[r] blocks, so row r takes
    steps_per_block = num_steps * block_sizes[r] / gen_length steps per block and unmasks
    `num_transfer_tokens(block_sizes[r], steps_per_block)` tokens at them. `step_map` holds the
    global step in [0, num_steps) at which each token was unmasked, so RLDF's replay (MASK where
    step_map >= s) holds for every row.

    Randomness: row r draws its Gumbel noise and random-remasking scores from
    fold_in(fold_in(rng, r), step) over all gen_length positions, so a row's completion depends
    only on its prompt, its block size, `rng` and its index, not on the other rows' sizes. With
    temperature 0 and "low_confidence" remasking an all-equal `block_sizes` reproduces
    `diffusion_generate` with steps_per_block = num_steps * block_size / gen_length; with noise
    the two draw different (equally distributed) samples. The logits of the whole completion are
    computed at each step (`diffusion_generate` computes one block), which costs B * G * V
    floats instead of B * block_size * V.

    Args:
      graphdef, params, prompt_tokens, prompt_mask, mask_id, temperature, remasking, eos_id:
        as in `diffusion_generate`.
      rng: PRNG key; the same key and row index give the same completion.
      block_sizes: [B] int, each a divisor of `gen_length` whose block count
        gen_length // block_sizes[r] divides `num_steps`. Checked when concrete; under an outer
        jit (traced sizes) the caller guarantees it.
      gen_length: completion length G.
      num_steps: forward passes of every row.

    Returns:
      A `DiffusionRollout` with B rows; `block_ids[r]` = position // block_sizes[r].
    """
    chex.assert_rank([prompt_tokens, prompt_mask], 2)
    chex.assert_equal_shape([prompt_tokens, prompt_mask])
    chex.assert_shape(block_sizes, (prompt_tokens.shape[0],))
    if gen_length < 1 or num_steps < 1:
        raise ValueError(f"gen_length={gen_length} and num_steps={num_steps} must be >= 1")
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 is the argmax)")
    if remasking not in REMASKING:
        raise ValueError(f"remasking={remasking!r} is unknown; choose one of {REMASKING}")
    if not isinstance(block_sizes, jax.core.Tracer):
        for size in {int(x) for x in jnp.asarray(block_sizes).tolist()}:
            if size < 1 or gen_length % size or num_steps % (gen_length // size):
                raise ValueError(
                    f"block size {size} must divide gen_length={gen_length} into a number of "
                    f"blocks that divides num_steps={num_steps}; pick sizes and a step budget "
                    "that fit (e.g. num_steps a multiple of gen_length)"
                )
    return _generate_per_row(
        graphdef,
        params,
        prompt_tokens,
        prompt_mask,
        rng,
        jnp.asarray(block_sizes),
        gen_length=gen_length,
        num_steps=num_steps,
        mask_id=mask_id,
        temperature=temperature,
        remasking=remasking,
        eos_id=eos_id,
    )

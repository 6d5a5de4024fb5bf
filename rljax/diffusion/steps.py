"""The jitted steps of a masked-diffusion LM on the one driver (`rljax.train.Steps`).

  rollout(state, prompt_tokens [N, P], prompt_mask [N, P], attempt=0, block_sizes=None, salt=0)
      -> DiffusionRollout of N x G rows (the block-wise sampler; with `block_sizes` [N] each
         prompt's G samples use its own block size, Block-R1)
  prepare(state, batch) -> (state, batch, metrics)
      the algorithm's transforms (group advantages), RLDF's states, and the estimates of
      theta_old and ref for every optimizer step of the update, on that step's masks
  update(state, batch) -> (state, metrics)
      epochs x minibatches optimizer steps of the algorithm's objective (d1's inner steps)
  logprobs(state, prompt_tokens, prompt_mask, completion_tokens, completion_mask) -> [B, T]
      the one-pass estimate with a clean prompt

Randomness: every step takes its key from `state.rng` folded with `state.step` and a salt, so
a resumed run repeats a straight one exactly. Each optimizer step (epoch e, minibatch m) draws
one estimator key; `prepare` evaluates theta_old and ref with it and `update` evaluates theta
with it, on the same rows, so ratios and KLs compare the same masks (d1). Minibatches hold
whole prompt groups (wd1 softmaxes within a group); each epoch reshuffles the groups.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.core.batch import Batch
from rljax.core.state import TrainState
from rljax.core.transform import Context
from rljax.diffusion.algorithms import STEP_MAP_KEY, DiffusionAlgorithm
from rljax.diffusion.likelihood import (
    elbo_fixed_count,
    one_pass_estimate,
    rldf_logprobs,
    rldf_states,
    rldf_timesteps,
    stratified_estimate,
)
from rljax.diffusion.objectives import diffu_grpo_loss, rldf_loss, rspo_loss, wd1_loss
from rljax.diffusion.policy import masked_logits
from rljax.diffusion.sampler import (
    DiffusionRollout,
    diffusion_generate,
    diffusion_generate_per_row,
)
from rljax.parallel.rules import DEFAULT_RULES
from rljax.train.guard import all_finite
from rljax.train.steps import Steps, UpdateConfig

_ROLLOUT, _PREPARE, _UPDATE = 0, 1, 2
# batch.extras keys written by the rollout (token_probs) and by prepare.
TOKEN_PROBS_KEY = "token_probs"
OLD_KEY, REF_KEY = "old_estimates", "ref_estimates"
RLDF_MASKED_KEY, RLDF_SCORED_KEY = "rldf_masked", "rldf_scored"


@dataclasses.dataclass(frozen=True)
class DiffusionRolloutConfig:
    """The block-wise sampler's settings (static: changing them recompiles).

    Attributes:
      gen_length: T, completion tokens (`rollout.max_new_tokens`).
      block_size: tokens per block of the uniform sampler.
      steps_per_block: denoising steps per block.
      n_samples: G, samples per prompt.
      mask_id: the reserved MASK id.
      eos_id: EOS; `completion_mask` ends at the first one (inclusive).
      temperature: sampling temperature (> 0 in training; evaluation is greedy).
      remasking: "low_confidence" or "random".
    """

    gen_length: int
    block_size: int
    steps_per_block: int
    n_samples: int
    mask_id: int
    eos_id: int
    temperature: float = 1.0
    remasking: str = "low_confidence"

    @property
    def num_steps(self) -> int:
        """S, forward passes per rollout (the same for every Block-R1 block size)."""
        return self.gen_length // self.block_size * self.steps_per_block


def _step_key(state: TrainState, salt: int) -> jax.Array:
    return jax.random.fold_in(jax.random.fold_in(state.rng, state.step), salt)


def _take(batch: Batch, ids: jax.Array) -> Batch:
    return jax.tree.map(lambda x: x[ids], batch)


def _logits_fn(
    graphdef: nnx.GraphDef, params: nnx.State, prompt_mask: jax.Array, gen_length: int, mask_id: int
) -> Callable[[jax.Array], jax.Array]:
    """The estimators' `logits_fn(tokens [B, P + T]) -> [B, P + T, V]` for one prompt batch."""
    valid = jnp.concatenate(
        [prompt_mask.astype(bool), jnp.ones((prompt_mask.shape[0], gen_length), bool)], axis=1
    )
    return lambda tokens: masked_logits(graphdef, params, tokens, valid, mask_id=mask_id)


def diffusion_estimates(
    algorithm: DiffusionAlgorithm,
    graphdef: nnx.GraphDef,
    params: nnx.State,
    batch: Batch,
    key: jax.Array,
    mask_id: int,
) -> jax.Array:
    """Per-token log-prob estimates of the batch's completions under `params`.

    Args:
      algorithm: picks the estimator (`rljax.diffusion.algorithms`).
      graphdef, params: the policy (theta, theta_old or ref).
      batch: the rows; RLDF reads its states from `extras["rldf_masked"]` and
        `extras["rldf_scored"]` (drawn by prepare).
      key: the estimator key, the same for theta, theta_old and ref of one optimizer step
        (the prompt mask, the ELBO masks, the strata; RLDF's states ignore it).
      mask_id: the MASK id.

    Returns:
      [B, T] estimates (one-pass, ELBO or stratified), or [B, k, T] for RLDF's states.
    """
    s, name = algorithm.settings, algorithm.name
    completion, mask = batch.completion_tokens, batch.completion_mask
    fn = _logits_fn(graphdef, params, batch.prompt_mask, completion.shape[1], mask_id)
    args = (fn, batch.prompt_tokens, completion)
    if name in ("diffu_grpo", "wd1"):
        return one_pass_estimate(*args, mask, key, mask_id, s.p_mask_prompt)
    if name == "daca":
        return stratified_estimate(*args, mask, key, mask_id, s.num_strata)
    if name == "rspo":
        return elbo_fixed_count(*args, mask, key, mask_id, s.elbo_samples)
    extras = batch.extras
    return rldf_logprobs(*args, extras[RLDF_MASKED_KEY], extras[RLDF_SCORED_KEY], mask_id)


def diffusion_objective(
    algorithm: DiffusionAlgorithm,
    logprobs: jax.Array,
    old: jax.Array | None,
    ref: jax.Array | None,
    batch: Batch,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The algorithm's loss on theta's estimates and theta_old's / ref's on the same masks.

    Token advantages are `batch.advantages` [B, T] (GRPO's sequence advantage on every token
    through the first EOS, DACA-weighted for daca); the sequence objectives read the advantage
    at position 0, which is always such a token (`completion_mask` runs up to and including
    the first EOS).

    Args:
      algorithm: picks the objective.
      logprobs: theta's `diffusion_estimates` (differentiated).
      old: theta_old's, or None (wd1, rspo).
      ref: ref's, or None without a reference (beta = 0; wd1).
      batch: the rows (advantages, completion mask, RLDF's scored positions).

    Returns:
      (loss, metrics) of `diffu_grpo_loss`, `rldf_loss`, `wd1_loss` or `rspo_loss`.
    """
    s, name = algorithm.settings, algorithm.name
    seq_adv = batch.advantages[:, 0]
    if name in ("diffu_grpo", "daca"):
        mask = batch.completion_mask
        return diffu_grpo_loss(logprobs, old, batch.advantages, mask, ref, s.clip_eps, s.beta)
    if name == "rldf":
        scored = batch.extras[RLDF_SCORED_KEY]
        return rldf_loss(logprobs, old, ref, seq_adv, scored, s.clip_eps, s.beta)
    if name == "wd1":
        return wd1_loss(logprobs.sum(-1), seq_adv, algorithm.group_size)
    return rspo_loss(logprobs.sum(-1), ref.sum(-1), seq_adv, s.rspo_beta)


def make_diffusion_steps(
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    algorithm: DiffusionAlgorithm,
    rollout_config: DiffusionRolloutConfig,
    update_config: UpdateConfig = UpdateConfig(),
    mesh: Mesh | None = None,
    state_shardings: TrainState | None = None,
) -> Steps:
    """Builds the jitted rollout / prepare / update / logprobs of a diffusion policy.

    Args:
      graphdef: the bidirectional transformer (`create_diffusion_model`).
      optimizer: the optax optimizer of `TrainState.opt_state`.
      algorithm: estimator/objective pairing and transforms (`rljax.diffusion.algorithms`).
      rollout_config: the sampler's settings.
      update_config: epochs (d1's inner steps) and minibatches; microbatches and packing must
        be off.
      mesh, state_shardings: as for `rljax.train.make_steps` (batch rows over the mesh's
        batch axes, the state kept in its shardings).

    Raises:
      ValueError: for microbatches or packing, or a mesh without state shardings.
    """
    rc, cfg, s = rollout_config, update_config, algorithm.settings
    if cfg.microbatches != 1 or cfg.pack_ratio:
        raise ValueError(
            "the diffusion update takes no train.microbatches or train.pack_ratio; set them to "
            "1 and 0"
        )
    g, name = algorithm.group_size, algorithm.name
    mask_id, n_updates = rc.mask_id, cfg.epochs * cfg.minibatches

    def rollout(state: TrainState, tokens, mask, attempt, salt) -> DiffusionRollout:
        key = _rollout_key(state, attempt, salt)
        return diffusion_generate(
            graphdef,
            state.params,
            jnp.repeat(tokens, g, axis=0),
            jnp.repeat(mask, g, axis=0),
            key,
            gen_length=rc.gen_length,
            block_size=rc.block_size,
            steps_per_block=rc.steps_per_block,
            mask_id=mask_id,
            temperature=rc.temperature,
            remasking=rc.remasking,
            eos_id=rc.eos_id,
        )

    def rollout_per_row(state: TrainState, tokens, mask, sizes, attempt, salt):
        return diffusion_generate_per_row(
            graphdef,
            state.params,
            jnp.repeat(tokens, g, axis=0),
            jnp.repeat(mask, g, axis=0),
            _rollout_key(state, attempt, salt),
            jnp.repeat(sizes, g, axis=0),
            gen_length=rc.gen_length,
            num_steps=rc.num_steps,
            mask_id=mask_id,
            temperature=rc.temperature,
            remasking=rc.remasking,
            eos_id=rc.eos_id,
        )

    def estimate(params, batch: Batch, key: jax.Array) -> jax.Array:
        return diffusion_estimates(algorithm, graphdef, params, batch, key, mask_id)

    def objective(logp, old, ref, batch: Batch):
        return diffusion_objective(algorithm, logp, old, ref, batch)

    def plan(state: TrainState, rows: int) -> tuple[jax.Array, jax.Array]:
        """Row ids [E * M, rows / M] of every optimizer step (whole groups, reshuffled each
        epoch) and its estimator key [E * M, 2]."""
        groups = rows // g
        if groups % cfg.minibatches:
            raise ValueError(
                f"{groups} prompt groups per batch do not split into train.minibatches="
                f"{cfg.minibatches} (diffusion minibatches hold whole groups)"
            )
        order_key, mask_key = jax.random.split(_step_key(state, _UPDATE))
        perms = jnp.stack(
            [jax.random.permutation(k, groups) for k in jax.random.split(order_key, cfg.epochs)]
        )
        ids = (perms[..., None] * g + jnp.arange(g)).reshape(n_updates, rows // cfg.minibatches)
        return ids, jax.random.split(mask_key, n_updates)

    def per_step_estimates(params, batch: Batch, ids, keys) -> jax.Array:
        """[B, E, ...]: each row's estimate on the masks of its optimizer step in each epoch."""

        def one(carry, xs):
            step_ids, key = xs
            return carry, estimate(params, _take(batch, step_ids), key)

        _, est = jax.lax.scan(one, None, (ids, keys))  # [E * M, B / M, ...]
        rows = ids.shape[0] * ids.shape[1] // cfg.epochs
        est = est.reshape(cfg.epochs, rows, *est.shape[2:])
        back = jnp.argsort(ids.reshape(cfg.epochs, rows), axis=1)
        est = jax.vmap(lambda e, i: e[i])(est, back)
        return jnp.moveaxis(est, 0, 1)

    def prepare(state: TrainState, batch: Batch):
        ctx = Context(step=state.step, rng=_step_key(state, _PREPARE), extras={})
        batch, transform_state, metrics = algorithm.transform.apply(
            batch, state.transform_state, ctx
        )
        extras = dict(batch.extras)
        if name == "rldf":
            step_map = extras[STEP_MAP_KEY].astype(jnp.int32)
            probs, mask = extras[TOKEN_PROBS_KEY], batch.completion_mask
            steps = rldf_timesteps(
                ctx.rng, step_map, probs, mask, rc.num_steps, s.rldf_k, s.rldf_temperature
            )
            threshold = s.rldf_threshold if s.rldf_threshold > 0 else None
            masked, scored = rldf_states(step_map, steps, mask, probs, threshold)
            extras.update({RLDF_MASKED_KEY: masked, RLDF_SCORED_KEY: scored})
            metrics["rldf/scored_tokens"] = scored.sum(axis=(1, 2)).mean(dtype=jnp.float32)
        batch = batch.replace(extras=extras)
        ids, keys = plan(state, batch.group_id.shape[0])
        if name in ("diffu_grpo", "rldf", "daca"):  # ratio objectives: theta_old
            extras[OLD_KEY] = per_step_estimates(state.params, batch, ids, keys)
        if algorithm.needs_reference:
            extras[REF_KEY] = per_step_estimates(state.ref_params, batch, ids, keys)
        return state.replace(transform_state=transform_state), batch.replace(extras=extras), metrics

    def update(state: TrainState, batch: Batch):
        ids, keys = plan(state, batch.group_id.shape[0])

        def loss_fn(params, sub: Batch, key, epoch):
            pick = lambda k: jnp.take(sub.extras[k], epoch, axis=1) if k in sub.extras else None
            logp = estimate(params, sub, key)
            return objective(logp, pick(OLD_KEY), pick(REF_KEY), sub)

        def one(carry, xs):
            params, opt_state = carry
            i, step_ids, key = xs
            sub = _take(batch, step_ids)
            grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
            (loss, metrics), grads = grad_fn(params, sub, key, i // cfg.minibatches)
            updates, new_opt_state = optimizer.update(grads, opt_state, params)
            new = (optax.apply_updates(params, updates), new_opt_state)
            finite = all_finite((loss, grads, new))  # the step it makes too (rljax.train.guard)
            carry = jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, carry)
            metrics = {**metrics, "loss": loss, "grad_norm": optax.tree.norm(grads)}
            return carry, (metrics, ~finite)

        xs = (jnp.arange(n_updates), ids, keys)
        (params, opt_state), (metrics, skipped) = jax.lax.scan(
            one, (state.params, state.opt_state), xs
        )
        metrics = jax.tree.map(jnp.mean, metrics)
        metrics["guard/skipped"] = skipped.mean(dtype=jnp.float32)
        metrics["guard/first_nonfinite"] = jnp.int32(-1)  # not traced to a tensor here
        state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
        return state, metrics

    def logprobs(state: TrainState, prompt_tokens, prompt_mask, completion_tokens, mask):
        key = jax.random.PRNGKey(0)  # unused: no prompt token is masked
        fn = _logits_fn(graphdef, state.params, prompt_mask, rc.gen_length, mask_id)
        return one_pass_estimate(
            fn, prompt_tokens, completion_tokens, mask.astype(bool), key, mask_id, 0.0
        )

    def _rollout_key(state: TrainState, attempt, salt) -> jax.Array:
        key = _step_key(state, _ROLLOUT)
        # Attempt 0 keeps the step's key; refill attempts (DAPO) and Block-R1's measurement
        # rollouts (salt) draw fresh samples.
        key = jnp.where(attempt == 0, key, jax.random.fold_in(key, attempt))
        return jnp.where(salt == 0, key, jax.random.fold_in(key, 1000 + salt))

    if mesh is None:
        jit_rollout, jit_per_row = jax.jit(rollout), jax.jit(rollout_per_row)
        jit_prepare, jit_update = jax.jit(prepare), jax.jit(update, donate_argnums=0)
        jit_logprobs = jax.jit(logprobs)
    else:
        if state_shardings is None:
            raise ValueError("make_diffusion_steps(mesh=...) also needs state_shardings")
        rows = NamedSharding(mesh, PartitionSpec(DEFAULT_RULES["batch"]))
        none = NamedSharding(mesh, PartitionSpec())
        st = state_shardings
        jit_rollout = jax.jit(
            rollout, in_shardings=(st, rows, rows, none, none), out_shardings=rows
        )
        jit_per_row = jax.jit(
            rollout_per_row, in_shardings=(st, rows, rows, rows, none, none), out_shardings=rows
        )
        jit_prepare = jax.jit(prepare, in_shardings=(st, rows), out_shardings=(st, rows, none))
        jit_update = jax.jit(
            update, in_shardings=(st, rows), out_shardings=(st, none), donate_argnums=0
        )
        jit_logprobs = jax.jit(
            logprobs, in_shardings=(st, rows, rows, rows, rows), out_shardings=rows
        )

    def run_rollout(state, tokens, mask, attempt=0, block_sizes=None, salt=0):
        if block_sizes is None:
            return jit_rollout(state, tokens, mask, attempt, salt)
        return jit_per_row(state, tokens, mask, block_sizes, attempt, salt)

    return Steps(run_rollout, jit_prepare, jit_update, jit_logprobs)

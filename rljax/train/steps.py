"""The jitted steps of an RL iteration: rollout, prepare (score + transforms) and update.

  rollout(state, prompt_tokens, prompt_mask, attempt) -> Rollout   (sampler, no gradients)
  prepare(state, batch) -> (state, batch, metrics)                 (old/ref log-probs, transforms)
  update(state, batch) -> (state, metrics)                         (epochs x minibatches x micro)
  logprobs(state, prompt_tokens, prompt_mask, completion_tokens, completion_mask) -> [B, T]
                                                                   (host-side rescoring: DARE, LoPE)

Where the old log-probs come from is `UpdateConfig.old_logprobs` (`rljax.train.old_policy`): a
forward pass in `prepare` ("recompute"), the sampler's log-probs ("sampler"), or, on-policy,
the update's own detached forward pass ("auto"; `prepare` then runs no policy pass).

Rewards are computed on the host between `rollout` and `prepare`. Each step takes its
randomness from `state.rng` folded with `state.step` and a per-step salt, so a resumed run
repeats a straight one exactly.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from absl import logging
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.algorithms import Algorithm
from rljax.core.aggregation import aggregation_denominator, masked_mean
from rljax.core.batch import Batch, context_mask
from rljax.core.keys import POLICY_TOPK_LOGPROBS, check_algorithm
from rljax.core.state import TrainState
from rljax.core.transform import Context, Metrics
from rljax.entropy.covariance import logprob_advantage_covariance
from rljax.models.lora import count, full_params, merged_params, reference_params, sampler_params
from rljax.models.moe import expert_load
from rljax.objectives.kl import kl_penalty
from rljax.parallel.rules import DEFAULT_RULES, MeshAxes
from rljax.quant.mismatch import mismatch_metrics
from rljax.quant.rollout import RolloutWeights, rollout_error_metrics, rollout_weights
from rljax.rollout.engine import EngineConfig, StopRule, engine_generate
from rljax.rollout.sampler import Rollout, generate
from rljax.rollout.sampling import SamplingParams
from rljax.train.compile_options import update_compiler_options
from rljax.train.critic import critic_values
from rljax.train.guard import (
    all_finite,
    first_nonfinite,
    input_names,
    named_tensors,
    update_tensors,
)
from rljax.train.logprobs import PolicyStates, policy_states, token_logprobs_of, token_stats
from rljax.train.old_policy import OLD_LOGPROBS_MODES, PREPARE, UPDATE, old_policy_plan
from rljax.train.packing import pack_plan
from rljax.train.statistics import TOKEN_STATISTICS, StatisticInputs, compute_statistics

_ROLLOUT, _PREPARE, _UPDATE = 0, 1, 2
# batch.extras key of an MoE rollout's expert choices [B, P + T, n_layers, k] (`Rollout.routes`).
ROUTES_KEY = "routes"
_AQN_SALT = 0x51

# Per-token statistics of the pre-update policy that prepare puts in `batch.extras` when the
# algorithm reads them: the open registry of `rljax.train.statistics` (name -> description).
BATCH_STATS = TOKEN_STATISTICS


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Sampler settings of a run (static: changing them recompiles).

    `weights` says how the sampler's weights are made from the trainer's
    (`rljax.quant.rollout_weights`): the trainer's own by default, or fake-quantized
    MXFP4/MXFP8/FP8 kernels (with MX corrections and QeRL's noise) while the trainer keeps
    full precision.
    """

    max_new_tokens: int
    n_samples: int
    eos_id: int
    pad_id: int
    sampling: SamplingParams = SamplingParams()
    weights: RolloutWeights = RolloutWeights()
    lora_unmerged: bool = False  # LoRA adapters applied as x W + scale (x A) B, not merged
    # The rollout engine's schedule (continuous batching, `rljax.rollout.engine`); None: the
    # static sampler (`rljax.rollout.generate`). The engine also takes more EOS ids and a
    # host-side stop rule (stop strings).
    engine: EngineConfig | None = None
    extra_eos_ids: tuple[int, ...] = ()
    stop: StopRule | None = None


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
    """How one rollout batch is turned into optimizer steps.

    Attributes:
      epochs: passes over the batch (PPO epochs); each pass reshuffles the rows.
      minibatches: optimizer steps per epoch.
      microbatches: gradient-accumulation chunks per minibatch (memory, not maths: the
        accumulated gradient equals the minibatch gradient, see `aggregation_denominator`).
      vocab_chunk: vocabulary columns per chunk when computing log-probs and entropy.
      pack_ratio: 0, or the trainer's forward passes pack each (micro)batch's sequences into
        ceil(pack_ratio x rows) rows when they fit (`rljax.train.packing`: the same results,
        less padding computed; the unpacked pass when they do not fit).
      old_logprobs: where the old policy's log-probs come from, one of `OLD_LOGPROBS_MODES`:
        "recompute" (a forward pass in prepare), "sampler" (`batch.rollout_logprobs`, any
        schedule) or "auto" (on-policy, 1 epoch x 1 minibatch: the update's own detached
        log-probs and no policy pass in prepare, unless a transform, statistic or value head
        reads the old policy before the update; off-policy: "recompute").
        `rljax.train.old_policy` says what reads the old policy and where the metrics move.
    """

    epochs: int = 1
    minibatches: int = 1
    microbatches: int = 1
    vocab_chunk: int = 8192
    pack_ratio: float = 0.0
    old_logprobs: str = "auto"

    def __post_init__(self):
        for name in ("epochs", "minibatches", "microbatches", "vocab_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"UpdateConfig.{name}={getattr(self, name)} must be >= 1")
        if not 0.0 <= self.pack_ratio <= 1.0:
            raise ValueError(
                f"UpdateConfig.pack_ratio={self.pack_ratio} must be in [0, 1] (0: off)"
            )
        if self.old_logprobs not in OLD_LOGPROBS_MODES:
            raise ValueError(
                f"UpdateConfig.old_logprobs={self.old_logprobs!r} is unknown; use one of "
                f"{OLD_LOGPROBS_MODES}"
            )


class Steps(NamedTuple):
    """The jitted step functions of a run."""

    rollout: Callable[..., Rollout]  # (state, prompt_tokens, prompt_mask, attempt=0)
    prepare: Callable[[TrainState, Batch], tuple[TrainState, Batch, Metrics]]
    update: Callable[[TrainState, Batch], tuple[TrainState, Metrics]]
    # (state, prompt_tokens, prompt_mask, completion_tokens, completion_mask) -> [B, T] the
    # policy's log-probs of the completion tokens, 0 where masked.
    logprobs: Callable[..., jax.Array]


def _step_key(state: TrainState, salt: int) -> jax.Array:
    return jax.random.fold_in(jax.random.fold_in(state.rng, state.step), salt)


def trained_temperature(sampling: SamplingParams) -> float:
    """The temperature of the policy the trainer trains: the sampler's (1 when it decodes
    greedily). Samples drawn at temperature T are scored, clipped and updated as samples of
    softmax(logits / T), as verl and TRL do: training the temperature-1 policy on them is a
    biased gradient, which at T < 1 pushes probability onto tokens the sampler rarely draws
    until the entropy blows up."""
    return 1.0 if sampling.greedy else float(sampling.temperature)


def tempered(policy: PolicyStates, temperature: float) -> PolicyStates:
    """`policy` whose logits are divided by `temperature` (its output matrix is)."""
    if temperature == 1.0:
        return policy
    return policy._replace(head=policy.head / jnp.asarray(temperature, policy.head.dtype))


def make_steps(
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    algorithm: Algorithm,
    rollout_config: RolloutConfig,
    update_config: UpdateConfig = UpdateConfig(),
    mesh: Mesh | None = None,
    state_shardings: TrainState | None = None,
    rules: Mapping[str, MeshAxes] = DEFAULT_RULES,
    critic_graphdef: nnx.GraphDef | None = None,
) -> Steps:
    """Builds the jitted rollout / prepare / update functions.

    Args:
      graphdef: the policy's graph definition (static).
      optimizer: the optax optimizer whose state lives in `TrainState.opt_state`.
      algorithm: transform chain + objective (`rljax.algorithms`).
      rollout_config: sampler settings.
      update_config: epochs, minibatches, microbatches.
      mesh: when given, batches are split over the mesh's "batch" axes and the state keeps
        `state_shardings` (`rljax.parallel.mesh_shardings(state, mesh)`).
      state_shardings: shardings of the TrainState, required with `mesh`.
      rules: logical-axis rules; batch rows are split over the mesh axes of "batch".
      critic_graphdef: graph of the critic's own trunk when `algorithm.value_loss` is set and
        the critic is a separate network; None for a value head on the policy.

    Raises:
      ValueError: for an algorithm whose declared keys do not fit together
        (`rljax.core.keys.check_algorithm`), or a statistic it reads that is not registered
        (`rljax.train.statistics.register_token_statistic`).
    """
    check_algorithm(algorithm)
    cfg = update_config
    plan = old_policy_plan(
        cfg.old_logprobs, algorithm, cfg.epochs, cfg.minibatches, critic_graphdef is not None
    )
    logging.info(
        "old log-probs (train.old_logprobs=%r): from %s, %s prepare pass (%s)",
        cfg.old_logprobs,
        plan.source,
        "a" if plan.prepare_pass else "no",
        plan.reason,
    )
    chunk = cfg.vocab_chunk
    wanted = algorithm.batch_stats
    needs_reference = algorithm.needs_reference
    # GKD: the update's pass also scores the teacher's top-k tokens, with gradients.
    reads_top_k = POLICY_TOPK_LOGPROBS in algorithm.reads
    temperature = trained_temperature(rollout_config.sampling)
    unknown = sorted(set(wanted) - set(TOKEN_STATISTICS))
    if unknown:
        raise ValueError(
            f"algorithm reads unknown batch statistics {unknown}; known: "
            f"{sorted(TOKEN_STATISTICS)} (register_token_statistic adds one)"
        )

    def pack_rows(rows: int) -> int:
        return math.ceil(cfg.pack_ratio * rows) if cfg.pack_ratio else 0

    def states(params, batch: Batch) -> PolicyStates:
        # MoE: the sampler's expert choices are replayed (routing replay), so the trainer
        # scores each token through the experts that produced it. The pass attends to the
        # environment tokens of multi-turn episodes too (`context_mask`); the statistics and
        # losses read the policy tokens only (`batch.completion_mask`).
        policy = policy_states(
            graphdef,
            params,
            batch.prompt_tokens,
            batch.prompt_mask,
            batch.completion_tokens,
            context_mask(batch),
            routes=batch.extras.get(ROUTES_KEY),
            pack_rows=pack_rows(batch.group_id.shape[0]),
        )
        return tempered(policy, temperature)

    def stats(policy: PolicyStates, batch: Batch):
        out = token_stats(policy.completion_hidden, policy.head, batch.completion_tokens, chunk)
        return jax.tree.map(lambda x: jnp.where(batch.completion_mask, x, 0.0), out)

    def values(critic, policy: PolicyStates | None, batch: Batch) -> jax.Array:
        return critic_values(
            critic,
            critic_graphdef,
            policy,
            batch.prompt_tokens,
            batch.prompt_mask,
            batch.completion_tokens,
            batch.completion_mask,
            context_mask=context_mask(batch),
        )

    rc = rollout_config

    def sampler_inputs(state: TrainState, attempt=0):
        """The sampler's weights and the rollout key of this step (and refill attempt)."""
        key = _step_key(state, _ROLLOUT)
        # Attempt 0 keeps the step's key; refill attempts (DAPO) draw fresh samples.
        key = jnp.where(attempt == 0, key, jax.random.fold_in(key, attempt))
        noise_key = jax.random.fold_in(key, _AQN_SALT)  # AQN only; leaves the sampling key be
        params = rollout_weights(
            sampler_params(state, rc.lora_unmerged), rc.weights, state.step, noise_key
        )
        return params, key

    sample_args = dict(
        max_new_tokens=rc.max_new_tokens,
        eos_id=rc.eos_id,
        pad_id=rc.pad_id,
        n_samples=rc.n_samples,
        sampling=rc.sampling,
    )

    def rollout(state: TrainState, prompt_tokens, prompt_mask, attempt=0) -> Rollout:
        params, key = sampler_inputs(state, attempt)
        return generate(graphdef, params, prompt_tokens, prompt_mask, key, **sample_args)

    def engine_rollout(jitted_inputs, rows) -> Callable[..., Rollout]:
        """The rollout step run by the engine: jitted weights and key, host-scheduled
        decoding, the result placed as `rows` (None: where the engine left it)."""

        def run(
            state: TrainState, prompt_tokens, prompt_mask, attempt=0, turns=None, in_flight=None
        ) -> Rollout:
            params, key = jitted_inputs(state, attempt)
            swap = dict(version=0, swap=None)
            if in_flight is not None:  # newer states' sampling weights, between decode calls

                def newer():
                    found = in_flight.newer()
                    return None if found is None else (found[0], jitted_inputs(found[1], 0)[0])

                swap = dict(version=in_flight.version, swap=newer)
            out = engine_generate(
                graphdef,
                params,
                prompt_tokens,
                prompt_mask,
                key,
                engine=rc.engine,
                extra_eos_ids=rc.extra_eos_ids,
                stop=rc.stop,
                turns=turns,
                **swap,
                **sample_args,
            )
            return out if rows is None else jax.device_put(out, rows)

        return run

    def policy_metrics(batch: Batch, logprobs, entropy, ref_logprobs) -> Metrics:
        """What the prepare step reports of the pre-update policy ([B, T] `logprobs`,
        `entropy`; `batch` after the transforms)."""
        mask = batch.completion_mask
        return {
            "entropy": masked_mean(entropy, mask),
            "kl_to_ref": masked_mean(kl_penalty(logprobs, ref_logprobs, "k3"), mask),
            # Sampler vs trainer policy: log-prob gaps, KL estimates, ESS (0, 0 and 1 up to
            # numerics: the trainer scores at the sampling temperature; not so under quantized
            # rollouts, top-k or top-p).
            **mismatch_metrics(batch.replace(old_logprobs=logprobs)),
            # Cui et al.'s first-order law: a natural-PG step of size eta changes the entropy
            # by about -eta * this, so a positive value predicts falling entropy.
            "entropy/cov_logp_adv": logprob_advantage_covariance(logprobs, batch.advantages, mask),
        }

    def prepare(state: TrainState, batch: Batch):
        old, old_stats, extras = None, None, dict(batch.extras)
        params = merged_params(state)  # under LoRA: the base with the adapters merged in
        reference = reference_params(state, needs_reference)
        if plan.prepare_pass:
            old = states(params, batch)
            old_stats = stats(old, batch)
            extras["old_entropy"] = old_stats.entropy
        if plan.source == PREPARE:
            old_logprobs = old_stats.logprobs
        else:
            # "sampler": the old policy. On-policy "auto": a stand-in that the update replaces
            # by its own detached log-probs.
            old_logprobs = batch.rollout_logprobs
        ref_logprobs, ref = old_logprobs, None
        if needs_reference and reference is None:
            raise ValueError(
                "the algorithm reads ref_logprobs (or a statistic of the reference) but the "
                "train state has no reference policy; build it with "
                "init_train_state(..., keep_reference=True) (builders.build_train_state does)"
            )
        if reference is not None:
            ref = states(reference, batch)
            ref_logprobs = stats(ref, batch).logprobs
        if plan.prepare_pass:
            inputs = StatisticInputs(batch, old, old_stats, ref, chunk)
            extras.update(compute_statistics(wanted, inputs))
        if algorithm.value_loss is not None:
            if state.critic is None:
                raise ValueError(
                    "the algorithm has a value loss but the train state has no critic; build "
                    "it with init_train_state(..., critic=rljax.train.critic.init_critic(...))"
                )
            extras["old_values"] = values(state.critic, old, batch)
        batch = batch.replace(old_logprobs=old_logprobs, ref_logprobs=ref_logprobs, extras=extras)
        ctx = Context(step=state.step, rng=_step_key(state, _PREPARE), extras={})
        batch, transform_state, metrics = algorithm.transform.apply(
            batch, state.transform_state, ctx
        )
        if plan.prepare_pass:  # else the update measures them (its first epoch)
            # The trainer's own log-probs, also under "sampler" (the sampler's are the old).
            measured = old_stats.logprobs if plan.source != PREPARE else old_logprobs
            ref_measured = ref_logprobs if ref is not None else measured
            pre = policy_metrics(batch, measured, old_stats.entropy, ref_measured)
        else:
            pre = {}
        cov = pre.pop("entropy/cov_logp_adv", None)  # keeps the metrics' order of old
        metrics = {
            **metrics,
            **pre,
            # The sampler's quantization error per kind of kernel (quantized rollouts only).
            **rollout_error_metrics(params, rollout_config.weights),
        }
        if cov is not None:
            metrics["entropy/cov_logp_adv"] = cov
        if cfg.pack_ratio and ROUTES_KEY not in batch.extras:
            valid = jnp.concatenate([batch.prompt_mask, context_mask(batch)], axis=1)
            metrics["pack/fits"] = pack_plan(valid, pack_rows(valid.shape[0])).fits.astype(
                jnp.float32
            )
        if ROUTES_KEY in batch.extras:
            valid = jnp.concatenate([batch.prompt_mask, context_mask(batch)], axis=1)
            experts = nnx.merge(graphdef, params).config.num_experts
            load = expert_load(batch.extras[ROUTES_KEY], valid, experts)
            metrics.update({k: v for k, v in load.items() if k != "moe/load"})
        if rollout_config.weights.aqn_sigma_start > 0:
            metrics["quant/aqn_sigma"] = rollout_config.weights.sigma(state.step)
        return state.replace(transform_state=transform_state), batch, metrics

    def loss_fn(trainable, batch: Batch, has_reference: bool = True, base=None):
        params, critic = trainable
        new = states(full_params(base, params), batch)  # LoRA: gradients reach the adapters only
        new_stats = stats(new, batch)
        if plan.source == UPDATE:
            # On-policy "auto": this forward pass IS the old policy's, so its detached
            # log-probs are the old ones (ratio exactly 1); without a reference the reference
            # log-probs are the old ones, as in prepare.
            old_logprobs = jax.lax.stop_gradient(new_stats.logprobs)
            batch = batch.replace(
                old_logprobs=old_logprobs,
                ref_logprobs=batch.ref_logprobs if has_reference else old_logprobs,
                extras={**batch.extras, "old_entropy": jax.lax.stop_gradient(new_stats.entropy)},
            )
        if reads_top_k:
            ids = batch.extras["teacher_topk_ids"]
            top_k = token_logprobs_of(new.completion_hidden, new.head, ids, chunk)
            top_k = jnp.where(batch.completion_mask[..., None], top_k, 0.0)
            batch = batch.replace(extras={**batch.extras, "policy_topk_logprobs": top_k})
        loss, metrics = algorithm.objective(new_stats.logprobs, new_stats.entropy, batch)
        if algorithm.value_loss is not None:
            value_loss, value_metrics = algorithm.value_loss(values(critic, new, batch), batch)
            loss = loss + value_loss
            metrics = {**metrics, **value_metrics}
        return loss, (metrics, {"logprobs": new_stats.logprobs, "entropy": new_stats.entropy})

    def update(state: TrainState, batch: Batch):
        # Only the policy's tokens are learned from: a loss weight off `completion_mask` (an
        # environment token of a multi-turn episode, padding) would enter the aggregated loss
        # and its microbatch weight, so it is dropped here.
        loss_weights = jnp.where(batch.completion_mask, batch.loss_weights, 0.0)
        batch = batch.replace(loss_weights=loss_weights.astype(batch.loss_weights.dtype))
        rows = batch.group_id.shape[0]
        per_step = cfg.minibatches * cfg.microbatches
        if rows % per_step:
            raise ValueError(
                f"batch of {rows} rows is not divisible by minibatches x microbatches = "
                f"{cfg.minibatches} x {cfg.microbatches}; change train.minibatches or "
                "train.microbatches"
            )
        keys = jax.random.split(_step_key(state, _UPDATE), cfg.epochs)
        order = jnp.stack([jax.random.permutation(k, rows) for k in keys])
        order = order.reshape(cfg.epochs * cfg.minibatches, cfg.microbatches, rows // per_step)

        has_reference = reference_params(state, needs_reference) is not None
        n_inputs = len(input_names(batch, state.params, state.critic))  # update.* come after

        def microbatch(carry, ids):
            trainable, grads, loss, weight, first_bad = carry
            sub = jax.tree.map(lambda x: x[ids], batch)
            (sub_loss, (metrics, policy)), sub_grads = jax.value_and_grad(loss_fn, has_aux=True)(
                trainable, sub, has_reference, state.base
            )
            w = aggregation_denominator(sub.loss_weights, algorithm.aggregation)
            grads = jax.tree.map(lambda g, s: g + w * s, grads, sub_grads)
            # Only a non-finite microbatch looks for its culprit, over the whole batch's fields:
            # a NaN reward is named even where only the advantages it spoiled reached it.
            bad = jax.lax.cond(
                all_finite((sub_loss, sub_grads)),
                lambda: jnp.int32(-1),
                lambda: first_nonfinite(
                    named_tensors(batch, trainable, policy, sub_loss, sub_grads)
                ),
            )
            first_bad = jnp.where(first_bad >= 0, first_bad, bad)
            carry = (trainable, grads, loss + w * sub_loss, weight + w, first_bad)
            if plan.prepare_pass:
                return carry, metrics
            return carry, (metrics, jax.lax.stop_gradient(policy))

        def minibatch(carry, ids):
            (params, critic), (opt_state, critic_opt_state) = carry
            zeros = jax.tree.map(jnp.zeros_like, (params, critic))
            start = ((params, critic), zeros, 0.0, 0.0, jnp.int32(-1))
            (_, grads, loss, weight, first_bad), metrics = jax.lax.scan(microbatch, start, ids)
            if not plan.prepare_pass:
                metrics, policy = metrics
            scale = jnp.where(weight > 0, 1.0 / jnp.maximum(weight, 1e-30), 0.0)
            grads = jax.tree.map(lambda g: g * scale, grads)
            # The guard (rljax.train.guard): a non-finite loss or gradient, or a non-finite
            # step made of finite ones, leaves params and optimizer state as they were.
            inputs_ok = all_finite((loss, grads))
            before = ((params, critic), (opt_state, critic_opt_state))
            grads, critic_grads = grads
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            metrics = jax.tree.map(jnp.mean, metrics)
            metrics.update(loss=loss * scale, grad_norm=optax.tree.norm(grads))
            if critic is not None:
                updates, critic_opt_state = optimizer.update(critic_grads, critic_opt_state, critic)
                critic = optax.apply_updates(critic, updates)
                metrics["value/grad_norm"] = optax.tree.norm(critic_grads)
            after = ((params, critic), (opt_state, critic_opt_state))
            update_ok = all_finite(after)
            rejected = inputs_ok & ~update_ok  # named after the inputs (`update_tensors`)
            first_bad = jax.lax.cond(
                rejected,
                lambda: first_nonfinite(update_tensors(*after)) + n_inputs,
                lambda: first_bad,
            )
            commit = inputs_ok & update_ok
            carry = jax.tree.map(lambda a, b: jnp.where(commit, a, b), after, before)
            if plan.prepare_pass:
                return carry, (metrics, ~commit, rejected, first_bad)
            return carry, (metrics, ~commit, rejected, first_bad, policy)

        trainable = (state.params, state.critic)
        opt_states = (state.opt_state, state.critic_opt_state)
        ((params, critic), (opt_state, critic_opt_state)), outs = jax.lax.scan(
            minibatch, (trainable, opt_states), order
        )
        metrics, skipped, rejected, first_bad = outs[:4]
        metrics = jax.tree.map(jnp.mean, metrics)
        if not plan.prepare_pass:
            # The pre-update metrics that prepare did not measure, from the first epoch's
            # forward passes (each row once): on-policy, the old policy itself.
            def first_epoch(x):  # [E * MB, M, rows / (MB * M), ...] -> [rows, ...]
                x = x[: cfg.minibatches].reshape((rows, *x.shape[3:]))
                return jnp.zeros_like(x).at[order[: cfg.minibatches].reshape(rows)].set(x)

            policy = jax.tree.map(first_epoch, outs[4])
            ref = batch.ref_logprobs if has_reference else policy["logprobs"]
            metrics.update(policy_metrics(batch, policy["logprobs"], policy["entropy"], ref))
        # The share of optimizer steps skipped, and the first skipped one's culprit.
        metrics["guard/skipped"] = skipped.mean(dtype=jnp.float32)
        # ... of which rolled back for a non-finite result of finite gradients
        metrics["guard/update_nonfinite"] = rejected.mean(dtype=jnp.float32)
        metrics["guard/first_nonfinite"] = jnp.where(
            skipped.any(), first_bad[jnp.argmax(skipped)], -1
        )
        if state.base is not None:  # LoRA: what is trained, of how much (trace-time counts)
            metrics["lora/trainable_params"] = jnp.float32(count(state.params))
            metrics["lora/base_params"] = jnp.float32(count(state.base.params))
        state = state.replace(
            step=state.step + 1,
            params=params,
            opt_state=opt_state,
            critic=critic,
            critic_opt_state=critic_opt_state,
        )
        return state, metrics

    def logprobs(state: TrainState, prompt_tokens, prompt_mask, completion_tokens, completion_mask):
        policy = policy_states(
            graphdef,
            merged_params(state),
            prompt_tokens,
            prompt_mask,
            completion_tokens,
            completion_mask,
        )
        policy = tempered(policy, temperature)
        out = token_stats(policy.completion_hidden, policy.head, completion_tokens, chunk)
        return jnp.where(completion_mask, out.logprobs, 0.0)

    def default_attempt(jitted):
        return lambda state, tokens, mask, attempt=0: jitted(state, tokens, mask, attempt)

    if rollout_config.engine is None and (rollout_config.extra_eos_ids or rollout_config.stop):
        raise ValueError(
            "more EOS ids and stop strings need the rollout engine (rollout.engine='continuous')"
        )
    platform = jax.default_backend() if mesh is None else mesh.devices.flat[0].platform
    update_options = update_compiler_options(platform)
    if mesh is None:
        rollout_step = default_attempt(jax.jit(rollout))
        if rollout_config.engine is not None:
            rollout_step = engine_rollout(jax.jit(sampler_inputs), None)
        return Steps(
            rollout_step,
            jax.jit(prepare),
            jax.jit(update, donate_argnums=0, compiler_options=update_options),
            jax.jit(logprobs),
        )
    if state_shardings is None:
        raise ValueError("make_steps(mesh=...) also needs state_shardings")
    rows = NamedSharding(mesh, PartitionSpec(rules["batch"]))
    none = NamedSharding(mesh, PartitionSpec())
    rollout_step = default_attempt(
        jax.jit(rollout, in_shardings=(state_shardings, rows, rows, none), out_shardings=rows)
    )
    if rollout_config.engine is not None:
        inputs = jax.jit(sampler_inputs, in_shardings=(state_shardings, none))
        rollout_step = engine_rollout(inputs, rows)
    return Steps(
        rollout_step,
        jax.jit(
            prepare,
            in_shardings=(state_shardings, rows),
            out_shardings=(state_shardings, rows, none),
        ),
        jax.jit(
            update,
            in_shardings=(state_shardings, rows),
            out_shardings=(state_shardings, none),
            donate_argnums=0,
            compiler_options=update_options,
        ),
        jax.jit(
            logprobs, in_shardings=(state_shardings, rows, rows, rows, rows), out_shardings=rows
        ),
    )

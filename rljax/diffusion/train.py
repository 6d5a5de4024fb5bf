"""A compact driver for RL on a tiny masked-diffusion LM: SFT warm start, then diffu-GRPO or RLDF.

The run trains the bidirectional transformer of `rljax.diffusion.policy` from scratch on a
task (addition by default) in two stages:

1. SFT (LLaDA's supervised recipe, arXiv 2502.09992): each completion token is masked with
   probability t ~ U(eps, 1) and the loss is the 1/t-weighted cross-entropy on the masked
   tokens (`elbo_random_t` with its sign flipped), the prompt always clean.
2. RL: G completions per prompt from the block-wise sampler (`diffusion_generate`), decoded and
   scored on the host, group-normalised advantages (GRPO), then `inner_steps` updates of
   - "diffu_grpo" (d1, arXiv 2504.12216): `diffu_grpo_loss` on `one_pass_estimate` (completion
     fully masked, prompt tokens masked with probability `p_mask_prompt`); each inner step
     draws one mask key, shared by theta, theta_old (the pre-update policy) and ref;
   - "rldf" (arXiv 2605.25638): `rldf_loss` on `rldf_logprobs` of k noisy states x_s replayed
     from the rollout's `step_map`, the steps drawn once per rollout by `rldf_timesteps`.
   ref is the SFT policy (the RL stage's initial params), used for the k3 KL when beta > 0.
   With `block_sizes` (Block-R1), each prompt's rollouts use the candidate block size that
   earned the highest mean reward in a measurement rollout of the same step.

Completion layout (choice, documented here because SFT and RL share it): a completion is
`gen_length` tokens. SFT teaches target + EOS followed by EOS up to gen_length, every position
in the loss, as LLaDA's SFT pads answers with EOS and trains on that padding; so the model
learns where the answer stops. A rollout always fills gen_length tokens; its text is the
tokens before the first EOS, decoded with special tokens kept visible (a stray PAD or BOS
makes the answer wrong instead of being dropped), and the RL estimators see the tokens through
the first EOS (`completion_mask`), later positions fed as MASK (one-pass) or replayed as
sampled (RLDF states).

Jitted: the SFT step, the rollout, the estimates of theta_old/ref and each update. On the host:
data, decoding and rewards.

  python -m rljax.diffusion.train --config=configs/diffusion_lm.py
  python -m rljax.diffusion.train --config=configs/diffusion_lm.py --config.algorithm=rldf
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rljax.advantages.group import grpo_advantages
from rljax.data import AdditionTask, decode_answers, prompt_batches, prompt_dataset, sft_dataset
from rljax.diffusion.block_size import best_block_sizes, measure_rewards_by_size
from rljax.diffusion.likelihood import (
    elbo_random_t,
    one_pass_estimate,
    rldf_logprobs,
    rldf_states,
    rldf_timesteps,
)
from rljax.diffusion.objectives import diffu_grpo_loss, rldf_loss
from rljax.diffusion.policy import create_diffusion_model, diffusion_config, masked_logits
from rljax.diffusion.sampler import diffusion_generate, diffusion_generate_per_row
from rljax.models.tokenizer import ByteTokenizer, Tokenizer

ALGORITHMS = ("diffu_grpo", "rldf")
Batch = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class DiffusionRLConfig:
    """Every knob of a diffusion-LM RL run; the defaults are the addition recipe.

    Attributes:
      seed: seeds the model, the data order, the masks and the rollouts.
      min_digits, max_digits: operand digits of `AdditionTask`.
      max_prompt_len: P, BOS + "a+b=" left-padded.
      eval_size: greedy accuracy on the first eval_size test problems (the test split has
        1000; the standard error at accuracy p is sqrt(p (1 - p) / eval_size)).
      d_model, n_layers, n_heads, n_kv_heads, d_ff: the bidirectional transformer.
      gen_length, block_size, steps_per_block, remasking: the sampler (`diffusion_generate`).
      temperature: rollout temperature (evaluation is greedy).
      sft_steps, sft_batch_size, sft_learning_rate: the SFT warm start (`sft_optimizer`).
      sft_warmup_steps: linear warm-up of the SFT learning rate, then cosine decay to 0.
      sft_weight_decay: AdamW's decoupled weight decay in SFT. With 0.1 the model generalises
        to held-out sums after ~1000 steps; with 0 it mostly memorised the train sums (one
        1000-step run: 0.19 train vs 0.03 held-out accuracy).
      sft_eps: lower bound of the SFT masking ratio t. 0.2 (LLaDA: 1e-3) caps the 1/t weight
        at 5: at 1e-3 a few rows with t ~ 0.01 dominate each batch's gradient and Adam's
        second moment, and the model learned only the answer-length distribution (measured).
      algorithm: "diffu_grpo" or "rldf".
      steps: RL steps (one rollout each).
      prompts_per_step: prompts per rollout; each is sampled group_size times.
      group_size: G, completions per prompt (>= 2).
      learning_rate, max_grad_norm: the RL optimizer (clip by global norm, then Adam).
      inner_steps: optimizer steps per rollout (d1's mu), each with a fresh estimator key.
      clip_eps: PPO clip range of both objectives.
      beta: k3 KL coefficient to the SFT policy (0: no reference pass).
      p_mask_prompt: diffu-GRPO's prompt masking probability.
      rldf_k: RLDF states (timesteps) per sample.
      rldf_temperature: softmax temperature of RLDF's surprisal-weighted timestep draw.
      rldf_threshold: RLDF's clipped clean state keeps masked tokens with rollout probability
        >= threshold (plus the step's own tokens); 0 keeps every masked token.
      eval_every: RL steps between evaluations (the last step is always evaluated).
      block_sizes: Block-R1's candidate training block sizes; () trains every rollout at
        `block_size`. Otherwise each RL step first measures, per prompt, the mean reward of
        group_size completions at every candidate (`measure_rewards_by_size`, current policy),
        then samples that prompt's training group at its best size (`best_block_sizes`), every
        size with the same num_denoising_steps forward passes (`diffusion_generate_per_row`).
        Evaluation stays at `block_size`.
    """

    seed: int = 0
    min_digits: int = 1
    max_digits: int = 2
    max_prompt_len: int = 8
    eval_size: int = 1000
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    d_ff: int = 384
    gen_length: int = 4
    block_size: int = 4
    steps_per_block: int = 4
    remasking: str = "low_confidence"
    temperature: float = 1.0
    sft_steps: int = 1700
    sft_batch_size: int = 64
    sft_learning_rate: float = 3e-3
    sft_warmup_steps: int = 100
    sft_weight_decay: float = 0.1
    sft_eps: float = 0.2
    algorithm: str = "diffu_grpo"
    steps: int = 60
    prompts_per_step: int = 16
    group_size: int = 8
    learning_rate: float = 1e-4
    max_grad_norm: float = 1.0
    inner_steps: int = 2
    clip_eps: float = 0.2
    beta: float = 0.04
    p_mask_prompt: float = 0.15
    rldf_k: int = 2
    rldf_temperature: float = 1.0
    rldf_threshold: float = 0.0
    eval_every: int = 10
    block_sizes: tuple[int, ...] = ()

    def __post_init__(self):
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm={self.algorithm!r} is unknown; choose one of {ALGORITHMS}")
        if self.group_size < 2:
            raise ValueError(f"group_size={self.group_size} must be >= 2 for GRPO advantages")
        if self.inner_steps < 1 or self.steps < 0 or self.sft_steps < 0:
            raise ValueError(
                f"inner_steps={self.inner_steps} must be >= 1 and steps={self.steps}, "
                f"sft_steps={self.sft_steps} >= 0"
            )
        for size in self.block_sizes:
            if (
                size < 1
                or self.gen_length % size
                or self.num_denoising_steps % (self.gen_length // size)
            ):
                raise ValueError(
                    f"block_sizes entry {size} must divide gen_length={self.gen_length} into a "
                    f"number of blocks that divides num_denoising_steps="
                    f"{self.num_denoising_steps}; drop it or raise steps_per_block"
                )

    @property
    def num_denoising_steps(self) -> int:
        """S, the sampler's forward passes per rollout (RLDF's timestep range)."""
        return self.gen_length // self.block_size * self.steps_per_block


def _logits_fn(
    graphdef: nnx.GraphDef, params: nnx.State, prompt_mask: jax.Array, gen_length: int, mask_id: int
) -> Callable[[jax.Array], jax.Array]:
    """The estimators' `logits_fn(tokens [B, P + T]) -> [B, P + T, V]` for one prompt batch."""
    valid = jnp.concatenate(
        [prompt_mask.astype(bool), jnp.ones((prompt_mask.shape[0], gen_length), bool)], axis=1
    )
    return lambda tokens: masked_logits(graphdef, params, tokens, valid, mask_id=mask_id)


def sft_loss(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    batch: Batch,
    rng: jax.Array,
    mask_id: int,
    eps: float,
) -> jax.Array:
    """LLaDA's SFT loss: -(1/T) sum_i 1[i masked] log p(x_i | x_t, prompt) / t, batch mean.

    Args:
      graphdef, params: the diffusion LM.
      batch: prompt_tokens [B, P], prompt_mask [B, P], completion_tokens [B, T] (target, EOS,
        EOS padding; every position is a target).
      rng: key of t ~ U(eps, 1) per row and of the masks.
      mask_id: the MASK id.
      eps: lower bound of t.

    Returns:
      Scalar loss (token mean over the T completion positions of each row, then batch mean).
    """
    completion = batch["completion_tokens"]
    logits_fn = _logits_fn(graphdef, params, batch["prompt_mask"], completion.shape[1], mask_id)
    every = jnp.ones(completion.shape, bool)
    contrib = elbo_random_t(
        logits_fn, batch["prompt_tokens"], completion, every, rng, mask_id, 1, eps
    )
    return -contrib.mean()


def make_sft_step(
    graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation, mask_id: int, eps: float
) -> Callable[..., tuple[nnx.State, optax.OptState, jax.Array]]:
    """A jitted `(params, opt_state, batch, rng) -> (params, opt_state, loss)` SFT update."""

    @jax.jit
    def step(params, opt_state, batch, rng):
        loss, grads = jax.value_and_grad(sft_loss, argnums=1)(
            graphdef, params, batch, rng, mask_id, eps
        )
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def sft_completions(tokens: np.ndarray, mask: np.ndarray, eos_id: int) -> np.ndarray:
    """`sft_dataset` completions (target + EOS, PAD after) with the padding replaced by EOS."""
    return np.where(mask, tokens, eos_id).astype(np.int32)


def estimates(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    batch: Batch,
    rng: jax.Array,
    config: DiffusionRLConfig,
    mask_id: int,
) -> jax.Array:
    """Per-token log-prob estimates of the batch's completions under `params`.

    Args:
      graphdef, params: the policy (theta, theta_old or ref).
      batch: an RL batch (`rl_batch`).
      rng: the estimator key, the same for theta, theta_old and ref of one update (diffu-GRPO's
        prompt mask; RLDF's states are fixed in the batch and ignore it).
      config: the run's config (algorithm, p_mask_prompt).
      mask_id: the MASK id.

    Returns:
      diffu_grpo: [B, T] `one_pass_estimate`; rldf: [B, k, T] `rldf_logprobs`.
    """
    completion = batch["completion_tokens"]
    logits_fn = _logits_fn(graphdef, params, batch["prompt_mask"], completion.shape[1], mask_id)
    if config.algorithm == "diffu_grpo":
        return one_pass_estimate(
            logits_fn,
            batch["prompt_tokens"],
            completion,
            batch["completion_mask"],
            rng,
            mask_id,
            config.p_mask_prompt,
        )
    return rldf_logprobs(
        logits_fn,
        batch["prompt_tokens"],
        completion,
        batch["rldf_masked"],
        batch["rldf_scored"],
        mask_id,
    )


def rl_loss(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    batch: Batch,
    rng: jax.Array,
    old: jax.Array,
    ref: jax.Array | None,
    config: DiffusionRLConfig,
    mask_id: int,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The configured objective on theta's estimates (`estimates`) with the same `rng`.

    Args:
      graphdef, params: theta (differentiated).
      batch: an RL batch (`rl_batch`) with "advantages" [B].
      rng: the estimator key used for `old` and `ref`.
      old: theta_old's estimates, same shape as theta's.
      ref: ref's estimates, or None without KL.
      config: the run's config.
      mask_id: the MASK id.

    Returns:
      (loss, metrics) of `diffu_grpo_loss` (token advantages = the sequence advantage on every
      token through the first EOS) or `rldf_loss`.
    """
    logp = estimates(graphdef, params, batch, rng, config, mask_id)
    if config.algorithm == "diffu_grpo":
        return diffu_grpo_loss(
            logp,
            old,
            batch["advantages"],
            batch["completion_mask"],
            ref,
            config.clip_eps,
            config.beta,
        )
    return rldf_loss(
        logp, old, ref, batch["advantages"], batch["rldf_scored"], config.clip_eps, config.beta
    )


def decode_texts(tokenizer: Tokenizer, tokens: np.ndarray) -> list[str]:
    """Answer texts of completions [N, T]: the tokens before the first EOS, specials visible."""
    texts = []
    for row in np.asarray(tokens).tolist():
        if tokenizer.eos_id in row:
            row = row[: row.index(tokenizer.eos_id)]
        texts.append(tokenizer.decode(row, skip_special=False))
    return texts


def score(
    task: Any, texts: list[str], answers: list[str], group_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Rewards [N] of the texts against their answers, and their GRPO advantages [N].

    The N = prompts * group_size texts are laid out as contiguous groups of one prompt.
    """
    rewards = np.asarray([task.reward(t, a) for t, a in zip(texts, answers)], np.float32)
    advantages = np.asarray(grpo_advantages(jnp.asarray(rewards), group_size))
    return rewards, advantages


@functools.partial(jax.jit, static_argnames=("config",))
def _rldf_fields(rollout_fields: Batch, rng: jax.Array, config: DiffusionRLConfig) -> Batch:
    steps = rldf_timesteps(
        rng,
        rollout_fields["step_map"],
        rollout_fields["token_probs"],
        rollout_fields["completion_mask"],
        config.num_denoising_steps,
        config.rldf_k,
        config.rldf_temperature,
    )
    threshold = config.rldf_threshold if config.rldf_threshold > 0 else None
    masked, scored = rldf_states(
        rollout_fields["step_map"],
        steps,
        rollout_fields["completion_mask"],
        rollout_fields["token_probs"],
        threshold,
    )
    return {"rldf_masked": masked, "rldf_scored": scored}


def rl_batch(
    rollout: Any, advantages: np.ndarray, rng: jax.Array, config: DiffusionRLConfig
) -> Batch:
    """The arrays an update needs from a `DiffusionRollout` and its advantages.

    For RLDF the k states per sample are drawn here, once per rollout, with `rng`.
    """
    batch = {
        "prompt_tokens": rollout.prompt_tokens,
        "prompt_mask": rollout.prompt_mask,
        "completion_tokens": rollout.completion_tokens,
        "completion_mask": rollout.completion_mask,
        "advantages": jnp.asarray(advantages, jnp.float32),
    }
    if config.algorithm == "rldf":
        fields = {k: getattr(rollout, k) for k in ("step_map", "token_probs", "completion_mask")}
        batch.update(_rldf_fields(fields, rng, config))
    return batch


class RLFunctions:
    """The jitted pieces of an RL step for one (graphdef, optimizer, config).

    Attributes:
      estimate: (params, batch, rng) -> estimates (theta_old's and ref's, no gradient).
      update: (params, opt_state, batch, rng, old, ref) -> (params, opt_state, loss, metrics).
    """

    def __init__(
        self,
        graphdef: nnx.GraphDef,
        optimizer: optax.GradientTransformation,
        config: DiffusionRLConfig,
        mask_id: int,
    ):
        self.estimate = jax.jit(
            lambda params, batch, rng: estimates(graphdef, params, batch, rng, config, mask_id)
        )

        @jax.jit
        def update(params, opt_state, batch, rng, old, ref):
            grad_fn = jax.value_and_grad(rl_loss, argnums=1, has_aux=True)
            (loss, metrics), grads = grad_fn(
                graphdef, params, batch, rng, old, ref, config, mask_id
            )
            updates, opt_state = optimizer.update(grads, opt_state, params)
            metrics["grad_norm"] = optax.tree.norm(grads)
            return optax.apply_updates(params, updates), opt_state, loss, metrics

        self.update = update


@dataclasses.dataclass
class Setup:
    """What both stages share: the task, tokenizer, model and the held-out prompts."""

    config: DiffusionRLConfig
    task: AdditionTask
    tokenizer: ByteTokenizer
    graphdef: nnx.GraphDef
    mask_id: int
    eval_batch: Batch


def setup(config: DiffusionRLConfig) -> tuple[Setup, nnx.State]:
    """The task, tokenizer, eval prompts and a freshly initialised model (params returned)."""
    task = AdditionTask(min_digits=config.min_digits, max_digits=config.max_digits)
    tokenizer = ByteTokenizer()
    dconfig = diffusion_config(
        tokenizer.vocab_size,
        d_model=config.d_model,
        n_layers=config.n_layers,
        n_heads=config.n_heads,
        n_kv_heads=config.n_kv_heads,
        d_ff=config.d_ff,
    )
    graphdef, params = create_diffusion_model(dconfig, config.seed)
    test = prompt_dataset(
        task, "test", tokenizer, config.max_prompt_len, seed=None, num_examples=config.eval_size
    )
    eval_batch = next(prompt_batches(test, config.eval_size, num_epochs=1))
    return Setup(config, task, tokenizer, graphdef, dconfig.mask_id, eval_batch), params


def evaluate(s: Setup, params: nnx.State) -> float:
    """Greedy (temperature 0) accuracy on the first `eval_size` test problems, in [0, 1]."""
    c = s.config
    rollout = diffusion_generate(
        s.graphdef,
        params,
        jnp.asarray(s.eval_batch["prompt_tokens"]),
        jnp.asarray(s.eval_batch["prompt_mask"]),
        jax.random.PRNGKey(0),
        gen_length=c.gen_length,
        block_size=c.block_size,
        steps_per_block=c.steps_per_block,
        mask_id=s.mask_id,
        temperature=0.0,
        remasking=c.remasking,
        eos_id=s.tokenizer.eos_id,
    )
    texts = decode_texts(s.tokenizer, np.asarray(rollout.completion_tokens))
    answers = decode_answers(s.eval_batch)
    return float(np.mean([s.task.reward(t, a) for t, a in zip(texts, answers)]))


def sft_optimizer(config: DiffusionRLConfig) -> optax.GradientTransformation:
    """AdamW whose learning rate warms up linearly to `sft_learning_rate` over
    `sft_warmup_steps`, then follows a cosine decay to 0 at `sft_steps`."""
    schedule = optax.warmup_cosine_decay_schedule(
        0.0,
        config.sft_learning_rate,
        min(config.sft_warmup_steps, max(config.sft_steps - 1, 0)),
        max(config.sft_steps, 1),
    )
    return optax.adamw(schedule, weight_decay=config.sft_weight_decay)


def sft_stage(config: DiffusionRLConfig) -> tuple[Setup, nnx.State, list[dict]]:
    """Builds the run and trains the SFT warm start.

    Returns:
      (setup, params, records): records hold {"step": i, "sft/loss"} every 50 steps and a
      final {"step": 0, "eval/accuracy", "sft/loss"} (RL step 0 is the SFT policy).
    """
    s, params = setup(config)
    optimizer = sft_optimizer(config)
    opt_state = optimizer.init(params)
    step_fn = make_sft_step(s.graphdef, optimizer, s.mask_id, config.sft_eps)
    data = sft_dataset(
        s.task, "train", s.tokenizer, config.max_prompt_len, config.gen_length, seed=config.seed
    )
    batches = prompt_batches(data, config.sft_batch_size)
    key = jax.random.fold_in(jax.random.PRNGKey(config.seed), 0)
    records, loss = [], float("nan")
    for i in range(config.sft_steps):
        raw = next(batches)
        batch = {
            "prompt_tokens": raw["prompt_tokens"],
            "prompt_mask": raw["prompt_mask"],
            "completion_tokens": sft_completions(
                raw["completion_tokens"], raw["completion_mask"], s.tokenizer.eos_id
            ),
        }
        params, opt_state, loss = step_fn(params, opt_state, batch, jax.random.fold_in(key, i))
        if i % 50 == 0 or i == config.sft_steps - 1:
            loss = float(loss)
            records.append({"sft_step": i, "sft/loss": loss})
    records.append({"step": 0, "sft/loss": float(loss), "eval/accuracy": evaluate(s, params)})
    return s, params, records


def rl_step(
    s: Setup,
    fns: RLFunctions,
    params: nnx.State,
    ref_params: nnx.State,
    opt_state: optax.OptState,
    prompts: Batch,
    rng: jax.Array,
) -> tuple[nnx.State, optax.OptState, dict[str, float]]:
    """One rollout of G completions per prompt, its rewards, and `inner_steps` updates.

    Args:
      s: the run (`setup`).
      fns: the jitted estimate/update (`RLFunctions`).
      params: theta before the step (theta_old of every inner update).
      ref_params: the KL reference (unused when beta = 0).
      opt_state: the optimizer state.
      prompts: a `prompt_batches` batch (prompt_tokens, prompt_mask, answer, answer_len).
      rng: this step's key (block-size measurement, rollout, RLDF states, estimator masks).

    Returns:
      (params, opt_state, metrics): "reward/mean", "accuracy" (share of prompts with at least
      one right sample), "loss" (mean over inner steps), the objective's metrics of the
      last inner step and, with `block_sizes`, "block_size/mean" (mean chosen size per prompt).
    """
    c = s.config
    g = c.group_size
    key_rollout, key_states, key_masks = jax.random.split(rng, 3)
    prompt_answers = decode_answers(prompts)
    sampler = dict(mask_id=s.mask_id, temperature=c.temperature, remasking=c.remasking)
    sampler.update(gen_length=c.gen_length, eos_id=s.tokenizer.eos_id)
    prompt_tokens = np.repeat(prompts["prompt_tokens"], g, axis=0)
    prompt_mask = np.repeat(prompts["prompt_mask"], g, axis=0)
    extra = {}
    if c.block_sizes:

        def reward_fn(tokens: np.ndarray, index: np.ndarray) -> np.ndarray:
            texts = decode_texts(s.tokenizer, tokens)
            return np.asarray([s.task.reward(t, prompt_answers[i]) for t, i in zip(texts, index)])

        rewards_by_size = measure_rewards_by_size(
            s.graphdef,
            params,
            prompts["prompt_tokens"],
            prompts["prompt_mask"],
            jax.random.fold_in(key_rollout, 1),
            reward_fn,
            block_sizes=c.block_sizes,
            group_size=g,
            num_steps=c.num_denoising_steps,
            **sampler,
        )
        sizes = np.asarray(c.block_sizes)[best_block_sizes(rewards_by_size, c.block_sizes)]
        extra["block_size/mean"] = float(sizes.mean())
        rollout = diffusion_generate_per_row(
            s.graphdef,
            params,
            jnp.asarray(prompt_tokens),
            jnp.asarray(prompt_mask),
            key_rollout,
            jnp.asarray(np.repeat(sizes, g), jnp.int32),
            num_steps=c.num_denoising_steps,
            **sampler,
        )
    else:
        rollout = diffusion_generate(
            s.graphdef,
            params,
            jnp.asarray(prompt_tokens),
            jnp.asarray(prompt_mask),
            key_rollout,
            block_size=c.block_size,
            steps_per_block=c.steps_per_block,
            **sampler,
        )
    texts = decode_texts(s.tokenizer, np.asarray(rollout.completion_tokens))
    answers = [a for a in prompt_answers for _ in range(g)]
    rewards, advantages = score(s.task, texts, answers, g)
    batch = rl_batch(rollout, advantages, key_states, c)
    keys = jax.random.split(key_masks, c.inner_steps)
    # theta_old is the pre-update policy: every inner step's old estimate uses `params` as given.
    olds = [fns.estimate(params, batch, k) for k in keys]
    refs = [fns.estimate(ref_params, batch, k) if c.beta > 0 else None for k in keys]
    losses = []
    for key, old, ref in zip(keys, olds, refs):
        params, opt_state, loss, metrics = fns.update(params, opt_state, batch, key, old, ref)
        losses.append(loss)
    out = {k: float(v) for k, v in metrics.items()}
    out["loss"] = float(np.mean([float(x) for x in losses]))
    out["reward/mean"] = float(rewards.mean())
    out["accuracy"] = float(rewards.reshape(-1, g).max(axis=1).mean())
    return params, opt_state, out | extra


def rl_optimizer(config: DiffusionRLConfig) -> optax.GradientTransformation:
    """Global-norm clipping then Adam at the RL learning rate."""
    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm), optax.adam(config.learning_rate)
    )


def rl_stage(
    s: Setup, params: nnx.State, config: DiffusionRLConfig | None = None
) -> tuple[nnx.State, list[dict]]:
    """RL from `params` (the SFT policy, also the KL reference) with `config` (default s.config).

    Returns:
      (params, records): one record per step 1..steps with "step" and `rl_step`'s metrics,
      plus "eval/accuracy" every `eval_every` steps and at the last step.
    """
    c = s.config if config is None else config
    s = dataclasses.replace(s, config=c)
    optimizer = rl_optimizer(c)
    opt_state = optimizer.init(params)
    fns = RLFunctions(s.graphdef, optimizer, c, s.mask_id)
    ref_params = params
    data = prompt_dataset(s.task, "train", s.tokenizer, c.max_prompt_len, seed=c.seed)
    batches: Iterator[Batch] = prompt_batches(data, c.prompts_per_step)
    key = jax.random.fold_in(jax.random.PRNGKey(c.seed), 1)
    records = []
    for step in range(1, c.steps + 1):
        params, opt_state, metrics = rl_step(
            s, fns, params, ref_params, opt_state, next(batches), jax.random.fold_in(key, step)
        )
        record = {"step": step, **metrics}
        if step % c.eval_every == 0 or step == c.steps:
            record["eval/accuracy"] = evaluate(s, params)
        records.append(record)
    return params, records


def train(config: DiffusionRLConfig) -> list[dict]:
    """SFT warm start then RL; the per-step records of both stages (see `sft_stage`, `rl_stage`)."""
    s, params, records = sft_stage(config)
    _, rl_records = rl_stage(s, params)
    return records + rl_records


def main(argv: list[str]) -> None:
    """`python -m rljax.diffusion.train --config=configs/diffusion_lm.py`."""
    del argv
    config = DiffusionRLConfig(**_CONFIG.value.to_dict())
    for record in train(config):
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in record.items()})


if __name__ == "__main__":
    from absl import app
    from ml_collections import config_flags

    _CONFIG = config_flags.DEFINE_config_file("config", None, "ml_collections config file.")
    app.run(main)

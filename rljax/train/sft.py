"""Supervised warm start: teacher-forced cross-entropy on target tokens, before RL.

A tiny model trained from scratch has no chance of ever sampling a right answer, so RL has no
signal; a short SFT stage on the task's targets starts it above zero accuracy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from tqdm.auto import tqdm

from rljax.train.logprobs import completion_logprobs

SftStep = Callable[
    [nnx.State, optax.OptState, dict[str, jax.Array]], tuple[nnx.State, optax.OptState, jax.Array]
]


def make_sft_step(
    graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation, vocab_chunk: int = 8192
) -> SftStep:
    """A jitted `(params, opt_state, batch) -> (params, opt_state, loss)` step.

    The loss is the token-mean negative log-likelihood of `completion_tokens` under
    `completion_mask` (the targets and their EOS), given the left-padded prompt. A batch
    with an "env_mask" (scripted multi-turn episodes) attends to those tokens too, as
    context that is not learned.
    """

    def loss_fn(params, batch):
        context = batch["completion_mask"]
        if "env_mask" in batch:
            context = context | batch["env_mask"]
        logprobs, _ = completion_logprobs(
            graphdef,
            params,
            batch["prompt_tokens"],
            batch["prompt_mask"],
            batch["completion_tokens"],
            context,
            vocab_chunk,
        )
        mask = batch["completion_mask"].astype(jnp.float32)
        return -(logprobs * mask).sum() / jnp.maximum(mask.sum(), 1.0)

    @jax.jit
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def run_sft(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    batches: Iterator[dict[str, Any]],
    steps: int,
    optimizer: optax.GradientTransformation,
    vocab_chunk: int = 8192,
    on_step: Callable[[int, float], None] | None = None,
    log_every: int = 10,
) -> nnx.State:
    """Runs `steps` SFT updates on batches from `batches` and returns the new params.

    Args:
      graphdef, params: the policy.
      batches: yields dicts with prompt_tokens/prompt_mask/completion_tokens/completion_mask
        (and env_mask, for multi-turn episodes).
      steps: number of updates.
      optimizer: optax optimizer for this stage only (its state is discarded afterwards).
      vocab_chunk: vocabulary chunk for the log-probs.
      on_step: called with (step, loss) every `log_every` updates and after the last one.
      log_every: how often the loss is fetched from the device (each fetch is a sync).
    """
    fields = ("prompt_tokens", "prompt_mask", "completion_tokens", "completion_mask", "env_mask")
    step_fn = make_sft_step(graphdef, optimizer, vocab_chunk)
    opt_state = optimizer.init(params)
    bar = tqdm(
        range(steps),
        desc="sft",
        unit="step",
        dynamic_ncols=True,
        disable=jax.process_index() != 0,
    )
    for i in bar:
        batch = next(batches)
        inputs = {k: batch[k] for k in fields if k in batch}
        params, opt_state, loss = step_fn(params, opt_state, inputs)
        if i % log_every == 0 or i == steps - 1:
            loss = float(loss)
            bar.set_postfix(loss=f"{loss:.3f}")
            if on_step is not None:
                on_step(i, loss)
    return params

"""Compile time of Tunix's GRPO policy update for one layer count; run with a Tunix venv's python.

What is compiled is the actor's train step exactly as Tunix's GRPO learner jits it: a
`tunix.rl.trainer.Trainer` (the RL cluster's actor trainer class) given the loss function and
model-input function that `tunix.rl.grpo.grpo_learner.GRPOLearner.__init__` installs (the
registered "grpo" policy loss, `algo_core.grpo_loss_fn`, with GRPOConfig beta 0, epsilon 0.2,
token-mean aggregation and temperature 1), then `Trainer.jit_train_and_eval_step()`, which
wraps `PeftTrainer._train_step` (loss + `nnx.value_and_grad` + global grad norm +
`nnx.Optimizer.update`) in `nnx.jit`. Its `.lower(model, optimizer, train_example).compile()`
is timed; nothing runs. The RL cluster, rollout engine and tokenizer are not built (they are
not part of this program).

The model is Tunix's Llama 3 (`tunix.models.llama3.model.Llama3`: no q/k/v bias, tied
embeddings, like rljax's scratch model) with the given widths; Tunix runs its decoder layers in
a Python loop (`for i, layer in enumerate(self.layers)`), no scan. The optimizer is rljax's
default: global-norm clipping 1.0, then AdamW. The train example holds B rows of P prompt and T
completion tokens, advantages and old log-probs (as rljax's update gets them), no reference.

  /work/venvs/tunix/bin/python benchmarks/tunix_compile.py --layers 4

Prints one JSON line: lower_s, compile_s, total_s, load_1min, params (the model's parameter
count), settings, versions.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

jax.config.update("jax_enable_compilation_cache", False)

from tunix.models.llama3 import model as llama3  # noqa: E402
from tunix.rl import common, function_registry  # noqa: E402
from tunix.rl import trainer as rl_trainer  # noqa: E402
from tunix.rl.grpo.grpo_learner import GRPOConfig  # noqa: E402
from tunix.sft import peft_trainer  # noqa: E402

PAD_ID, EOS_ID = 0, 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--d-ff", type=int, default=256)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens P")
    p.add_argument("--completion", type=int, default=32, help="completion tokens T")
    p.add_argument("--batch", type=int, default=4, help="rows B (prompts x group)")
    p.add_argument("--group", type=int, default=4, help="samples per prompt G")
    return p.parse_args(argv)


def grpo_train_step(model: nnx.Module, group: int):
    """(jitted train step, its bound (model, optimizer)) as Tunix's GRPO learner builds them."""
    algo = GRPOConfig(num_generations=group, beta=0.0, epsilon=0.2, loss_agg_mode="token-mean")
    algo.temperature = 1.0  # GRPOLearner copies it from the rollout config
    policy_loss_fn = function_registry.get_policy_loss_fn(algo.policy_loss_fn)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-6))
    trainer = rl_trainer.Trainer(
        model=model,
        optimizer=optimizer,
        training_config=peft_trainer.TrainingConfig(eval_every_n_steps=1_000_000, max_steps=1),
        custom_checkpoint_metadata_fn=dict,
    )
    trainer.with_loss_fn(
        lambda model, train_example, algo_config: policy_loss_fn(
            model, train_example, algo_config=algo, pad_id=PAD_ID, eos_id=EOS_ID
        ),
        has_aux=True,
    )
    trainer.with_gen_model_input_fn(lambda x: {"train_example": x, "algo_config": algo})
    step, _ = trainer.jit_train_and_eval_step()  # functools.partial(nnx.jit(...), model, opt)
    return step.func, step.args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    load = os.getloadavg()[0]
    config = llama3.ModelConfig(
        num_layers=args.layers,
        vocab_size=args.vocab,
        embed_dim=args.d_model,
        hidden_dim=args.d_ff,
        num_heads=args.heads,
        head_dim=args.d_model // args.heads,
        num_kv_heads=args.kv_heads,
        rope_theta=10000,
        norm_eps=1e-6,
        weight_tying=True,
    )
    model = llama3.Llama3(config, rngs=nnx.Rngs(0))
    jitted, (model, optimizer) = grpo_train_step(model, args.group)
    rng = np.random.default_rng(0)
    b, p, t = args.batch, args.prompt, args.completion
    example = common.TrainExample(
        prompt_ids=jnp.asarray(rng.integers(2, args.vocab, (b, p)), jnp.int32),
        prompt_mask=jnp.ones((b, p), bool),
        completion_ids=jnp.asarray(rng.integers(2, args.vocab, (b, t)), jnp.int32),
        completion_mask=jnp.ones((b, t), jnp.int32),
        advantages=jnp.asarray(rng.standard_normal(b), jnp.float32),
        ref_per_token_logps=None,
        old_per_token_logps=jnp.full((b, t), -np.log(args.vocab), jnp.float32),
    )
    start = time.perf_counter()
    lowered = jitted.lower(model, optimizer, example)
    traced = time.perf_counter()
    lowered.compile()
    done = time.perf_counter()
    result = dict(
        lower_s=traced - start,
        compile_s=done - traced,
        total_s=done - start,
        load_1min=load,
        params=sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))),
        settings="Tunix Llama3 (Python loop over layers, no scan), rl.trainer.Trainer's nnx.jit "
        "train step with GRPOLearner's loss (grpo_loss_fn, beta 0, token-mean) and "
        "clip + AdamW",
        versions={
            name: importlib.metadata.version(name)
            for name in ("google-tunix", "jax", "flax", "optax")
        },
    )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

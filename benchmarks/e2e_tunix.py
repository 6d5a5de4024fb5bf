"""The Tunix side of `benchmarks/e2e.py`: Tunix 0.1.7's GRPO learner on the SmolLM2 step, timed.

Runs in its own virtual environment (google-tunix 0.1.7: jax 0.10.2, flax 0.12.8,
transformers 5.12) and imports nothing from rljax but rljax/rewards/math.py, loaded by path
(`numeric_match_reward`, standard library only).

  VENV/bin/python -m benchmarks.e2e_tunix --work WORK --model_dir DIR --steps N

The learner: `tunix.rl.grpo.grpo_learner.GRPOLearner` on an `RLCluster` whose actor, reference
and rollout roles share one 1x1 ("fsdp", "tp") mesh on the one CPU device (so the rollout uses
the actor's weights, no sync), the "vanilla" rollout engine (Tunix's own `Sampler`), and Tunix's
Llama 3 model (`tunix.models.llama3`: SmolLM2 is a Llama with tied embeddings) loaded from the
float32 safetensors export. GRPOConfig: num_generations 4, num_iterations 1, beta 0, epsilon
0.2, loss_agg_mode "token-mean". RLTrainingConfig: mini_batch_size 8 prompts (one optimizer
step per step), train_micro_batch_size 2 prompts (4 micro-batches of 8 completions, Tunix's
gradient accumulation via optax.MultiSteps), rollout and log-prob micro-batches of 8 prompts
(one sampler call of 32 sequences). Optimizer: clip_by_global_norm(1.0) then AdamW (weight
decay 0) on optax.linear_schedule(0, lr, warmup). Rollout: temperature 1, top_p 1, no top-k,
48 new tokens, prompts left-padded to max_prompt_length, EOS = rljax's.

Patched (documented in the report): Tunix 0.1.7's Llama calls `apply_rope` without the
configured `rope_theta`, so every Llama runs at the default 1e6; SmolLM2 needs 100000. The
module function `tunix.models.llama3.model.apply_rope` is replaced by the same function with
the checkpoint's theta bound, before anything is traced (unpatched, the last-position logits
differ from rljax's by 1.2e-1 relative; patched, 1.5e-6).

Differences from rljax/TRL that the settings cannot remove (noted in the report): Tunix's
token-mean is per micro-batch (each of the 4 micro-batch losses is normalised by its own
tokens, then MultiSteps averages the 4 gradients; rljax and TRL's "dapo" normalise by the whole
step's tokens); the completion mask is `tokens != pad` and the sampler cuts completions before
EOS, so the EOS token is not trained (SmolLM2's pad id is its EOS id); prompts are padded to
max_prompt_length and completions to 48 tokens in every pass; the sampler's key is
PRNGKey(0) at every step (RolloutConfig.seed None).

Prints `E2E {json}` lines: kind "check" (logits_rel_err against rljax's, tokens_match), one
kind "step" per step (step, step_s, generation_s, reward_s, old_logprobs_s, update_s, other_s,
reward_mean), kind "versions". Phases wrap Tunix's calls with time.perf_counter:
`RLCluster.generate` (generation: tokenize, prefill, decode, detokenize),
`RLLearner._compute_rewards` (reward), `RLCluster.get_old_per_token_logps` /
`get_ref_per_token_logps` (old-log-probs: not called with num_iterations 1 and beta 0),
`RLCluster.update_actor` (update, once per micro-batch). A step runs from the start of one
`_run_global_step` to the next (the first from `train()`, the last to `RLCluster.close()`).
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import json
import os
import time

import numpy as np

from benchmarks.e2e_worker import emit, left_padded, reward_function

PHASES = ("generation_s", "reward_s", "old_logprobs_s", "update_s")


def patch_rope_theta(theta: float) -> None:
    """Makes Tunix's Llama 3 use `theta` (its attention calls apply_rope without one)."""
    from tunix.models.llama3 import model as llama3

    original = getattr(llama3.apply_rope, "_e2e_original", llama3.apply_rope)
    patched = functools.partial(original, rope_theta=theta)
    patched._e2e_original = original
    llama3.apply_rope = patched


def model_config(model_dir: str):
    """Tunix's Llama 3 config for the HF config.json in `model_dir`, and its rope theta."""
    from tunix.models.llama3 import model as llama3

    with open(os.path.join(model_dir, "config.json")) as f:
        hf = json.load(f)
    rope = hf.get("rope_parameters") or {}
    theta = float(hf.get("rope_theta", rope.get("rope_theta", 10000.0)))
    config = llama3.ModelConfig(
        num_layers=hf["num_hidden_layers"],
        vocab_size=hf["vocab_size"],
        embed_dim=hf["hidden_size"],
        hidden_dim=hf["intermediate_size"],
        num_heads=hf["num_attention_heads"],
        head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
        num_kv_heads=hf["num_key_value_heads"],
        rope_theta=int(theta),
        norm_eps=hf["rms_norm_eps"],
        weight_tying=hf.get("tie_word_embeddings", False),
    )
    return config, theta


def last_logits(model, check_ids: list[list[int]]) -> np.ndarray:
    """Tunix's float32 logits [K, V] at the last position of each (left-padded) prompt."""
    import jax
    import jax.numpy as jnp

    tokens, valid = left_padded(check_ids)
    length = tokens.shape[1]
    positions = np.maximum(np.cumsum(valid, axis=1) - 1, 0)
    causal = np.tril(np.ones((length, length), bool))
    mask = causal[None] & valid[:, None, :]
    with jax.default_matmul_precision("highest"):
        logits, _ = model(jnp.asarray(tokens), jnp.asarray(positions), None, jnp.asarray(mask))
    return np.asarray(logits[:, -1], np.float64)


class Clock:
    """Seconds per phase since the last step boundary."""

    def __init__(self):
        self.phases: dict[str, float] = {}

    def wrap(self, fn, phase: str):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.phases[phase] = self.phases.get(phase, 0.0) + time.perf_counter() - start

        return timed


def train(args: argparse.Namespace) -> None:
    import jax
    import optax
    import transformers
    from tunix.models.llama3 import params as llama3_params
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout

    with open(os.path.join(args.work, "prompts.json")) as f:
        work = json.load(f)
    s = work["settings"]
    config, theta = model_config(args.model_dir)
    patch_rope_theta(theta)
    # A Mesh (Auto axes, as Tunix's examples build it): jax.make_mesh's default Explicit
    # axes make Tunix's embedding gather ambiguous.
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    model = llama3_params.create_model_from_safe_tensors(
        args.model_dir, config, mesh=mesh, dtype=jax.numpy.float32
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model_dir)
    ref = np.load(os.path.join(args.work, "ref_logits.npy")).astype(np.float64)
    ours = last_logits(model, work["check_ids"])
    err = float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))

    g, p = s["group_size"], s["prompts_per_step"]
    schedule = optax.linear_schedule(0.0, s["learning_rate"], s["warmup_steps"])
    optimizer = optax.chain(
        optax.clip_by_global_norm(s["max_grad_norm"]),
        optax.adamw(schedule, weight_decay=s["weight_decay"]),
    )
    max_prompt = s["tunix_max_prompt_length"]
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=s["max_new_tokens"],
        temperature=s["temperature"],
        top_p=1.0,
        top_k=None,
        max_prompt_length=max_prompt,
        kv_cache_size=max_prompt + s["max_new_tokens"],
        eos_tokens=[s["eos_id"]],
    )
    training = rl_cluster_lib.RLTrainingConfig(
        actor_optimizer=optimizer,
        eval_every_n_steps=10**9,
        max_steps=args.steps,
        mini_batch_size=p,
        train_micro_batch_size=p // s["microbatches"],
        rollout_micro_batch_size=p,
        compute_logps_micro_batch_size=p,
        pbar_description=None,
    )
    roles = rl_cluster_lib.Role
    cluster = rl_cluster_lib.RLCluster(
        actor=model,
        reference=None,
        tokenizer=tokenizer,
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={roles.ACTOR: mesh, roles.REFERENCE: mesh, roles.ROLLOUT: mesh},
            rollout_engine="vanilla",
            offload_to_cpu=False,
            training_config=training,
            rollout_config=rollout,
        ),
    )
    sampler = cluster.rollout._sampler
    tokens_match = all(
        sampler.tokenize(row["text"]).tolist() == row["ids"] for row in work["prompts"]
    )
    emit("check", logits_rel_err=err, tokens_match=tokens_match, rope_theta=theta)
    if not tokens_match or err > s["logit_tol"]:
        raise SystemExit(f"Tunix side does not run rljax's model/prompts: {err=}, {tokens_match=}")

    rewards: list[float] = []
    reward = reward_function(rewards)

    algo = grpo_learner.GRPOConfig(
        num_generations=g,
        num_iterations=1,
        beta=s["kl_coef"],
        epsilon=s["clip_eps"],
        loss_agg_mode="token-mean",
    )
    learner = grpo_learner.GRPOLearner(rl_cluster=cluster, algo_config=algo, reward_fns=reward)

    clock = Clock()
    cluster.generate = clock.wrap(cluster.generate, "generation_s")
    cluster.get_old_per_token_logps = clock.wrap(cluster.get_old_per_token_logps, "old_logprobs_s")
    cluster.get_ref_per_token_logps = clock.wrap(cluster.get_ref_per_token_logps, "old_logprobs_s")
    cluster.update_actor = clock.wrap(cluster.update_actor, "update_s")
    learner._compute_rewards = clock.wrap(learner._compute_rewards, "reward_s")
    marks: list[float] = []

    def boundary() -> None:
        now = time.perf_counter()
        if marks:
            record = dict(step=len(marks), step_s=now - marks[-1])
            record.update({k: clock.phases.get(k, 0.0) for k in PHASES})
            record["other_s"] = record["step_s"] - sum(record[k] for k in PHASES)
            record["reward_mean"] = float(np.mean(rewards[-p * g :])) if rewards else None
            emit("step", **record)
        clock.phases = {}
        marks.append(now)

    run_step, close = learner._run_global_step, cluster.close

    calls = []

    def global_step(*a, **kw):
        if calls:  # the previous step ends where this one starts
            boundary()
        calls.append(1)
        return run_step(*a, **kw)

    def closing(*a, **kw):
        boundary()
        return close(*a, **kw)

    learner._run_global_step = global_step
    cluster.close = closing
    batches = [
        dict(
            prompts=[row["text"] for row in work["prompts"][i * p : (i + 1) * p]],
            answer=[row["answer"] for row in work["prompts"][i * p : (i + 1) * p]],
        )
        for i in range(args.steps)
    ]
    marks.append(time.perf_counter())  # step 1 starts with train()
    learner.train(batches)
    emit(
        "versions",
        **{
            name: importlib.metadata.version(name)
            for name in ("google-tunix", "jax", "flax", "optax", "transformers")
        },
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", required=True, help="the parent's work dir (prompts, ref logits)")
    p.add_argument("--model_dir", required=True, help="the float32 safetensors export")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="unused (XLA uses every core)")
    args = p.parse_args(argv)
    train(args)


if __name__ == "__main__":
    main()

"""rljax next to its peers on one machine and one model: rollout and GRPO-update tokens/s.

One random Qwen2ForCausalLM is built in torch, saved with `save_pretrained` to a temp dir and
loaded into rljax with `rljax.models.load_hf_checkpoint` (the same weights: the script checks
that the logits of the first generated token agree to 1e-4 relative before it times anything).

- rollout: B prompts of P real tokens, T new tokens each, sampling at temperature 1 with no
  top-k/top-p and no early stop. HF transformers `model.generate(do_sample=True,
  use_cache=True)` against the jitted `rljax.rollout.sampler.generate`. Tokens/s = B * T / s.
- update: one GRPO step on N = prompts x group rows of P + T random tokens (all real, random
  rewards): forward over prompt + completion, per-token log-probs of the completion, the
  clipped surrogate with token-mean aggregation, backward and one AdamW step. The torch side
  is the loss of TRL's GRPOTrainer written here from its documented formula (not TRL's code):
    A_i = (r_i - mean_group(r)) / (std_group(r) + 1e-4)      (torch's unbiased std)
    ratio = exp(logp - logp_old)
    loss = sum_tokens(-min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A) * mask) / sum(mask)
  with beta = 0 (TRL's default: no reference model), and the log-probs from the last T + 1
  positions' logits only (`logits_to_keep`, as TRL does). The rljax side is
  `make_steps(...).update` with `rljax.algorithms.grpo`, which also computes the entropy and
  the non-finite guard. The old log-probs and advantages are computed once, outside the timed
  step, on both sides (TRL computes them while generating; rljax in `steps.prepare`).
  Tokens/s = N * T (trained completion tokens) / s.

rljax's compile time is measured separately (`.lower(...).compile()`) and left out of its
tokens/s. Each side runs once as a warm-up; then the repetitions alternate between the
frameworks, so a load change on a shared machine hits both, and the median is reported.
On a CUDA machine torch runs on the GPU (float32 matmuls in TF32 on both sides, as JAX does by
default; `--dtype bfloat16` runs both under bf16 compute with float32 weights: autocast in
torch, `dtype="bfloat16"` in rljax).

Tunix (`google-tunix`, installed in its own virtual environment so that it cannot change this
one's jax/flax): with `--tunix_python VENV/bin/python`, this file runs itself there as a worker
(`--tunix_worker DIR`) that loads the same checkpoint with `tunix.models.qwen2.params` and times
one update step built from Tunix's own pieces: `tunix.rl.algo_core.grpo_loss_fn` (GRPOConfig
with beta 0, epsilon 0.2, token-mean), `nnx.value_and_grad` and an `nnx.Optimizer` with AdamW,
under `nnx.jit`. Its rollout is not timed: Tunix's `Sampler` takes strings through a tokenizer
and the random model has none. The worker runs after the other two, not alternating with them.

  taskset -c 0,1 python -m benchmarks.peers     # the README numbers (about 4 min on 2 cores)
  python -m benchmarks.peers --quick            # a tiny model: a smoke test

Writes a JSON report (default benchmarks/results/peers.json) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import tempfile
import time
import types
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.rollout import build_checkpoint, cpu_model

_LOGIT_TOL = 1e-4


@dataclasses.dataclass(frozen=True)
class Settings:
    """The model and batch shapes of one run."""

    layers: int
    d_model: int
    heads: int
    kv_heads: int
    d_ff: int
    vocab: int
    rollout_batch: int  # B prompts
    prompt_tokens: int  # P
    new_tokens: int  # T
    update_prompts: int  # prompts in the update batch
    group_size: int  # G samples per prompt; N = update_prompts * G rows

    @property
    def update_rows(self) -> int:
        return self.update_prompts * self.group_size


FULL = Settings(8, 512, 8, 2, 1408, 32000, 16, 64, 128, 2, 4)
QUICK = Settings(1, 64, 4, 2, 128, 512, 4, 8, 8, 2, 2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny model and batch: a smoke test")
    p.add_argument("--repeats", type=int, default=None, help="timed runs; default 3 (1 quick)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--scale", type=int, default=1, help="multiply batch sizes (GPU runs)")
    p.add_argument("--tunix_python", default="", help="python of a venv with google-tunix")
    p.add_argument("--tunix_worker", default="", help=argparse.SUPPRESS)  # a checkpoint dir
    p.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "peers.json")
    )
    return p.parse_args(argv)


def settings_of(args: argparse.Namespace) -> Settings:
    base = QUICK if args.quick else FULL
    return dataclasses.replace(
        base,
        rollout_batch=base.rollout_batch * args.scale,
        update_prompts=base.update_prompts * args.scale,
    )


def make_data(s: Settings) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The rollout prompts [B, P] and the update batch (prompt, completion, rewards), seeded."""
    rng = np.random.default_rng(0)
    prompts = rng.integers(1, s.vocab, (s.rollout_batch, s.prompt_tokens)).astype(np.int32)
    update_batch = dict(
        prompt=rng.integers(1, s.vocab, (s.update_rows, s.prompt_tokens)).astype(np.int32),
        completion=rng.integers(1, s.vocab, (s.update_rows, s.new_tokens)).astype(np.int32),
        rewards=rng.random(s.update_rows).astype(np.float32),
    )
    return prompts, update_batch


def check_same_model(model, graphdef, params, prompts: np.ndarray, device) -> float:
    """Max |rljax - torch| / max |torch| of the logits after the prompts (full float32 matmuls).

    Raises:
      RuntimeError: above 1e-4, i.e. the two frameworks do not run the same model.
    """
    import torch

    from rljax.models import forward, positions_from_mask

    mask = np.ones(prompts.shape, bool)
    with jax.default_matmul_precision("highest"):
        ours, _ = jax.jit(forward, static_argnums=0)(
            graphdef, params, jnp.asarray(prompts), positions_from_mask(mask), jnp.asarray(mask)
        )
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(prompts).long().to(device)).logits
    torch.backends.cuda.matmul.allow_tf32 = tf32
    ours = np.asarray(ours[:, -1], np.float64)
    ref = ref[:, -1].double().cpu().numpy()
    err = float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))
    if err > _LOGIT_TOL:
        raise RuntimeError(
            f"rljax and torch logits differ by {err:.2e} (relative) on the same checkpoint; "
            "fix the loader before comparing speeds"
        )
    return err


def timed(fn: Callable[[], object]) -> float:
    """Seconds of one call of `fn` (which must wait for its own results)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def alternate(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """One warm-up of each run, then `repeats` rounds that time each run once, in turn."""
    for fn in runs.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            times[name].append(timed(fn))
    return times


def grpo_advantages(rewards, group_size: int):
    """TRL's GRPO advantages: (r - group mean) / (group std + 1e-4), torch's unbiased std.

    Args:
      rewards: [N] torch tensor, rows of one group adjacent.
      group_size: G.

    Returns:
      [N] advantages.
    """
    grouped = rewards.view(-1, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True)
    return ((grouped - mean) / (std + 1e-4)).view(-1)


def grpo_token_mean_loss(logps, old_logps, advantages, mask, eps: float = 0.2):
    """TRL GRPOTrainer's clipped surrogate with token-mean aggregation (beta = 0).

    Args:
      logps, old_logps: [N, T] log-probs of the completion tokens, new and at sampling time.
      advantages: [N].
      mask: [N, T] float, 1 on completion tokens.
      eps: clip range (TRL's `epsilon`, 0.2 by default).

    Returns:
      The scalar loss sum(-min(r A, clip(r, 1 - eps, 1 + eps) A) * mask) / sum(mask).
    """
    import torch

    ratio = torch.exp(logps - old_logps)
    adv = advantages[:, None]
    per_token = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps, 1 + eps) * adv)
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


class TorchSide:
    """HF transformers `generate` and a TRL-style GRPO update step in torch."""

    def __init__(self, model, s: Settings, dtype: str, device):
        import torch

        self.torch, self.s, self.device = torch, s, device
        self.model = model
        self.autocast = dtype == "bfloat16"
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def _sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def _amp(self):
        return self.torch.autocast(self.device.type, self.torch.bfloat16, enabled=self.autocast)

    def rollout_fn(self, prompts: np.ndarray) -> Callable[[], object]:
        torch, s = self.torch, self.s
        ids = torch.from_numpy(prompts).long().to(self.device)
        attn = torch.ones_like(ids)

        def run():
            with torch.inference_mode(), self._amp():
                out = self.model.generate(
                    input_ids=ids,
                    attention_mask=attn,
                    max_new_tokens=s.new_tokens,
                    min_new_tokens=s.new_tokens,
                    do_sample=True,
                    temperature=1.0,
                    top_k=0,
                    top_p=1.0,
                    pad_token_id=0,
                    use_cache=True,
                )
            self._sync()
            assert out.shape == (len(prompts), s.prompt_tokens + s.new_tokens)

        return run

    def _completion_logps(self, sequences):
        t = self.s.new_tokens
        with self._amp():
            logits = self.model(input_ids=sequences, logits_to_keep=t + 1).logits
        logits = logits[:, :-1].float()  # position i predicts token i + 1
        targets = sequences[:, -t:]
        picked = logits.gather(-1, targets[..., None])[..., 0]
        return picked - logits.logsumexp(dim=-1)

    def update_fn(self, batch: dict[str, np.ndarray]) -> Callable[[], object]:
        torch = self.torch
        seq = np.concatenate([batch["prompt"], batch["completion"]], axis=1)
        sequences = torch.from_numpy(seq).long().to(self.device)
        mask = torch.ones(batch["completion"].shape, device=self.device)
        rewards = torch.from_numpy(batch["rewards"]).float().to(self.device)
        advantages = grpo_advantages(rewards, self.s.group_size)
        with torch.no_grad():
            old = self._completion_logps(sequences)

        def step():
            loss = grpo_token_mean_loss(self._completion_logps(sequences), old, advantages, mask)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            self._sync()

        return step


class RljaxSide:
    """The jitted rljax sampler and `make_steps(...).update` with GRPO."""

    def __init__(self, graphdef, params, s: Settings):
        self.graphdef, self.params, self.s = graphdef, params, s

    def rollout_fn(self, prompts: np.ndarray) -> tuple[Callable[[], object], float]:
        from rljax.rollout.sampler import generate

        tokens = jnp.asarray(prompts)
        mask = jnp.ones(tokens.shape, bool)
        key = jax.random.key(0)
        start = time.perf_counter()
        compiled = generate.lower(
            self.graphdef,
            self.params,
            tokens,
            mask,
            key,
            max_new_tokens=self.s.new_tokens,
            eos_id=-1,
            pad_id=0,
        ).compile()
        compile_s = time.perf_counter() - start
        keys = {"key": key}

        def run():
            keys["key"], sub = jax.random.split(keys["key"])
            out = compiled(self.params, tokens, mask, sub)
            jax.block_until_ready(out.completion_tokens)
            assert out.completion_tokens.shape == (len(prompts), self.s.new_tokens)

        return run, compile_s

    def update_fn(self, batch: dict[str, np.ndarray]) -> tuple[Callable[[], object], float]:
        from rljax.algorithms import grpo
        from rljax.core.batch import make_batch
        from rljax.core.state import init_train_state
        from rljax.train.steps import RolloutConfig, make_steps

        s = self.s
        algorithm, optimizer = grpo(group_size=s.group_size), optax.adamw(1e-6)
        # A copy: the update donates its state, and the rollout keeps using self.params.
        params = jax.tree.map(jnp.copy, self.params)
        state = init_train_state(params, optimizer, algorithm.transform, jax.random.key(0))
        rollout = RolloutConfig(s.new_tokens, s.group_size, eos_id=-1, pad_id=0)
        steps = make_steps(self.graphdef, optimizer, algorithm, rollout)
        rows = s.update_rows
        grpo_batch = make_batch(
            batch["prompt"],
            np.ones(batch["prompt"].shape, bool),
            batch["completion"],
            np.ones(batch["completion"].shape, bool),
            np.repeat(np.arange(rows // s.group_size), s.group_size),
            batch["rewards"],
        )
        state, grpo_batch, _ = steps.prepare(state, grpo_batch)
        start = time.perf_counter()
        compiled = steps.update.lower(state, grpo_batch).compile()
        compile_s = time.perf_counter() - start
        holder = {"state": state}

        def step():
            holder["state"], metrics = compiled(holder["state"], grpo_batch)
            jax.block_until_ready(metrics["loss"])

        return step, compile_s


def machine(device: str) -> dict:
    import torch
    import transformers

    return dict(
        platform=platform.platform(),
        processor=cpu_model(),
        cpus=len(os.sched_getaffinity(0)),
        jax=jax.__version__,
        jax_backend=jax.default_backend(),
        torch=torch.__version__,
        torch_device=device,
        torch_threads=torch.get_num_threads(),
        transformers=transformers.__version__,
    )


def summarize(times: list[float], tokens: int) -> dict:
    median = statistics.median(times)
    return dict(times_s=times, median_s=median, tokens_per_s=tokens / median)


def tunix_worker(args: argparse.Namespace, path: str, repeats: int) -> dict:
    """Runs in the Tunix venv: times Tunix's GRPO update step on the checkpoint in `path`."""
    import importlib.metadata

    from flax import nnx
    from tunix.models.qwen2 import model as qwen2
    from tunix.models.qwen2 import params as qwen2_params
    from tunix.rl import common
    from tunix.rl.algo_core import grpo_loss_fn
    from tunix.rl.grpo.grpo_learner import GRPOConfig

    s = settings_of(args)
    with open(os.path.join(path, "config.json")) as f:
        hf = json.load(f)
    theta = hf.get("rope_theta", (hf.get("rope_parameters") or {}).get("rope_theta", 10000))
    config = qwen2.ModelConfig(
        num_layers=s.layers,
        vocab_size=s.vocab,
        embed_dim=s.d_model,
        hidden_dim=s.d_ff,
        num_heads=s.heads,
        head_dim=s.d_model // s.heads,
        num_kv_heads=s.kv_heads,
        rope_theta=int(theta),
        norm_eps=hf["rms_norm_eps"],
        use_tied_embedding=True,
        dtype=jnp.dtype(args.dtype),
    )
    model = qwen2_params.create_model_from_safe_tensors(path, config)
    algo = GRPOConfig(
        num_generations=s.group_size, beta=0.0, epsilon=0.2, loss_agg_mode="token-mean"
    )
    # grpo_loss_fn reads algo_config.temperature, which this GRPOConfig lacks (the learner
    # supplies it from the rollout config): the same fields plus temperature 1.
    algo = types.SimpleNamespace(**dataclasses.asdict(algo), temperature=1.0)
    _, batch = make_data(s)
    rewards = batch["rewards"].reshape(-1, s.group_size)
    std = rewards.std(axis=1, ddof=1, keepdims=True)
    advantages = ((rewards - rewards.mean(1, keepdims=True)) / (std + 1e-4)).reshape(-1)
    prompt, completion = jnp.asarray(batch["prompt"]), jnp.asarray(batch["completion"])
    graphdef, state = nnx.split(model)
    old = common.compute_per_token_logps(graphdef, state, prompt, completion, pad_id=0, eos_id=-1)
    example = common.TrainExample(
        prompt_ids=prompt,
        prompt_mask=jnp.ones(prompt.shape, bool),
        completion_ids=completion,
        completion_mask=jnp.ones(completion.shape, jnp.int32),
        advantages=jnp.asarray(advantages),
        ref_per_token_logps=None,
        old_per_token_logps=old,
    )
    optimizer = nnx.Optimizer(model, optax.adamw(1e-6), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, example):
        def loss_fn(m):
            return grpo_loss_fn(m, example, algo, pad_id=0, eos_id=-1)[0]

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    def run():
        jax.block_until_ready(step(model, optimizer, example))

    compile_and_first_s = timed(run)
    second_s = timed(run)  # compiles again: the optimizer state's types change after step 1
    times = [timed(run) for _ in range(repeats)]
    out = summarize(times, s.update_rows * s.new_tokens)
    out["compile_plus_first_run_s"] = compile_and_first_s
    out["second_run_s"] = second_s
    out["versions"] = dict(tunix=importlib.metadata.version("google-tunix"), jax=jax.__version__)
    return out


def run_tunix(args: argparse.Namespace, path: str, repeats: int) -> dict | str:
    """Runs `tunix_worker` in `args.tunix_python`; its result, or one line saying what failed."""
    import subprocess

    cmd = [args.tunix_python, "-m", "benchmarks.peers", "--tunix_worker", path]
    cmd += ["--repeats", str(repeats), "--dtype", args.dtype, "--scale", str(args.scale)]
    cmd += ["--quick"] if args.quick else []
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        errors = [line for line in proc.stderr.splitlines() if "Error" in line]
        tail = (errors or proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"Tunix worker failed (exit {proc.returncode}): {tail}"
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    s = settings_of(args)
    repeats = args.repeats or (1 if args.quick else 3)
    if args.tunix_worker:
        result = tunix_worker(args, args.tunix_worker, repeats)
        print(json.dumps(result))
        return result

    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # what JAX's default precision does
    load_start = os.getloadavg()
    prompts, update_batch = make_data(s)

    from rljax.models.hf import load_hf_checkpoint

    with tempfile.TemporaryDirectory() as path:
        model = build_checkpoint(s, path).to(device)
        _, graphdef32, params = load_hf_checkpoint(path, dtype="float32")
        logit_err = check_same_model(model, graphdef32, params, prompts, device)
        graphdef = graphdef32
        if args.dtype != "float32":
            _, graphdef, params = load_hf_checkpoint(path, dtype=args.dtype)
        tunix = run_tunix(args, path, repeats) if args.tunix_python else "not tried in this run"

    ours, peer = RljaxSide(graphdef, params, s), TorchSide(model, s, args.dtype, device)
    rljax_rollout, rollout_compile = ours.rollout_fn(prompts)
    rollout_times = alternate(
        {"rljax": rljax_rollout, "hf_transformers": peer.rollout_fn(prompts)}, repeats
    )
    rljax_update, update_compile = ours.update_fn(update_batch)
    update_times = alternate(
        {"rljax": rljax_update, "torch_trl_loss": peer.update_fn(update_batch)}, repeats
    )

    generated = s.rollout_batch * s.new_tokens
    trained = s.update_rows * s.new_tokens
    rollout = {k: summarize(v, generated) for k, v in rollout_times.items()}
    update = {k: summarize(v, trained) for k, v in update_times.items()}
    rollout["rljax"]["compile_s"] = rollout_compile
    update["rljax"]["compile_s"] = update_compile
    report = dict(
        benchmark="peers",
        command="python -m benchmarks.peers"
        + (" --quick" if args.quick else "")
        + (f" --dtype {args.dtype}" if args.dtype != "float32" else "")
        + (f" --scale {args.scale}" if args.scale != 1 else ""),
        settings=dict(dataclasses.asdict(s), dtype=args.dtype, repeats=repeats),
        first_token_logits_rel_err=logit_err,
        rollout=rollout,
        update=update,
        rljax_over_peer=dict(
            rollout=rollout["rljax"]["tokens_per_s"] / rollout["hf_transformers"]["tokens_per_s"],
            update=update["rljax"]["tokens_per_s"] / update["torch_trl_loss"]["tokens_per_s"],
        ),
        torch_loss="TRL GRPOTrainer's documented clipped surrogate, token-mean, beta=0, "
        "written in torch here (trl not installed)",
        tunix=tunix,
        machine=machine(str(device)),
        load_average=dict(start=load_start, end=os.getloadavg()),
    )
    if isinstance(tunix, dict):
        report["rljax_over_peer"]["update_tunix"] = (
            update["rljax"]["tokens_per_s"] / tunix["tokens_per_s"]
        )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print_table(report)
    print(f"wrote {args.out}")
    return report


def print_table(report: dict) -> None:
    s = report["settings"]
    print(
        f"\nQwen2 {s['layers']} layers, d_model {s['d_model']}, vocab {s['vocab']}, {s['dtype']}; "
        f"rollout {s['rollout_batch']} x ({s['prompt_tokens']} + {s['new_tokens']}), "
        f"update {s['update_prompts']} x {s['group_size']} rows x "
        f"({s['prompt_tokens']} + {s['new_tokens']}); {report['machine']['processor']}, "
        f"{report['machine']['cpus']} cores, torch on {report['machine']['torch_device']}"
    )
    print("| phase | framework | median s | tokens/s | rljax / peer | rljax compile s |")
    print("|---|---|---|---|---|---|")
    for phase, peer in (("rollout", "hf_transformers"), ("update", "torch_trl_loss")):
        ours, theirs = report[phase]["rljax"], report[phase][peer]
        ratio = report["rljax_over_peer"][phase]
        print(
            f"| {phase} | rljax | {ours['median_s']:.2f} | {ours['tokens_per_s']:.0f} "
            f"| {ratio:.2f}x | {ours['compile_s']:.1f} |"
        )
        print(f"| {phase} | {peer} | {theirs['median_s']:.2f} | {theirs['tokens_per_s']:.0f} | | |")
    tunix = report["tunix"]
    if isinstance(tunix, dict):
        print(
            f"| update | tunix {tunix['versions']['tunix']} | {tunix['median_s']:.2f} "
            f"| {tunix['tokens_per_s']:.0f} | {report['rljax_over_peer']['update_tunix']:.2f}x "
            f"| {tunix['compile_plus_first_run_s']:.1f} (compile + first run) |"
        )
    else:
        print(f"Tunix: {tunix}")


if __name__ == "__main__":
    main()

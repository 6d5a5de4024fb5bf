"""SmolLM2-135M-Instruct: rollout and update throughput of rljax next to HF transformers + torch.

Both sides load the same GGUF file (`rljax.models.load_gguf` and transformers'
`from_pretrained(dir, gguf_file=...)`), use the same chat-formatted prompts, dtype, batch,
prompt and generation lengths, on this machine's CPU, in one process.

- rollout: sampling at temperature 1 with no early stop, tokens generated per second.
- update: one GRPO-style policy-gradient step (forward + backward + AdamW) on prompt +
  completion sequences, tokens (completion tokens) per second. The torch side is the same loss
  written directly in PyTorch: -(A * exp(logp - logp_old)) token-mean.

  python -m benchmarks.smollm2          # the README numbers
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.engine_workload import workload_texts
from benchmarks.rollout import machine, time_it


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--new_tokens", type=int, default=64)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "smollm2.json")
    )
    return p.parse_args()


def prompts(tokenizer, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """The first `batch` prompts of the engine workload, LEFT-padded to the longest."""
    from rljax.models.tokenizer import encode_prompts

    texts = workload_texts(tokenizer, batch)
    length = max(len(tokenizer.encode(t)) for t in texts)
    return encode_prompts(tokenizer, texts, length, add_bos=False)


def bench_rljax(args, path, tokens, mask) -> dict:
    from rljax.algorithms import grpo
    from rljax.core import init_train_state, make_batch
    from rljax.models import load_gguf
    from rljax.train.steps import RolloutConfig, UpdateConfig, make_steps

    _, graphdef, params = load_gguf(path, dtype=args.dtype)
    algorithm, optimizer = grpo(group_size=args.batch), optax.adamw(1e-6)
    state = init_train_state(params, optimizer, algorithm.transform, jax.random.PRNGKey(0))
    steps = make_steps(
        graphdef,
        optimizer,
        algorithm,
        RolloutConfig(args.new_tokens, 1, eos_id=-1, pad_id=0),
        UpdateConfig(vocab_chunk=16384),
    )
    tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
    out = {}

    def rollout():
        r = steps.rollout(state, tokens, mask)
        jax.block_until_ready(r.completion_tokens)
        return r

    start = time.perf_counter()
    r = rollout()
    out["rollout_compile_plus_first_s"] = time.perf_counter() - start
    out["rollout_times_s"] = time_it(rollout, args.repeats)
    rewards = jnp.linspace(0.0, 1.0, args.batch)
    batch = make_batch(
        r.prompt_tokens,
        r.prompt_mask,
        r.completion_tokens,
        r.completion_mask,
        jnp.zeros(args.batch, jnp.int32),
        rewards,
        rollout_logprobs=r.sampling_logprobs,
    )
    _, batch, _ = steps.prepare(state, batch)

    holder = {"state": state}  # update donates its input state: carry the new one along

    def update():
        holder["state"], metrics = steps.update(holder["state"], batch)
        jax.block_until_ready(metrics["loss"])

    start = time.perf_counter()
    update()
    out["update_compile_plus_first_s"] = time.perf_counter() - start
    out["update_times_s"] = time_it(update, args.repeats)
    return out


def bench_torch(args, path, tokens, mask) -> dict:
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count() or 1)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path),
        gguf_file=os.path.basename(path),
        torch_dtype=getattr(torch, args.dtype),
    )
    ids, attn = torch.from_numpy(tokens).long(), torch.from_numpy(mask).long()
    out = {}

    def rollout():
        with torch.no_grad():  # not inference_mode: the update step reuses the sequences
            return model.generate(
                input_ids=ids,
                attention_mask=attn,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                pad_token_id=0,
            )

    sequences = rollout()  # warm-up
    out["rollout_times_s"] = time_it(rollout, args.repeats)
    full_mask = torch.cat([attn, torch.ones(args.batch, args.new_tokens, dtype=torch.long)], 1)
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
    advantages = torch.linspace(-1.0, 1.0, args.batch)[:, None]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    p = ids.shape[1]

    def update():
        logits = model(input_ids=sequences, attention_mask=full_mask, position_ids=positions).logits
        logp = torch.log_softmax(logits[:, p - 1 : -1].float(), -1)
        logp = logp.gather(-1, sequences[:, p:, None])[..., 0]
        loss = -(advantages * torch.exp(logp - logp.detach())).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    update()  # warm-up
    out["update_times_s"] = time_it(update, args.repeats)
    return out


def main() -> None:
    from rljax.models import fetch_smollm2, gguf_tokenizer

    args = parse_args()
    path = fetch_smollm2()
    tokens, mask = prompts(gguf_tokenizer(path), args.batch)
    results = {
        "rljax": bench_rljax(args, path, tokens, mask),
        "hf_transformers_torch": bench_torch(args, path, tokens, mask),
    }
    generated = args.batch * args.new_tokens
    for r in results.values():
        for kind in ("rollout", "update"):
            r[f"{kind}_median_s"] = statistics.median(r[f"{kind}_times_s"])
            r[f"{kind}_tokens_per_s"] = generated / r[f"{kind}_median_s"]
    report = dict(
        benchmark="smollm2",
        args=vars(args),
        prompt_tokens=int(tokens.shape[1]),
        results=results,
        machine=machine(),
    )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(
        f"\nSmolLM2-135M, batch {args.batch}, {tokens.shape[1]}+{args.new_tokens} tokens, "
        f"{args.dtype}"
    )
    print(f"{'engine':<24}{'rollout tok/s':>15}{'update tok/s':>15}")
    for name, r in results.items():
        print(f"{name:<24}{r['rollout_tokens_per_s']:>15.1f}{r['update_tokens_per_s']:>15.1f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

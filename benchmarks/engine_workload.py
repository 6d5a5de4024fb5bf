"""The rollout-engine benchmark's workload (issue 24), shared by the rljax and vLLM sides.

SmolLM2-135M-Instruct (the registry GGUF) on the first `n_prompts` test problems of
`WordProblemTask`, chat-formatted and encoded without BOS (the template writes `<|im_start|>`),
sampled G times each at temperature 1 with up to 512 new tokens, so completion lengths are
heavy-tailed as in real RL. `benchmarks/smollm2.py` formats its prompts with the same function.

Both engines must see the very same token ids, so this module also exports what the vLLM side
needs: the GGUF as a float32 Hugging Face directory (config.json, model.safetensors,
generation_config.json and the tokenizer files) and a JSON file with the prompts' token ids.
Token ids come from rljax's GGUF tokenizer; transformers' GGUF tokenizer splits whitespace
before digits differently (see tests/models/test_smollm2.py), which does not matter because
vLLM is given ids, not text.

  # export the HF directory, check its logits against rljax's, write the workload file
  PYTHONPATH=$PWD python -m benchmarks.engine_workload --out_dir /tmp/smollm2_hf \\
      --prompts_out /tmp/engine_prompts.json

Then `benchmarks/vllm_engine.py` (in its own venv) runs vLLM on them.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

N_PROMPTS = 32
N_SAMPLES = 8
MAX_NEW_TOKENS = 512
TEMPERATURE = 1.0
# The fixed-shape case of benchmarks/smollm2.py: 8 prompts x 1 sample x 64 tokens, no early stop.
FIXED = dict(n_prompts=8, n_samples=1, max_new_tokens=64)


def workload_texts(tokenizer, n_prompts: int = N_PROMPTS, split: str = "test") -> list[str]:
    """The first `n_prompts` WordProblemTask problems of `split`, each rendered as one user turn
    with the tokenizer's chat template (generation prompt included)."""
    from rljax.data.tasks import WordProblemTask

    task = WordProblemTask()
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": task.example(i, split)["prompt"]}]
        )
        for i in range(n_prompts)
    ]


def workload_prompts(tokenizer, n_prompts: int = N_PROMPTS) -> list[list[int]]:
    """Token ids of the workload's prompts: `workload_texts` encoded without BOS.

    Args:
      tokenizer: an rljax tokenizer with `apply_chat_template` (e.g. `gguf_tokenizer(path)`).
      n_prompts: how many test problems, from the first.

    Returns:
      n_prompts lists of token ids, unpadded (ragged lengths).
    """
    return [tokenizer.encode(t, add_bos=False) for t in workload_texts(tokenizer, n_prompts)]


def write_prompts(path: str, prompts: list[list[int]], **meta) -> None:
    """Write `{"prompt_token_ids": prompts, **meta}` as JSON (what vllm_engine.py reads)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({**meta, "prompt_token_ids": prompts}, f)


def export_smollm2_hf(out_dir: str) -> str:
    """Export the registry SmolLM2-135M-Instruct GGUF as a float32 Hugging Face directory.

    Weights and config.json come from rljax (`load_gguf` then `save_hf_checkpoint` as a Llama);
    the tokenizer files from transformers' GGUF loader (`save_pretrained`); generation_config.json
    names the GGUF's BOS/EOS/pad ids, which is where vLLM reads the EOS it stops on.

    Args:
      out_dir: the directory to write (created if needed).

    Returns:
      out_dir.
    """
    import transformers

    from rljax.models import fetch_smollm2, gguf_tokenizer, load_gguf
    from rljax.models.gguf import gguf_limits
    from rljax.models.hf import save_hf_checkpoint

    path = fetch_smollm2()
    config, _, params = load_gguf(path, dtype="float32", param_dtype="float32")
    _, context = gguf_limits(path)
    tok = gguf_tokenizer(path)
    special = dict(bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
    save_hf_checkpoint(
        out_dir,
        config,
        params,
        model_type="llama",
        extra_config=dict(max_position_embeddings=context or 8192, **special),
    )
    hf_tok = transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path)
    )
    if hf_tok.chat_template is None and tok.chat_template is not None:
        hf_tok.chat_template = tok.chat_template
    hf_tok.save_pretrained(out_dir)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(special, f, indent=2)
    return out_dir


def check_logits(out_dir: str, prompt: list[int]) -> dict[str, float]:
    """Logits of transformers on `out_dir` against rljax's on the GGUF, both float32.

    Args:
      out_dir: an `export_smollm2_hf` directory.
      prompt: token ids of one prompt.

    Returns:
      max_abs: max over positions and vocabulary of |transformers - rljax|; max_rel: that over
      max |transformers| (as tests/models/test_smollm2.py measures it); argmax_equal: 1.0 when
      both pick the same token at every position.
    """
    import jax
    import jax.numpy as jnp
    import torch
    import transformers

    from rljax.models import fetch_smollm2, forward, load_gguf

    _, graphdef, params = load_gguf(fetch_smollm2(), dtype="float32", param_dtype="float32")
    tokens = np.asarray([prompt], np.int32)
    mask = np.ones_like(tokens, bool)
    positions = np.arange(tokens.shape[1], dtype=np.int32)[None]
    ours, _ = jax.jit(forward, static_argnums=0)(
        graphdef, params, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask)
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    ours = np.asarray(ours, np.float32)
    max_abs = float(np.max(np.abs(ours - ref)))
    return dict(
        max_abs=max_abs,
        max_rel=max_abs / float(np.max(np.abs(ref))),
        argmax_equal=float(np.array_equal(ours.argmax(-1), ref.argmax(-1))),
    )


def main() -> None:
    from rljax.models import fetch_smollm2, gguf_tokenizer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out_dir", required=True, help="HF directory to write")
    p.add_argument("--prompts_out", required=True, help="workload JSON to write")
    p.add_argument("--n_prompts", type=int, default=N_PROMPTS)
    p.add_argument(
        "--tolerance", type=float, default=1e-4, help="max relative logit difference allowed"
    )
    args = p.parse_args()

    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    path = fetch_smollm2()
    tok = gguf_tokenizer(path)
    prompts = workload_prompts(tok, args.n_prompts)
    export_smollm2_hf(args.out_dir)
    err = check_logits(args.out_dir, prompts[0])
    print(
        f"exported {args.out_dir}; transformers vs rljax logits on prompt 0 "
        f"({len(prompts[0])} tokens): max abs {err['max_abs']:.2e}, rel {err['max_rel']:.2e}, "
        f"argmax equal {bool(err['argmax_equal'])}"
    )
    if not (err["max_rel"] <= args.tolerance and err["argmax_equal"]):
        raise SystemExit(f"logits differ ({err}) beyond {args.tolerance:.0e}; export is wrong")
    lengths = [len(x) for x in prompts]
    write_prompts(
        args.prompts_out,
        prompts,
        model="SmolLM2-135M-Instruct.Q4_1.gguf (float32)",
        task="WordProblemTask test[0:%d], chat template, no BOS" % args.n_prompts,
        eos_id=tok.eos_id,
        logits_vs_rljax=err,
    )
    print(
        f"wrote {args.prompts_out}: {len(prompts)} prompts, lengths "
        f"{min(lengths)}..{max(lengths)} (mean {np.mean(lengths):.1f}), eos {tok.eos_id}"
    )


if __name__ == "__main__":
    main()

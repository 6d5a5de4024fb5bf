"""Tokenizers: byte round trips, left-padded prompt batches, HF tokenizer.json loading."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rljax.models import ByteTokenizer, HFTokenizer, Tokenizer, encode_prompts
from rljax.models.tokenizer import char_spans

_STRINGS = [
    "",
    "hello world",
    "héllo wörld",
    "日本語のテキスト",
    "emoji 🤖👍🏽 and ✓",
    "tabs\tand\nnewlines\r\n",
    "e\u0301 combining",
    "  leading and trailing  ",
    "the quick brown fox",
    "<s>special</s> inside",
]


def test_byte_tokenizer_round_trips_unicode():
    tok = ByteTokenizer()
    assert isinstance(tok, Tokenizer)
    assert (tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id) == (259, 256, 257, 258)
    for text in _STRINGS + ["\x00nul"]:
        ids = tok.encode(text)
        assert ids == list(text.encode("utf-8")) and all(0 <= i < 256 for i in ids)
        assert tok.decode(ids) == text
        framed = tok.encode(text, add_bos=True, add_eos=True)
        assert framed == [257] + ids + [258]
        assert tok.decode(framed) == text
    assert tok.decode([257, 104, 105, 258, 256], skip_special=False) == "<bos>hi<eos><pad>"
    assert tok.decode([0xE6, 0x97, 258]) == "\ufffd"  # a truncated 3-byte character
    with pytest.raises(ValueError, match="id 259"):
        tok.decode([259])


def test_encode_prompts_left_pads():
    tok = ByteTokenizer()
    tokens, mask = encode_prompts(tok, ["ab", "", "abcd"], max_len=6)
    p, b = tok.pad_id, tok.bos_id
    np.testing.assert_array_equal(
        tokens, [[p, p, p, b, 97, 98], [p, p, p, p, p, b], [p, b, 97, 98, 99, 100]]
    )
    np.testing.assert_array_equal(mask, tokens != p)
    assert tokens.dtype == np.int32 and mask.dtype == bool and tokens.shape == (3, 6)

    tokens, mask = encode_prompts(tok, ["xyz"], max_len=3, add_bos=False)
    np.testing.assert_array_equal(tokens, [[120, 121, 122]])
    assert mask.all()


def test_encode_prompts_length_errors_and_truncation():
    tok = ByteTokenizer()
    with pytest.raises(ValueError, match="prompt 1 has 7 tokens, more than max_len=4"):
        encode_prompts(tok, ["ok", "abcdef"], max_len=4)
    tokens, mask = encode_prompts(tok, ["ok", "abcdef"], max_len=4, truncate="left")
    np.testing.assert_array_equal(tokens[1], [tok.bos_id, 100, 101, 102])  # BOS kept, "def"
    tokens, _ = encode_prompts(tok, ["abcdef"], max_len=4, add_bos=False, truncate="left")
    np.testing.assert_array_equal(tokens[0], [99, 100, 101, 102])
    with pytest.raises(ValueError, match="truncate='right'"):
        encode_prompts(tok, ["a"], max_len=4, truncate="right")
    with pytest.raises(ValueError, match="max_len=0"):
        encode_prompts(tok, ["a"], max_len=0)


def _bpe(bos_post_processor: bool = False):
    """A byte-level BPE tokenizer trained in process on a tiny corpus."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tok = RawTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(
        ["hello world", "the quick brown fox jumps over the lazy dog", "héllo wörld ✓ 日本語"] * 10,
        trainer,
    )
    if bos_post_processor:  # as Llama's tokenizer.json: BOS added by "add_special_tokens"
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
        )
    return tok


def _write(directory, raw, **json_files):
    directory.mkdir(exist_ok=True)
    raw.save(str(directory / "tokenizer.json"))
    for name, content in json_files.items():
        (directory / f"{name}.json").write_text(json.dumps(content))
    return directory


def test_hf_tokenizer_matches_tokenizers_library(tmp_path):
    raw = _bpe(bos_post_processor=True)
    eos = {"content": "</s>", "special": True, "lstrip": False, "rstrip": False}
    tok = HFTokenizer.from_dir(
        _write(tmp_path, raw, tokenizer_config={"bos_token": "<s>", "eos_token": eos})
    )
    assert isinstance(tok, Tokenizer)
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 2)  # pad falls back to EOS
    assert tok.vocab_size == raw.get_vocab_size() > 256 + 3  # bytes, specials and merges
    for text in _STRINGS:
        ids = raw.encode(text, add_special_tokens=False).ids
        assert tok.encode(text) == ids, text
        assert tok.encode(text, add_bos=True) == raw.encode(text).ids  # post-processor adds BOS
        assert tok.encode(text, add_bos=True, add_eos=True)[-1] == 2
        if "<s>" not in text:
            assert tok.decode(tok.encode(text, add_bos=True, add_eos=True)) == text
    assert tok.decode([1, 2], skip_special=False) == "<s></s>"

    tokens, mask = encode_prompts(tok, ["hello", "hello world"], max_len=8)
    assert tokens[0, -len(tok.encode("hello", add_bos=True)) :].tolist() == tok.encode(
        "hello", add_bos=True
    )
    assert (tokens[~mask] == tok.pad_id).all() and mask[1].sum() == len(
        tok.encode("hello world")
    ) + 1


@pytest.mark.hf
def test_hf_tokenizer_matches_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    raw = _bpe(bos_post_processor=True)
    directory = _write(tmp_path, raw, tokenizer_config={"bos_token": "<s>", "eos_token": "</s>"})
    ours = HFTokenizer.from_dir(directory)
    theirs = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(directory / "tokenizer.json"), bos_token="<s>", eos_token="</s>"
    )
    assert (theirs.bos_token_id, theirs.eos_token_id) == (ours.bos_id, ours.eos_id)
    for text in _STRINGS:
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False), text
        assert ours.encode(text, add_bos=True) == theirs.encode(text), text
        ids = ours.encode(text, add_bos=True)
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text


def test_hf_special_token_sources(tmp_path):
    raw = _bpe()
    # special_tokens_map.json only, with an explicit pad token.
    tok = HFTokenizer.from_dir(
        _write(
            tmp_path / "a",
            raw,
            special_tokens_map={"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"},
        )
    )
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 0)
    # tokenizer_config.json wins over special_tokens_map.json.
    tok = HFTokenizer.from_dir(
        _write(
            tmp_path / "b",
            raw,
            tokenizer_config={"eos_token": "<s>"},
            special_tokens_map={"eos_token": "</s>"},
        )
    )
    assert tok.eos_id == 1
    # config.json ids only; a list of EOS ids gives the first; an explicit null BOS in
    # tokenizer_config.json wins over config.json's bos_token_id (as in Qwen2).
    tok = HFTokenizer.from_dir(
        _write(
            tmp_path / "c",
            raw,
            config={"eos_token_id": [2, 0], "bos_token_id": 1},
            tokenizer_config={"bos_token": None},
        )
    )
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (None, 2, 2)
    assert tok.encode("hello", add_bos=True) == tok.encode("hello")


def test_hf_tokenizer_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        HFTokenizer.from_dir(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        HFTokenizer.from_dir(tmp_path)
    raw = _bpe()
    with pytest.raises(ValueError, match="no EOS token"):
        HFTokenizer.from_dir(_write(tmp_path / "a", raw))
    with pytest.raises(ValueError, match="eos_token '<eot>' from tokenizer_config.json"):
        HFTokenizer.from_dir(_write(tmp_path / "b", raw, tokenizer_config={"eos_token": "<eot>"}))


def test_char_spans_cover_the_decoded_text():
    tok = ByteTokenizer()
    ids = tok.encode("ab") + [tok.eos_id]
    np.testing.assert_array_equal(char_spans(tok, ids), [[0, 1], [1, 2], [2, 2]])  # EOS: empty
    # "é" is two byte tokens and "€" three: spans never overlap, end at the text's length, and
    # each character lies in exactly one token's span.
    text = "aé€b"
    ids = tok.encode(text)
    spans = char_spans(tok, ids)
    assert spans[-1, 1] == len(text) and (spans[1:, 0] == spans[:-1, 1]).all()
    owners = [[i for i, (s, e) in enumerate(spans) if s <= c < e] for c in range(len(text))]
    assert [len(o) for o in owners] == [1] * len(text)
    assert text[slice(*spans[-1])] == "b"


class SpaceEatingTokenizer:
    """Word tokens whose one-by-one decodes lose the separating space (as SentencePiece's
    leading "▁" does), so spans must come from the decoded prefixes."""

    words = ["x", "=", "1", "+", "y"]

    def decode(self, ids, skip_special=True):
        return " ".join(self.words[i] for i in ids)


def test_char_spans_fall_back_to_prefix_decoding():
    spans = char_spans(SpaceEatingTokenizer(), [0, 1, 2])  # "x = 1"
    np.testing.assert_array_equal(spans, [[0, 1], [1, 3], [3, 5]])

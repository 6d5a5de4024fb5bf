"""The tokenizer a GGUF file describes: byte-level BPE or SentencePiece BPE from its metadata,
plus its chat template.

Byte-level BPE (`tokenizer.ggml.model == "gpt2"`): llama.cpp stores the vocabulary, merges,
token types and a pre-tokenizer *name* (`tokenizer.ggml.pre`); we rebuild an equivalent
`tokenizers.Tokenizer`, applying the pre-tokenizer llama.cpp applies for that name (for
SmolLM2's "smollm": every digit split off, then GPT-2's regex, as the model's own
tokenizer.json does).

SentencePiece BPE (`"llama"`, Gemma): no merges are stored. SentencePiece lists its pieces in
merge order (a normal piece's score is minus its rank), and llama.cpp merges the adjacent pair
whose concatenation is the best piece; a BPE whose merges are every (left, right) split of each
piece, ranked by the piece's position, is the same. Position, not score, also ranks the
user-defined space runs ("  ", scored -1000 but listed early), which llama.cpp matches whole,
as transformers' GGUF loader does. Spaces become "▁" (no prefix space unless
`tokenizer.ggml.add_space_prefix`), and text no piece covers falls back to the `<0xXX>` bytes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from rljax.models.gguf import _field, _reader
from rljax.models.tokenizer import HFTokenizer, byte_alphabet

# llama.cpp token types (gguf.TokenType).
_CONTROL, _USER_DEFINED = 3, 4
_SPACE = "\u2581"  # SentencePiece's visible space

# Pre-tokenizer regexes, as llama.cpp applies them for each `tokenizer.ggml.pre` value.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Each pre-tokenizer family: (regex to isolate first or None, digits split one by one,
# GPT-2 regex inside ByteLevel, ignore_merges).
_PRE_FAMILIES = {
    "gpt2": (None, False, True, False),
    "starcoder": (None, True, True, False),  # \p{N} isolated, then the GPT-2 regex
    "llama3": (_LLAMA3_SPLIT, False, False, True),
    "qwen2": (_QWEN2_SPLIT, False, False, False),
}
_PRE_TYPES = {
    **dict.fromkeys(("default", "gpt-2", "gpt2", "mpt", "olmo", "jais"), "gpt2"),
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"),
        "starcoder",
    ),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe"), "llama3"),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), "qwen2"),
}


class GGUFTokenizer(HFTokenizer):
    """An `HFTokenizer` built from GGUF metadata, plus the file's chat template.

    Attributes:
      chat_template: the Jinja template from `tokenizer.chat_template` (None if absent).
      add_bos_token: whether the model expects BOS before every prompt
        (`tokenizer.ggml.add_bos_token`). Pass it as `encode_prompts(..., add_bos=...)`: for
        SmolLM2 it is False and BOS is `<|im_start|>`, which the chat template already writes.
    """

    def __init__(
        self,
        tokenizer: Any,
        bos_id: int | None,
        eos_id: int,
        pad_id: int | None = None,
        chat_template: str | None = None,
        add_bos_token: bool = False,
    ):
        super().__init__(tokenizer, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
        self.chat_template = chat_template
        self.add_bos_token = add_bos_token
        self._template = None

    def tokenizer_config(self) -> dict[str, Any]:
        """The special tokens, the chat template and the BOS flag."""
        config = {**super().tokenizer_config(), "add_bos_token": self.add_bos_token}
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        return config

    def _token(self, token_id: int | None) -> str | None:
        return None if token_id is None else self._tok.id_to_token(token_id)

    def apply_chat_template(
        self,
        messages: Iterable[dict[str, Any]],
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """Render `messages` ([{"role": ..., "content": ...}]) with the file's chat template.

        Rendered as transformers does (sandboxed Jinja, trim_blocks, lstrip_blocks, loop
        controls, `raise_exception`, `strftime_now`, an unescaped `tojson`), with bos_token,
        eos_token, pad_token and unk_token defined; `kwargs` reach the template too.
        """
        if self.chat_template is None:
            raise ValueError(
                "this GGUF file has no tokenizer.chat_template; format the prompt yourself"
            )
        if self._template is None:
            self._template = _compile_template(self.chat_template)
        special = {
            "bos_token": self._token(self._bos_id),
            "eos_token": self._token(self._eos_id),
            "pad_token": self._token(self._pad_id),
        }
        return self._template.render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            tools=None,
            documents=None,
            **{**special, **kwargs},
        )


def _compile_template(source: str):
    """A Jinja template in the environment transformers renders chat templates in."""
    import datetime
    import json

    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ImportError("chat templates need jinja2: pip install 'jinja2>=3.1'") from None

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(source)


def _pre_tokenizer(pre: str, path: str):
    """(pre_tokenizer, ignore_merges) for llama.cpp's `tokenizer.ggml.pre` value."""
    from tokenizers import Regex, pre_tokenizers

    family = _PRE_TYPES.get(pre)
    if family is None:
        raise ValueError(
            f"{path}: tokenizer.ggml.pre={pre!r} is not supported; supported: "
            f"{sorted(_PRE_TYPES)}. Add its split regex (llama.cpp's llama-vocab.cpp) to "
            "rljax.models.gguf_tokenizer._PRE_TYPES"
        )
    split, digits, gpt2_regex, ignore_merges = _PRE_FAMILIES[family]
    steps = []
    if split is not None:
        steps.append(pre_tokenizers.Split(Regex(split), behavior="isolated"))
    if digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=gpt2_regex))
    return pre_tokenizers.Sequence(steps), ignore_merges


def _position_merges(tokens: list[str]) -> list[tuple[str, str]]:
    """Every (left, right) split of each token into two tokens, best first: by the merged
    token's position in the file, then the longer left piece."""
    known = set(tokens)
    return [
        (token[:cut], token[cut:])
        for token in tokens
        for cut in range(len(token) - 1, 0, -1)
        if token[:cut] in known and token[cut:] in known
    ]


def _sentencepiece(reader, tokens: list[str], types: list[int]):
    """A `tokenizers.Tokenizer` equal to llama.cpp's SentencePiece-BPE ("llama") vocabulary.

    Tokens of two or more spaces are stored as spaces but looked up as "▁" runs, so they
    are respelled; control tokens become special added tokens and user-defined ones plain
    added tokens, matched whole in the text.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    tokens = [_SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    unk = _field(reader, "tokenizer.ggml.unknown_token_id", None)
    bpe = models.BPE(
        vocab=vocab,
        merges=_position_merges(tokens),
        unk_token=None if unk is None else tokens[int(unk)],
        fuse_unk=True,
        byte_fallback=True,
    )
    tok = Tokenizer(bpe)
    prefix = bool(_field(reader, "tokenizer.ggml.add_space_prefix", False))
    space = normalizers.Replace(" ", _SPACE)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(_SPACE), space]) if prefix else space
    steps = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    special = [t for t, k in zip(tokens, types) if k == _CONTROL]
    plain = [t for t, k in zip(tokens, types) if k == _USER_DEFINED and _SPACE not in t]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain])
    return tok


def gguf_tokenizer(path: str) -> GGUFTokenizer:
    """The tokenizer a GGUF file describes: byte-level BPE (`tokenizer.ggml.model == "gpt2"`)
    or SentencePiece BPE (`"llama"`, e.g. Gemma 3; see the module docstring).

    Built from `tokenizer.ggml.tokens`, `.merges` (byte-level BPE only) and `.token_type`:
    control tokens (e.g. `<|im_start|>`) become special added tokens and user-defined ones
    plain added tokens, so both are matched whole in text. A byte-level pre-tokenizer follows
    `tokenizer.ggml.pre` as llama.cpp does (e.g. "smollm": every digit on its own, then
    GPT-2's split regex).

    Raises:
      FileNotFoundError: the file does not exist.
      ValueError: a unigram or other vocabulary type, an unknown pre-tokenizer type, or
        missing metadata.
    """
    path = os.fspath(path)
    reader = _reader(path)
    kind = _field(reader, "tokenizer.ggml.model")
    if kind not in ("gpt2", "llama"):
        raise ValueError(
            f"{path}: tokenizer.ggml.model={kind!r} is not supported; rljax builds byte-level "
            "BPE ('gpt2') and SentencePiece BPE ('llama') tokenizers from GGUF. Load this "
            "model's tokenizer.json with HFTokenizer.from_dir instead"
        )
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    types = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    if kind == "llama":
        tok = _sentencepiece(reader, tokens, types)
    else:
        tok = _byte_level(reader, path, tokens, types)
    return _wrap(reader, path, tok, len(tokens))


def _byte_level(reader, path: str, tokens: list[str], types: list[int]):
    """A `tokenizers.Tokenizer` for a byte-level BPE ("gpt2") vocabulary."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    pre_tokenizer, ignore_merges = _pre_tokenizer(pre, path)

    spell = byte_alphabet()
    alphabet = set(spell.values())
    vocab: dict[str, int] = {}
    added = []
    for i, (token, token_type) in enumerate(zip(tokens, types)):
        if token_type in (_CONTROL, _USER_DEFINED):
            special = token_type == _CONTROL
            added.append(AddedToken(token, special=special, normalized=False))
        elif not set(token) <= alphabet:  # stored as raw text: respell in the byte alphabet
            token = "".join(spell[b] for b in token.encode("utf-8"))
        vocab.setdefault(token, i)
    bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges, fuse_unk=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([t for t in added if t.special])
    tok.add_tokens([t for t in added if not t.special])
    return tok


def _wrap(reader, path: str, tok, n_tokens: int) -> GGUFTokenizer:
    """`tok` with the file's special ids, chat template and BOS flag."""

    def token_id(key: str) -> int | None:
        value = _field(reader, f"tokenizer.ggml.{key}", None)
        if value is not None and not 0 <= int(value) < n_tokens:
            raise ValueError(f"{path}: tokenizer.ggml.{key}={value} is outside the vocabulary")
        return None if value is None else int(value)

    eos = token_id("eos_token_id")
    if eos is None:
        raise ValueError(f"{path} declares no tokenizer.ggml.eos_token_id; the sampler stops on it")
    return GGUFTokenizer(
        tok,
        bos_id=token_id("bos_token_id"),
        eos_id=eos,
        pad_id=token_id("padding_token_id"),
        chat_template=_field(reader, "tokenizer.chat_template", None),
        add_bos_token=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
    )

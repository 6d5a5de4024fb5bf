"""The tokenizer a GGUF file describes: byte-level BPE from its metadata, plus its chat template.

llama.cpp stores the vocabulary, merges, token types and a pre-tokenizer *name*
(`tokenizer.ggml.pre`); we rebuild an equivalent `tokenizers.Tokenizer`, applying the
pre-tokenizer llama.cpp applies for that name (for SmolLM2's "smollm": every digit split off,
then GPT-2's regex, as the model's own tokenizer.json does).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from rljax.models.gguf import _field, _reader
from rljax.models.tokenizer import HFTokenizer

# llama.cpp token types (gguf.TokenType).
_CONTROL, _USER_DEFINED = 3, 4

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


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table used by byte-level BPE vocabularies."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


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


def gguf_tokenizer(path: str) -> GGUFTokenizer:
    """The byte-level BPE tokenizer a GGUF file describes (`tokenizer.ggml.model == "gpt2"`).

    Built from `tokenizer.ggml.tokens`, `.merges` and `.token_type`: control tokens (e.g.
    `<|im_start|>`) become special added tokens and user-defined ones plain added tokens, so
    both are matched whole in text. The pre-tokenizer follows `tokenizer.ggml.pre` as llama.cpp
    does (e.g. "smollm": every digit on its own, then GPT-2's split regex).

    Raises:
      FileNotFoundError: the file does not exist.
      ValueError: a sentencepiece/unigram vocabulary, an unknown pre-tokenizer type, or
        missing metadata.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models

    path = os.fspath(path)
    reader = _reader(path)
    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"{path}: tokenizer.ggml.model={kind!r} is not supported; rljax builds byte-level "
            "BPE ('gpt2') tokenizers from GGUF. Load this model's tokenizer.json with "
            "HFTokenizer.from_dir instead"
        )
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    types = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    pre_tokenizer, ignore_merges = _pre_tokenizer(pre, path)

    spell = _byte_alphabet()
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

    def token_id(key: str) -> int | None:
        value = _field(reader, f"tokenizer.ggml.{key}", None)
        if value is not None and not 0 <= int(value) < len(tokens):
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

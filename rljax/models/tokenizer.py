"""Tokenizers: a dependency-free byte tokenizer and Hugging Face `tokenizers` from a local dir.

Both follow the `Tokenizer` protocol, which is all the samplers and data pipelines use.
`encode_prompts` turns a list of prompts into the static-shape, LEFT-padded batch the sampler
expects (real tokens flush right, so every row's next token is written at the same slot).
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Tokenizer(Protocol):
    """What rljax needs from a tokenizer: text <-> ids and the special ids."""

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Token ids of `text`, optionally framed by BOS/EOS."""
        ...

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of `ids`; special tokens are dropped when `skip_special`."""
        ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def bos_id(self) -> int | None: ...

    @property
    def eos_id(self) -> int: ...


def byte_alphabet() -> dict[int, str]:
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


def _write_tokenizer_files(path: str, backend: Any, config: dict[str, Any]) -> None:
    """tokenizer.json (a `tokenizers.Tokenizer`) and tokenizer_config.json (`config`, as a
    `PreTrainedTokenizerFast`) in `path`, which transformers' AutoTokenizer loads."""
    os.makedirs(path, exist_ok=True)
    backend.save(os.path.join(path, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **config}
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
        json.dump(config, fh, indent=2, sort_keys=True, ensure_ascii=False)


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0..255, then pad=256, bos=257, eos=258 (vocab 259).

    Needs no files, round-trips any string exactly, and suits tiny models on synthetic tasks.
    """

    _SPECIAL_NAMES = {256: "<pad>", 257: "<bos>", 258: "<eos>"}

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of the ids; invalid UTF-8 (a model may emit any bytes) becomes U+FFFD."""
        pieces: list[str] = []
        run = bytearray()
        for i in (int(i) for i in ids):
            if 0 <= i < 256:
                run.append(i)
                continue
            if i not in self._SPECIAL_NAMES:
                raise ValueError(
                    f"id {i} is outside ByteTokenizer's vocabulary [0, {self.vocab_size})"
                )
            pieces.append(run.decode("utf-8", errors="replace"))
            run = bytearray()
            if not skip_special:
                pieces.append(self._SPECIAL_NAMES[i])
        pieces.append(run.decode("utf-8", errors="replace"))
        return "".join(pieces)

    @property
    def vocab_size(self) -> int:
        return 259

    @property
    def pad_id(self) -> int:
        return 256

    @property
    def bos_id(self) -> int:
        return 257

    @property
    def eos_id(self) -> int:
        return 258

    def save_pretrained(self, path: str) -> None:
        """Write tokenizer.json and tokenizer_config.json that transformers loads as the same
        tokenizer: a byte-level BPE whose 256 symbols are the bytes (ids 0..255) with no
        merges, then the three special tokens."""
        import tokenizers

        vocab = {char: byte for byte, char in byte_alphabet().items()}
        backend = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, merges=[]))
        backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
            add_prefix_space=False, use_regex=False
        )
        backend.decoder = tokenizers.decoders.ByteLevel()
        backend.add_special_tokens([self._SPECIAL_NAMES[i] for i in sorted(self._SPECIAL_NAMES)])
        names = {"pad_token": 256, "bos_token": 257, "eos_token": 258}
        _write_tokenizer_files(
            path,
            backend,
            {**{key: self._SPECIAL_NAMES[i] for key, i in names.items()}, "add_bos_token": False},
        )


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _token_content(value: Any) -> str | None:
    """A special token as written in tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class HFTokenizer(Tokenizer):
    """A Hugging Face fast tokenizer (tokenizer.json) loaded with the `tokenizers` library.

    Encoding is chat-template free and adds no special tokens of its own: the tokenizer.json
    post-processor is bypassed, and BOS/EOS are added only when asked. As in transformers,
    special-token strings that appear in the text (e.g. "<|im_start|>") map to their ids.
    """

    def __init__(self, tokenizer: Any, bos_id: int | None, eos_id: int, pad_id: int | None = None):
        """Wrap a `tokenizers.Tokenizer`; `pad_id=None` pads with EOS."""
        self._tok = tokenizer
        self._bos_id = bos_id
        self._eos_id = eos_id
        self._pad_id = eos_id if pad_id is None else pad_id

    @classmethod
    def from_dir(cls, path: str) -> "HFTokenizer":
        """Load tokenizer.json from a local directory, with its special tokens.

        BOS/EOS/PAD are read from tokenizer_config.json, then special_tokens_map.json (token
        strings), then config.json (`*_token_id`): the first file that has the key wins, and an
        explicit null there means "none" (Qwen2 declares `"bos_token": null` although its
        config.json has a bos_token_id). PAD falls back to EOS when
        none is set (Llama ships without one), which is safe because padding is masked. BOS may
        be absent (Qwen2); `encode(add_bos=True)` then adds nothing.

        Raises:
          FileNotFoundError: the directory or its tokenizer.json is missing.
          ValueError: no EOS token is declared, or a declared token is not in the vocabulary.
        """
        import tokenizers  # imported here so ByteTokenizer users need no extra package

        path = os.fspath(path)
        if not os.path.isdir(path):
            raise FileNotFoundError(
                f"tokenizer directory {path!r} does not exist; pass the local "
                "directory that holds tokenizer.json"
            )
        file = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(file):
            raise FileNotFoundError(
                f"{file} not found; rljax loads only fast tokenizers (tokenizer.json). Convert a "
                "slow (sentencepiece) tokenizer with transformers' AutoTokenizer.from_pretrained("
                "..., use_fast=True).save_pretrained(dir)"
            )
        tok = tokenizers.Tokenizer.from_file(file)
        sources = [
            (_read_json(os.path.join(path, name)), name)
            for name in ("tokenizer_config.json", "special_tokens_map.json")
        ]
        model_config = _read_json(os.path.join(path, "config.json"))

        def resolve(kind: str) -> int | None:
            for source, name in sources:
                if f"{kind}_token" not in source:
                    continue
                content = _token_content(source[f"{kind}_token"])
                if content is None:  # declared absent, e.g. Qwen2's "bos_token": null
                    return None
                token_id = tok.token_to_id(content)
                if token_id is None:
                    raise ValueError(
                        f"{kind}_token {content!r} from {name} is not in the "
                        f"vocabulary of {file}; fix {name}"
                    )
                return token_id
            token_id = model_config.get(f"{kind}_token_id")
            if isinstance(token_id, list):  # e.g. several EOS ids; the first is the primary one
                token_id = token_id[0] if token_id else None
            return token_id

        eos_id = resolve("eos")
        if eos_id is None:
            raise ValueError(
                f"no EOS token declared in {path}: set eos_token in "
                "tokenizer_config.json (or eos_token_id in config.json); the sampler "
                "stops on it"
            )
        return cls(tok, bos_id=resolve("bos"), eos_id=eos_id, pad_id=resolve("pad"))

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        bos = [self._bos_id] if add_bos and self._bos_id is not None else []
        return bos + ids + ([self._eos_id] if add_eos else [])

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer can produce (with added tokens); a model's vocab may be larger."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def tokenizer_config(self) -> dict[str, Any]:
        """The tokenizer_config.json fields `save_pretrained` writes: the special tokens."""
        tokens = {"bos_token": self._bos_id, "eos_token": self._eos_id, "pad_token": self._pad_id}
        return {key: self._tok.id_to_token(i) for key, i in tokens.items() if i is not None}

    def save_pretrained(self, path: str) -> None:
        """Write tokenizer.json and tokenizer_config.json (special tokens, and what
        `tokenizer_config` adds) that transformers' AutoTokenizer loads."""
        _write_tokenizer_files(path, self._tok, self.tokenizer_config())

    @property
    def pad_id(self) -> int:
        return self._pad_id

    @property
    def bos_id(self) -> int | None:
        return self._bos_id

    @property
    def eos_id(self) -> int:
        return self._eos_id


def encode_prompts(
    tokenizer: Tokenizer,
    texts: list[str],
    max_len: int,
    add_bos: bool = True,
    truncate: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Encode prompts into a LEFT-padded batch.

    Args:
      tokenizer: any `Tokenizer`.
      texts: B prompt strings.
      max_len: the padded length T.
      add_bos: prepend the tokenizer's BOS (if it has one).
      truncate: None to raise on a prompt longer than max_len, or "left" to drop its oldest
        tokens (the BOS, when added, is kept in front).

    Returns:
      tokens: [B, T] int32, padding (pad_id) on the left, prompt flush right.
      mask: [B, T] bool, True on real tokens.
    """
    if max_len <= 0:
        raise ValueError(f"max_len={max_len} must be positive")
    if truncate not in (None, "left"):
        raise ValueError(f"truncate={truncate!r}; use None (raise on long prompts) or 'left'")
    tokens = np.full((len(texts), max_len), tokenizer.pad_id, np.int32)
    mask = np.zeros((len(texts), max_len), bool)
    for row, text in enumerate(texts):
        ids = tokenizer.encode(text, add_bos=add_bos)
        if len(ids) > max_len:
            if truncate is None:
                raise ValueError(
                    f"prompt {row} has {len(ids)} tokens, more than max_len={max_len}; "
                    "raise max_len or pass truncate='left'"
                )
            has_bos = add_bos and tokenizer.bos_id is not None and ids[0] == tokenizer.bos_id
            ids = ids[:1] + ids[len(ids) - max_len + 1 :] if has_bos else ids[len(ids) - max_len :]
        if ids:
            tokens[row, max_len - len(ids) :] = ids
            mask[row, max_len - len(ids) :] = True
    return tokens, mask


def char_spans(tokenizer: Tokenizer, ids: Iterable[int]) -> np.ndarray:
    """[n, 2] (start, end) character span of each token in `tokenizer.decode(ids)`.

    For token-level rewards that blame a span of the text (e.g. a failing line of code). When
    decoding token by token reproduces the whole text (byte-level BPE on ASCII, the byte
    tokenizer on ASCII) the spans are the pieces' lengths; otherwise they come from the lengths
    of the decoded prefixes, clipped to the text and made non-decreasing, so spans never
    overlap and a character split over several tokens (a UTF-8 sequence over byte tokens) lies
    in one of them. Special tokens dropped by `decode` get empty spans.
    """
    ids = [int(i) for i in ids]
    text = tokenizer.decode(ids)
    pieces = [len(tokenizer.decode([i])) for i in ids]
    if sum(pieces) == len(text) and "".join(tokenizer.decode([i]) for i in ids) == text:
        ends = np.cumsum(pieces, dtype=np.int64)
    else:
        prefix = [len(tokenizer.decode(ids[: t + 1])) for t in range(len(ids))]
        ends = np.minimum.accumulate(np.minimum(prefix, len(text))[::-1])[::-1].astype(np.int64)
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    return np.stack([starts, ends], axis=1) if ids else np.zeros((0, 2), np.int64)

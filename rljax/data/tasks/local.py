"""Tasks from local data files: math (GSM8K / MATH), code (MBPP) or exact-answer JSONL rows.

`LocalTask` turns the rows of a JSONL, parquet or ArrayRecord file, of a Hugging Face
`datasets` directory (`Dataset.save_to_disk`) or of a prepared TFDS directory
(`rljax.data.tfds_source`) into a `Task`, so the grain pipelines in `rljax.data.pipeline`
shuffle, shard and checkpoint them like any other task. Nothing is downloaded: the user names
the files. JSONL, parquet and `datasets` rows are read once, at construction, into memory;
ArrayRecord rows (see `rljax.data.array_record.convert`) and TFDS rows are read by index
when asked for, for sets too large to hold on every host.

Without a test file, a row is held out for test when a fixed hash of its prompt text (salted
by `seed`) falls below `test_fraction`: the splits are disjoint, identical on every host and
run, a prompt repeated in the file stays in one split, and appending rows to the file neither
moves old rows between splits nor changes their indices (rows keep their file order).
"""

from __future__ import annotations

import dataclasses
import json
import os
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from rljax.data.array_record import ArrayRecordRows
from rljax.data.tasks.split_hash import text_hash, unit_hash
from rljax.data.tfds_source import TfdsRows, split_location
from rljax.rewards.code import CodeReward, code_reward, token_level_rewards
from rljax.rewards.math import last_boxed, math_reward
from rljax.rewards.math_verify import math_verify_reward

RewardFn = Callable[[str, str], float]

_FORMATS = ("jsonl", "parquet", "array_record", "hf_dataset", "tfds")
# The split a TFDS directory gives each key when its location names none.
_TFDS_SPLITS = {"task.train_path": "train", "task.test_path": "test"}
_SUFFIXES = {
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
    ".array_record": "array_record",
    ".arrayrecord": "array_record",
}
_KINDS = ("math", "exact", "code")
_GRADERS = ("rljax", "math_verify")  # kind="math"
# (prompt_field, answer_field) when not given: GSM8K's and MBPP's column names.
_DEFAULT_FIELDS = {
    "math": ("question", "answer"),
    "exact": ("question", "answer"),
    "code": (
        "text",
        "test_list",
    ),
}
_GSM8K_MARK = "####"
# MBPP's reference solution column, kept for the SFT target of kind="code".
_CODE_SOLUTION_FIELD = "code"
_CODE_SETUP_FIELD = "test_setup_code"
_PARQUET_BATCH_ROWS = 4096
# A Hugging Face `datasets` directory (`save_to_disk`): its state (the Arrow files) and, for a
# DatasetDict, the split list.
_HF_STATE, _HF_DICT = "state.json", "dataset_dict.json"


def resolve_format(path: str | os.PathLike, format: str = "auto") -> str:
    """The file format: `format` itself, or with "auto" the one its suffix names.

    Returns:
      "jsonl" (.jsonl, .json: one JSON object a line), "parquet", "array_record"
      (.array_record, .arrayrecord), "hf_dataset" (a directory written by Hugging Face
      `datasets`' `Dataset.save_to_disk`: its state.json and Arrow files) or "tfds" (a
      prepared TFDS directory, "DIR" or "DIR:SPLIT": `rljax.data.tfds_source`).
    """
    if format == "auto":
        if _is_hf_dataset(path):
            return "hf_dataset"
        if split_location(path, "train") is not None:
            return "tfds"
        suffix = os.path.splitext(os.fspath(path))[1].lower()
        if suffix not in _SUFFIXES:
            raise ValueError(
                f"cannot tell the format of {os.fspath(path)} from its suffix {suffix!r} "
                f"(known: {sorted(_SUFFIXES)}); pass task.format as one of {_FORMATS}"
            )
        return _SUFFIXES[suffix]
    if format not in _FORMATS:
        raise ValueError(f"unknown format={format!r}; use 'auto' or one of {_FORMATS}")
    return format


def iter_file_rows(
    path: str | os.PathLike, format: str = "auto"
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Stream (where, row) pairs of a data file, in file order; `where` names the row in errors.

    JSONL rows are named by 1-based line ("data.jsonl line 3"; blank lines are skipped), parquet
    and ArrayRecord rows by 0-based row ("data.parquet row 2"). A TFDS directory without a
    split reads its "train" split.
    """
    path = os.fspath(path)
    format = resolve_format(path, format)
    if format == "jsonl":
        with open(path, "rb") as f:  # bytes: a line that is not UTF-8 is named by its number
            for lineno, data in enumerate(f, start=1):
                where = f"{path} line {lineno}"
                try:
                    line = data.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise ValueError(
                        f"{where} is not UTF-8 (byte {data[err.start]:#04x} at position "
                        f"{err.start + 1} of the line); re-save the file as UTF-8"
                    ) from None
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{where} is not valid JSON: {err}") from err
                if not isinstance(row, dict):
                    raise ValueError(
                        f"{where} is a JSON {type(row).__name__}, not an object (JSONL: one "
                        "object per line)"
                    )
                yield where, row
    elif format == "parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as err:
            raise ImportError(f"reading {path} needs pyarrow: pip install pyarrow") from err
        i = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=_PARQUET_BATCH_ROWS):
            for row in batch.to_pylist():
                yield f"{path} row {i}", row
                i += 1
    elif format == "hf_dataset":
        for i, row in enumerate(_hf_dataset_rows(path)):
            yield f"{path} row {i}", row
    else:
        rows = _indexed_rows(path, format, "train")
        for i in range(len(rows)):
            yield f"{path} row {i}", rows[i]


def _hf_dataset_rows(path: str) -> Iterator[dict[str, Any]]:
    """The rows of a `Dataset.save_to_disk` directory, in order, read with pyarrow alone.

    The directory's state.json lists its Arrow files (Arrow IPC streams), in order; that is
    all `datasets.load_from_disk` reads for a dataset without an indices mapping, which
    `save_to_disk` never writes (it flattens one first). Reading it here spares the
    `datasets` package and its dependencies for a few files.
    """
    if os.path.exists(os.path.join(path, _HF_DICT)):
        raise ValueError(
            f"{path} holds a DatasetDict; point the task at one of its splits, e.g. "
            f"{os.path.join(path, 'train')}"
        )
    import pyarrow as pa

    with open(os.path.join(path, _HF_STATE), encoding="utf-8") as f:
        state = json.load(f)
    for entry in state.get("_data_files", []):
        with pa.memory_map(os.path.join(path, entry["filename"])) as source:
            for batch in pa.ipc.open_stream(source):
                yield from batch.to_pylist()


def _indexed_rows(path: str, format: str, default_split: str) -> Sequence[dict[str, Any]]:
    """The rows of a file read by index: an ArrayRecord file, or a TFDS directory's split."""
    if format != "tfds":
        return ArrayRecordRows(path)
    location = split_location(path, default_split)
    if location is None:
        raise ValueError(
            f"{path} is not a prepared TFDS directory (DATA_DIR/NAME[/CONFIG]/VERSION holding "
            "dataset_info.json), optionally followed by :SPLIT"
        )
    return TfdsRows(*location)


def _is_hf_dataset(path: str | os.PathLike) -> bool:
    return os.path.isdir(path) and (
        os.path.exists(os.path.join(path, _HF_STATE))
        or os.path.exists(os.path.join(path, _HF_DICT))
    )


def final_answer(answer: str) -> str:
    """The final answer inside a reference solution, for the reward (interpretation).

    GSM8K: the text after the last "####" ("...so 6 + 4 = 10.\\n#### 10" -> "10"). MATH: the
    contents of the last balanced \\boxed{...} or \\fbox{...}
    (`rljax.rewards.math.last_boxed`). Anything else is already final.
    """
    if _GSM8K_MARK in answer:
        return answer.rsplit(_GSM8K_MARK, 1)[1].strip()
    boxed = last_boxed(answer)
    return (answer if boxed is None else boxed).strip()


def normalize_text(text: str) -> str:
    """Unicode NFKC, case folded, whitespace runs collapsed to one space and trimmed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def exact_match_reward(completion: str, answer: str) -> float:
    """1.0 if the completion equals the answer after `normalize_text`, else 0.0."""
    return 1.0 if normalize_text(completion) == normalize_text(answer) else 0.0


@dataclasses.dataclass(frozen=True)
class _Split:
    """One split: its rows (examples, or raw ArrayRecord rows) and the row numbers it uses."""

    rows: Sequence[dict[str, Any]]
    indices: np.ndarray | None  # row numbers in `rows`; None: all of them
    raw: bool  # rows still need `_to_example`
    path: str
    wheres: Sequence[str] | None = None  # each row's place in the file; None: "path row i"

    def where(self, row: int) -> str:
        """Row `row` of `rows` as its place in the file ("data.jsonl line 3"), for errors."""
        return f"{self.path} row {row}" if self.wheres is None else self.wheres[row]

    def __len__(self) -> int:
        return len(self.rows) if self.indices is None else len(self.indices)


@dataclasses.dataclass(frozen=True)
class LocalTask:
    """A `Task` over the rows of local JSONL, parquet or ArrayRecord files.

    kind="math" (GSM8K, MATH): the prompt is the row's `prompt_field`; the answer is the
    row's `answer_field` (a number or a solution text). The reward is
    `rljax.rewards.math.math_reward` against `final_answer(answer)` (after "####" or in
    the last \\boxed{}), so a solution may reason first. With `keep_solution`, the example's
    answer is the whole solution and `sft_target` teaches it; otherwise only the final answer.

    kind="exact": the reward is 1.0 when the completion equals the answer after
    `normalize_text` (case, Unicode form and whitespace ignored).

    kind="code" (MBPP): the prompt is the row's `prompt_field` (MBPP "text"; sanitized MBPP
    "prompt") followed by "\\nYour code should pass this test:\\n" and the first assert of
    `answer_field` (MBPP "test_list"). Interpretation: the MBPP paper (Austin et al., 2021)
    shows all three asserts; one fixes the function's name and signature and keeps the rest
    unseen. The answer is JSON: {"tests": [asserts], "solution": code} ("solution"
    from MBPP's "code" column, when present and `keep_solution`; a non-empty
    "test_setup_code" is put first in "tests", since the asserts run in order after it).
    The reward is the execution-aware `rljax.rewards.code.code_reward` (syntax, tests passed,
    style, security; run in the sandbox with `code_timeout_s` and `code_memory_mb`), or
    `reward_fn(completion, json.dumps(tests))` when given. `token_rewards` maps its outcome to
    the completion's tokens (the failing line's tokens share `line_penalty`).

    Attributes:
      train_path: the train file (config key `task.train_path`); for TFDS its directory,
        whose "train" split it reads ("DIR:SPLIT" another, in TFDS's split syntax).
      test_path: the test file (a TFDS directory's "test" split, or "DIR:SPLIT"); None holds
        out rows of train_path by a hash of their prompt.
      format: "auto" (from each file's suffix, a `save_to_disk` directory's state.json, or a
        TFDS directory's dataset_info.json), "jsonl", "parquet", "array_record", "hf_dataset"
        or "tfds".
      prompt_field, answer_field: the row's columns; None uses the kind's default
        ("question"/"answer" for math and exact, "text"/"test_list" for code).
      kind: "math", "exact" or "code" (see above).
      test_fraction: share of rows held out for test when test_path is None.
      seed: salts the held-out hash: another seed holds out another subset (the pipelines'
        shuffle has its own seed).
      keep_solution: keep reference solutions in the answer for SFT. RL then needs
        `prompt_dataset(..., max_answer_len=...)` long enough for them.
      reward_fn: reward(completion, reference) replacing the kind's own, where reference is
        the final answer (math), the answer (exact) or the JSON list of asserts (code).
      code_timeout_s, code_memory_mb: the sandbox's limits for one completion and its tests.
      line_penalty: kind="code" token rewards: the penalty shared by the failing line's tokens.
      grader: kind="math": "rljax" (`rljax.rewards.math.math_equal`: exact numbers, no
        computer algebra) or "math_verify" (Hugging Face's math-verify, symbolic; the `math`
        extra). `benchmarks/math_graders.py` compares them.
    """

    train_path: str
    test_path: str | None = None
    format: str = "auto"
    prompt_field: str | None = None
    answer_field: str | None = None
    kind: str = "math"
    test_fraction: float = 0.1
    seed: int = 0
    keep_solution: bool = True
    reward_fn: RewardFn | None = None
    code_timeout_s: float = 2.0
    code_memory_mb: int = 256
    line_penalty: float = 0.5
    grader: str = "rljax"
    _splits: dict[str, _Split] = dataclasses.field(init=False, repr=False, compare=False)

    splits = ("train", "test")

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise ValueError(f"kind={self.kind!r} must be one of {_KINDS}")
        if self.grader not in _GRADERS:
            raise ValueError(f"grader={self.grader!r} must be one of {_GRADERS}")
        if self.code_timeout_s <= 0 or self.code_memory_mb < 16:
            raise ValueError(
                f"code_timeout_s={self.code_timeout_s} must be > 0 and code_memory_mb="
                f"{self.code_memory_mb} >= 16"
            )
        if self.test_path is None and not 0.0 < self.test_fraction < 1.0:
            raise ValueError(
                f"test_fraction={self.test_fraction} must be strictly between 0 and 1 when "
                "test_path is None (or pass task.test_path)"
            )
        if self.seed < 0:
            raise ValueError(f"seed={self.seed} must be >= 0")
        object.__setattr__(self, "_splits", self._load())

    @property
    def fields(self) -> tuple[str, str]:
        """(prompt_field, answer_field), the kind's defaults filled in."""
        prompt_default, answer_default = _DEFAULT_FIELDS[self.kind]
        return self.prompt_field or prompt_default, self.answer_field or answer_default

    def split_size(self, split: str) -> int:
        """Rows in `split`."""
        return len(self._split(split))

    def example(self, index: int, split: str) -> dict[str, str]:
        """dict(prompt=..., answer=...) of the split's `index`-th row (rows in file order)."""
        s = self._split(split)
        if not 0 <= index < len(s):
            raise ValueError(f"index={index} is out of range [0, {len(s)}) for split {split!r}")
        row = self._row(index, split)
        if s.raw:
            return self._to_example(s.rows[row], s.where(row))
        return s.rows[row]

    def source(self, index: int, split: str) -> str:
        """Where the split's `index`-th example sits in its file ("train.jsonl line 7")."""
        return self._split(split).where(self._row(index, split))

    def _row(self, index: int, split: str) -> int:
        """The row number in its file's rows of the split's `index`-th example."""
        s = self._split(split)
        return int(index) if s.indices is None else int(s.indices[index])

    def _code_reward(self, completion: str, answer: str) -> CodeReward:
        tests = json.loads(answer)["tests"]
        return code_reward(
            completion, tests, timeout_s=self.code_timeout_s, memory_mb=self.code_memory_mb
        )

    def token_rewards(
        self, completion: str, answer: str, spans: np.ndarray
    ) -> tuple[float, np.ndarray]:
        """The reward and its [n] per-token rewards, for tokens with character `spans` [n, 2]
        (`rljax.models.tokenizer.char_spans`).

        kind="code" with the built-in reward: `rljax.rewards.code.token_level_rewards` (the
        total on the last token, `line_penalty` shared by the tokens of the line an error or
        the first failing test points at). Otherwise the reward sits on the last token.
        """
        if self.kind == "code" and self.reward_fn is None:
            result = self._code_reward(completion, answer)
            tokens = token_level_rewards(completion, result, spans, line_penalty=self.line_penalty)
            return result.total, tokens
        total = self.reward(completion, answer)
        tokens = np.zeros(len(spans), np.float32)
        if len(tokens):
            tokens[-1] = total
        return total, tokens

    def reward(self, completion: str, answer: str) -> float:
        """The kind's reward of `completion` (or `reward_fn`'s) against the reference."""
        if self.kind == "code":
            if self.reward_fn is None:
                return self._code_reward(completion, answer).total
            tests = json.loads(answer)["tests"]
            return float(self.reward_fn(completion, json.dumps(tests)))
        reference = final_answer(answer) if self.kind == "math" else answer
        if self.reward_fn is not None:
            return float(self.reward_fn(completion, reference))
        if self.kind == "math":
            grade = math_reward if self.grader == "rljax" else math_verify_reward
            return grade(completion, reference)
        return exact_match_reward(completion, reference)

    def sft_target(self, answer: str) -> str:
        """The full solution when the example keeps one, else the answer itself.

        kind="code" has no answer to fall back on: a row without a solution raises.
        """
        if self.kind != "code":
            return answer
        solution = json.loads(answer).get("solution")
        if solution is None:
            raise ValueError(
                f"this code example has no reference solution (no {_CODE_SOLUTION_FIELD!r} "
                "column, or keep_solution=False), so it has no SFT target"
            )
        return solution

    def _split(self, split: str) -> _Split:
        if split not in self._splits:
            raise ValueError(f"split={split!r} is not one of {self.splits}")
        return self._splits[split]

    def _to_example(self, row: dict[str, Any], where: str) -> dict[str, str]:
        """A row as dict(prompt=..., answer=...); raises naming the row when it lacks a field."""
        prompt_field, answer_field = self.fields
        for field, key in ((prompt_field, "prompt_field"), (answer_field, "answer_field")):
            if row.get(field) is None:
                raise ValueError(
                    f"{where} has no {field!r} value (task.{key}); its fields are {sorted(row)}. "
                    f"Set task.{key} to the column that holds the {key.split('_')[0]}"
                )
        prompt = str(row[prompt_field])
        if self.kind != "code":
            answer = str(row[answer_field])
            if self.kind == "math" and not self.keep_solution:
                answer = final_answer(answer)
            return {"prompt": prompt, "answer": answer}
        tests = row[answer_field]
        if isinstance(tests, str):
            try:
                tests = json.loads(tests)
            except json.JSONDecodeError:
                tests = None
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise ValueError(
                f"{where}: {answer_field!r} must be a non-empty list of assert strings "
                f"(or its JSON), got {row[answer_field]!r}"
            )
        prompt = f"{prompt}\nYour code should pass this test:\n{tests[0]}"
        setup = row.get(_CODE_SETUP_FIELD)
        reference: dict[str, Any] = {"tests": ([setup] if setup else []) + list(tests)}
        if self.keep_solution and row.get(_CODE_SOLUTION_FIELD):
            reference["solution"] = str(row[_CODE_SOLUTION_FIELD])
        return {"prompt": prompt, "answer": json.dumps(reference)}

    def _in_test(self, example: dict[str, str]) -> bool:
        return unit_hash(self.seed, text_hash(example["prompt"])) < self.test_fraction

    def _open(self, path: str | None, key: str) -> tuple[str, str]:
        """(path, format) of a configured file; raises naming the config key if it is missing."""
        known = path is not None and (
            os.path.isfile(path) or _is_hf_dataset(path) or split_location(path, "") is not None
        )
        if not known:
            raise FileNotFoundError(
                f"{key}={path!r}: no such file; set {key} to a local data file (or a "
                "directory written by datasets' save_to_disk, or a prepared TFDS directory)"
            )
        return os.fspath(path), resolve_format(path, self.format)

    def _load(self) -> dict[str, _Split]:
        train = self._load_file(*self._open(self.train_path, "task.train_path"), "task.train_path")
        if self.test_path is not None:
            test = self._load_file(*self._open(self.test_path, "task.test_path"), "task.test_path")
            return {"train": train, "test": test}
        if train.raw:  # ArrayRecord, TFDS: one pass to hash each row's prompt, rows stay on disk
            examples = (
                self._to_example(train.rows[i], f"{train.path} row {i}") for i in range(len(train))
            )
        else:
            examples = iter(train.rows)
        held_out = np.fromiter((self._in_test(ex) for ex in examples), bool, len(train))
        splits = {}
        for split, mask in (("train", ~held_out), ("test", held_out)):
            if not mask.any():
                raise ValueError(
                    f"the {split} split of {train.path} is empty ({len(train)} rows, "
                    f"test_fraction={self.test_fraction}); add rows, change test_fraction or "
                    "pass task.test_path"
                )
            splits[split] = dataclasses.replace(train, indices=np.flatnonzero(mask))
        return splits

    def _load_file(self, path: str, format: str, key: str) -> _Split:
        if format in ("array_record", "tfds"):
            split = _Split(_indexed_rows(path, format, _TFDS_SPLITS[key]), None, True, path)
            if len(split):  # rows are read when asked for: a wrong field mapping fails now
                self._to_example(split.rows[0], split.where(0))
        else:
            wheres, rows = [], []
            for where, row in iter_file_rows(path, format):
                wheres.append(where)
                rows.append(self._to_example(row, where))
            split = _Split(rows, None, False, path, wheres)
        if not len(split):
            raise ValueError(f"{key}={path!r} has no rows")
        return split

"""Rows in SkyRL's data layout as an episodic task (`task.name="skyrl_gym"`).

SkyRL's data sets are JSONL or parquet files of rows such as
`{"prompt": [{"role": "user", "content": ...}], "env_class": "gsm8k", "reward_spec":
{"ground_truth": "42"}, "extra_info": {...}}`: each row names the SkyRL-Gym environment that
plays it and carries what that environment reads (`rljax.envs.skyrl_gym_env`). The files are
local; nothing is downloaded. An example's answer is "<split>:<row>", so episodes look their row
up in memory. Without a test file, a row is held out when a fixed hash of its prompt (salted by
`seed`) falls below `test_fraction`, as `LocalTask` does. There is no scripted expert, so runs
on this task start without an SFT warm start (`sft.steps=0`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Mapping
from typing import Any

from rljax.data.tasks.expertless import Expertless
from rljax.data.tasks.local import iter_file_rows
from rljax.data.tasks.split_hash import text_hash, unit_hash
from rljax.envs.skyrl_gym_env import ROW_KEYS, SkyRLGymText, conversation_text


@dataclasses.dataclass(frozen=True)
class SkyRLTask(Expertless):
    """Episodes of the SkyRL-Gym environments that a file's rows name.

    Attributes:
      train_path: JSONL or parquet file of SkyRL rows.
      test_path: the test rows; None holds out `test_fraction` of train_path's rows.
      test_fraction: the held-out share when there is no test_path.
      env_config: the environments' `env_config` (SkyRL's per-class settings).
      max_turns: turns before an episode is cut off (failure "turn_limit", rewards kept).
      seed: salts the held-out hash.
    """

    train_path: str | None = None
    test_path: str | None = None
    test_fraction: float = 0.1
    env_config: Mapping[str, Any] | None = None
    max_turns: int = 4
    seed: int = 0
    rows: dict[str, list[dict[str, Any]]] = dataclasses.field(init=False, repr=False, compare=False)
    # A fresh adapter per episode (its environment is made in `reset`, from the row): a
    # partial, not a method, so that a process environment pickles it without the rows.
    make_env: Callable[[], SkyRLGymText] = dataclasses.field(init=False, repr=False, compare=False)
    splits = ("train", "test")
    task_name = "skyrl_gym"

    def __post_init__(self):
        if self.max_turns < 1 or not 0.0 < self.test_fraction < 1.0:
            raise ValueError(
                f"max_turns={self.max_turns}, test_fraction={self.test_fraction}: need "
                "max_turns >= 1 and 0 < test_fraction < 1"
            )
        object.__setattr__(self, "rows", self._load())
        object.__setattr__(self, "make_env", functools.partial(SkyRLGymText, self.env_config))

    def _read(self, path: str | None, key: str) -> list[dict[str, Any]]:
        if path is None or not os.path.isfile(path):
            raise FileNotFoundError(f"{key}={path!r}: no such file; set {key} to a SkyRL data file")
        rows = []
        for where, row in iter_file_rows(path):
            missing = [k for k in ROW_KEYS if k not in row]
            if missing:
                raise ValueError(f"{where} has no {missing}: a SkyRL row needs {list(ROW_KEYS)}")
            try:
                row["prompt"] = list(row["prompt"])
                conversation_text(row["prompt"])
            except TypeError as err:
                raise ValueError(
                    f"{where}: prompt is not a list of chat messages ({err})"
                ) from None
            rows.append(row)
        if not rows:
            raise ValueError(f"{key}={path!r} has no rows")
        return rows

    def _load(self) -> dict[str, list[dict[str, Any]]]:
        train = self._read(self.train_path, "task.train_path")
        if self.test_path is not None:
            return {"train": train, "test": self._read(self.test_path, "task.test_path")}
        held_out = [
            unit_hash(self.seed, text_hash(conversation_text(row["prompt"]))) < self.test_fraction
            for row in train
        ]
        splits = {
            "train": [row for row, out in zip(train, held_out) if not out],
            "test": [row for row, out in zip(train, held_out) if out],
        }
        for split, rows in splits.items():
            if not rows:
                raise ValueError(
                    f"the {split} split of {self.train_path} is empty ({len(train)} rows, "
                    f"test_fraction={self.test_fraction}); add rows or pass task.test_path"
                )
        return splits

    def split_size(self, split: str) -> int:
        """Rows in `split`."""
        return len(self._split(split))

    def _split(self, split: str) -> list[dict[str, Any]]:
        if split not in self.splits:
            raise ValueError(f"split={split!r} is not one of {self.splits}")
        return self.rows[split]

    def example(self, index: int, split: str) -> dict[str, str]:
        """dict(prompt=the row's prompt messages as text, answer="<split>:<index>")."""
        row = self._split(split)[index]
        return {"prompt": conversation_text(row["prompt"]), "answer": f"{split}:{index}"}

    def env_task(self, answer: str) -> dict[str, Any]:
        """The row of the example whose answer is `answer`."""
        split, index = answer.split(":")
        return self._split(split)[int(index)]

"""Prepared TensorFlow Datasets (TFDS) directories as rows read by index, without TensorFlow.

A TFDS data set prepared with `file_format="array_record"` (`tfds build --file_format
array_record`, or `builder.download_and_prepare(file_format=...)`) lives in
`DATA_DIR/NAME[/CONFIG]/VERSION`: dataset_info.json, features.json and one ArrayRecord shard
set per split. `tfds.builder_from_directory(...).as_data_source(split)` reads it by index the
way `tfds.data_source(NAME, data_dir=DATA_DIR)` does, but needs neither the builder's code nor
its registration: the directory is all a user has to point at. TFDS decodes each record to
numpy (text as bytes); `TfdsRows` hands out plain Python rows (str, int, float, lists) like
the other local formats, so `LocalTask` maps their fields the same way and grain reads them
by index.

A location is "DIR" or "DIR:SPLIT" with TFDS's split syntax ("DIR:train[:90%]",
"DIR:validation"); without a split, the caller's default applies.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

_INFO = "dataset_info.json"


def is_tfds_dir(path: str | os.PathLike) -> bool:
    """Whether `path` is a prepared TFDS data set directory (it holds dataset_info.json)."""
    return os.path.isfile(os.path.join(path, _INFO))


def split_location(location: str, default_split: str) -> tuple[str, str] | None:
    """(directory, split) of "DIR" or "DIR:SPLIT" when DIR is a prepared TFDS directory, else
    None (the location names something else)."""
    location = os.fspath(location)
    if is_tfds_dir(location):
        return location, default_split
    for colon in (i for i, char in enumerate(location) if char == ":"):  # DIR may hold ":"
        directory, split = location[:colon], location[colon + 1 :]
        if split and is_tfds_dir(directory):
            return directory, split
    return None


def _plain(value: Any) -> Any:
    """A decoded TFDS value as plain Python: bytes -> str (UTF-8), arrays -> lists."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()] if value.ndim else _plain(value.item())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class TfdsRows:
    """One split of a prepared TFDS directory, read by index as plain Python dicts.

    Raises (on construction):
      ValueError: the directory is not a TFDS data set, was prepared as TFRecord (which needs
        TensorFlow to read), or has no such split (the message lists its splits).
    """

    def __init__(self, directory: str, split: str):
        import tensorflow_datasets as tfds  # imported here: only TFDS tasks need it

        self.directory, self.split = os.fspath(directory), split
        try:
            builder = tfds.builder_from_directory(self.directory)
        except Exception as err:  # TFDS raises its own error types for unreadable metadata
            raise ValueError(
                f"{self.directory} is not a readable TFDS data set directory ({err}); point "
                "at DATA_DIR/NAME[/CONFIG]/VERSION, the folder that holds dataset_info.json"
            ) from None
        file_format = str(getattr(builder.info.file_format, "value", builder.info.file_format))
        if file_format != "array_record":
            raise ValueError(
                f"{self.directory} was prepared as {file_format}, which TFDS reads through "
                "TensorFlow; prepare it with file_format='array_record' (tfds build "
                "--file_format=array_record) for random access without TensorFlow"
            )
        try:
            self._source = builder.as_data_source(split=split)
        except (ValueError, KeyError) as err:
            raise ValueError(
                f"{self.directory} has no split {split!r} ({err}); its splits are "
                f"{sorted(builder.info.splits)}"
            ) from None

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return _plain(self._source[int(index)])

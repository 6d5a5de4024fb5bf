"""ArrayRecord files of JSON rows: random access to data sets too large to hold in memory.

A JSONL or parquet file is read whole into memory by `LocalTask`; past a few million rows
that costs gigabytes on every host. `convert` streams such a file into an ArrayRecord file
(one JSON-encoded row per record, written with `group_size:1` so any record is read without
decoding its neighbours), and `ArrayRecordRows` reads rows by index, which is all a grain
MapDataset (and `LocalTask(format="array_record")`) needs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

import grain
from array_record.python import array_record_module

# One record per chunk: random access decodes only the record asked for (grain requires it).
_WRITER_OPTIONS = "group_size:1"

PathLike = str | os.PathLike


def write_array_record(rows: Iterable[dict[str, Any]], path: PathLike) -> int:
    """Write `rows` to the ArrayRecord file `path`, one JSON-encoded (UTF-8) row per record.

    The file is written under a temporary name and renamed when complete, so a failed write
    never leaves a truncated file at `path`.

    Args:
      rows: JSON-serialisable dicts, e.g. dict(question=..., answer=...).
      path: the output file (conventionally ending in ".array_record").

    Returns:
      The number of rows written.
    """
    path = os.fspath(path)
    tmp = f"{path}.tmp"
    writer = array_record_module.ArrayRecordWriter(tmp, _WRITER_OPTIONS)
    count = 0
    try:
        for row in rows:
            if not isinstance(row, dict):
                raise TypeError(f"row {count} is a {type(row).__name__}, not a dict")
            try:
                record = json.dumps(row, ensure_ascii=False)
            except TypeError as err:
                raise TypeError(f"row {count} is not JSON-serialisable: {err}") from err
            writer.write(record.encode("utf-8"))
            count += 1
    except BaseException:
        writer.close()
        os.remove(tmp)
        raise
    writer.close()
    os.replace(tmp, path)
    return count


class ArrayRecordRows(Sequence):
    """The rows of ArrayRecord file(s) written by `write_array_record`, read by index.

    A random-access grain data source (`len` and `[i]`): readers open lazily, are shared by
    threads and survive pickling (grain's `ArrayRecordDataSource` underneath). Several paths
    (shards) read as one sequence, in the order given.

    Args:
      paths: one file or a sequence of files.
    """

    def __init__(self, paths: PathLike | Sequence[PathLike]):
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        paths = [os.fspath(p) for p in paths]
        if not paths:
            raise ValueError("ArrayRecordRows needs at least one path")
        for p in paths:
            if not os.path.isfile(p):
                raise FileNotFoundError(f"ArrayRecord file {p} does not exist")
        self.paths = tuple(paths)
        self._source = grain.sources.ArrayRecordDataSource(list(paths))

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index: int) -> dict[str, Any]:
        """The row at `index` (0 <= index < len), decoded from JSON."""
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} is out of range [0, {len(self)}) of {self.paths}")
        return json.loads(self._source[index].decode("utf-8"))

    def __repr__(self) -> str:
        return f"ArrayRecordRows({list(self.paths)!r}, rows={len(self)})"


def convert(src_path: PathLike, out_path: PathLike, format: str = "auto") -> int:
    """Stream a JSONL or parquet file into an ArrayRecord file of the same rows, in order.

    Rows are streamed (parquet by record batch), so the source need not fit in memory.

    Args:
      src_path: a .jsonl or .parquet file (see `rljax.data.tasks.local.iter_file_rows`).
      out_path: the ArrayRecord file to write.
      format: "auto" (from the suffix), "jsonl" or "parquet".

    Returns:
      The number of rows written.
    """
    # Imported here: local.py imports this module for ArrayRecordRows.
    from rljax.data.tasks.local import iter_file_rows, resolve_format

    format = resolve_format(src_path, format)
    if format == "array_record":
        raise ValueError(f"{os.fspath(src_path)} is already an ArrayRecord file")
    return write_array_record((row for _, row in iter_file_rows(src_path, format)), out_path)

"""ArrayRecord rows: write/read round trips, conversion, grain use, LocalTask on ArrayRecord."""

import json
import os
import pickle

import grain
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from array_record.python import array_record_module

from rljax.data.array_record import ArrayRecordRows, convert, write_array_record
from rljax.data.tasks.local import LocalTask

ROWS = [
    {"question": "Café costs 3 €, tea 2 €. Total?", "answer": "#### 5"},
    {"question": "List?", "answer": "x", "test_list": ["assert f() == 1", "assert g()"]},
    {"question": "Null?", "answer": None, "n": 3.5},
]


def gsm_rows(n):
    return [{"question": f"What is {i} times two?", "answer": f"#### {2 * i}"} for i in range(n)]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


def test_round_trip_and_file_format(tmp_path):
    path = str(tmp_path / "r.array_record")
    assert write_array_record(iter(ROWS), path) == 3
    rows = ArrayRecordRows(path)
    assert len(rows) == 3 and [rows[i] for i in range(3)] == ROWS and list(rows) == ROWS
    # Independently of ArrayRecordRows: the raw records are UTF-8 JSON, one chunk per record.
    reader = array_record_module.ArrayRecordReader(path)
    assert [json.loads(r.decode("utf-8")) for r in reader.read_all()] == ROWS
    assert "group_size:1," in reader.writer_options_string()
    reader.close()
    with pytest.raises(IndexError, match=r"row 3 is out of range \[0, 3\)"):
        rows[3]
    with pytest.raises(IndexError):
        rows[-1]


def test_shards_read_as_one_sequence_and_survive_pickling(tmp_path):
    a, b = str(tmp_path / "a.array_record"), str(tmp_path / "b.array_record")
    write_array_record(ROWS[:2], a)
    write_array_record(ROWS[2:], b)
    rows = ArrayRecordRows([a, b])
    assert len(rows) == 3 and rows[2] == ROWS[2]
    clone = pickle.loads(pickle.dumps(rows))
    assert [clone[i] for i in range(3)] == ROWS
    shuffled = grain.MapDataset.source(rows).shuffle(seed=0)
    assert sorted(json.dumps(shuffled[i]) for i in range(3)) == sorted(json.dumps(r) for r in ROWS)


def test_write_errors_leave_no_file(tmp_path):
    path = str(tmp_path / "w.array_record")
    with pytest.raises(TypeError, match=r"row 1 is not JSON-serialisable"):
        write_array_record([ROWS[0], {"bad": object()}], path)
    with pytest.raises(TypeError, match=r"row 0 is a list, not a dict"):
        write_array_record([[1, 2]], path)
    assert os.listdir(tmp_path) == []
    with pytest.raises(FileNotFoundError, match=r"ArrayRecord file .*w\.array_record"):
        ArrayRecordRows(path)


def test_convert_jsonl_and_parquet(tmp_path):
    src = write_jsonl(tmp_path / "s.jsonl", ROWS)
    out = str(tmp_path / "s.array_record")
    assert convert(src, out) == 3
    with open(src, encoding="utf-8") as f:
        assert list(ArrayRecordRows(out)) == [json.loads(line) for line in f]
    table_rows = gsm_rows(5)
    pq.write_table(pa.Table.from_pylist(table_rows), tmp_path / "t.parquet")
    assert convert(tmp_path / "t.parquet", tmp_path / "t.array_record") == 5
    assert list(ArrayRecordRows(tmp_path / "t.array_record")) == table_rows
    with pytest.raises(ValueError, match="already an ArrayRecord file"):
        convert(out, tmp_path / "again.array_record")


def test_local_task_on_array_record_matches_jsonl(tmp_path):
    src = write_jsonl(tmp_path / "g.jsonl", gsm_rows(100))
    out = str(tmp_path / "g.array_record")
    convert(src, out)
    from_jsonl, from_ar = LocalTask(src, test_fraction=0.2), LocalTask(out, test_fraction=0.2)
    for split in ("train", "test"):
        n = from_jsonl.split_size(split)
        assert from_ar.split_size(split) == n
        assert [from_ar.example(i, split) for i in range(n)] == [
            from_jsonl.example(i, split) for i in range(n)
        ]
    with_test = LocalTask(out, test_path=out, format="array_record")
    assert with_test.split_size("test") == 100
    assert with_test.example(7, "test") == {"prompt": "What is 7 times two?", "answer": "#### 14"}
    assert with_test.reward("7 * 2 = 14", with_test.example(7, "test")["answer"]) == 1.0


def test_array_record_row_errors(tmp_path):
    path = str(tmp_path / "e.array_record")
    write_array_record(gsm_rows(3) + [{"question": "q"}], path)
    with pytest.raises(ValueError, match=r"e\.array_record row 3 has no 'answer' value"):
        LocalTask(path)  # the held-out hash reads every row at construction
    task = LocalTask(path, test_path=path)  # with a test file, rows are checked when read
    assert task.example(2, "train")["answer"] == "#### 4"
    with pytest.raises(ValueError, match=r"row 3 has no 'answer' value.*\['question'\]"):
        task.example(3, "train")
    empty = str(tmp_path / "empty.array_record")
    write_array_record([], empty)
    with pytest.raises(ValueError, match=r"task\.train_path=.*empty\.array_record' has no rows"):
        LocalTask(empty, test_path=path)

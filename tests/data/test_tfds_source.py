"""TFDS directories as local task data (rljax.data.tfds_source, LocalTask format "tfds"): a
tiny data set prepared by a real TFDS builder (tests/data/tiny_tfds) reads like the same rows
in JSONL, through the field mappings, split syntax, grain pipeline and errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import tiny_tfds

from rljax.data import decode_answers, decode_prompts, prompt_batches, prompt_dataset
from rljax.data.tasks.local import LocalTask, iter_file_rows, resolve_format
from rljax.data.tfds_source import TfdsRows, split_location
from rljax.models.tokenizer import ByteTokenizer

FIELDS = dict(prompt_field="problem", answer_field="solution")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> str:
    """The prepared directory DATA_DIR/tiny_tfds/1.0.0 (ArrayRecord shards)."""
    data_dir = tmp_path_factory.mktemp("tfds")
    builder = tiny_tfds.TinyTfds(data_dir=str(data_dir), file_format="array_record")
    builder.download_and_prepare()
    return str(builder.data_dir)


def _jsonl(path, ids) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for i in ids:
            f.write(json.dumps(tiny_tfds.row(i)) + "\n")
    return str(path)


def _by_prompt(task: LocalTask, split: str) -> dict[str, dict[str, str]]:
    examples = [task.example(i, split) for i in range(task.split_size(split))]
    return {ex["prompt"]: ex for ex in examples}


def test_rows_are_plain_python_and_every_split_reads_whole(prepared):
    rows = TfdsRows(prepared, "train")
    assert len(rows) == 30
    got = sorted((rows[i] for i in range(len(rows))), key=lambda r: r["id"])
    assert got == [tiny_tfds.row(i) for i in range(30)]  # str, int and list[str], no bytes
    assert len(TfdsRows(prepared, "test")) == 6
    assert len(TfdsRows(prepared, "train[:50%]")) == 15


def test_a_tfds_directory_gives_the_examples_its_jsonl_gives(prepared, tmp_path):
    assert resolve_format(prepared) == "tfds"
    task = LocalTask(prepared, test_path=prepared, **FIELDS)
    same = LocalTask(
        _jsonl(tmp_path / "train.jsonl", range(30)),
        test_path=_jsonl(tmp_path / "test.jsonl", range(100, 106)),
        **FIELDS,
    )
    for split in ("train", "test"):
        assert _by_prompt(task, split) == _by_prompt(same, split)
    ex = task.example(0, "train")
    assert task.reward("so the answer is 12", ex["answer"]) == float(ex["answer"].endswith(" 12"))
    assert task.source(3, "train") == f"{prepared} row 3"


def test_held_out_rows_by_hash_and_split_syntax(prepared, tmp_path):
    held = LocalTask(prepared, test_fraction=0.3, **FIELDS)
    same = LocalTask(_jsonl(tmp_path / "all.jsonl", range(30)), test_fraction=0.3, **FIELDS)
    for split in ("train", "test"):
        assert _by_prompt(held, split) == _by_prompt(same, split)
    halves = LocalTask(f"{prepared}:train[:50%]", test_path=f"{prepared}:train[50%:]", **FIELDS)
    assert halves.split_size("train") == halves.split_size("test") == 15
    everything = set(_by_prompt(halves, "train")) | set(_by_prompt(halves, "test"))
    assert everything == set(_by_prompt(same, "train")) | set(_by_prompt(same, "test"))
    assert split_location(f"{prepared}:validation", "train") == (prepared, "validation")
    assert split_location(str(tmp_path), "train") is None
    assert [row for _, row in iter_file_rows(f"{prepared}:test")] == [
        TfdsRows(prepared, "test")[i] for i in range(6)
    ]


def test_a_sequence_of_texts_is_a_code_tasks_asserts(prepared):
    task = LocalTask(prepared, test_path=prepared, kind="code", prompt_field="problem",
                     answer_field="checks")  # fmt: skip
    ex = task.example(0, "test")
    i = int(ex["prompt"].split()[2])  # "Ann has {i} pens ..."
    assert ex["prompt"].endswith(f"Your code should pass this test:\nassert f({i}) == {2 * i + 2}")
    assert json.loads(ex["answer"])["tests"] == tiny_tfds.row(i)["checks"]


def test_grain_batches_every_row_once(prepared):
    task = LocalTask(prepared, test_path=prepared, **FIELDS)
    tok = ByteTokenizer()
    ds = prompt_dataset(task, "train", tok, 64, seed=1, max_answer_len=64, shard_index=0,
                        shard_count=1)  # fmt: skip
    seen = []
    for batch in prompt_batches(ds, 10, num_epochs=1):
        for i, prompt, answer in zip(batch["index"], decode_prompts(batch, tok),
                                     decode_answers(batch)):  # fmt: skip
            assert task.example(int(i), "train") == {"prompt": prompt, "answer": answer}
            seen.append(int(i))
    assert sorted(seen) == list(range(30))


def test_errors_name_the_fix(prepared, tmp_path):
    with pytest.raises(ValueError, match=r"no split 'validation'.*\['test', 'train'\]"):
        LocalTask(f"{prepared}:validation", test_path=prepared, **FIELDS)
    with pytest.raises(ValueError, match="no 'question' value.*problem"):
        LocalTask(prepared, test_path=prepared)
    with pytest.raises(FileNotFoundError, match="prepared TFDS directory"):
        LocalTask(str(tmp_path / "nothing"), **FIELDS)
    tfrecord = tmp_path / "tfrecord"
    tfrecord.mkdir()
    for name in os.listdir(prepared):
        if name.endswith(".json"):
            with open(os.path.join(prepared, name), encoding="utf-8") as f:
                info = json.load(f)
            if name == "dataset_info.json":
                info["fileFormat"] = "tfrecord"
            with open(tfrecord / name, "w", encoding="utf-8") as f:
                json.dump(info, f)
    with pytest.raises(ValueError, match="prepared as tfrecord.*array_record"):
        TfdsRows(str(tfrecord), "train")


def test_reading_needs_neither_tensorflow_nor_the_builder(prepared):
    code = (
        "import sys\n"
        "from rljax.data.tasks.local import LocalTask\n"
        f"task = LocalTask({prepared!r}, test_path={prepared!r}, prompt_field='problem', "
        "answer_field='solution')\n"
        "assert task.split_size('train') == 30 and task.split_size('test') == 6\n"
        "assert 'tensorflow' not in sys.modules and 'tiny_tfds' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]

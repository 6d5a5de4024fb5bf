"""Local file tasks: JSONL/parquet round trips, GSM8K/MATH/MBPP rows, held-out split, errors."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rljax.data import decode_answers, decode_prompts, prompt_batches, prompt_dataset, sft_dataset
from rljax.data.tasks import Task
from rljax.data.tasks.local import LocalTask, exact_match_reward, final_answer
from rljax.models.tokenizer import ByteTokenizer, char_spans

GSM8K = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "Mia reads 1,200 pages, then 34 more.", "answer": "1200 + 34 = 1234\n#### 1,234"},
    {"question": "Half of 9?", "answer": "9 / 2 = 4.5\n#### 4.5"},
]
MBPP = [
    {
        "task_id": 2,
        "text": "Write a function to add two numbers.",
        "code": "def add(a, b):\n    return a + b",
        "test_list": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"],
        "test_setup_code": "",
    },
    {
        "task_id": 3,
        "text": "Write a function to scale by K.",
        "code": "def scale(x):\n    return K * x",
        "test_list": ["assert scale(2) == 6"],
        "test_setup_code": "K = 3",
    },
]


def write_jsonl(path, rows, blank_lines=False):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n" + ("\n" if blank_lines else ""))
    return str(path)


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def many_rows(n, start=0):
    return [
        {"question": f"What is {i} plus one?", "answer": f"#### {i + 1}"} for i in range(start, n)
    ]


def run_tests(completion: str, tests_json: str) -> float:
    """A test-only code reward: exec the completion then the asserts (trusted tiny inputs)."""
    scope: dict = {}
    try:
        exec(completion, scope)
        for test in json.loads(tests_json):
            exec(test, scope)
    except Exception:
        return 0.0
    return 1.0


def test_gsm8k_jsonl_round_trip_and_rewards(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K, blank_lines=True)
    task = LocalTask(path, test_path=path)
    assert isinstance(task, Task)
    assert task.split_size("train") == task.split_size("test") == 3
    for i, row in enumerate(GSM8K):
        assert task.example(i, "train") == {"prompt": row["question"], "answer": row["answer"]}
    answer = task.example(1, "train")["answer"]
    assert task.sft_target(answer) == GSM8K[1]["answer"]  # the full reasoning is the target
    assert task.reward("so 1200 + 34 = 1234.\n#### 1234", answer) == 1.0
    assert task.reward("The answer is \\boxed{1,234}", answer) == 1.0
    assert task.reward("1200 + 34 = 1235", answer) == 0.0
    assert task.reward("no number here", answer) == 0.0
    half = task.example(2, "train")["answer"]
    assert task.reward("9/2 = 4.5", half) == 1.0 and task.reward("4", half) == 0.0


def test_keep_solution_false_keeps_only_the_final_answer(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    task = LocalTask(path, test_path=path, keep_solution=False)
    assert [task.example(i, "test")["answer"] for i in range(3)] == ["7", "1,234", "4.5"]
    assert task.sft_target("7") == "7"
    assert task.reward("#### 7", "7") == 1.0


def test_final_answer_by_hand():
    assert final_answer("a\n#### 42") == "42"
    assert final_answer("#### 1 #### 2 ") == "2"
    assert final_answer("so $x = \\boxed{\\frac{1}{2}}$.") == "\\frac{1}{2}"
    assert final_answer("\\boxed{3} no, \\boxed{ 5 }") == "5"
    assert final_answer(" 17 ") == "17"


def test_math_style_fields_and_boxed_reward(tmp_path):
    rows = [{"problem": "Compute 6*7.", "solution": "$6 \\cdot 7 = \\boxed{42}$"}]
    path = write_jsonl(tmp_path / "math.jsonl", rows)
    task = LocalTask(path, test_path=path, prompt_field="problem", answer_field="solution")
    ex = task.example(0, "train")
    assert ex == {"prompt": "Compute 6*7.", "answer": rows[0]["solution"]}
    assert task.reward("6*7 is \\boxed{42}", ex["answer"]) == 1.0
    assert task.reward("it is 42, not 41", ex["answer"]) == 0.0


def test_parquet_matches_jsonl_and_stringifies_numbers(tmp_path):
    rows = [{"question": "1+1?", "answer": 2}, {"question": "2+3?", "answer": 5}]
    jsonl = LocalTask(write_jsonl(tmp_path / "a.jsonl", rows), test_path=str(tmp_path / "a.jsonl"))
    pqt = write_parquet(tmp_path / "a.parquet", rows)
    parquet = LocalTask(pqt, test_path=pqt)
    for i in range(2):
        assert parquet.example(i, "train") == jsonl.example(i, "train")
    assert parquet.example(1, "train") == {"prompt": "2+3?", "answer": "5"}
    assert parquet.reward("= 5", "5") == 1.0


def test_held_out_split_is_disjoint_complete_and_deterministic(tmp_path):
    rows = many_rows(300)
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    task = LocalTask(path, test_fraction=0.2)
    n_train, n_test = task.split_size("train"), task.split_size("test")
    assert n_train + n_test == 300 and 30 <= n_test <= 90  # 60 expected, sd about 7
    train = [task.example(i, "train")["prompt"] for i in range(n_train)]
    test = [task.example(i, "test")["prompt"] for i in range(n_test)]
    assert not set(train) & set(test)
    assert sorted(train + test) == sorted(r["question"] for r in rows)
    order = {r["question"]: i for i, r in enumerate(rows)}
    assert [order[p] for p in train] == sorted(order[p] for p in train)  # file order kept
    again = LocalTask(path, test_fraction=0.2)
    assert [again.example(i, "test") for i in range(n_test)] == [
        task.example(i, "test") for i in range(n_test)
    ]
    other = LocalTask(path, test_fraction=0.2, seed=1)
    assert {other.example(i, "test")["prompt"] for i in range(other.split_size("test"))} != set(
        test
    )


def test_appending_rows_keeps_old_rows_in_place(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", many_rows(120))
    before = LocalTask(path, test_fraction=0.3)
    write_jsonl(tmp_path / "d.jsonl", many_rows(200))
    after = LocalTask(path, test_fraction=0.3)
    for split in ("train", "test"):
        old = [before.example(i, split) for i in range(before.split_size(split))]
        assert [after.example(i, split) for i in range(len(old))] == old
        assert after.split_size(split) >= len(old)


def test_repeated_prompt_stays_in_one_split(tmp_path):
    rows = many_rows(60) + [{"question": r["question"], "answer": "#### 0"} for r in many_rows(60)]
    task = LocalTask(write_jsonl(tmp_path / "d.jsonl", rows), test_fraction=0.3)
    test = [task.example(i, "test")["prompt"] for i in range(task.split_size("test"))]
    train = {task.example(i, "train")["prompt"] for i in range(task.split_size("train"))}
    assert not set(test) & train and len(test) == 2 * len(set(test))


def test_exact_kind(tmp_path):
    rows = [{"question": "Capital of France?", "answer": "Paris"}]
    path = write_jsonl(tmp_path / "e.jsonl", rows)
    task = LocalTask(path, test_path=path, kind="exact")
    answer = task.example(0, "train")["answer"]
    assert answer == "Paris" and task.sft_target(answer) == "Paris"
    assert task.reward("  paris\n", answer) == 1.0
    assert task.reward("ＰＡＲＩＳ", answer) == 1.0  # NFKC folds full-width letters
    assert task.reward("Paris, France", answer) == 0.0
    assert exact_match_reward("New   York", "new york") == 1.0
    assert exact_match_reward("Lyon", "Paris") == 0.0


def test_custom_reward_fn_gets_the_final_answer(tmp_path):
    seen = []
    path = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    task = LocalTask(path, test_path=path, reward_fn=lambda c, r: seen.append((c, r)) or 0.5)
    assert task.reward("x", task.example(0, "train")["answer"]) == 0.5
    assert seen == [("x", "7")]


def test_mbpp_rows(tmp_path):
    path = write_jsonl(tmp_path / "mbpp.jsonl", MBPP)
    task = LocalTask(path, test_path=path, kind="code", reward_fn=run_tests)
    ex = task.example(0, "test")
    assert ex["prompt"] == (
        "Write a function to add two numbers.\nYour code should pass this test:\n"
        "assert add(1, 2) == 3"
    )
    assert json.loads(ex["answer"]) == {
        "tests": MBPP[0]["test_list"],
        "solution": MBPP[0]["code"],
    }
    assert task.sft_target(ex["answer"]) == MBPP[0]["code"]
    assert task.reward(MBPP[0]["code"], ex["answer"]) == 1.0
    assert task.reward("def add(a, b):\n    return a - b", ex["answer"]) == 0.0
    scaled = task.example(1, "test")["answer"]
    assert json.loads(scaled)["tests"] == ["K = 3", "assert scale(2) == 6"]
    assert task.reward(MBPP[1]["code"], scaled) == 1.0


def test_mbpp_json_string_tests_and_no_solution(tmp_path):
    rows = [{"prompt": "Return 1.", "test_list": json.dumps(["assert one() == 1"])}]
    path = write_jsonl(tmp_path / "s.jsonl", rows)
    task = LocalTask(path, test_path=path, kind="code", prompt_field="prompt", reward_fn=run_tests)
    ex = task.example(0, "train")
    assert ex["prompt"].endswith("\nassert one() == 1")
    assert task.reward("def one():\n    return 1", ex["answer"]) == 1.0
    with pytest.raises(ValueError, match="no reference solution"):
        task.sft_target(ex["answer"])


def test_pipeline_batches_from_a_local_task(tmp_path):
    rows = [{"question": f"{i}+{i}=", "answer": str(2 * i)} for i in range(12)]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    task = LocalTask(path, test_path=path)
    tok = ByteTokenizer()
    ds = prompt_dataset(task, "train", tok, 8, seed=1, shard_index=0, shard_count=1)
    batches = list(prompt_batches(ds, 4, num_epochs=1))
    assert len(batches) == 3
    seen = []
    for batch in batches:
        assert batch["prompt_tokens"].shape == (4, 8)
        for i, prompt, answer in zip(
            batch["index"], decode_prompts(batch, tok), decode_answers(batch)
        ):
            assert rows[int(i)] == {"question": prompt, "answer": answer}
            seen.append(int(i))
    assert sorted(seen) == list(range(12))
    sft = sft_dataset(task, "train", tok, 8, 4, seed=None, shard_index=0, shard_count=1)
    first = sft[0]
    np.testing.assert_array_equal(first["completion_tokens"][:2], list(b"0") + [tok.eos_id])


def test_file_errors(tmp_path):
    good = write_jsonl(tmp_path / "g.jsonl", GSM8K)
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError, match=r"task\.train_path=.*nope\.jsonl"):
        LocalTask(missing)
    with pytest.raises(FileNotFoundError, match=r"task\.test_path=.*nope\.jsonl"):
        LocalTask(good, test_path=missing)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match=r"task\.train_path=.*empty\.jsonl' has no rows"):
        LocalTask(str(empty), test_path=good)
    with pytest.raises(ValueError, match=r"unknown format='csv'"):
        LocalTask(good, format="csv")
    (tmp_path / "d.csv").write_text("question,answer\n")
    with pytest.raises(ValueError, match=r"suffix '\.csv'.*task\.format"):
        LocalTask(str(tmp_path / "d.csv"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(GSM8K[0]) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl line 2 is not valid JSON"):
        LocalTask(str(bad))
    bad.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"line 1 is a JSON list, not an object"):
        LocalTask(str(bad))


def test_row_errors_name_the_row_and_fields(tmp_path):
    rows = GSM8K[:2] + [{"question": "q", "solution": "#### 1"}]
    path = write_jsonl(tmp_path / "r.jsonl", rows, blank_lines=True)
    msg = r"r\.jsonl line 5 has no 'answer' value \(task\.answer_field\); its fields are " + (
        r"\['question', 'solution'\]"
    )
    with pytest.raises(ValueError, match=msg):
        LocalTask(path)
    pqt = write_parquet(tmp_path / "r.parquet", [{"text": "t", "answer": "1"}])
    with pytest.raises(ValueError, match=r"r\.parquet row 0 has no 'question' value"):
        LocalTask(pqt)
    code = write_jsonl(tmp_path / "c.jsonl", [{"text": "t", "test_list": []}])
    with pytest.raises(ValueError, match=r"'test_list' must be a non-empty list of assert"):
        LocalTask(code, kind="code", reward_fn=run_tests)


def test_a_line_that_is_not_utf8_is_named_by_file_and_line(tmp_path):
    bad = tmp_path / "latin1.jsonl"
    good = json.dumps(GSM8K[0]).encode() + b"\n\n"
    bad.write_bytes(good + '{"question": "caf\u00e9?", "answer": "1"}\n'.encode("latin-1"))
    message = rf"^{bad} line 3 is not UTF-8 \(byte 0xe9 at position 18 of the line\); re-save"
    with pytest.raises(ValueError, match=message):
        LocalTask(str(bad))


@pytest.mark.parametrize("split_by", ["test_path", "hash"])
def test_an_overlong_prompt_is_clipped_and_named_by_its_file_line(split_by, tmp_path):
    long = "x" * 100_000
    rows = many_rows(40) + [{"question": long, "answer": "1"}]
    path = write_jsonl(tmp_path / "long.jsonl", rows, blank_lines=True)
    task = LocalTask(path, test_path=path if split_by == "test_path" else None, test_fraction=0.5)
    split = next(
        s
        for s in task.splits
        if any(task.example(i, s)["prompt"] == long for i in range(task.split_size(s)))
    )
    ds = prompt_dataset(task, split, ByteTokenizer(), 64, seed=None, shard_index=0, shard_count=1)
    with pytest.raises(ValueError) as err:
        list(ds)
    message = str(err.value)
    assert message.startswith(f"{path} line 81: prompt '{'x' * 80}'... (100000 characters) is ")
    assert len(message) < 400, len(message)


def test_argument_errors(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", GSM8K)
    with pytest.raises(ValueError, match=r"kind='proof' must be one of"):
        LocalTask(path, kind="proof")
    with pytest.raises(ValueError, match=r"test_fraction=1\.0 must be strictly between"):
        LocalTask(path, test_fraction=1.0)
    with pytest.raises(ValueError, match=r"the test split of .*g\.jsonl is empty \(3 rows"):
        LocalTask(path, test_fraction=1e-9)
    task = LocalTask(path, test_path=path)
    with pytest.raises(ValueError, match=r"index=3 is out of range \[0, 3\)"):
        task.example(3, "train")
    with pytest.raises(ValueError, match=r"split='valid' is not one of"):
        task.split_size("valid")


def test_code_rows_default_to_the_sandboxed_reward_and_map_it_to_tokens(tmp_path):
    path = write_jsonl(tmp_path / "mbpp.jsonl", MBPP)
    task = LocalTask(path, test_path=path, kind="code", line_penalty=0.6)
    answer = task.example(0, "test")["answer"]
    good = MBPP[0]["code"]
    assert task.reward(good, answer) == pytest.approx(1.0)  # all four components full
    tok = ByteTokenizer()
    total, per_token = task.token_rewards(good, answer, char_spans(tok, tok.encode(good)))
    assert total == pytest.approx(1.0) and per_token[-1] == pytest.approx(1.0)
    assert per_token[:-1].sum() == 0
    # The tests fail with a NameError raised on line 2: no test passes, so the total is the
    # syntax, style and security weights (0.1 each); that line's tokens share the penalty and
    # its last token (the completion's) also carries the total.
    bad = "def add(a, b):\n    return a + undefined_name"
    ids = tok.encode(bad)
    total, per_token = task.token_rewards(bad, answer, char_spans(tok, ids))
    line2 = np.arange(len(ids)) >= bad.index("\n") + 1
    assert total == pytest.approx(0.3)
    share = -0.6 / line2.sum()
    np.testing.assert_allclose(per_token[line2][:-1], share, rtol=1e-6)
    np.testing.assert_allclose(per_token[-1], share + 0.3, rtol=1e-6)
    assert (per_token[~line2] == 0).all()
    with pytest.raises(ValueError, match="code_timeout_s=0"):
        LocalTask(path, test_path=path, kind="code", code_timeout_s=0)


def test_token_rewards_of_other_kinds_sit_on_the_last_token(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    task = LocalTask(path, test_path=path)
    answer = task.example(0, "train")["answer"]
    total, per_token = task.token_rewards("7", answer, np.array([[0, 1], [1, 1]]))
    assert total == task.reward("7", answer)
    np.testing.assert_array_equal(per_token, [0.0, total])


def test_a_saved_hugging_face_dataset_reads_like_its_jsonl(tmp_path):
    """A directory from `datasets`' save_to_disk (several Arrow shards, a column the task does
    not read) gives the examples its JSONL gives; a DatasetDict names the split to pick."""
    datasets = pytest.importorskip("datasets")
    rows = many_rows(40)
    for i, row in enumerate(rows):
        row["source"] = f"gen-{i}"
    saved = tmp_path / "gsm"
    datasets.Dataset.from_list(rows).save_to_disk(str(saved), num_shards=3)
    assert len(list(saved.glob("*.arrow"))) == 3
    jsonl = write_jsonl(tmp_path / "gsm.jsonl", rows)
    from_dir = LocalTask(str(saved), test_fraction=0.25)
    from_file = LocalTask(jsonl, test_fraction=0.25)
    for split in ("train", "test"):
        assert from_dir.split_size(split) == from_file.split_size(split) > 0
        for i in range(from_dir.split_size(split)):
            assert from_dir.example(i, split) == from_file.example(i, split)
    both = tmp_path / "dict"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows[:5])}
    ).save_to_disk(str(both))
    with pytest.raises(ValueError, match="holds a DatasetDict.*dict/train"):
        LocalTask(str(both))
    task = LocalTask(str(both / "train"), test_path=str(both / "test"))
    assert task.split_size("test") == 5
    assert task.example(0, "test") == {"prompt": "What is 0 plus one?", "answer": "#### 1"}


def test_math_verify_grader_accepts_symbolic_answers(tmp_path):
    pytest.importorskip("math_verify")
    path = write_jsonl(tmp_path / "a.jsonl", [{"question": "sqrt 9?", "answer": "#### 3"}])
    ours = LocalTask(path, test_path=path)
    theirs = LocalTask(path, test_path=path, grader="math_verify")
    answer = ours.example(0, "test")["answer"]
    assert ours.reward("\\boxed{\\sqrt{9}}", answer) == 0.0
    assert theirs.reward("\\boxed{\\sqrt{9}}", answer) == 1.0
    assert theirs.reward("\\boxed{4}", answer) == 0.0
    with pytest.raises(ValueError, match="grader='sympy' must be one of"):
        LocalTask(path, test_path=path, grader="sympy")

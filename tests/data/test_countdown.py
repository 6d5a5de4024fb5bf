"""CountdownTask: solvable instances, a safe exact verifier, knobs, determinism, disjoint splits,
mixed instance sizes as curriculum levels."""

import hashlib
import json
import re
from fractions import Fraction

import pytest

from rljax.data.tasks import CountdownTask, Task, get_task
from rljax.data.tasks.countdown import evaluate, final_expression, parse_expression

_NUMBERS = re.compile(r"\[([\d, ]+)\]")


def _reference_value(expression: str) -> Fraction:
    """An independent evaluator for trusted generated text: Python's own parser on Fractions."""
    assert re.fullmatch(r"[\d +\-*/()]+", expression) and "**" not in expression
    return eval(re.sub(r"\d+", r"Fraction(\g<0>)", expression), {"Fraction": Fraction})


def _answer(target, numbers, use_all=False):
    return json.dumps(dict(target=target, numbers=numbers, use_all=use_all, solution=""))


def test_is_a_task_and_registered():
    task = get_task("countdown", num_numbers=3, seed=2)
    assert isinstance(task, Task)
    assert task == CountdownTask(num_numbers=3, seed=2)


@pytest.mark.parametrize(
    "kwargs",
    [dict(), dict(num_numbers=2, max_number=9), dict(num_numbers=6, max_number=100, use_all=True)],
)
def test_stored_solutions_are_correct_and_rewarded(kwargs):
    task = CountdownTask(**kwargs)
    for split in ("train", "test"):
        for i in range(60):
            ex = task.example(i, split)
            spec = json.loads(ex["answer"])
            numbers = [int(x) for x in _NUMBERS.search(ex["prompt"]).group(1).split(",")]
            assert numbers == spec["numbers"] and f"equal to {spec['target']}." in ex["prompt"]
            solution = task.sft_target(ex["answer"])
            assert _reference_value(solution) == spec["target"] > 0
            used = [int(x) for x in re.findall(r"\d+", solution)]
            assert all(used.count(x) <= numbers.count(x) for x in used)
            assert task.reward(solution, ex["answer"]) == 1.0


def test_knobs_change_instances_as_documented():
    for num_numbers, max_number in ((3, 5), (5, 50)):
        task = CountdownTask(num_numbers=num_numbers, max_number=max_number)
        values = set()
        for i in range(100):
            numbers = json.loads(task.example(i, "train")["answer"])["numbers"]
            assert len(numbers) == num_numbers
            values.update(numbers)
        assert min(values) >= 1 and max(values) <= max_number and max(values) > max_number // 2
    sizes = {True: set(), False: set()}
    for use_all in (True, False):
        task = CountdownTask(num_numbers=4, use_all=use_all)
        for i in range(100):
            ex = task.example(i, "train")
            assert ("exactly once" in ex["prompt"]) == use_all
            spec = json.loads(ex["answer"])
            used = sorted(int(x) for x in re.findall(r"\d+", spec["solution"]))
            sizes[use_all].add(len(used))
            if use_all:
                assert used == sorted(spec["numbers"])
    assert sizes[True] == {4} and sizes[False] == {2, 3, 4}


def test_reward_accepts_any_correct_expression():
    task = CountdownTask()
    answer = _answer(24, [4, 6, 2, 3])
    for good in (
        "4 * 6",
        "2*3*4",
        "6 / (3 - 2) * 4",
        "I try 4 and 6.\nAnswer: (6) * 4",
        "4*6 = 24",
        "Working: 2 + 3 = 5.\n\\boxed{(2 + 6) * 3} and 4 * 5 below",
    ):
        assert task.reward(good, answer) == 1.0, good
    assert task.reward("\\boxed{4 * 6} and more text", answer) == 1.0
    # Exact rational intermediates: 6 / (1 - 3/4) = 24.
    assert task.reward("6 / (1 - 3 / 4)", _answer(24, [1, 3, 4, 6])) == 1.0


@pytest.mark.parametrize(
    "completion",
    [
        "4 + 6",  # wrong value
        "4 * 5 + 4",  # 5 is not given
        "(6 - 2) * (3 + 3)",  # 3 used twice
        "6 / (2 - 2) + 24",  # division by zero
        "2 ** 3 * 3",  # no power operator
        "9**9**9",
        "__import__('os').system('true')",
        "-2 + 26",  # no unary minus
        "4.0 * 6",  # integers only
        "4 6",
        "(4 * 6",
        "",
        "(" * 200 + "4 * 6" + ")" * 200,  # nesting cap
    ],
)
def test_tampered_expressions_get_zero(completion):
    task = CountdownTask()
    assert task.reward(completion, _answer(24, [4, 6, 2, 3, 2])) == 0.0


def test_use_all_and_format_reward():
    task = CountdownTask(format_reward=0.1)
    strict = _answer(24, [4, 6, 2, 3], use_all=True)
    assert task.reward("4 * 6", strict) == 0.0
    assert task.reward("(6 - 3) * 2 * 4", strict) == 1.0
    assert task.reward("(6 - 3) * 2 + 4", strict) == 0.1  # well formed, wrong value
    assert task.reward("4 * 6", _answer(25, [4, 6])) == 0.1
    assert task.reward("4 * 7", _answer(28, [4, 6])) == 0.0  # 7 not given: no format credit
    assert CountdownTask().reward("4 + 6", _answer(24, [4, 6])) == 0.0


def test_parser_and_extraction_against_python():
    for text in ("1 + 2 * 3", "(1 + 2) * 3", "8 / 4 / 2", "8 - 4 - 2", "2 * (3 - 5) / 7"):
        assert evaluate(parse_expression(text)) == _reference_value(text)
    assert parse_expression("1 +") is None and parse_expression("1 ) + (2") is None
    assert parse_expression("1 + " * 100 + "1") is not None
    assert parse_expression("1 + " * 200 + "1") is None  # over the 500-character cap
    assert final_expression("x " + "1 + " * 200 + "1") == ("1 + " * 200 + "1")[-501:].strip()
    assert final_expression("x\nAnswer: (1 + 2) * 3 = 9\n\n") == "(1 + 2) * 3"


def test_deterministic_in_seed_split_index():
    task = CountdownTask()
    assert task.example(3, "train") == CountdownTask().example(3, "train")
    first = [task.example(i, "train") for i in range(10)]
    assert first != [CountdownTask(seed=1).example(i, "train") for i in range(10)]
    assert first != [task.example(i + 10, "train") for i in range(10)]


def test_splits_are_disjoint_by_construction():
    task = CountdownTask(num_numbers=3, max_number=12)

    def key(ex):
        spec = json.loads(ex["answer"])
        return spec["target"], tuple(sorted(spec["numbers"]))

    train = {key(task.example(i, "train")) for i in range(600)}
    test = {key(task.example(i, "test")) for i in range(150)}
    assert all(task.in_test_split(t, list(n)) for t, n in test)
    assert not any(task.in_test_split(t, list(n)) for t, n in train)
    assert len(test) > 100 and not train & test


def test_split_sizes_and_bad_split():
    task = CountdownTask(test_size=7)
    assert task.split_size("train") is None and task.split_size("test") == 7
    with pytest.raises(ValueError, match="split='val' is not one of"):
        task.example(0, "val")
    with pytest.raises(ValueError, match="index=-1"):
        task.example(-1, "train")


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_numbers=1),
        dict(num_numbers=9),
        dict(max_number=1),
        dict(format_reward=1.0),
        dict(format_reward=-0.1),
        dict(test_fraction=0.0),
        dict(seed=-1),
        dict(test_size=0),
    ],
)
def test_bad_config_raises(kwargs):
    with pytest.raises(ValueError):
        CountdownTask(**kwargs)


def _digest(task):
    """A fingerprint of train examples 0-29 and test examples 0-9."""
    examples = [task.example(i, "train") for i in range(30)]
    examples += [task.example(i, "test") for i in range(10)]
    return hashlib.sha256(json.dumps(examples, sort_keys=True).encode()).hexdigest()[:16]


def test_default_min_numbers_keeps_the_instances_of_before():
    # Recorded with the code before `min_numbers` existed: its default must not move any seed.
    task = CountdownTask()
    assert json.loads(task.example(0, "train")["answer"]) == dict(
        target=286, numbers=[22, 16, 13, 7], use_all=False, solution="13 * 22"
    )
    assert json.loads(task.example(3, "test")["answer"])["solution"] == "13 + 14"
    recorded = {
        (): "19ddc29c594f9899",
        (("num_numbers", 6), ("max_number", 100), ("use_all", True)): "f14648cc0f1c9500",
        (("num_numbers", 3), ("max_number", 9)): "a8127fcfcddb554e",
    }
    for kwargs, digest in recorded.items():
        assert _digest(CountdownTask(**dict(kwargs))) == digest
        # min_numbers == num_numbers draws nothing, so it is the same task.
        same = CountdownTask(**dict(kwargs), min_numbers=CountdownTask(**dict(kwargs)).num_numbers)
        assert _digest(same) == digest
    assert CountdownTask(num_numbers=5).difficulty(11, "test") == 5


@pytest.mark.parametrize("use_all", [False, True])
def test_min_numbers_levels_are_uniform_and_counted_in_the_prompt(use_all):
    task = CountdownTask(num_numbers=6, min_numbers=2, max_number=30, use_all=use_all)
    levels = range(2, 7)
    counts = dict.fromkeys(levels, 0)
    for i in range(400):
        ex, level = task.example(i, "train"), task.difficulty(i, "train")
        numbers = [int(x) for x in _NUMBERS.search(ex["prompt"]).group(1).split(",")]
        assert level == len(numbers)  # independent recount from the prompt text
        counts[level] += 1
        solution = task.sft_target(ex["answer"])
        used = sorted(int(x) for x in re.findall(r"\d+", solution))
        assert _reference_value(solution) == json.loads(ex["answer"])["target"]
        if use_all:
            assert used == sorted(numbers)
        else:
            assert 2 <= len(used) <= level and all(used.count(x) <= numbers.count(x) for x in used)
    # Pearson chi-square against uniform over 5 levels; 18.47 is the 0.1% point with 4 d.o.f.
    expected = 400 / len(levels)
    assert sum((c - expected) ** 2 / expected for c in counts.values()) < 18.47
    assert min(counts.values()) > 0


def test_difficulty_is_deterministic_per_example():
    task = CountdownTask(num_numbers=5, min_numbers=3)
    twin = CountdownTask(num_numbers=5, min_numbers=3)
    for split in ("train", "test"):
        for i in (0, 9, 123):
            assert task.example(i, split) == twin.example(i, split)
            assert task.difficulty(i, split) == twin.difficulty(i, split)
            spec = json.loads(task.example(i, split)["answer"])
            assert len(spec["numbers"]) == task.difficulty(i, split)
    assert {task.difficulty(i, "test") for i in range(40)} == {3, 4, 5}


@pytest.mark.parametrize("kwargs", [dict(min_numbers=1), dict(min_numbers=5), dict(min_numbers=-2)])
def test_bad_min_numbers_names_the_field(kwargs):
    with pytest.raises(ValueError, match="min_numbers="):
        CountdownTask(num_numbers=4, **kwargs)

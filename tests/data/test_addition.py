"""AdditionTask: correct sums, determinism, digit ranges, disjoint splits, exact reward."""

import re

import pytest

from rljax.data.tasks import AdditionTask, Task, get_task

_PROMPT = re.compile(r"^(\d+)\+(\d+)=$")


def _operands(prompt: str) -> tuple[int, int]:
    match = _PROMPT.match(prompt)
    assert match, f"prompt {prompt!r} is not of the form 'a+b='"
    return int(match.group(1)), int(match.group(2))


def test_is_a_task_and_registered():
    task = get_task("addition", max_digits=2, seed=3)
    assert isinstance(task, Task)
    assert task == AdditionTask(max_digits=2, seed=3)


def test_unknown_task_lists_known_names():
    with pytest.raises(
        ValueError,
        match=(
            r"did you mean 'addition'.*"
            r"known tasks: \['addition', 'code_feedback', 'countdown', .*\]"
        ),
    ):
        get_task("addtion")


@pytest.mark.parametrize("split", ["train", "test"])
def test_answers_are_sums_within_digit_range(split):
    task = AdditionTask(min_digits=2, max_digits=3, seed=1)
    lengths = set()
    for i in range(300):
        example = task.example(i, split)
        a, b = _operands(example["prompt"])
        assert example["answer"] == str(a + b)
        for operand in (a, b):
            assert 10 <= operand <= 999
            lengths.add(len(str(operand)))
    assert lengths == {2, 3}


def test_one_digit_operands_include_zero():
    task = AdditionTask(min_digits=1, max_digits=1, test_fraction=0.5)
    operands = {x for i in range(400) for x in _operands(task.example(i, "train")["prompt"])}
    assert 0 in operands and max(operands) <= 9


def test_deterministic_in_seed_split_index():
    task = AdditionTask()
    assert task.example(7, "train") == AdditionTask().example(7, "train")
    assert [task.example(i, "train") for i in range(20)] != [
        AdditionTask(seed=1).example(i, "train") for i in range(20)
    ]
    assert [task.example(i, "train") for i in range(20)] != [
        task.example(i + 20, "train") for i in range(20)
    ]


def test_splits_are_disjoint_by_construction():
    task = AdditionTask()
    pairs = {
        split: [_operands(task.example(i, split)["prompt"]) for i in range(2000)]
        for split in ("train", "test")
    }
    assert all(task.in_test_split(a, b) for a, b in pairs["test"])
    assert not any(task.in_test_split(a, b) for a, b in pairs["train"])
    unordered = {split: {tuple(sorted(p)) for p in pairs[split]} for split in pairs}
    assert not unordered["train"] & unordered["test"]  # neither a+b nor b+a is shared
    assert len(unordered["test"]) > 1000  # a real held-out set, not a few repeated problems
    # The held-out rule ignores the seed, so no seed ever trains on a test problem.
    other = AdditionTask(seed=5)
    other_train = {
        tuple(sorted(_operands(other.example(i, "train")["prompt"]))) for i in range(2000)
    }
    assert not unordered["test"] & other_train


def test_empty_split_raises_instead_of_looping():
    task = AdditionTask(min_digits=1, max_digits=1, test_fraction=1e-6)
    with pytest.raises(ValueError, match="test split is .nearly. empty"):
        task.example(0, "test")


def test_split_sizes_and_bad_split():
    task = AdditionTask(test_size=50)
    assert task.split_size("train") is None and task.split_size("test") == 50
    with pytest.raises(ValueError, match="split='val' is not one of"):
        task.example(0, "val")


def test_reward_is_exact_match_after_strip():
    task = AdditionTask()
    assert task.reward("22", "22") == 1.0
    assert task.reward("  22\n", "22") == 1.0
    for wrong in ("23", "022", "22 22", "22abc", "", "2 2"):
        assert task.reward(wrong, "22") == 0.0
    assert task.sft_target("22") == "22"


@pytest.mark.parametrize(
    "completion,components",
    [
        (" 123\n", (1.0, 1.0, 1.0)),  # exact
        ("124", (0.0, 2 / 3, 1.0)),  # the ones digit wrong
        ("23", (0.0, 2 / 3, 0.0)),  # the hundreds digit missing: right-aligned credit
        ("1123", (0.0, 1.0, 0.0)),  # an extra leading digit
        ("abc", (0.0, 0.0, 1.0)),  # no digit in place, the right length
        ("", (0.0, 0.0, 0.0)),
    ],
)
def test_reward_components(completion, components):
    task = AdditionTask()
    assert task.reward_component_names == ("correct", "digits", "length")
    assert task.reward_components(completion, "123") == pytest.approx(components)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(min_digits=0),
        dict(min_digits=3, max_digits=2),
        dict(test_fraction=1.0),
        dict(seed=-1),
        dict(test_size=0),
    ],
)
def test_bad_config_raises(kwargs):
    with pytest.raises(ValueError):
        AdditionTask(**kwargs)


def test_difficulty_is_the_longer_operands_digit_count():
    task = AdditionTask(min_digits=1, max_digits=3)
    seen = set()
    for i in range(40):
        a, b = task.example(i, "train")["prompt"].rstrip("=").split("+")
        assert task.difficulty(i, "train") == max(len(str(int(a))), len(str(int(b))))
        seen.add(task.difficulty(i, "train"))
    assert seen == {1, 2, 3}

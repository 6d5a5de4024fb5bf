"""Word problems: answers recomputed from the story text, determinism, disjoint splits."""

import re

import pytest

from rljax.data.tasks import WordProblemTask, get_task


def solve(prompt: str) -> int:
    """An independent solver: read the operands from the story and apply the template's verb."""
    nums = [int(x) for x in re.findall(r"\d+", prompt)]
    if "gives" in prompt:
        return nums[0] - nums[1]
    if "in each bag" in prompt:
        return nums[0] * nums[1]
    if "loses" in prompt:
        return nums[0] + nums[1] - nums[2]
    return nums[0] + nums[1]


def test_answers_match_an_independent_solver():
    task = WordProblemTask(max_value=30)
    for split in ("train", "test"):
        for i in range(300):
            ex = task.example(i, split)
            assert int(ex["answer"]) == solve(ex["prompt"]) >= 0
            assert ex["prompt"].endswith("Give the final answer as a number.")


def test_deterministic_and_seeded():
    a, b = WordProblemTask(seed=1), WordProblemTask(seed=2)
    assert a.example(5, "train") == WordProblemTask(seed=1).example(5, "train")
    assert [a.example(i, "train") for i in range(10)] != [b.example(i, "train") for i in range(10)]


def test_splits_are_disjoint():
    task = WordProblemTask()
    key = lambda ex: (
        re.sub(
            r"\d+|Tom|Mia|Ali|Sara|Ben|Lena|Omar|Yuki|Ivan|Nora|apples|books|"  # noqa
            r"marbles|pencils|stickers|coins|cookies|cards",
            "",
            ex["prompt"],
        ),
        tuple(re.findall(r"\d+", ex["prompt"])),
    )
    train = {key(task.example(i, "train")) for i in range(2000)}
    test = {key(task.example(i, "test")) for i in range(500)}
    assert train and test and not train & test


def test_reward_uses_the_final_number():
    task = get_task("word_problems")
    assert task.reward("13 + 7 = 20. The answer is 20", "20") == 1.0
    assert task.reward("20 or 21", "20") == 0.0


@pytest.mark.parametrize("kwargs", [dict(max_value=1), dict(test_fraction=1.0), dict(seed=-1)])
def test_bad_settings(kwargs):
    with pytest.raises(ValueError):
        WordProblemTask(**kwargs)

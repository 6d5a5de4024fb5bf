"""Final-number extraction and numeric matching on a table of tricky completions."""

from fractions import Fraction

import pytest

from rljax.rewards.math import final_number, numeric_match_reward, parse_number

CASES = [
    ("42", Fraction(42)),
    ("The answer is 42.", Fraction(42)),
    ("3 + 4 = 7", Fraction(7)),
    ("First 12, then 30, so 1,234 in total", Fraction(1234)),
    ("She has -5 left", Fraction(-5)),
    ("It is 2.50 dollars", Fraction(5, 2)),
    ("half: 3/4", Fraction(3, 4)),
    ("so \\boxed{18} (not 19)", Fraction(18)),
    ("\\boxed{1/2} then 7", Fraction(1, 2)),
    ("no digits here", None),
    ("", None),
]


@pytest.mark.parametrize("text,want", CASES)
def test_final_number(text, want):
    assert final_number(text) == want


@pytest.mark.parametrize(
    "completion,answer,reward",
    [
        ("The answer is 18.", "18", 1.0),
        ("18.0", "18", 1.0),
        ("1,000", "1000", 1.0),
        ("19", "18", 0.0),
        ("18 apples, or maybe 20", "18", 0.0),
        ("nothing", "18", 0.0),
        ("7", "not a number", 0.0),
    ],
)
def test_numeric_match_reward(completion, answer, reward):
    assert numeric_match_reward(completion, answer) == reward


def test_parse_number_rejects_garbage():
    assert parse_number("1/0") is None and parse_number("abc") is None
    assert parse_number(" 12 ") == 12

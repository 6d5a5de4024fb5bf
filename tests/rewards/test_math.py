"""Final-number extraction and numeric matching on a table of tricky completions."""

from fractions import Fraction

import pytest

from rljax.rewards.math import (
    extract_answer,
    final_number,
    math_equal,
    math_reward,
    numeric_match_reward,
    parse_number,
)

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


def test_parse_number_latex_and_scientific():
    assert parse_number("\\dfrac12") == Fraction(1, 2)
    assert parse_number("$-\\frac{3}{4}$") == Fraction(-3, 4)
    assert parse_number("1e3") == 1000 and parse_number("2.5\\times10^{3}") == 2500
    assert parse_number("1,2") is None and parse_number("\\sqrt{4}") is None
    assert parse_number("1e99999999") is None  # no huge integer is built


@pytest.mark.parametrize(
    "completion,want",
    [
        ("so the result is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\boxed{3} first, then \\boxed{x^{2}} finally", "x^{2}"),
        ("\\boxed{\\boxed{7}}", "7"),
        ("\\fbox{42}", "42"),
        ("unbalanced \\boxed{1 and then 5", "5"),
        ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72"),
        ("The answer is $\\frac{1}{2}$. It took 3 steps.", "$\\frac{1}{2}$"),
        ("Answer: 12 apples", "12 apples"),
        ("first 3, then 4", "4"),
        ("no digits", None),
    ],
)
def test_extract_answer(completion, want):
    assert extract_answer(completion) == want


def test_final_number_reads_nested_boxes():
    assert final_number("\\boxed{\\frac{1}{2}} then 7") == Fraction(1, 2)
    assert final_number("\\boxed{x^{2}} then 7") is None  # a non-numeric box is the answer


# (pred, ref, equal): every rule of the module docstring, and look-alikes that must not match.
EQUAL_CASES = [
    ("42", "42", True),
    ("0.5", "1/2", True),
    ("\\frac{1}{2}", "0.5", True),
    ("\\dfrac12", "1/2", True),
    ("\\tfrac{1}{2}", ".5", True),
    ("-\\frac{1}{2}", "-0.5", True),
    ("\\frac{-1}{2}", "-1/2", True),
    ("1,234", "1234", True),
    ("1{,}234", "1234", True),
    ("50\\%", "50", True),
    ("50\\%", "0.5", True),
    ("0.5", "50%", True),
    ("x = 5", "5", True),
    ("$y=\\frac{3}{4}$", "0.75", True),
    ("5\\text{ cm}", "5", True),
    ("\\text{5 cm}", "5", True),
    ("18 dollars", "18", True),
    ("30^\\circ", "30", True),
    ("5.", "5", True),
    ("1e3", "1000", True),
    ("2.5\\times10^{3}", "2500", True),
    ("\\left( 1, 2 \\right)", "(1,2)", True),
    ("(0.5, -2)", "(\\frac{1}{2}, -2)", True),
    ("(-\\infty, 2]", "(-\\infty,2]", True),
    ("\\frac{\\sqrt{3}}{2}", "\\dfrac{\\sqrt3}{2}", True),
    ("x^{2} + 1", "x^2+1", True),
    ("\\text{Monday}", "Monday", True),
    ("a\\!b\\,c\\;d", "a b c d", True),
    ("-0", "0", True),
    # Found by comparing with math-verify (benchmarks/math_graders.py): money, bold numbers,
    # squared units, a bare power of ten, a box around the whole answer.
    ("\\$5", "5", True),
    ("\\$1,200", "1200", True),
    ("\\mathbf{12}", "12", True),
    ("12 \\mathrm{cm}^2", "12", True),
    ("10^{3}", "1000", True),
    ("\\boxed{7}", "7", True),
    ("10^{3}", "100", False),
    ("\\boxed{7}+1", "8", False),
    ("1/2", "2", False),
    ("0.333", "1/3", False),
    ("50", "0.5", False),
    ("-\\frac{1}{2}", "\\frac{1}{2}", False),
    ("12", "(1,2)", False),
    ("(12, 3)", "(1,2, 3)", False),
    ("(1,234)", "1234", False),
    ("1,2", "12", False),
    ("(1, 2)", "[1, 2]", False),
    ("(-\\infty, 2)", "(-\\infty, 2]", False),
    ("(2, 1)", "(1, 2)", False),
    ("3x", "3", False),
    ("\\sqrt{4}", "2", False),
    ("Monday", "monday", False),
    ("", "0", False),
    ("1e99999999", "1", False),
]


@pytest.mark.parametrize("pred,ref,equal", EQUAL_CASES)
def test_math_equal(pred, ref, equal):
    assert math_equal(pred, ref) is equal
    assert math_equal(ref, pred) is equal  # the rules are symmetric


@pytest.mark.parametrize(
    "completion,answer,reward",
    [
        ("so \\boxed{\\dfrac{1}{2}}", "0.5", 1.0),
        ("The answer is 1,000.", "1000", 1.0),
        ("We get 3 and then #### 0.25", "25\\%", 1.0),
        ("\\boxed{3}", "Half of 6 is \\boxed{3}.", 1.0),  # a MATH-style reference solution
        ("\\boxed{3}", "2 + 1 = 3\n#### 3", 1.0),  # a GSM8K-style reference solution
        ("The answer is 19", "18", 0.0),
        ("nothing here", "18", 0.0),
    ],
)
def test_math_reward(completion, answer, reward):
    assert math_reward(completion, answer) == reward

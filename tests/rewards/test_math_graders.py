"""rljax's `math_equal` and the optional math-verify grader on the generated table of
`benchmarks/math_graders.py`, whose truth comes from how each pair was built."""

import pytest

from benchmarks.math_graders import CLAIMED, FORMS, agreement, pairs
from rljax.rewards.math import math_equal, math_reward


@pytest.fixture(scope="module")
def table():
    return pairs()


def test_the_table_covers_every_form_with_equal_and_unequal_pairs(table):
    assert len(table) >= 500
    for form in FORMS:  # near misses are unequal by definition
        truths = {p.equal for p in table if p.form == form}
        assert truths == ({False} if form == "near_miss" else {True, False}), form


def test_rljax_decides_every_claimed_form_as_the_truth_does(table):
    results = agreement(math_equal, table)
    for form in CLAIMED:
        assert results[form]["wrong"] == [], form
    # No computer algebra, by design: an equality that needs it is "not equal".
    symbolic = [p for p in table if p.form == "symbolic"]
    assert not any(math_equal(p.prediction, p.answer) for p in symbolic)


def test_math_verify_decides_symbolic_equalities(table):
    pytest.importorskip("math_verify")
    from rljax.rewards.math_verify import math_verify_equal, math_verify_reward

    results = agreement(math_verify_equal, table)
    assert results["symbolic"]["wrong"] == []
    # Where it differs from the truth (README): word units such as "18 dollars", and
    # scientific notation ("8.5e3"; one "4.4\times10^{5}").
    missed = {form for form in FORMS if results[form]["wrong"]}
    assert missed <= {"unit", "scientific"}, missed
    assert all(" dollars" in w[0] for w in results["unit"]["wrong"])
    # The reward: rljax's answer extraction, then math-verify.
    assert math_verify_reward("so the answer is \\boxed{\\sqrt{9}}", "3") == 1.0
    assert math_reward("so the answer is \\boxed{\\sqrt{9}}", "3") == 0.0
    assert math_verify_reward("it is 4", "#### 3") == 0.0

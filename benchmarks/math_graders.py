"""rljax's `math_equal` against Hugging Face's math-verify on generated (prediction, answer) pairs.

Every pair is built from known values, so whether the prediction equals the answer is known
by construction (the truth), not by either grader. The forms are the ones
`rljax.rewards.math` claims (integers, decimals, fractions, LaTeX wrappers, units, money,
percents, scientific notation, tuples, intervals) plus near misses and, as "symbolic",
equalities that need computer algebra, which `math_equal` deliberately does not do. Writes
`benchmarks/results/math_graders.json`: per form, each grader's agreement with the truth and
the pairs where they differ.

  .venv/bin/python -m benchmarks.math_graders
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from fractions import Fraction
from typing import NamedTuple


class Pair(NamedTuple):
    form: str
    prediction: str
    answer: str
    equal: bool  # the truth, by construction


# Forms `math_equal` claims; "symbolic" is the documented gap (no computer algebra).
CLAIMED = (
    "integer",
    "thousands",
    "decimal",
    "fraction",
    "negative",
    "wrapper",
    "unit",
    "money",
    "percent",
    "scientific",
    "tuple",
    "interval",
    "near_miss",
)
FORMS = (*CLAIMED, "symbolic")


def _decimal(value: Fraction) -> str | None:
    """A terminating decimal of `value`, or None."""
    q = value.denominator
    while q % 2 == 0:
        q //= 2
    while q % 5 == 0:
        q //= 5
    if q != 1:
        return None
    text = f"{float(value):.10f}".rstrip("0").rstrip(".")
    return text if Fraction(text) == value else None


def _fraction_forms(value: Fraction) -> list[str]:
    p, q = value.numerator, value.denominator
    forms = [
        f"\\frac{{{p}}}{{{q}}}",
        f"\\dfrac{{{p}}}{{{q}}}",
        f"{p}/{q}",
        f"\\frac{{{2 * p}}}{{{2 * q}}}",
    ]
    if 0 <= p < 10 and 0 < q < 10:
        forms.append(f"\\frac{p}{q}")
    return forms


def pairs(seed: int = 0, per_form: int = 12) -> list[Pair]:
    """The table: `per_form` rounds of each form's equal and unequal pairs."""
    rng = random.Random(seed)
    out: list[Pair] = []

    def add(form: str, prediction: str, answer: str, equal: bool) -> None:
        out.append(Pair(form, prediction, answer, equal))

    for _ in range(per_form):
        n = rng.randint(2, 999)
        add("integer", str(n), str(n), True)
        add("integer", f"{n}.0", str(n), True)
        add("integer", f"${n}$", str(n), True)
        add("integer", str(n + rng.randint(1, 9)), str(n), False)

        big = rng.randint(1_000, 9_999_999)
        add("thousands", f"{big:,}", str(big), True)
        add("thousands", f"{big:,}".replace(",", "{,}"), str(big), True)
        add("thousands", f"{big + 1000:,}", str(big), False)

        value = Fraction(rng.randint(1, 99), rng.choice([2, 4, 5, 8, 10, 20, 25]))
        dec = _decimal(value)
        add("decimal", dec, dec, True)
        add("decimal", dec + "00" if "." in dec else dec + ".00", dec, True)
        add("decimal", _fraction_forms(value)[0], dec, True)
        add("decimal", str(float(value) + 0.01), dec, False)

        p, q = rng.randint(1, 40), rng.randint(2, 41)
        frac = Fraction(p, q)
        for form in _fraction_forms(frac):
            add("fraction", form, f"\\frac{{{frac.numerator}}}{{{frac.denominator}}}", True)
        if frac.denominator != 1 and frac.numerator != frac.denominator:
            flipped = f"\\frac{{{frac.denominator}}}{{{frac.numerator}}}"
            add("fraction", flipped, f"\\frac{{{frac.numerator}}}{{{frac.denominator}}}", False)

        m = rng.randint(1, 500)
        add("negative", f"-{m}", f"-{m}", True)
        add("negative", f"- {m}", f"-{m}", True)
        add("negative", f"−{m}", f"-{m}", True)  # a Unicode minus sign
        add("negative", str(m), f"-{m}", False)

        w = rng.randint(1, 300)
        add("wrapper", f"x = {w}", str(w), True)
        add("wrapper", f"{w}.", str(w), True)
        add("wrapper", f"\\displaystyle {w}", str(w), True)
        add("wrapper", f"\\text{{{w}}}", str(w), True)
        add("wrapper", f"\\mathbf{{{w}}}", str(w), True)
        add("wrapper", f"\\boxed{{{w}}}", str(w), True)
        add("wrapper", f"x = {w + 1}", str(w), False)

        u = rng.randint(1, 300)
        add("unit", f"{u} \\text{{ cm}}", str(u), True)
        add("unit", f"{u} dollars", str(u), True)
        add("unit", f"{u}^\\circ", str(u), True)
        add("unit", f"{u} \\mathrm{{cm}}^2", str(u), True)
        add("unit", f"{u + 2} \\text{{ cm}}", str(u), False)

        cents = rng.randint(100, 99_999)
        money = _decimal(Fraction(cents, 100))
        add("money", f"\\${money}", money, True)
        add("money", f"\\$ {cents // 100:,}", str(cents // 100), True)
        add("money", f"\\${float(money) + 1:.2f}", money, False)

        pct = rng.randint(1, 99)
        add("percent", f"{pct}\\%", str(pct), True)
        add("percent", f"{pct}\\%", _decimal(Fraction(pct, 100)), True)
        add("percent", _decimal(Fraction(pct, 100)), f"{pct}\\%", True)
        add("percent", str(pct), _decimal(Fraction(pct, 100)), False)

        mant, exp = rng.randint(11, 99), rng.randint(2, 5)
        plain = str(mant * 10 ** (exp - 1))
        add("scientific", f"{mant / 10}\\times10^{{{exp}}}", plain, True)
        add("scientific", f"{mant / 10}e{exp}", plain, True)
        add("scientific", f"10^{{{exp}}}", str(10**exp), True)
        add("scientific", f"{mant / 10}\\times10^{{{exp - 1}}}", plain, False)

        a, b, c = rng.sample(range(-20, 40), 3)
        add("tuple", f"({a}, {b})", f"({a},{b})", True)
        add("tuple", f"(\\frac{{{2 * a}}}{{2}}, {b})", f"({a}, {b})", True)
        add("tuple", f"({b}, {a})", f"({a}, {b})", False)
        add("tuple", f"({a}, {b}, {c})", f"({a}, {b})", False)

        lo, hi = sorted(rng.sample(range(-30, 30), 2))
        add("interval", f"[{lo}, {hi})", f"[{lo},{hi})", True)
        add("interval", f"(-\\infty, {hi}]", f"(-\\infty,{hi}]", True)
        add("interval", f"[{lo}, {hi}]", f"[{lo}, {hi})", False)
        add("interval", f"({lo}, {hi})", f"[{lo}, {hi}]", False)

        third = Fraction(1, rng.choice([3, 6, 7, 9]))
        add("near_miss", f"{float(third):.3f}", f"\\frac{{1}}{{{third.denominator}}}", False)
        add("near_miss", "3.14", "\\pi", False)
        add("near_miss", f"{pct}", f"{pct / 100}", False)

        s = rng.randint(2, 12)
        add("symbolic", f"\\sqrt{{{s * s}}}", str(s), True)
        add("symbolic", f"{s}\\pi", f"\\pi \\cdot {s}", True)
        add("symbolic", f"x^2+{s}", f"{s}+x^2", True)
        add("symbolic", f"\\sqrt{{{s * s + 1}}}", str(s), False)
    return out


def agreement(grader: Callable[[str, str], bool], table: list[Pair]) -> dict:
    """Per form: how many pairs the grader decides as the truth does, and its misses."""
    out: dict = {}
    for pair in table:
        got = bool(grader(pair.prediction, pair.answer))
        entry = out.setdefault(pair.form, {"pairs": 0, "right": 0, "wrong": []})
        entry["pairs"] += 1
        if got == pair.equal:
            entry["right"] += 1
        else:
            entry["wrong"].append([pair.prediction, pair.answer, pair.equal])
    return out


def main() -> None:
    from rljax.rewards.math import math_equal
    from rljax.rewards.math_verify import math_verify_equal

    table = pairs()
    graders = {"rljax": math_equal, "math_verify": math_verify_equal}
    results = {name: agreement(grader, table) for name, grader in graders.items()}
    print(f"{len(table)} pairs")
    print(f"{'form':12s} {'pairs':>5s} {'rljax':>7s} {'math-verify':>12s}")
    for form in FORMS:
        r, m = results["rljax"][form], results["math_verify"][form]
        print(f"{form:12s} {r['pairs']:5d} {r['right']:7d} {m['right']:12d}")
    path = os.path.join(os.path.dirname(__file__), "results", "math_graders.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"pairs": len(table), "results": results}, f, indent=1)
    print(f"written: {path}")


if __name__ == "__main__":
    main()

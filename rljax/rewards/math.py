"""Math answers: extract the final answer of a completion and decide whether it equals a reference.

Verifiable-reward RL on math (GSM8K, MATH) scores a completion 1 when its final answer equals the
reference. Models write the same number many ways ("0.5", "1/2", "\\dfrac12", "50\\%"), so a
string comparison under-rewards correct answers, while a loose float comparison over-rewards
("0.333" is not 1/3). This module compares numbers exactly with `fractions.Fraction` after a
LaTeX normalisation, elementwise for tuples and intervals, and falls back to normalised string
equality for everything non-numeric (no computer algebra: "\\sqrt{4}" is not "2").

The rules (interpretation; no single standard exists):
- Answer extraction, first that applies: the last `\\boxed{...}` / `\\fbox{...}` (nested braces
  handled), the last "#### X" line (GSM8K), the last "answer is X" / "answer: X" up to the end of
  its sentence, the last number of the text.
- Dropped before comparing: `$` and `\\$` (money), a `\\boxed{...}` around the whole answer,
  `\\left` / `\\right`, spacing (`\\!`, `\\,`, `\\;`, `\\:`, `\\quad`, `~`, whitespace),
  `\\displaystyle`, degree signs, a leading "x =", a trailing period, trailing `\\text{...}` /
  `\\mbox{...}` / `\\mathrm{...}` / `\\mathbf{...}` groups after the answer, squared or cubed
  too (units: "12 \\mathrm{cm}^2"; a group that is the whole answer is unwrapped instead) and
  plain-word units after a number ("18 dollars"). `\\dfrac` / `\\tfrac` are `\\frac`;
  `\\frac12` is `\\frac{1}{2}`, `\\sqrt3` is `\\sqrt{3}` and `x^{2}` is `x^2`. Strings compare
  case-sensitively.
- Numbers: integers, decimals, "1e3", "2.5\\times10^{3}", "10^{3}", "a/b", "\\frac{a}{b}", a
  leading sign, thousands separators ("1,234" or "1{,}234", groups of exactly three digits).
- Percent: the sign is dropped, so "50\\%" equals "50"; when exactly one side carries a percent
  sign, its value divided by 100 is also accepted, so "50\\%" equals "0.5". Without a percent
  sign "50" does not equal "0.5".
- Tuples and intervals: "(1, 2)", "[0, 1)", or a bare "1, 2" are compared elementwise; the
  brackets must be the same (an open interval is not a closed one) and inside brackets a comma
  always separates elements ("(1,234)" has two). Order matters.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

# A signed integer or decimal, with optional thousands separators ("1,234.5"), or a fraction.
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")
_BOX_START = re.compile(r"\\(?:boxed|fbox)\s*\{")
_HASHES = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*:?\s*([^\n]*)", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.(?:\s|$)")

_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_DECIMAL = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE]([+-]?\d+))?")
_TIMES_TEN = re.compile(r"(.+?)(?:\\times|\\cdot|\*)10\^(?:\{([+-]?\d+)\}|([+-]?\d))")
_POWER_OF_TEN = re.compile(r"10\^(?:\{([+-]?\d+)\}|([+-]?\d))")
_MAX_EXPONENT = 1000  # "1e999999999" would build a huge integer; treat it as not a number.

_SPACING = re.compile(r"\\[!,;: ]|\\q?quad(?![a-zA-Z])|~|\\displaystyle|\s+")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![a-zA-Z])")
_DEGREES = re.compile(r"\^\s*\{?\\circ\}?|°")
_PERCENT = re.compile(r"\\?%")
_TEXT_START = re.compile(r"\\(?:text|textbf|mbox|mathrm|mathbf)\s*\{")
_UNIT_POWER = re.compile(r"\^\{?[23]\}?")  # a unit's square or cube: "\mathrm{cm}^2"
_LEADING_VARIABLE = re.compile(r"^(?:[A-Za-z]|\\[A-Za-z]+)(?:_\{?\w+\}?)?\s*=(?!=)\s*(?=\S)")
_WORD_UNITS = re.compile(r"^(-?[\d.,/]+)\s+[A-Za-z]{2,}(?:\s+[A-Za-z]+)*$")


def _braced(text: str, open_at: int) -> tuple[str, int] | None:
    """(content, index after the closing brace) of the group opening at text[open_at] == "{"."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i], i + 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last balanced \\boxed{...} or \\fbox{...}, nested braces included."""
    closes, stack = {}, []  # one pass: the closing brace of every balanced opening brace
    for i, char in enumerate(text):
        if char == "{":
            stack.append(i)
        elif char == "}" and stack:
            closes[stack.pop()] = i
    for match in reversed(list(_BOX_START.finditer(text))):
        if match.end() - 1 in closes:
            return text[match.end() : closes[match.end() - 1]]
    return None


def _marked_answer(text: str) -> str | None:
    """The answer a text marks explicitly: last boxed, else last "#### X"; None if unmarked."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    hashes = [h.strip() for h in _HASHES.findall(text)]
    return hashes[-1] if hashes and hashes[-1] else None


def extract_answer(completion: str) -> str | None:
    """The final answer a completion commits to, as raw text (see the module docstring's order).

    Args:
      completion: decoded model output.

    Returns:
      The last boxed / fboxed content, else the last "#### X", else the last "answer is X" cut at
      the end of its sentence, else the last number; None if there is none of these.
    """
    marked = _marked_answer(completion)
    if marked is not None:
        return marked
    stated = [s for s in _ANSWER_IS.findall(completion) if s.strip()]
    if stated:
        return _SENTENCE_END.split(stated[-1], maxsplit=1)[0].strip()
    numbers = _NUMBER.findall(completion)
    return numbers[-1] if numbers else None


def _frac_argument(text: str) -> tuple[str, str] | None:
    """(argument, rest) of one \\frac argument: a braced group or a single character."""
    if not text:
        return None
    if text[0] == "{":
        group = _braced(text, 0)
        return None if group is None else (group[0], text[group[1] :])
    return text[0], text[1:]


def _wraps_whole(text: str, opener: str, closer: str) -> bool:
    """Whether text[0] == opener closes only at the last character."""
    if len(text) < 2 or text[0] != opener or text[-1] != closer:
        return False
    depth = 0
    for i, char in enumerate(text):
        depth += (char == opener) - (char == closer)
        if depth == 0:
            return i == len(text) - 1
    return False


def _scalar(text: str) -> Fraction | None:
    """Exact value of a cleaned, whitespace-free number; None if it is not one."""
    if not text:
        return None
    if text[0] in "+-":
        value = _scalar(text[1:])
        return None if value is None else (-value if text[0] == "-" else value)
    if _wraps_whole(text, "{", "}") or (_wraps_whole(text, "(", ")") and "," not in text):
        return _scalar(text[1:-1])
    if text.startswith("\\frac"):
        first = _frac_argument(text[5:])
        second = _frac_argument(first[1]) if first else None
        if second is None or second[1]:
            return None
        num, den = _scalar(first[0]), _scalar(second[0])
        return None if num is None or not den else num / den
    power = _POWER_OF_TEN.fullmatch(text)
    if power:
        exponent = int(power[1] or power[2])
        return Fraction(10) ** exponent if abs(exponent) <= _MAX_EXPONENT else None
    times = _TIMES_TEN.fullmatch(text)
    if times:
        mantissa, exponent = _scalar(times[1]), int(times[2] or times[3])
        if mantissa is None or abs(exponent) > _MAX_EXPONENT:
            return None
        return mantissa * Fraction(10) ** exponent
    if text.count("/") == 1:
        num, den = (_scalar(part) for part in text.split("/"))
        return None if num is None or not den else num / den
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    decimal = _DECIMAL.fullmatch(text)
    if not decimal or (decimal[1] and abs(int(decimal[1])) > _MAX_EXPONENT):
        return None
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def _latex_light(text: str) -> str:
    """Drops `$`, spacing, \\left / \\right and LaTeX thousands braces; \\dfrac -> \\frac."""
    text = text.replace("−", "-").replace("$", "").replace("{,}", ",")
    text = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", text)
    return _SPACING.sub("", _LEFT_RIGHT.sub("", text))


def parse_number(text: str) -> Fraction | None:
    """An exact rational from a written number; None if it is not a number.

    Accepts "12", "-3.5", "1,234", "3/4", "1e3", "2.5\\times10^{3}", "\\frac{1}{2}", "\\dfrac12",
    "-\\frac{1}{2}", optionally inside `$...$`. Rejects "1/0", "1,2" (not a thousands group) and
    expressions ("2+2", "\\sqrt{4}").
    """
    return _scalar(_latex_light(text))


def final_number(completion: str) -> Fraction | None:
    """The number a completion commits to: its last \\boxed{...} if any, else its last number.

    A boxed answer that is not a number ("\\boxed{x+1}") gives None rather than a number from
    elsewhere in the text; units, "x =" and a percent sign inside the box are dropped.
    """
    boxed = last_boxed(completion)
    if boxed is not None:
        return _scalar(_normalize(boxed)[0])
    numbers = _NUMBER.findall(completion)
    return parse_number(numbers[-1]) if numbers else None


def numeric_match_reward(completion: str, answer: str) -> float:
    """1.0 if the completion's final number equals the reference answer exactly, else 0.0."""
    got, want = final_number(completion), parse_number(answer)
    return 1.0 if got is not None and want is not None and got == want else 0.0


def _drop_text_groups(text: str) -> str:
    """Drops trailing \\text{...}-like groups after an answer (units) and unwraps the others."""
    while True:
        starts = list(_TEXT_START.finditer(text))
        if not starts:
            return text
        last = starts[-1]
        group = _braced(text, last.end() - 1)
        if group is None:
            return text
        content, end = group
        before, after = text[: last.start()], text[end:]
        if before.strip() and (not after.strip() or _UNIT_POWER.fullmatch(after.strip())):
            text = before  # a unit after the answer (cm, or cm^2)
        else:
            text = before + content + after


def _normalize(text: str) -> tuple[str, bool]:
    """(whitespace-free canonical text, whether it carried a percent sign)."""
    text = _unboxed(text.strip())
    text = _DEGREES.sub("", text.replace("−", "-").replace("\\$", "").replace("$", ""))
    text = _LEFT_RIGHT.sub("", text.replace("\\displaystyle", ""))
    text, percents = _PERCENT.subn("", text)
    text = _drop_text_groups(text).strip().rstrip(".").strip()
    text = _LEADING_VARIABLE.sub("", text)
    text = _WORD_UNITS.sub(r"\1", text)
    text = _latex_light(text).rstrip(".")
    text = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\frac(\d)", r"\\frac{\1}", text)
    text = re.sub(r"\\frac(\{[^{}]*\})(\d)", r"\\frac\1{\2}", text)
    text = re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", text)
    text = re.sub(r"([\^_])\{(\w)\}", r"\1\2", text)
    return text, percents > 0


def _unboxed(text: str) -> str:
    """The contents of a \\boxed{...} / \\fbox{...} that is the whole text, else the text."""
    start = _BOX_START.match(text)
    group = _braced(text, start.end() - 1) if start else None
    return group[0] if group and group[1] == len(text) else text


def _split_top_level(text: str) -> list[str]:
    """Splits on commas outside (), [] and {}."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def _elements(text: str) -> tuple[str, list[str]]:
    """(brackets, elements): "(1,2]" -> ("(]", ["1", "2"]), a scalar -> ("", [text])."""
    if _THOUSANDS.fullmatch(text.lstrip("+-")):
        return "", [text]
    if len(text) >= 2 and text[0] in "([" and text[-1] in ")]":
        depth = 0
        for i, char in enumerate(text):
            depth += (char in "([") - (char in ")]")
            if depth == 0 and i < len(text) - 1:
                break  # "(1)+(2)": the first bracket closes early, not a tuple
        else:
            inner = _split_top_level(text[1:-1])
            if len(inner) > 1:
                return text[0] + text[-1], inner
    parts = _split_top_level(text)
    return ("," if len(parts) > 1 else ""), parts


def _scalar_equal(pred: str, ref: str, pred_percent: bool, ref_percent: bool) -> bool:
    """Exact numeric equality when both parse (with the percent rule), else string equality."""
    a, b = _scalar(pred), _scalar(ref)
    if a is None or b is None:
        return a is None and b is None and pred == ref
    if a == b:
        return True
    if pred_percent and not ref_percent:
        return a / 100 == b
    if ref_percent and not pred_percent:
        return a == b / 100
    return False


def math_equal(pred: str, ref: str) -> bool:
    """Whether a predicted answer equals a reference answer (rules in the module docstring).

    Args:
      pred: the extracted answer (e.g. from `extract_answer`), raw LaTeX or plain text.
      ref: the reference answer.

    Returns:
      True if both are the same number (exactly), the same tuple / interval elementwise, or
      the same string after normalisation.
    """
    (pred_text, pred_percent), (ref_text, ref_percent) = _normalize(pred), _normalize(ref)
    if not pred_text or not ref_text:
        return False
    (pred_brackets, preds), (ref_brackets, refs) = _elements(pred_text), _elements(ref_text)
    if pred_brackets != ref_brackets or len(preds) != len(refs):
        return False
    return all(
        _scalar_equal(p, r, pred_percent, ref_percent) for p, r in zip(preds, refs, strict=True)
    )


def math_reward(
    completion: str, answer: str, equal: Callable[[str, str], bool] = math_equal
) -> float:
    """1.0 if the completion's extracted answer equals the reference, else 0.0.

    Args:
      completion: decoded model output.
      answer: the reference answer; a full reference solution also works when it marks its
        answer with \\boxed{...} (MATH) or "#### X" (GSM8K).
      equal: `(predicted, reference) -> bool`; `math_equal`, or another grader such as
        `rljax.rewards.math_verify.math_verify_equal`.

    Returns:
      1.0 or 0.0.
    """
    pred = extract_answer(completion)
    ref = _marked_answer(answer)
    return 1.0 if pred is not None and equal(pred, answer if ref is None else ref) else 0.0

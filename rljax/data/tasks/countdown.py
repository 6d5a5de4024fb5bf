"""Countdown: reach a target number with + - * / and parentheses over given numbers.

An instance is a list of `num_numbers` integers in [1, max_number] and a target. The target is
built from a random expression over the numbers (all of them when `use_all`, else a random
subset of at least two), whose intermediate results are positive integers, so every instance
is solvable and the stored expression is one known solution. With `min_numbers` set, each
instance first draws how many numbers it gives, uniformly in [min_numbers, num_numbers]; that
count is its curriculum level (`difficulty`). The answer is JSON holding the target, the
numbers, the `use_all` rule and that solution, so `reward` can check any correct expression,
not only the stored one.

The reward never calls `eval`: a small recursive-descent parser accepts only non-negative
integer literals, binary + - * /, and parentheses (no unary minus, no `**`, no names), and the
value is computed in exact `Fraction` arithmetic. Train and test are disjoint: a fixed hash of
(target, sorted numbers) puts each instance in one split, whatever the seed.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
from fractions import Fraction

import numpy as np

from rljax.data.tasks.generated import GeneratedSplits
from rljax.data.tasks.split_hash import unit_hash

_MAX_DRAWS = 1000
_MAX_NUMBERS = 8
_MAX_NESTING = 32  # deeper parentheses are rejected before they can exhaust the stack
_MAX_EXPRESSION_CHARS = 500
_TOKEN = re.compile(r"\s*(?:(\d+)|([-+*/()]))")
_EXPRESSION_CHARS = re.compile(r"[\d\s+\-*/()]*$")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


@dataclasses.dataclass(frozen=True)
class _Leaf:
    value: int


@dataclasses.dataclass(frozen=True)
class _Node:
    op: str
    left: _Leaf | _Node
    right: _Leaf | _Node


def parse_expression(text: str) -> _Leaf | _Node | None:
    """The syntax tree of an arithmetic expression, or None if it is not one.

    Grammar: expr := term (("+"|"-") term)*; term := atom (("*"|"/") atom)*;
    atom := integer | "(" expr ")". Anything else (unary minus, "**", decimals, names, more than
    `_MAX_NESTING` nested parentheses or `_MAX_EXPRESSION_CHARS` characters) gives None.
    """
    if len(text) > _MAX_EXPRESSION_CHARS:
        return None
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            return None
        tokens.append(int(match.group(1)) if match.group(1) is not None else match.group(2))
        pos = match.end()
    parser = _Parser(tokens)
    try:
        tree = parser.expression(0)
    except _SyntaxError:
        return None
    return tree if parser.pos == len(tokens) else None


class _SyntaxError(Exception):
    pass


class _Parser:
    def __init__(self, tokens: list[int | str]):
        self.tokens, self.pos = tokens, 0

    def _peek(self) -> int | str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def expression(self, nesting: int) -> _Leaf | _Node:
        tree = self.term(nesting)
        while self._peek() in ("+", "-"):
            op = self.tokens[self.pos]
            self.pos += 1
            tree = _Node(op, tree, self.term(nesting))
        return tree

    def term(self, nesting: int) -> _Leaf | _Node:
        tree = self.atom(nesting)
        while self._peek() in ("*", "/"):
            op = self.tokens[self.pos]
            self.pos += 1
            tree = _Node(op, tree, self.atom(nesting))
        return tree

    def atom(self, nesting: int) -> _Leaf | _Node:
        token = self._peek()
        self.pos += 1
        if isinstance(token, int):
            return _Leaf(token)
        if token == "(" and nesting < _MAX_NESTING:
            tree = self.expression(nesting + 1)
            if self._peek() != ")":
                raise _SyntaxError
            self.pos += 1
            return tree
        raise _SyntaxError


def _leaves(tree: _Leaf | _Node) -> list[int]:
    if isinstance(tree, _Leaf):
        return [tree.value]
    return _leaves(tree.left) + _leaves(tree.right)


def evaluate(tree: _Leaf | _Node) -> Fraction | None:
    """The exact value of a parsed expression, or None on division by zero."""
    if isinstance(tree, _Leaf):
        return Fraction(tree.value)
    left, right = evaluate(tree.left), evaluate(tree.right)
    if left is None or right is None:
        return None
    if tree.op == "+":
        return left + right
    if tree.op == "-":
        return left - right
    if tree.op == "*":
        return left * right
    return None if right == 0 else left / right


def final_expression(completion: str) -> str:
    """The expression a completion commits to (see `CountdownTask.reward` for the rule)."""
    boxed = _BOXED.findall(completion)
    lines = [line for line in completion.splitlines() if line.strip()]
    text = boxed[-1] if boxed else (lines[-1] if lines else "")
    # A suffix longer than the cap is rejected by the parser anyway, so scan only that far.
    text = text.split("=")[0][-(_MAX_EXPRESSION_CHARS + 1) :]
    start = len(text)
    while start > 0 and _EXPRESSION_CHARS.match(text[start - 1]):
        start -= 1
    return text[start:].strip()


def _render(tree: _Leaf | _Node) -> str:
    """Infix text with the parentheses precedence and left-associativity need."""
    if isinstance(tree, _Leaf):
        return str(tree.value)
    prec = _PRECEDENCE[tree.op]

    def side(child: _Leaf | _Node, right: bool) -> str:
        text = _render(child)
        if isinstance(child, _Node):
            child_prec = _PRECEDENCE[child.op]
            if child_prec < prec or (right and child_prec == prec and tree.op in "-/"):
                return f"({text})"
        return text

    return f"{side(tree.left, False)} {tree.op} {side(tree.right, True)}"


@dataclasses.dataclass(frozen=True)
class CountdownTask(GeneratedSplits):
    """Reach a target with + - * / over given numbers, each used at most (or exactly) once.

    Attributes:
      num_numbers: how many numbers an instance gives (2 to 8); the most it gives when
        `min_numbers` is set.
      min_numbers: None (every instance gives `num_numbers`) or the fewest numbers an instance
        gives (2 to num_numbers): each instance draws its count uniformly in
        [min_numbers, num_numbers] from its own generator. None and min_numbers == num_numbers
        draw nothing, so they generate the same instances.
      max_number: numbers are drawn uniformly from [1, max_number].
      use_all: whether a solution must use every number exactly once (else at most once); the
        generated target then uses all numbers, else a random subset of at least two.
      format_reward: reward for a well-formed expression over allowed numbers whose value is
        wrong; 0.0 by default (no format reward).
      seed: seeds instance generation; splits stay the same for every seed.
      test_fraction: share of (target, numbers) instances held out for the test split.
      test_size: examples in the finite test split (train is unbounded).
    """

    num_numbers: int = 4
    min_numbers: int | None = None
    max_number: int = 25
    use_all: bool = False
    format_reward: float = 0.0
    seed: int = 0
    test_fraction: float = 0.1
    test_size: int = 500

    def __post_init__(self):
        if not 2 <= self.num_numbers <= _MAX_NUMBERS:
            raise ValueError(f"num_numbers={self.num_numbers} must be in [2, {_MAX_NUMBERS}]")
        if self.min_numbers is not None and not 2 <= self.min_numbers <= self.num_numbers:
            raise ValueError(
                f"min_numbers={self.min_numbers} must be None or in [2, num_numbers="
                f"{self.num_numbers}]"
            )
        if self.max_number < 2:
            raise ValueError(f"max_number={self.max_number} must be at least 2")
        if not 0.0 <= self.format_reward < 1.0:
            raise ValueError(f"format_reward={self.format_reward} must be in [0, 1)")
        self.check_split_settings()

    def in_test_split(self, target: int, numbers: list[int]) -> bool:
        """Whether the instance (target, numbers in any order) belongs to the test split."""
        return unit_hash(target, *sorted(numbers)) < self.test_fraction

    def example(self, index: int, split: str) -> dict[str, str]:
        """dict(prompt=instructions, answer=JSON of target, numbers, use_all and a solution)."""
        rng = self.example_rng(index, split)
        count = self._count(rng)
        for _ in range(_MAX_DRAWS):
            numbers = [int(x) for x in rng.integers(1, self.max_number + 1, count)]
            tree = self._random_expression(rng, numbers)
            target = int(evaluate(tree))
            if self.in_test_split(target, numbers) != (split == "test"):
                continue
            rule = "exactly once" if self.use_all else "at most once"
            prompt = (
                f"Using the numbers {numbers}, each {rule}, and the operations + - * / with "
                f"parentheses, write an expression equal to {target}. Give the expression on "
                "the last line."
            )
            answer = {
                "target": target,
                "numbers": numbers,
                "use_all": self.use_all,
                "solution": _render(tree),
            }
            return {"prompt": prompt, "answer": json.dumps(answer)}
        raise ValueError(f"no {split} instance found in {_MAX_DRAWS} draws for {self}")

    def difficulty(self, index: int, split: str) -> int:
        """How many numbers example `index` of `split` gives (a curriculum level).

        Read from the example's generator without building the instance, so it is cheap.
        """
        return self._count(self.example_rng(index, split))

    def reward(self, completion: str, answer: str) -> float:
        """1.0 if the completion's final expression uses allowed numbers and equals the target.

        The final expression is the last \\boxed{...} if any, else the last non-empty line;
        text from the first "=" on is dropped ("(3 + 5) * 2 = 16" counts as "(3 + 5) * 2") and
        so is any leading non-expression text ("Answer: ..."). It must parse (see
        `parse_expression`), use a sub-multiset of the numbers (the whole multiset when the
        answer's use_all is set) and evaluate exactly to the target; division by zero gives 0.
        A parsed expression over allowed numbers with the wrong value gets `format_reward`.
        """
        spec = json.loads(answer)
        tree = parse_expression(final_expression(completion))
        if tree is None:
            return 0.0
        used, given = collections.Counter(_leaves(tree)), collections.Counter(spec["numbers"])
        if used - given or (spec["use_all"] and used != given):
            return 0.0
        value = evaluate(tree)
        if value is None:
            return 0.0
        return 1.0 if value == spec["target"] else self.format_reward

    def sft_target(self, answer: str) -> str:
        """A supervised warm start teaches the stored solution expression."""
        return json.loads(answer)["solution"]

    def _count(self, rng: np.random.Generator) -> int:
        """The number of given numbers: the example generator's first draw, when there is one."""
        low = self.num_numbers if self.min_numbers is None else self.min_numbers
        if low == self.num_numbers:
            return self.num_numbers
        return int(rng.integers(low, self.num_numbers + 1))

    def _random_expression(self, rng: np.random.Generator, numbers: list[int]) -> _Leaf | _Node:
        """A random expression over all numbers (use_all) or a random subset of two or more,
        combining random pairs with an operation whose result is a positive integer."""
        count = len(numbers)
        size = count if self.use_all else int(rng.integers(2, count + 1))
        chosen = [numbers[i] for i in rng.permutation(count)[:size]]
        pool: list[_Leaf | _Node] = [_Leaf(x) for x in chosen]
        while len(pool) > 1:
            i, j = (int(k) for k in rng.choice(len(pool), 2, replace=False))
            a, b = pool[i], pool[j]
            va, vb = evaluate(a), evaluate(b)
            ops = ["+", "*"] + (["-"] if va > vb else []) + (["/"] if va % vb == 0 else [])
            node = _Node(ops[int(rng.integers(len(ops)))], a, b)
            pool = [t for k, t in enumerate(pool) if k not in (i, j)] + [node]
        return pool[0]

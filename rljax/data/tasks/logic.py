"""ScaleLogic-style deductive reasoning with separate knobs for proof depth and logic.

ScaleLogic (see /work/shared/seeds/abstracts.txt) controls two axes of difficulty: the depth of
the proof and the expressiveness of the logic. This module is an interpretation of that
abstract (no code was published with it). Each level adds constructs to the previous ones:

- "implication": rules "If A, then B." over literals of one named entity.
- "conjunction": + premises joined by "and".
- "disjunction": + disjunctive facts and conclusions ("A or B"), used by proof by cases.
- "negation": + negated literals ("Bram is not wumpy") in facts, premises and conclusions.
- "forall": + several entities and universally quantified rules
  ("For all x, if x is wumpy, then x is zorpy."), applied to each entity.

Proof system (the semantics the answers follow). A known item is a literal or a disjunction of
two literals. A step is either modus ponens (a rule whose premises are all known literals gives
its conclusion) or proof by cases (a known disjunction "A or B", a rule with A among its
premises and a rule with B among its premises, both concluding the literal C and with all
other premises known, gives C). The depth of an item is 0 for facts and otherwise 1 + the
largest depth among what its step uses, minimised over proofs; `prove` computes it by rounds.

Negation is contrapositive-free by design: each predicate has one polarity in every fact and
conclusion, so no literal and its negation are ever both known, and contraposition,
contradiction and disjunctive syllogism never apply; a negated literal behaves as an atom of
its own. Distractor premises may use the opposite polarity, which then never holds.

Answers: closed world over provability. The question asks whether the statement can be
proven; "False" means it cannot be proven (not that its negation holds). A True instance is a
proof chain of exactly `depth` steps (the example's drawn depth with `min_depth`; checked
with `prove`) plus distractor rules whose conclusions are fresh predicates, so they never reach
the query. A False instance is the same construction with one link broken (a premise or a
fact replaced by an unprovable literal, or, from "negation" on, a premise's polarity flipped),
so both classes look alike. Classes are balanced in expectation (each example is True with
probability 1/2).

Mixed depths: with `min_depth` set, each example first draws its chain depth uniformly in
[min_depth, depth] and is built (and checked) for that depth; the drawn depth is its curriculum
level (`difficulty`). For a False instance it is the depth of the unbroken chain the instance
was made from (interpretation: the query has no proof, so there is no minimal proof depth to
report; the drawn depth keeps the two classes of a level alike, as the construction does).

Train and test are disjoint: a fixed hash of the prompt text puts each problem in one split.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable

import numpy as np

from rljax.data.tasks.generated import GeneratedSplits
from rljax.data.tasks.split_hash import unit_hash

LEVELS = ("implication", "conjunction", "disjunction", "negation", "forall")
_MAX_DRAWS = 1000
_MAX_DEPTH = 20
_MAX_DISTRACTORS = 20
_ONSETS = ("blor", "wump", "zar", "quil", "fren", "grob", "tov", "snib", "dral", "yup", "krel")
_ONSETS += ("mip", "vosk", "plen", "hask", "trun")
_ENDINGS = ("y", "ish", "ic", "ant", "ous", "ive", "al")
_WORDS = tuple(onset + ending for onset in _ONSETS for ending in _ENDINGS)
_NAMES = ("Bram", "Tova", "Quill", "Mirel", "Osk", "Fenna", "Dax", "Ilse", "Rook", "Sela")
_ANSWER_WORD = re.compile(r"\b(true|false)\b", re.IGNORECASE)

Literal = tuple[int, bool]  # (predicate id, positive)
Clause = frozenset  # of 1 literal (a literal) or 2 literals (a disjunction)
Rule = tuple[tuple[Literal, ...], Clause]  # (conjunctive premises, conclusion)


def prove(facts: Iterable[Clause], rules: Iterable[Rule]) -> dict[Clause, int]:
    """Every provable item of one entity with its minimal proof depth (see module docstring).

    Args:
      facts: known clauses (frozensets of one or two (predicate, positive) literals).
      rules: (premises, conclusion) pairs; premises a tuple of literals, conclusion a clause.

    Returns:
      {clause: depth}: round k adds every item whose step uses only items of earlier rounds, so
      an item's round is its minimal proof depth.
    """
    rules = list(rules)
    known = {frozenset(c): 0 for c in facts}
    depth = 0
    while True:
        depth += 1
        literals = {next(iter(c)) for c in known if len(c) == 1}
        new = {c for prem, c in rules if c not in known and all(p in literals for p in prem)}
        # usable[C]: literals x such that some rule concluding C fires once x is known.
        usable: dict[Clause, set[Literal]] = {}
        for prem, c in rules:
            if len(c) == 1:
                for i, x in enumerate(prem):
                    if all(p in literals for p in prem[:i] + prem[i + 1 :]):
                        usable.setdefault(c, set()).add(x)
        for d in (c for c in known if len(c) == 2):
            a, b = d
            new |= {c for c, xs in usable.items() if c not in known and a in xs and b in xs}
        if not new:
            return known
        known.update({c: depth for c in new})


@dataclasses.dataclass
class _Theory:
    """Rules (universal over entities) and per-entity facts; entity 0 is the query's."""

    facts: list[list[Clause]]
    rules: list[Rule]
    query: Literal


class _Builder:
    """Allocates predicates with one fixed polarity each (random from "negation" on)."""

    def __init__(self, rng: np.random.Generator, negation: bool):
        self.rng, self.negation, self.polarity = rng, negation, []

    def fresh(self) -> Literal:
        positive = bool(self.rng.random() < 0.5) if self.negation else True
        self.polarity.append(positive)
        return (len(self.polarity) - 1, positive)


@dataclasses.dataclass(frozen=True)
class LogicTask(GeneratedSplits):
    """Is a statement provable from facts and rules? Knobs: proof depth and logic level.

    Attributes:
      depth: number of steps in the minimal proof of the query (1 to 20); the largest such
        number when `min_depth` is set.
      min_depth: None (every example has `depth` steps) or the smallest depth (1 to depth):
        each example draws its depth uniformly in [min_depth, depth] from its own generator.
        None and min_depth == depth draw nothing, so they generate the same examples.
      logic: one of LEVELS; each level adds constructs to the previous ones.
      num_distractors: distractor rules that never lead to the query (0 to 20).
      num_entities: entities at the "forall" level (others use one entity). Each other entity
        gets a random half of the unbroken chain's and the distractors' facts, so the query's
        predicate may be provable for another entity even in a False instance.
      seed: seeds generation; splits stay the same for every seed.
      test_fraction: share of problems (by prompt hash) held out for the test split.
      test_size: examples in the finite test split (train is unbounded).
    """

    depth: int = 3
    min_depth: int | None = None
    logic: str = "implication"
    num_distractors: int = 4
    num_entities: int = 3
    seed: int = 0
    test_fraction: float = 0.1
    test_size: int = 500

    def __post_init__(self):
        if not 1 <= self.depth <= _MAX_DEPTH:
            raise ValueError(f"depth={self.depth} must be in [1, {_MAX_DEPTH}]")
        if self.min_depth is not None and not 1 <= self.min_depth <= self.depth:
            raise ValueError(
                f"min_depth={self.min_depth} must be None or in [1, depth={self.depth}]"
            )
        if self.logic not in LEVELS:
            raise ValueError(f"logic={self.logic!r} is not one of {LEVELS}")
        if not 0 <= self.num_distractors <= _MAX_DISTRACTORS:
            raise ValueError(
                f"num_distractors={self.num_distractors} must be in [0, {_MAX_DISTRACTORS}]"
            )
        if not 1 <= self.num_entities <= len(_NAMES):
            raise ValueError(f"num_entities={self.num_entities} must be in [1, {len(_NAMES)}]")
        self.check_split_settings()

    def in_test_split(self, prompt: str) -> bool:
        """Whether the problem with this prompt text belongs to the test split."""
        return unit_hash(*prompt.encode("utf-8")) < self.test_fraction

    def example(self, index: int, split: str) -> dict[str, str]:
        """dict(prompt=facts, rules and question, answer="True" or "False")."""
        rng = self.example_rng(index, split)
        depth = self._depth(rng)
        for _ in range(_MAX_DRAWS):
            label = bool(rng.random() < 0.5)
            theory, num_predicates = self._theory(rng, label, depth)
            prompt = self._render(rng, theory, num_predicates)
            if self.in_test_split(prompt) == (split == "test"):
                return {"prompt": prompt, "answer": str(label)}
        raise ValueError(f"no {split} problem found in {_MAX_DRAWS} draws for {self}")

    def difficulty(self, index: int, split: str) -> int:
        """The proof depth example `index` of `split` was built with (a curriculum level).

        For a True example this is the minimal proof depth of the query; for a False one, the
        depth of the chain before a link was broken. Read from the example's generator
        without building the problem, so it is cheap.
        """
        return self._depth(self.example_rng(index, split))

    def reward(self, completion: str, answer: str) -> float:
        """1.0 if the completion's last "True"/"False" word (any case) matches the answer."""
        words = _ANSWER_WORD.findall(completion)
        return 1.0 if words and words[-1].lower() == answer.lower() else 0.0

    def sft_target(self, answer: str) -> str:
        """A supervised warm start teaches the bare answer word."""
        return answer

    def _depth(self, rng: np.random.Generator) -> int:
        """The example's proof depth: the example generator's first draw, when there is one."""
        low = self.depth if self.min_depth is None else self.min_depth
        return self.depth if low == self.depth else int(rng.integers(low, self.depth + 1))

    def _theory(self, rng: np.random.Generator, label: bool, depth: int) -> tuple[_Theory, int]:
        level = LEVELS.index(self.logic)
        b = _Builder(rng, negation=level >= 3)
        facts: list[Clause] = []
        rules: list[Rule] = []
        prev, steps = b.fresh(), 0
        if level >= 2 and rng.random() < 0.5:  # start from a disjunctive fact, by cases
            x, y, prev = b.fresh(), b.fresh(), b.fresh()
            facts.append(frozenset({x, y}))
            rules += [((x,), frozenset({prev})), ((y,), frozenset({prev}))]
            steps = 1
        else:
            facts.append(frozenset({prev}))
        while steps < depth:
            kinds = ["if"] + ["and"] * (level >= 1) + ["cases"] * (level >= 2)
            kind = kinds[int(rng.integers(len(kinds)))]
            if kind == "cases" and steps + 2 <= depth:
                x, y, nxt = b.fresh(), b.fresh(), b.fresh()
                rules += [((prev,), frozenset({x, y}))]
                rules += [((x,), frozenset({nxt})), ((y,), frozenset({nxt}))]
                steps += 2
            elif kind == "and":
                extra, nxt = b.fresh(), b.fresh()
                facts.append(frozenset({extra}))
                premises = (prev, extra) if rng.random() < 0.5 else (extra, prev)
                rules.append((premises, frozenset({nxt})))
                steps += 1
            else:
                nxt = b.fresh()
                rules.append(((prev,), frozenset({nxt})))
                steps += 1
            prev = nxt
        query, original_facts = prev, facts
        if not label:
            facts, rules = self._break_link(rng, b, facts, rules)
        chain_predicates = len(b.polarity)
        distractor_facts, distractor_rules = self._distractors(rng, b, level, chain_predicates)
        got = prove(facts + distractor_facts, rules + distractor_rules).get(frozenset({query}))
        if got != (depth if label else None):  # the construction guarantees this
            raise AssertionError(
                f"proof depth {got} for a depth-{depth} {label} instance of {self}"
            )
        entity_facts = [facts + distractor_facts]
        for _ in range(1, self.num_entities if level == 4 else 1):
            pool = original_facts + distractor_facts  # other entities may prove the query
            entity_facts.append([c for c in pool if rng.random() < 0.5])
        return _Theory(entity_facts, rules + distractor_rules, query), len(b.polarity)

    def _break_link(
        self,
        rng: np.random.Generator,
        b: _Builder,
        facts: list[Clause],
        rules: list[Rule],
    ) -> tuple[list[Clause], list[Rule]]:
        """Replace one fact literal or rule premise by an unprovable literal."""
        sites = [("fact", i, x) for i, c in enumerate(facts) for x in c]
        sites += [("rule", i, x) for i, (prem, _) in enumerate(rules) for x in prem]
        where, i, old = sites[int(rng.integers(len(sites)))]
        if where == "rule" and b.negation and rng.random() < 0.5:
            new = (old[0], not old[1])  # same predicate, opposite polarity: never known
        else:
            new = b.fresh()
        facts, rules = list(facts), list(rules)
        if where == "fact":
            facts[i] = frozenset(new if x == old else x for x in facts[i])
        else:
            prem, conclusion = rules[i]
            rules[i] = (tuple(new if x == old else x for x in prem), conclusion)
        return facts, rules

    def _distractors(
        self, rng: np.random.Generator, b: _Builder, level: int, chain_predicates: int
    ) -> tuple[list[Clause], list[Rule]]:
        """Rules whose conclusions are fresh predicates (never a chain predicate), with premises
        from chain predicates, distractor predicates and one-off unprovable ones."""
        heads = [b.fresh() for _ in range(max(2, self.num_distractors))]
        facts = [frozenset({h}) for h in heads if rng.random() < 0.3]
        rules: list[Rule] = []
        for _ in range(self.num_distractors):
            premises = []
            for _ in range(int(rng.integers(1, 3)) if level >= 1 else 1):
                source = rng.random()
                if source < 0.5:
                    p = int(rng.integers(chain_predicates))
                    premise = (p, b.polarity[p])
                elif source < 0.8:
                    premise = heads[int(rng.integers(len(heads)))]
                else:
                    premise = b.fresh()
                if b.negation and rng.random() < 0.2:
                    premise = (premise[0], not premise[1])
                premises.append(premise)
            width = 2 if level >= 2 and rng.random() < 0.3 else 1
            picks = rng.choice(len(heads), width, replace=False)
            rules.append((tuple(dict.fromkeys(premises)), frozenset(heads[k] for k in picks)))
        return facts, rules

    def _render(self, rng: np.random.Generator, theory: _Theory, num_predicates: int) -> str:
        words = [_WORDS[k] for k in rng.permutation(len(_WORDS))[:num_predicates]]
        names = [_NAMES[k] for k in rng.permutation(len(_NAMES))[: len(theory.facts)]]
        forall = self.logic == "forall"

        def literal(subject: str, lit: Literal) -> str:
            return f"{subject} is {'' if lit[1] else 'not '}{words[lit[0]]}"

        def clause(subject: str, c: Clause) -> str:
            return " or ".join(literal(subject, x) for x in sorted(c))

        fact_lines = [clause(name, c) + "." for name, cs in zip(names, theory.facts) for c in cs]
        rule_lines = []
        for premises, conclusion in theory.rules:
            subject = "x" if forall else names[0]
            body = " and ".join(literal(subject, p) for p in premises)
            text = f"if {body}, then {clause(subject, conclusion)}."
            rule_lines.append("For all x, " + text if forall else text[0].upper() + text[1:])
        fact_lines = [fact_lines[k] for k in rng.permutation(len(fact_lines))]
        rule_lines = [rule_lines[k] for k in rng.permutation(len(rule_lines))]
        return (
            "Facts:\n"
            + "\n".join(fact_lines)
            + "\nRules:\n"
            + "\n".join(rule_lines)
            + "\nQuestion: using only these facts and rules, can it be proven that "
            + literal(names[0], theory.query)
            + "? Answer True or False."
        )

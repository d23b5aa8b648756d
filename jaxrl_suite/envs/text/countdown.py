"""Countdown: combine the given numbers with + - * / and parentheses to reach a target.

Prompt "3 5 7->56:", a correct completion "<answer>(3+5)*7</answer>". Answers are checked by a
small recursive-descent parser over `fractions.Fraction` (never `eval`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from fractions import Fraction
from typing import ClassVar, NamedTuple

import numpy as np

from jaxrl_suite.envs.text.base import TASKS, Example, Task, answer_tags, extract_answer

MAX_EXPRESSION_CHARS = 100  # longer answers are invalid (and never parsed)
MAX_PAREN_DEPTH = 20  # deeper parenthesis nesting is invalid
_MAX_DRAWS = 10_000  # bound on target rejection sampling inside one rng stream
_DIGITS = "0123456789"
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
_ATOM_PREC = 3


class CountdownMeta(NamedTuple):
    """`Example.meta` of a countdown problem (a plain tuple, so it stays hashable)."""

    numbers: tuple[int, ...]  # in prompt order
    target: int
    expression: str  # the generator's solution, e.g. "(3+5)*7"


def parse_expression(text: str, numbers: Iterable[int]) -> Fraction:
    """Evaluates an arithmetic expression over `numbers`, exactly, as a Fraction.

    Grammar: expr := term (('+'|'-') term)*;  term := factor (('*'|'/') factor)*;
    factor := INT | '(' expr ')'.  Whitespace is ignored; there is no unary minus or power.
    Each literal must be one of `numbers` (no leading zeros) and is used at most as many times
    as it appears there; not every number has to be used.

    Raises:
      ValueError: if the text is malformed, longer than MAX_EXPRESSION_CHARS, nested deeper than
        MAX_PAREN_DEPTH, uses an unavailable number, or divides by zero.
    """
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    return _Parser(_tokenize(text), Counter(numbers)).parse()


def _tokenize(text: str) -> list[str]:
    tokens, i = [], 0
    while i < len(text):
        c = text[i]
        if c in _DIGITS:
            j = i + 1
            while j < len(text) and text[j] in _DIGITS:
                j += 1
            tokens.append(text[i:j])
            i = j
            continue
        if c in "+-*/()":
            tokens.append(c)
        elif not c.isspace():
            raise ValueError(f"unexpected character {c!r}")
        i += 1
    return tokens


class _Parser:
    """Recursive descent over `tokens`, consuming numbers from the multiset `available`."""

    def __init__(self, tokens: list[str], available: Counter):
        self.tokens, self.pos, self.available = tokens, 0, available

    def parse(self) -> Fraction:
        value = self._expr(0)
        if self.pos != len(self.tokens):
            raise ValueError(f"unexpected token {self.tokens[self.pos]!r}")
        return value

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _next(self) -> str:
        token = self._peek()
        if token is None:
            raise ValueError("unexpected end of expression")
        self.pos += 1
        return token

    def _expr(self, depth: int) -> Fraction:
        value = self._term(depth)
        while self._peek() in ("+", "-"):
            op, rhs = self._next(), self._term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def _term(self, depth: int) -> Fraction:
        value = self._factor(depth)
        while self._peek() in ("*", "/"):
            op, rhs = self._next(), self._factor(depth)
            if op == "*":
                value *= rhs
            elif rhs == 0:
                raise ValueError("division by zero")
            else:
                value /= rhs
        return value

    def _factor(self, depth: int) -> Fraction:
        token = self._next()
        if token == "(":
            if depth >= MAX_PAREN_DEPTH:
                raise ValueError(f"parentheses nested deeper than {MAX_PAREN_DEPTH}")
            value = self._expr(depth + 1)
            if self._next() != ")":
                raise ValueError("expected ')'")
            return value
        if token[0] not in _DIGITS:
            raise ValueError(f"expected a number or '(', got {token!r}")
        if len(token) > 1 and token[0] == "0":
            raise ValueError(f"leading zero in {token!r}")
        n = int(token)
        if self.available[n] <= 0:
            raise ValueError(f"number {n} is not available")
        self.available[n] -= 1
        return Fraction(n)


def _paren(text: str, prec: int, need: int) -> str:
    return f"({text})" if prec < need else text


def _random_expression(rng: np.random.Generator, numbers: list[int]) -> tuple[int, str]:
    """Randomly combines `numbers` pairwise until one value remains; returns (value, expression).

    Every intermediate value is a positive integer: '-' needs a > b and '/' needs b > 1 dividing a.
    """
    items = [(n, str(n), _ATOM_PREC) for n in numbers]  # (value, text, precedence)
    while len(items) > 1:
        i, j = (int(k) for k in rng.choice(len(items), size=2, replace=False))
        (a, text_a, prec_a), (b, text_b, prec_b) = items[i], items[j]
        ops = ["+", "*"] + ["-"] * (a > b) + ["/"] * (b > 1 and a % b == 0)
        op = ops[int(rng.integers(len(ops)))]
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
        prec = _PREC[op]
        # a right operand of equal precedence needs parentheses after '-' and '/'.
        text = _paren(text_a, prec_a, prec) + op + _paren(text_b, prec_b, prec + (op in "-/"))
        items = [item for k, item in enumerate(items) if k not in (i, j)] + [(value, text, prec)]
    return items[0][0], items[0][1]


@dataclasses.dataclass(frozen=True)
class CountdownTask(Task):
    """Reach a target from `num_numbers` numbers in [1, max_number] with + - * / and parentheses.

    The generator draws the numbers, builds a random expression over a random subset of at least
    two of them (all intermediate values positive integers) and takes its value as the target,
    redrawing until 1 <= target <= max_target. Meta is `CountdownMeta(numbers, target, expression)`;
    `solution` returns the generator's expression.

    Reward (`score`): 1.0 iff the first `<answer>` content parses (`parse_expression`) with the
    given numbers and equals the target exactly. With `graded=True`, a valid expression of value v
    that misses gets partial credit 0.5 * max(0, 1 - |v - target| / target) (< 0.5, so a miss never
    ties a hit). Malformed, invalid or missing answers score 0.0.
    """

    name: ClassVar[str] = "countdown"
    num_numbers: int = 3
    max_number: int = 20
    max_target: int = 100
    seed: int = 0
    graded: bool = False

    def __post_init__(self):
        for field, low in (("num_numbers", 2), ("max_number", 1), ("max_target", 1)):
            if getattr(self, field) < low:
                raise ValueError(f"{field} must be >= {low}, got {field}={getattr(self, field)}")

    def _generate(self, rng: np.random.Generator) -> Example:
        for _ in range(_MAX_DRAWS):
            numbers = [int(n) for n in rng.integers(1, self.max_number + 1, size=self.num_numbers)]
            k = int(rng.integers(2, self.num_numbers + 1))
            subset = [numbers[i] for i in rng.choice(self.num_numbers, size=k, replace=False)]
            target, expression = _random_expression(rng, subset)
            if 1 <= target <= self.max_target:
                meta = CountdownMeta(tuple(numbers), target, expression)
                prompt = f"{' '.join(map(str, numbers))}->{target}:"
                return Example(prompt=prompt, answer=str(target), meta=meta)
        raise RuntimeError(f"{self!r}: no target <= max_target found in {_MAX_DRAWS} draws")

    def _problem_key(self, ex: Example) -> str:
        return f"{sorted(ex.meta.numbers)}->{ex.meta.target}"

    def solution(self, ex: Example) -> str:
        return answer_tags(ex.meta.expression)

    def score(self, completion: str, ex: Example) -> float:
        content = extract_answer(completion)
        if content is None:
            return 0.0
        try:
            value = parse_expression(content, ex.meta.numbers)
        except ValueError:
            return 0.0
        target = ex.meta.target
        if value == target:
            return 1.0
        if not self.graded:
            return 0.0
        miss = min(abs(value - target) / target, Fraction(1))  # clipped first: no float overflow
        return 0.5 * float(1 - miss)


    def feedback(self, completion: str, ex: Example) -> str:
        """"value 23, target 25" for a valid expression; "no answer" / "invalid expression"."""
        content = extract_answer(completion)
        if content is None:
            return "no answer"
        try:
            value = parse_expression(content, ex.meta.numbers)
        except ValueError:
            return "invalid expression"
        shown = str(value.numerator) if value.denominator == 1 else f"{float(value):.4g}"
        return f"value {shown}, target {ex.meta.target}"


TASKS.register(CountdownTask.name, CountdownTask)

__all__ = ["CountdownMeta", "CountdownTask", "parse_expression"]

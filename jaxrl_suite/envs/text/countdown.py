"""Countdown: combine the given numbers with + - * / and parentheses to reach a target.

Prompt "3 5 7->56:", a correct completion "<answer>(3+5)*7</answer>". Answers are checked by
`rewards.expression`, a small recursive-descent parser over `fractions.Fraction` (never `eval`);
`parse_expression` and its limits are re-exported here.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import numpy as np

from jaxrl_suite.envs.text.base import TASKS, Example, Task
from jaxrl_suite.rewards import jax_verify
from jaxrl_suite.rewards.expression import (
    MAX_EXPRESSION_CHARS,
    MAX_PAREN_DEPTH,
    expression_reward,
    parse_expression,
)
from jaxrl_suite.rewards.format import answer_tags, extract_answer

_MAX_DRAWS = 10_000  # bound on target rejection sampling inside one rng stream
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
_ATOM_PREC = 3


class CountdownMeta(NamedTuple):
    """`Example.meta` of a countdown problem (a plain tuple, so it stays hashable)."""

    numbers: tuple[int, ...]  # in prompt order
    target: int
    expression: str  # the generator's solution, e.g. "(3+5)*7"


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

    Reward (`score`, `rewards.expression_reward`): 1.0 iff the first `<answer>` content parses
    (`parse_expression`) with the given numbers and equals the target exactly. With `graded=True`,
    a valid expression of value v that misses gets partial credit
    0.5 * max(0, 1 - |v - target| / target) (< 0.5, so a miss never ties a hit). Malformed,
    invalid or missing answers score 0.0.
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
        return expression_reward(extract_answer(completion), ex.meta.numbers, ex.meta.target,
                                 graded=self.graded)

    def token_verifier(self, tokenizer):
        """`score` on token ids (`jax_verify.expression_value`: the same grammar, the numbers
        as a multiset, exact int32 fractions), for the exact reward; None with `graded` (its
        float miss) or numbers large enough that a valid expression's fractions could leave
        int32 ((2 * max_number) ** num_numbers >= 2^31: a value over k literals is p / q with
        |p| <= 2^k prod x_i)."""
        if self.graded or (2 * self.max_number) ** self.num_numbers >= 2**31:
            return None

        def gold(examples):
            numbers = np.zeros((len(examples), self.num_numbers), np.int32)
            for row, e in enumerate(examples):
                numbers[row] = e.meta.numbers
            return (numbers, np.full(len(examples), self.num_numbers, np.int32),
                    np.array([e.meta.target for e in examples], np.int32))

        def score(decoded, span, g):
            numbers, count, target = g
            value = jax_verify.expression_value(decoded, span, numbers, count,
                                                max_chars=MAX_EXPRESSION_CHARS,
                                                max_depth=MAX_PAREN_DEPTH)
            return (value.valid & (value.num == target * value.den)).astype(np.float32)

        return jax_verify.TokenVerifier(jax_verify.byte_table(tokenizer), tokenizer.eos_id,
                                        gold, score)

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

__all__ = [
    "MAX_EXPRESSION_CHARS",
    "MAX_PAREN_DEPTH",
    "CountdownMeta",
    "CountdownTask",
    "parse_expression",
]

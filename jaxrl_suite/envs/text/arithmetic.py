"""Multi-digit addition: prompt "a+b=", answer "<answer>{a+b}</answer>"."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from jaxrl_suite.envs.text.base import TASKS, Example, Task
from jaxrl_suite.rewards.format import answer_tags, extract_answer
from jaxrl_suite.rewards.match import string_match

_MAX_DIGITS = 18  # operands are drawn as int64


@dataclasses.dataclass(frozen=True)
class ArithmeticTask(Task):
    """Addition of two non-negative integers with `min_digits`..`digits` digits each.

    Each operand draws its digit count uniformly from [min_digits, digits] (min_digits defaults to
    digits), then its value uniformly among numbers with that many digits (no leading zeros; the
    1-digit numbers are 0..9). Example: prompt "123+456=", answer "579", meta (123, 456).

    Reward (`score`): 1.0 iff the first `<answer>` content, stripped, equals str(a + b) exactly
    (`rewards.string_match`, so "0579" or "579.0" score 0.0), else 0.0. a+b and b+a share a
    split.
    """

    name: ClassVar[str] = "arithmetic"
    digits: int = 3
    seed: int = 0
    min_digits: int | None = None

    def __post_init__(self):
        if not 1 <= self.digits <= _MAX_DIGITS:
            raise ValueError(f"digits must be in [1, {_MAX_DIGITS}], got digits={self.digits}")
        if self.min_digits is not None and not 1 <= self.min_digits <= self.digits:
            raise ValueError(
                f"min_digits must be in [1, digits={self.digits}], got min_digits={self.min_digits}"
            )

    def _operand(self, rng: np.random.Generator) -> int:
        lo_digits = self.digits if self.min_digits is None else self.min_digits
        n = int(rng.integers(lo_digits, self.digits + 1))
        return int(rng.integers(0 if n == 1 else 10 ** (n - 1), 10**n))

    def _generate(self, rng: np.random.Generator) -> Example:
        a, b = self._operand(rng), self._operand(rng)
        return Example(prompt=f"{a}+{b}=", answer=str(a + b), meta=(a, b))

    def _problem_key(self, ex: Example) -> str:
        a, b = sorted(ex.meta)
        return f"{a}+{b}"

    def solution(self, ex: Example) -> str:
        return answer_tags(ex.answer)

    def score(self, completion: str, ex: Example) -> float:
        return string_match(extract_answer(completion), ex.answer)


TASKS.register(ArithmeticTask.name, ArithmeticTask)

__all__ = ["ArithmeticTask"]

"""Multi-digit addition: prompt "a+b=", answer "<answer>{a+b}</answer>" (digits most- or
least-significant first)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

import numpy as np

from jaxrl_suite.envs.text.base import TASKS, Example, Task
from jaxrl_suite.rewards import jax_verify
from jaxrl_suite.rewards.format import answer_tags, extract_answer
from jaxrl_suite.rewards.match import string_match

_MAX_DIGITS = 18  # operands are drawn as int64
DIGIT_ORDERS = ("msb", "lsb")  # how an answer's digits are written: most / least significant first


@dataclasses.dataclass(frozen=True)
class ArithmeticTask(Task):
    """Addition of two non-negative integers with `min_digits`..`digits` digits each.

    Each operand draws its digit count uniformly from [min_digits, digits] (min_digits defaults to
    digits), then its value uniformly among numbers with that many digits (no leading zeros; the
    1-digit numbers are 0..9). Example: prompt "123+456=", answer "579", meta (123, 456).

    `digit_order` is how the answer is written: "msb" (most-significant digit first, "579") or
    "lsb" (least-significant first, "975"). With "lsb" each answer digit depends only on the
    operand digits of its place and the carry from the digit written just before it, so a
    left-to-right model computes the sum in the order a person does; with "msb" the units digit,
    which needs no carry but sits at the end, is written last, at a position that moves with the
    sum's length (Lee et al. 2023, "Teaching arithmetic to small transformers", arXiv 2307.03381).

    Reward (`score`): 1.0 iff the first `<answer>` content, stripped, equals the sum written in
    `digit_order` exactly (`rewards.string_match`, so "0579" or "579.0" score 0.0), else 0.0.
    a+b and b+a share a split, which does not depend on `digit_order`.
    """

    name: ClassVar[str] = "arithmetic"
    digits: int = 3
    seed: int = 0
    min_digits: int | None = None
    digit_order: Literal["msb", "lsb"] = "msb"

    def __post_init__(self):
        if self.digit_order not in DIGIT_ORDERS:
            raise ValueError(f"digit_order must be one of {list(DIGIT_ORDERS)}, got "
                             f"{self.digit_order!r}")
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
        total = str(a + b)
        return Example(prompt=f"{a}+{b}=", answer=total[::-1] if self.digit_order == "lsb"
                       else total, meta=(a, b))

    def _problem_key(self, ex: Example) -> str:
        a, b = sorted(ex.meta)
        return f"{a}+{b}"

    def solution(self, ex: Example) -> str:
        return answer_tags(ex.answer)

    def score(self, completion: str, ex: Example) -> float:
        return string_match(extract_answer(completion), ex.answer)

    def token_verifier(self, tokenizer) -> jax_verify.TokenVerifier:
        """`score` on token ids: the stripped answer equals the sum as written
        (`jax_verify.exact_answer`); gold: the answer's code points, digits + 1 wide."""
        return jax_verify.TokenVerifier(
            jax_verify.byte_table(tokenizer), tokenizer.eos_id,
            lambda examples: jax_verify.encode_texts([e.answer for e in examples],
                                                     self.digits + 1),
            lambda decoded, span, gold: jax_verify.exact_answer(decoded, span, *gold))

    def answer_places(self, ex: Example) -> list[int]:
        """The place value of each character of `ex.answer` as written (0 = units, 1 = tens,
        ...): e.g. [2, 1, 0] for "579" in "msb" order, [0, 1, 2] in "lsb" order."""
        places = list(range(len(ex.answer)))
        return places if self.digit_order == "lsb" else places[::-1]


TASKS.register(ArithmeticTask.name, ArithmeticTask)

__all__ = ["ArithmeticTask"]

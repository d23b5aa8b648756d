"""Counting: prompt "count 17 to 23:", answer "<answer>17 18 19 20 21 22 23</answer>".

A task whose prompt names its answer's length: completions run from a few tokens to several
times as many, the spread that length-aware rollout scheduling (`sampling.schedule`,
Infinite Sampling, arXiv 2506.22950) needs to matter.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp
import numpy as np

from jaxrl_suite.envs.text.base import TASKS, Example, Task
from jaxrl_suite.rewards import jax_verify
from jaxrl_suite.rewards.format import answer_tags, extract_answer
from jaxrl_suite.rewards.match import parse_numbers, positional_matches


@dataclasses.dataclass(frozen=True)
class CountTask(Task):
    """Count up from a start in [10, 10 + max_start) through `length` numbers, `length` uniform
    in [1, max_count].

    Reward (`score`): positional matches of the first `<answer>`'s numbers against the count,
    divided by max(len(answer), len(count)), so stopping early and running on both lose credit;
    only the exact count scores 1.0; malformed or missing answers score 0.0.
    """

    name: ClassVar[str] = "count"
    max_count: int = 12
    max_start: int = 80
    seed: int = 0

    def __post_init__(self):
        for field in ("max_count", "max_start"):
            if getattr(self, field) < 1:
                raise ValueError(f"{field} must be >= 1, got {field}={getattr(self, field)}")

    def _generate(self, rng: np.random.Generator) -> Example:
        start = int(rng.integers(10, 10 + self.max_start))
        length = int(rng.integers(1, self.max_count + 1))
        numbers = tuple(range(start, start + length))
        return Example(prompt=f"count {start} to {numbers[-1]}:",
                       answer=" ".join(map(str, numbers)), meta=numbers)

    def solution(self, ex: Example) -> str:
        return answer_tags(ex.answer)

    def score(self, completion: str, ex: Example) -> float:
        content = extract_answer(completion)
        got = None if content is None else parse_numbers(content)
        if not got:
            return 0.0
        return positional_matches(got, ex.meta) / max(len(got), len(ex.meta))

    def token_verifier(self, tokenizer) -> jax_verify.TokenVerifier:
        """`score` on token ids: positional matches of the parsed numbers
        (`jax_verify.number_list`) over max(len(answer), len(count))."""
        def score(decoded, span, gold):
            got = jax_verify.number_list(decoded, span)
            hits = jax_verify.positional_matches(got, gold)
            return jnp.where(got.valid, hits / jnp.maximum(got.count, gold.count), 0.0
                             ).astype(jnp.float32)

        return jax_verify.TokenVerifier(
            jax_verify.byte_table(tokenizer), tokenizer.eos_id,
            lambda examples: jax_verify.encode_numbers([e.meta for e in examples],
                                                       self.max_count), score)


TASKS.register(CountTask.name, CountTask)

__all__ = ["CountTask"]

"""Sorting: prompt "sort 42 7 19 3:", answer "<answer>3 7 19 42</answer>", a dense graded score.

A task where revising helps step by step (ExIt, arXiv 2509.04575, needs one): each revision can
put more numbers in place, and the verifier says how many are.
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
class SortTask(Task):
    """Sort `num_items` integers drawn uniformly from [0, max_value] in ascending order.

    Reward (`score`): the fraction of positions i < num_items whose i-th number of the first
    `<answer>` content (`rewards.parse_numbers`) equals the i-th number of the sorted list
    (`rewards.positional_matches`: a longer answer is cut at num_items; a shorter one misses the
    rest). Malformed or missing answers score 0.0; only the
    exact sorted list scores 1.0. Problems with the same multiset share a split.
    """

    name: ClassVar[str] = "sort"
    num_items: int = 6
    max_value: int = 99
    seed: int = 0

    def __post_init__(self):
        for field, low in (("num_items", 2), ("max_value", 1)):
            if getattr(self, field) < low:
                raise ValueError(f"{field} must be >= {low}, got {field}={getattr(self, field)}")

    def _generate(self, rng: np.random.Generator) -> Example:
        numbers = tuple(int(x) for x in rng.integers(0, self.max_value + 1, self.num_items))
        return Example(prompt=f"sort {' '.join(map(str, numbers))}:",
                       answer=" ".join(map(str, sorted(numbers))), meta=numbers)

    def _problem_key(self, ex: Example) -> str:
        return " ".join(map(str, sorted(ex.meta)))

    def solution(self, ex: Example) -> str:
        return answer_tags(ex.answer)

    def in_place(self, completion: str, ex: Example) -> int | None:
        """How many positions of the answer hold the right number; None if malformed."""
        content = extract_answer(completion)
        got = None if content is None else parse_numbers(content)
        if got is None:
            return None
        return positional_matches(got, sorted(ex.meta))

    def score(self, completion: str, ex: Example) -> float:
        k = self.in_place(completion, ex)
        return 0.0 if k is None else k / len(ex.meta)

    def feedback(self, completion: str, ex: Example) -> str:
        k = self.in_place(completion, ex)
        return "malformed" if k is None else f"{k} of {len(ex.meta)} in place"

    def token_verifier(self, tokenizer) -> jax_verify.TokenVerifier:
        """`score` on token ids: positional matches of the parsed numbers
        (`jax_verify.number_list`) with the sorted list, over num_items."""
        def score(decoded, span, gold):
            got = jax_verify.number_list(decoded, span)
            hits = jax_verify.positional_matches(got, gold)
            return jnp.where(got.valid, hits / self.num_items, 0.0).astype(jnp.float32)

        return jax_verify.TokenVerifier(
            jax_verify.byte_table(tokenizer), tokenizer.eos_id,
            lambda examples: jax_verify.encode_numbers([sorted(e.meta) for e in examples],
                                                       self.num_items), score)


TASKS.register(SortTask.name, SortTask)

__all__ = ["SortTask", "parse_numbers"]

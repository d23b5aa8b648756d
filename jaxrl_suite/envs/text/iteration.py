"""The self-iteration task format of ExIt (arXiv 2509.04575): improve a previous attempt.

Turn 0 is the task's own prompt. A later turn shows the task, the previous attempt's answer and
the verifier's feedback (its score and a short message, `Task.feedback`), then asks for an
improved answer, or, for a self-divergent step, for one that takes a significantly different
approach:

    3 7 9->25: | prev 3*7+9 | score 0.40, value 30, target 25 | improve:
    sort 42 7 19 3: | prev 3 19 7 42 | score 0.50, 2 of 4 in place | diverge:

Only the latest attempt is shown (a partial history is summarised by its last step), which keeps
prompts short and their length bounded by `max_previous_chars`.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from jaxrl_suite.envs.text.base import Example, Task, Verdicts
from jaxrl_suite.rewards.format import extract_answer

IMPROVE, DIVERGE = "improve", "diverge"


def previous_answer(completion: str, max_chars: int = 48) -> str:
    """What a prompt shows of a previous completion: its `<answer>` content, else "none"
    (cut to `max_chars`)."""
    content = extract_answer(completion)
    return "none" if content is None else content[:max_chars]


def iteration_prompt(task: Task, ex: Example, previous: str | None, *, divergent: bool = False,
                     max_previous_chars: int = 48) -> str:
    """The prompt of one self-iteration step on `ex`.

    `previous` is the previous attempt's completion, or None at turn 0 (the task's own prompt,
    `divergent` ignored). The score and message come from the task's verifier."""
    if previous is None:
        return ex.prompt
    score = task.score(previous, ex)
    mode = DIVERGE if divergent else IMPROVE
    return (f"{ex.prompt} | prev {previous_answer(previous, max_previous_chars)} | "
            f"score {score:.2f}, {task.feedback(previous, ex)} | {mode}:")


@dataclasses.dataclass(frozen=True)
class IterationMix(Task):
    """SFT data for the self-iteration format: `base`'s examples, a share `p_iter` of them shown
    as a self-iteration step (improve, or diverge with probability `p_div`) whose previous attempt
    is the solution of another example of the same split: a well-formed but wrong answer. The
    target is always the example's own solution, and scoring is `base`'s."""

    name: ClassVar[str] = "iteration_mix"
    base: Task
    p_iter: float = 0.5
    p_div: float = 0.1
    seed: int = 0
    max_previous_chars: int = 48

    def __post_init__(self):
        for field in ("p_iter", "p_div"):
            if not 0.0 <= getattr(self, field) <= 1.0:
                raise ValueError(f"{field} must be in [0, 1], got {getattr(self, field)}")

    def _generate(self, rng: np.random.Generator) -> Example:
        raise NotImplementedError("IterationMix draws its examples from `base` (see example)")

    def example(self, split: str, index: int) -> Example:
        ex = self.base.example(split, index)
        rng = np.random.default_rng([self.seed, 7, index, split == "test"])
        if rng.random() >= self.p_iter:
            return ex
        other = self.base.example(split, index + 1 + int(rng.integers(1000)))
        prompt = iteration_prompt(self.base, ex, self.base.solution(other),
                                  divergent=bool(rng.random() < self.p_div),
                                  max_previous_chars=self.max_previous_chars)
        return dataclasses.replace(ex, prompt=prompt)

    def solution(self, ex: Example) -> str:
        return self.base.solution(ex)

    def score(self, completion: str, ex: Example) -> float:
        return self.base.score(completion, ex)

    def verify_batch(self, completions, examples) -> Verdicts:
        return self.base.verify_batch(completions, examples)

    def feedback(self, completion: str, ex: Example) -> str:
        return self.base.feedback(completion, ex)


__all__ = ["DIVERGE", "IMPROVE", "IterationMix", "iteration_prompt", "previous_answer"]

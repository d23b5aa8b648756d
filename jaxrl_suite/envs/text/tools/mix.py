"""A mixture of tool tasks: one training stream over several `ToolTask`s."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from jaxrl_suite.envs.text.base import TASKS, Example, Verdicts, make_task
from jaxrl_suite.envs.text.tools.base import ToolTask


@dataclasses.dataclass(frozen=True)
class ToolMix(ToolTask):
    """Problem i of a split is problem i // K of sub-task i % K (K = len(names)), so a batch
    holds every sub-task in turn; `meta` = (sub-task index, the sub-task's meta). The tools are
    the union of the sub-tasks'; scoring, tool contexts and the expert go to the sub-task (the
    batch verifier groups the batch by sub-task, so each scores its share concurrently).

    names: registered `ToolTask` names, e.g. ("tool_arithmetic", "repo_search", "fix_tests");
    each is built with `seed`."""

    name: ClassVar[str] = "tool_mix"
    names: tuple[str, ...] = ("tool_arithmetic", "repo_search", "fix_tests")
    seed: int = 0

    def __post_init__(self):
        if not self.names:
            raise ValueError("tool_mix: names must name at least one tool task")
        for n in self.names:
            if not issubclass(TASKS.get(n), ToolTask):
                raise ValueError(f"tool_mix: task {n!r} is not a tool task")

    @functools.cached_property
    def parts(self) -> tuple[ToolTask, ...]:
        return tuple(make_task(n, seed=self.seed) for n in self.names)

    @property
    def tools(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(dict.fromkeys(t for part in self.parts for t in part.tools))

    def _generate(self, rng: np.random.Generator) -> Example:
        raise NotImplementedError("ToolMix serves its sub-tasks' problems (see example)")

    def example(self, split: str, index: int) -> Example:
        k, i = index % len(self.names), index // len(self.names)
        ex = self.parts[k].example(split, i)
        return dataclasses.replace(ex, meta=(k, ex.meta))

    def part(self, ex: Example) -> tuple[ToolTask, Example]:
        """The sub-task of a mixture problem and the problem as that sub-task made it."""
        k, meta = ex.meta
        return self.parts[k], dataclasses.replace(ex, meta=meta)

    def kind(self, ex: Example) -> str:
        """The sub-task name of a mixture problem (for per-task metrics)."""
        return self.names[ex.meta[0]]

    def solution(self, ex: Example) -> str:
        task, inner = self.part(ex)
        return task.solution(inner)

    def score(self, completion: str, ex: Example) -> float:
        task, inner = self.part(ex)
        return task.score(completion, inner)

    def verify_batch(self, completions: Sequence[str], examples: Sequence[Example]) -> Verdicts:
        if len(completions) != len(examples):
            raise ValueError(f"{len(completions)} completions for {len(examples)} examples")
        scores: list[float] = [0.0] * len(examples)
        outcomes: list[str | None] = [None] * len(examples)
        for k, task in enumerate(self.parts):
            rows = [i for i, ex in enumerate(examples) if ex.meta[0] == k]
            if not rows:
                continue
            v = task.verify_batch([completions[i] for i in rows],
                                  [self.part(examples[i])[1] for i in rows])
            for j, i in enumerate(rows):
                scores[i] = v.scores[j]
                outcomes[i] = v.outcomes[j] if v.outcomes else None
        labelled = any(o is not None for o in outcomes)
        return Verdicts(scores, [o or "scored" for o in outcomes] if labelled else None)

    def tool_context(self, ex: Example) -> Any:
        task, inner = self.part(ex)
        return task.tool_context(inner)

    def expert_turns(self, ex: Example, *, tools: bool = True) -> list[str]:
        task, inner = self.part(ex)
        return task.expert_turns(inner, tools=tools)


TASKS.register("tool_mix", ToolMix)

__all__ = ["ToolMix"]

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

from jaxrl_suite.envs.text.base import Example, Task, extract_answer

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


__all__ = ["DIVERGE", "IMPROVE", "iteration_prompt", "previous_answer"]

"""Verifiable text tasks: the `Example` record, the `Task` interface and the `TASKS` registry.

A task is a deterministic, index-addressable stream of problems with a programmatic checker:
`task.example(split, i)` depends only on (task params, seed, split, i), so a data cursor is just
an integer and resumes exactly. The train and test splits are disjoint: a problem belongs to
"test" iff the stable hash of its canonical key is 0 mod 10 (`_problem_key`), and each split
resamples (with a derived seed) until it draws a problem of its own.

Completions answer inside `<answer>...</answer>`; the reward is `score` (correctness in [0, 1])
plus an optional `format_weight * format_reward`. The answer extraction, format reward and the
verifiers live in `jaxrl_suite.rewards`; `extract_answer`, `format_reward` and `answer_tags` are
re-exported here for existing importers.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from typing import ClassVar, NamedTuple

import numpy as np

from jaxrl_suite.core.registry import Registry
from jaxrl_suite.rewards.format import answer_tags, extract_answer, format_reward

SPLITS = ("train", "test")
TEST_BUCKETS = 10  # a problem is held out iff stable_hash(key) % TEST_BUCKETS == 0
_MAX_ATTEMPTS = 10_000  # resampling bound; only reached if a split of a tiny task is empty


@dataclasses.dataclass(frozen=True)
class Example:
    """One problem: the prompt fed to the model and its canonical answer.

    Attributes:
      prompt: text fed to the model, e.g. "123+456=".
      answer: canonical answer string, e.g. "579" (countdown: the target).
      meta: task-specific hashable data (arithmetic: (a, b); countdown: `CountdownMeta`).
    """

    prompt: str
    answer: str
    meta: tuple = ()


class Verdicts(NamedTuple):
    """A verifier's answer on a batch: `scores` in [0, 1] (correctness; 1.0 counts as solved)
    and, where the task has them:
      outcomes: one label per completion (the sandbox's status, a classifier's predicted class),
        counted in the trainers' metrics (`outcome_fractions`, `label_entropy`);
      rewards: the task's designed training reward per completion (AEPO's exploration reward, a
        composite reward), which replaces score + grpo.format_weight * format_reward in GRPO;
      components: named per-completion parts of that reward, each logged as its batch mean
        ("reward_<name>")."""

    scores: list[float]
    outcomes: list[str] | None = None
    rewards: list[float] | None = None
    components: dict[str, list[float]] | None = None


def outcome_fractions(verdicts: Verdicts) -> dict[str, float]:
    """{"outcome_<label>": share of the batch} (empty without outcome labels)."""
    if not verdicts.outcomes:
        return {}
    n = len(verdicts.outcomes)
    return {f"outcome_{k}": verdicts.outcomes.count(k) / n for k in sorted(set(verdicts.outcomes))}


def verdict_metrics(verdicts: Verdicts) -> dict[str, float]:
    """A batch's verdicts as metrics: `outcome_fractions`, "outcome_entropy" (`label_entropy` of
    the outcome labels) and the mean of each reward component ("reward_<name>")."""
    out = outcome_fractions(verdicts)
    if verdicts.outcomes:
        out["outcome_entropy"] = label_entropy(verdicts.outcomes)
    for k, v in (verdicts.components or {}).items():
        out[f"reward_{k}"] = float(np.mean(v)) if len(v) else 0.0
    return out


def label_entropy(labels: Sequence[str]) -> float:
    """Entropy in bits of the empirical distribution of `labels` (0.0 for an empty list):
    H = -sum_c p_c log2 p_c with p_c the share of label c. A batch whose predictions all fall in
    one class scores 0; two balanced classes score 1."""
    if not labels:
        return 0.0
    _, counts = np.unique(np.asarray(labels, dtype=object).astype(str), return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum()) + 0.0  # + 0.0: one class gives 0.0, not -0.0


def split_index(split: str) -> int:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return SPLITS.index(split)


def stable_hash(key: str) -> int:
    """A process-independent 64-bit hash (Python's `hash` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


class Task(abc.ABC):
    """A verifiable text task; subclasses implement `_generate`, `solution` and `score`.

    `score(completion, ex)` is the correctness reward in [0, 1] (1.0 = correct) and never raises;
    `reward` adds `format_weight * format_reward(completion)`.
    """

    name: ClassVar[str]
    seed: int

    @abc.abstractmethod
    def _generate(self, rng: np.random.Generator) -> Example:
        """Draws one problem from `rng` (ignoring splits)."""

    def _problem_key(self, ex: Example) -> str:
        """Canonical identity of a problem; equal keys always land in the same split."""
        return ex.prompt

    def example(self, split: str, index: int) -> Example:
        """Returns problem `index` of `split`; a pure function of (params, seed, split, index)."""
        split_id = split_index(split)
        if index < 0:
            raise ValueError(f"index must be >= 0, got {index}")
        for attempt in range(_MAX_ATTEMPTS):
            ex = self._generate(np.random.default_rng([self.seed, split_id, index, attempt]))
            is_test = stable_hash(self._problem_key(ex)) % TEST_BUCKETS == 0
            if is_test == (split == "test"):
                return ex
        raise RuntimeError(f"{self!r}: no {split!r} problem found in {_MAX_ATTEMPTS} draws")

    def examples(self, split: str, start: int, n: int) -> list[Example]:
        """Returns `[example(split, i) for i in range(start, start + n)]`."""
        return [self.example(split, i) for i in range(start, start + n)]

    def texts(self, n: int = 2048) -> list[str]:
        """The text a tokenizer trained for this task sees (`run.tokenizer: "bpe:N"`): the
        first n training prompts, each with its solution. Multi-turn tasks add their turns."""
        return [e.prompt + self.solution(e) for e in self.examples("train", 0, n)]

    @abc.abstractmethod
    def solution(self, ex: Example) -> str:
        """The SFT target completion for `ex`, e.g. "<answer>579</answer>"; it scores 1.0."""

    @abc.abstractmethod
    def score(self, completion: str, ex: Example) -> float:
        """Correctness reward in [0, 1] of the decoded completion; malformed input -> 0.0."""

    def verify_batch(self, completions: Sequence[str], examples: Sequence[Example]) -> Verdicts:
        """`score` of each completion, and an outcome label per completion where the verifier
        has more to say than the score ("syntax", "timeout", ... for the sandboxed code tasks;
        None here). Tasks whose verifier is costly run the batch concurrently."""
        if len(completions) != len(examples):
            raise ValueError(f"{len(completions)} completions for {len(examples)} examples")
        return Verdicts([self.score(c, e) for c, e in zip(completions, examples, strict=True)])

    def is_correct(self, completion: str, ex: Example) -> bool:
        """Whether `completion` fully solves `ex` (score == 1.0)."""
        return self.score(completion, ex) == 1.0

    def feedback(self, completion: str, ex: Example) -> str:
        """A short verifier message on `completion` for a self-iteration prompt (never raises;
        it must not give the answer away). Default: "wrong" / "correct" / "no answer"."""
        if extract_answer(completion) is None:
            return "no answer"
        return "correct" if self.is_correct(completion, ex) else "wrong"

    def token_verifier(self, tokenizer):
        """This task's verifier on token ids (`rewards.jax_verify.TokenVerifier`), equal to
        `score` on the decoded text, for sampling, verifying and updating on the device
        (`algorithms.grpo_ondevice`); None (the default) where the answer is checked on the
        host only.

        Raises:
          ValueError: if the tokenizer is not byte-level (`rewards.jax_verify.byte_table`).
        """
        return None

    def reward(self, completion: str, ex: Example, *, format_weight: float = 0.0) -> float:
        """score(completion, ex) + format_weight * format_reward(completion). (The trainers
        score whole batches: `verify_batch`, then the same sum.)"""
        return self.score(completion, ex) + format_weight * format_reward(completion)


@dataclasses.dataclass(frozen=True)
class ExampleList(Task):
    """A fixed list of training examples over a `base` task, e.g. a data filter's output
    (ReST-GRPO's kept problems and partial-solution prompts, `curricula.rest`).

    `example("train", i)` walks `train` in a seeded order, reshuffled each epoch (deterministic
    in i, so a data cursor resumes); the test split, the solutions and the verifier are
    `base`'s. Not registered: it is built in code, from examples."""

    name: ClassVar[str] = "example_list"
    base: Task
    train: tuple[Example, ...]
    seed: int = 0

    def __post_init__(self):
        if not self.train:
            raise ValueError("ExampleList: no train examples")

    def _generate(self, rng: np.random.Generator) -> Example:
        raise NotImplementedError("ExampleList serves its own list (see example)")

    def example(self, split: str, index: int) -> Example:
        if split_index(split) == SPLITS.index("test"):
            return self.base.example(split, index)
        if index < 0:
            raise ValueError(f"index must be >= 0, got {index}")
        epoch, i = divmod(index, len(self.train))
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.train))
        return self.train[int(order[i])]

    def solution(self, ex: Example) -> str:
        return self.base.solution(ex)

    def score(self, completion: str, ex: Example) -> float:
        return self.base.score(completion, ex)

    def verify_batch(self, completions: Sequence[str], examples: Sequence[Example]) -> Verdicts:
        return self.base.verify_batch(completions, examples)

    def feedback(self, completion: str, ex: Example) -> str:
        return self.base.feedback(completion, ex)


TASKS: Registry[Callable[..., Task]] = Registry("task")


def make_task(name: str, **kwargs) -> Task:
    """Builds registered task `name` from keyword params, e.g. make_task("arithmetic", digits=2)."""
    return TASKS.get(name)(**kwargs)


__all__ = [
    "SPLITS",
    "TASKS",
    "Example",
    "ExampleList",
    "Task",
    "Verdicts",
    "answer_tags",
    "extract_answer",
    "format_reward",
    "label_entropy",
    "verdict_metrics",
    "make_task",
    "outcome_fractions",
]

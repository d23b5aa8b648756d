"""Resume screening: generated résumé / job pairs with a hidden qualification rule, a keyword
ATS baseline, and the composite reward (arXiv 2511.16073).

A prompt is a résumé line and a job line (40-112 bytes, 73 on average):

    CV: pytorch, k8s, react, spring; since 2020
    Job: deep learning, kubernetes, javascript; 5+ yrs

and the answer one fixed line (`rewards.composite`): decision, 0-10 score, the first reason

    <answer>SELECTED|8|has all, 5y>=5y</answer>     <answer>REJECTED|3|no javascript</answer>

The hidden rule: a candidate is SELECTED iff every required skill is present in the résumé,
literally or by an equivalent (`SKILLS`: "k8s" = "kubernetes", "postgresql" satisfies "sql",
"pytorch" implies "deep learning"), and their years of experience are at least the minimum.
Years are stated as "5 yrs", "5 years", "since 2020" (counted to the fixed reference year
`REF_YEAR` = 2025, a constant of the task) or "five years". Half the pairs are SELECTED; the
others are near misses: one required skill missing (often replaced by a look-alike that does
not count: "java" for "javascript", "nosql" for "sql"), the years one short (sometimes more), or
both. A literal keyword matcher (`KeywordATS`) misses the equivalents and the word-form years.

Rewards: `score` is the correctness of the decision (1.0 iff it is the gold one; a malformed
completion scores 0.0); `verify_batch` also returns the composite training reward, its
components and the predicted class of each completion (`Verdicts`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import ClassVar, NamedTuple

import numpy as np

from jaxrl_suite.envs.text.base import TASKS, Example, Task, Verdicts
from jaxrl_suite.rewards.composite import (
    REJECTED,
    SELECTED,
    CompositeConfig,
    composite_batch,
    predicted_label,
)
from jaxrl_suite.rewards.format import answer_tags

REF_YEAR = 2025  # "since YYYY" counts REF_YEAR - YYYY years
# canonical skill (as jobs name it) -> (equivalent names, specific skills that imply it)
SKILLS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "sql": ((), ("postgresql", "mysql", "sqlite")),
    "kubernetes": (("k8s",), ("openshift",)),
    "deep learning": ((), ("pytorch", "tensorflow", "keras")),
    "javascript": (("js",), ("react", "node.js")),
    "python": ((), ("django", "pandas")),
    "aws": ((), ("ec2", "s3")),
    "ci/cd": ((), ("jenkins", "gitlab ci")),
    "linux": ((), ("ubuntu", "debian")),
    "golang": (("go",), ()),
    "c++": (("cpp",), ()),
    "nlp": ((), ("spacy", "bert")),
    "java": ((), ("spring",)),
    "machine learning": (("ml",), ("sklearn", "xgboost")),
    "docker": ((), ()),
    "git": ((), ("github",)),
}
# Look-alikes that do NOT satisfy the skill (a near miss's replacement of a missing skill).
CONFUSABLE: dict[str, tuple[str, ...]] = {
    "sql": ("nosql", "mongodb"), "kubernetes": ("docker",), "deep learning": ("machine learning",),
    "javascript": ("java",), "python": ("perl",), "aws": ("azure", "gcp"), "ci/cd": ("jira",),
    "linux": ("windows",), "golang": ("rust",), "c++": ("c#", "c"), "nlp": ("opencv",),
    "java": ("javascript",), "machine learning": ("statistics",), "docker": ("vagrant",),
    "git": ("svn",),
}
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                "ten", "eleven", "twelve")
MIN_YEARS, MAX_YEARS = 2, 8  # the job's minimum lies in MIN_YEARS..MAX_YEARS
_SURPLUS = (0, 0, 1, 1, 2, 3, 4)  # years above the minimum of a candidate who has them
_NO_REJECTION = (0.45, 0.40, 0.15)  # a rejection's shortfall: a skill, the years, both


def satisfiers(skill: str) -> frozenset[str]:
    """The résumé items that satisfy required `skill`: itself, its equivalents, its
    specialisations (`SKILLS`)."""
    aliases, implied = SKILLS[skill]
    return frozenset((skill, *aliases, *implied))


# every name a résumé may list: each skill's satisfiers and the look-alikes
_ITEMS = tuple(sorted({i for s in SKILLS for i in satisfiers(s)} |
                      {c for cs in CONFUSABLE.values() for c in cs}))


class ScreeningMeta(NamedTuple):
    """A pair: the résumé's items and years (as a number and as written), the job's required
    skills and minimum years."""

    items: tuple[str, ...]
    years: int
    years_text: str
    required: tuple[str, ...]
    min_years: int


def years_text(years: int, form: int) -> str:
    """`years` written in form 0 "5 yrs", 1 "5 years", 2 "since 2020", 3 "five years" (one
    year)."""
    return (f"{years} yrs", f"{years} years", f"since {REF_YEAR - years}",
            f"{NUMBER_WORDS[years]} year{'s' * (years != 1)}")[form]


_YEARS = re.compile(r"(\d{1,2}) (?:yrs|years)|since (\d{4})|([a-z]+) years?")


def parse_years(text: str) -> int | None:
    """The years of a résumé's years statement in any of the `years_text` forms; else None."""
    m = _YEARS.fullmatch(text.strip())
    if m is None:
        return None
    digits, since, word = m.groups()
    if digits is not None:
        return int(digits)
    if since is not None:
        return REF_YEAR - int(since)
    return NUMBER_WORDS.index(word) if word in NUMBER_WORDS else None


def missing_skills(meta: ScreeningMeta) -> tuple[str, ...]:
    """The required skills that no résumé item satisfies (the hidden rule's skill half)."""
    have = set(meta.items)
    return tuple(r for r in meta.required if not satisfiers(r) & have)


def qualifies(meta: ScreeningMeta) -> bool:
    """The hidden rule: every required skill satisfied and years >= the minimum."""
    return not missing_skills(meta) and meta.years >= meta.min_years


def target_score(meta: ScreeningMeta) -> int:
    """The SFT target's 0-10 score: SELECTED 8, or 9 with >= 2 years to spare; REJECTED
    3 - (shortfalls - 1) - 1[years short by >= 2], at least 1 (a near miss scores 3)."""
    if qualifies(meta):
        return 8 + (meta.years >= meta.min_years + 2)
    gap = meta.min_years - meta.years
    shortfalls = len(missing_skills(meta)) + (gap > 0)
    return max(1, 4 - shortfalls - (gap >= 2))


def justification(meta: ScreeningMeta) -> str:
    """The first reason of the decision: "no SKILL" (the first required skill missing), else
    the years against the minimum, "3y<5y", else "has all, 6y>=5y"."""
    missing = missing_skills(meta)
    if missing:
        return f"no {missing[0]}"
    if meta.years < meta.min_years:
        return f"{meta.years}y<{meta.min_years}y"
    return f"has all, {meta.years}y>={meta.min_years}y"


@dataclasses.dataclass(frozen=True)
class ScreeningTask(Task):
    """Résumé / job pairs, balanced SELECTED / REJECTED (module docstring).

    `reward` weighs the composite training reward of `verify_batch`; `score` is correctness
    alone. Pairs with the same prompt share a split.
    """

    name: ClassVar[str] = "screening"
    seed: int = 0
    reward: CompositeConfig = CompositeConfig()
    min_required: int = 2  # required skills per job: min_required..max_required
    max_required: int = 3
    literal_prob: float = 1 / 3  # chance a present skill is written as the job names it
    max_prompt_bytes: int = 112  # longer draws are redrawn (about 1 in 600), so prompts fit

    def __post_init__(self):
        if not 1 <= self.min_required <= self.max_required <= len(SKILLS) - 2:
            raise ValueError(f"need 1 <= min_required <= max_required <= {len(SKILLS) - 2}, "
                             f"got {self.min_required}, {self.max_required}")
        if not 0.0 <= self.literal_prob <= 1.0:
            raise ValueError(f"literal_prob must be in [0, 1], got {self.literal_prob}")
        if self.max_prompt_bytes < 100:
            raise ValueError(f"max_prompt_bytes must be >= 100, got {self.max_prompt_bytes}")

    # ---- generation ----
    def _surface(self, skill: str, rng: np.random.Generator) -> str:
        others = sorted(satisfiers(skill) - {skill})
        if not others or rng.random() < self.literal_prob:
            return skill
        return others[rng.integers(len(others))]

    @staticmethod
    def _filler(required, items, rng: np.random.Generator, prefer: Sequence[str] = ()) -> str:
        """An item that satisfies no requirement and is not listed yet (from `prefer` first)."""
        taken = set(items) | {i for r in required for i in satisfiers(r)}
        pool = [p for p in prefer if p not in taken] or [i for i in _ITEMS if i not in taken]
        return pool[rng.integers(len(pool))]

    def _generate(self, rng: np.random.Generator) -> Example:
        for _ in range(1000):  # the same rng: deterministic; a draw fits with probability > 0.97
            ex = self._draw(rng)
            if len(ex.prompt.encode()) <= self.max_prompt_bytes:
                return ex
        raise RuntimeError(f"no prompt within max_prompt_bytes={self.max_prompt_bytes}")

    def _draw(self, rng: np.random.Generator) -> Example:
        canon = list(SKILLS)
        selected = bool(rng.random() < 0.5)
        n_req = int(rng.integers(self.min_required, self.max_required + 1))
        required = tuple(canon[i] for i in rng.choice(len(canon), n_req, replace=False))
        min_years = int(rng.integers(MIN_YEARS, MAX_YEARS + 1))
        years = min_years + int(_SURPLUS[rng.integers(len(_SURPLUS))])
        drop = None
        if not selected:
            kind = int(rng.choice(3, p=_NO_REJECTION))  # 0 skill, 1 years, 2 both
            if kind != 1:
                drop = int(rng.integers(n_req))
            if kind != 0:
                gap = 1 if rng.random() < 0.7 else int(rng.integers(2, 4))
                years = max(1, min_years - gap)
        items: list[str] = []
        for i, skill in enumerate(required):
            if i == drop:  # a look-alike half the time, else any non-qualifying item
                prefer = CONFUSABLE[skill] if rng.random() < 0.5 else ()
                items.append(self._filler(required, items, rng, prefer))
            else:
                items.append(self._surface(skill, rng))
        items.append(self._filler(required, items, rng))  # one unrelated skill
        items = [items[i] for i in rng.permutation(len(items))]
        text = years_text(years, int(rng.integers(4)))
        meta = ScreeningMeta(tuple(items), years, text, required, min_years)
        prompt = (f"CV: {', '.join(items)}; {text}\n"
                  f"Job: {', '.join(required)}; {min_years}+ yrs\n")
        return Example(prompt=prompt, answer=SELECTED if qualifies(meta) else REJECTED,
                       meta=meta)

    # ---- verification ----
    def solution(self, ex: Example) -> str:
        return answer_tags(f"{ex.answer}|{target_score(ex.meta)}|{justification(ex.meta)}")

    def score(self, completion: str, ex: Example) -> float:
        """1.0 iff the completion's decision is the gold one (malformed: 0.0)."""
        return 1.0 if predicted_label(completion) == ex.answer.lower() else 0.0

    def verify_batch(self, completions: Sequence[str], examples: Sequence[Example]) -> Verdicts:
        """Correctness scores, the predicted classes ("selected" / "rejected" / "invalid"), the
        composite reward of `self.reward` and its components."""
        if len(completions) != len(examples):
            raise ValueError(f"{len(completions)} completions for {len(examples)} examples")
        rewards, components = composite_batch(completions, [e.answer for e in examples],
                                              self.reward)
        return Verdicts(scores=list(components["correct"]),
                        outcomes=[predicted_label(c) for c in completions],
                        rewards=rewards, components=components)


# ---- the keyword-matching ATS baseline ----
_ATS_YEARS = re.compile(r"(\d+) ?(?:yrs|years|y)\b|since (\d{4})")


def ats_features(prompt: str) -> tuple[int, int, bool]:
    """What a keyword ATS reads from a prompt: (required skills listed verbatim in the résumé,
    required skills, years stated in digits and >= the minimum). It splits the two lines on
    "; " and ", " and compares strings (case-insensitive); "five years" and every equivalent
    skill are invisible to it. A prompt it cannot split gives (0, 1, False)."""
    lines = prompt.strip().split("\n")
    if len(lines) != 2 or not lines[0].startswith("CV: ") or not lines[1].startswith("Job: "):
        return 0, 1, False
    cv, job = lines[0][4:].rsplit("; ", 1), lines[1][5:].rsplit("; ", 1)
    if len(cv) != 2 or len(job) != 2:
        return 0, 1, False
    have = {s.strip().lower() for s in cv[0].split(",")}
    need = [s.strip().lower() for s in job[0].split(",")]
    m_min, m_cv = re.match(r"(\d+)", job[1]), _ATS_YEARS.search(cv[1])
    years = None
    if m_cv is not None:
        years = int(m_cv.group(1)) if m_cv.group(1) else REF_YEAR - int(m_cv.group(2))
    years_ok = years is not None and m_min is not None and years >= int(m_min.group(1))
    return sum(s in have for s in need), len(need), years_ok


def ats_score(prompt: str) -> float:
    """The ATS's match score in [0, 1]: (verbatim skills + years_ok) / (required skills + 1)."""
    matched, n, years_ok = ats_features(prompt)
    return (matched + years_ok) / (n + 1)


@dataclasses.dataclass(frozen=True)
class KeywordATS:
    """A keyword-matching applicant tracking system: SELECTED iff `ats_score` >= threshold."""

    threshold: float

    @classmethod
    def fit(cls, examples: Sequence[Example]) -> KeywordATS:
        """The threshold with the highest accuracy on `examples` (training pairs only), among
        the scores that occur and 1 + epsilon (reject all); ties go to the lowest."""
        scores = np.array([ats_score(e.prompt) for e in examples])
        gold = np.array([e.answer == SELECTED for e in examples])
        candidates = sorted(set(scores.tolist())) + [1.0 + 1e-9]
        accuracy = [float(np.mean((scores >= t) == gold)) for t in candidates]
        return cls(candidates[int(np.argmax(accuracy))])

    def predict(self, examples: Sequence[Example]) -> list[str]:
        """"selected" / "rejected" per example."""
        return ["selected" if ats_score(e.prompt) >= self.threshold else "rejected"
                for e in examples]


def selection_metrics(predicted: Sequence[str], gold: Sequence[str]) -> dict[str, float]:
    """Accuracy and the precision, recall and F1 of SELECTED, from predicted labels
    ("selected" / "rejected" / "invalid"; an invalid prediction is a wrong non-selection) and
    gold decisions (either case). Precision with no SELECTED prediction, recall with no
    SELECTED pair and F1 with precision + recall = 0 are 0.0. Also the shares of predictions
    that are SELECTED and invalid."""
    if len(predicted) != len(gold) or not gold:
        raise ValueError(f"need as many predictions as gold labels (> 0), got {len(predicted)} "
                         f"and {len(gold)}")
    p = np.array([x == "selected" for x in predicted])
    g = np.array([x.lower() == "selected" for x in gold])
    tp = float(np.sum(p & g))
    precision = tp / p.sum() if p.sum() else 0.0
    recall = tp / g.sum() if g.sum() else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    correct = [x == y.lower() for x, y in zip(predicted, gold, strict=True)]
    return {"accuracy": float(np.mean(correct)), "precision": float(precision),
            "recall": float(recall), "f1": float(f1), "selected_rate": float(p.mean()),
            "invalid_rate": float(np.mean([x == "invalid" for x in predicted]))}


TASKS.register(ScreeningTask.name, ScreeningTask)

__all__ = ["CONFUSABLE", "NUMBER_WORDS", "REF_YEAR", "SKILLS", "KeywordATS", "ScreeningMeta",
           "ScreeningTask", "ats_features", "ats_score", "justification", "missing_skills",
           "parse_years", "qualifies", "satisfiers", "selection_metrics", "target_score",
           "years_text"]

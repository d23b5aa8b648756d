"""Topic classification where keywords do not decide the class: "topics" (GenCLS++'s generated set).

Every text names three people from three roles, e.g.

    "banker was sued by nurse behind pilot"     -> health
    "beside coach, senator praised chemist"      -> politics

Each person word belongs to one of six topics (sports: coach, striker, ...; finance: banker, ...),
so every text carries the keywords of two or three topics. The topic is the one of the *agent*,
the person who does the main verb: the subject of an active sentence, the noun after "by" of a
passive one, wherever it stands. A bag-of-keywords matcher sees three topics (two of them
sometimes the same distractor topic) and cannot tell which is the agent
(`keyword_baseline_accuracy`: about 0.3); a model that reads the sentence's structure can.

A fraction `ambiguous` of the texts is genuinely undecidable: two agents of different topics
("nurse and pilot paid banker"); the gold label is one of the two, drawn at random,
as an annotator would. No reader does better than 1/2 on them; they are what an explicit
"uncertain" label is for (`algorithms.gencls`, GenCLS++, arXiv 2504.19898).

Prompt: `tfds_tasks.CLASSIFY_TEMPLATE` (as the TFDS classification adapters); answer: the topic
name; meta: `TopicMeta` (label index and label names first, as `ClassificationTask`'s meta, then
the raw text, the agent word(s) and the template). `view(ex)` gives what a prompt-strategy wrapper
needs (`algorithms.gencls.StrategyTask`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import ClassVar, NamedTuple

import numpy as np

from jaxrl_suite.envs.text.base import TASKS, Example, Task, Verdicts
from jaxrl_suite.envs.text.tfds_tasks import CLASSIFY_TEMPLATE
from jaxrl_suite.rewards.format import answer_tags, extract_answer
from jaxrl_suite.rewards.match import string_match

# topic -> its person words (each word belongs to exactly one topic)
KEYWORDS: dict[str, tuple[str, ...]] = {
    "sports": ("coach", "striker", "goalie"),
    "finance": ("banker", "trader", "broker"),
    "science": ("chemist", "physicist", "biologist"),
    "politics": ("senator", "minister", "mayor"),
    "health": ("nurse", "surgeon", "doctor"),
    "travel": ("pilot", "tourist", "guide"),
}
VERBS = ("praised", "hired", "sued", "thanked", "blamed", "met", "paid", "warned")
PREPOSITIONS = ("near", "beside", "behind", "with")
# {a}: the agent, {x} the patient, {y} the noun of the prepositional phrase, {p} the preposition,
# {v} the verb; "ambiguous": two agents {a} and {b}.
TEMPLATES: dict[str, str] = {
    "active": "{a} {v} {x} {p} {y}",
    "passive": "{x} was {v} by {a} {p} {y}",
    "fronted": "{p} {y}, {a} {v} {x}",
    "passive_pp": "{x} {p} {y} was {v} by {a}",
}
AMBIGUOUS_TEMPLATE = "{a} and {b} {v} {x}"
_WORD = re.compile(r"[a-z]+")
_TOPIC_OF = {w: t for t, words in KEYWORDS.items() for w in words}


class TopicMeta(NamedTuple):
    """What decides an example: label index and names (as `ClassificationTask`'s meta), the raw
    text, the agent word(s) (two for an ambiguous text) and the template's name."""

    label: int
    names: tuple[str, ...]
    text: str
    agents: tuple[str, ...]
    template: str


class ClassView(NamedTuple):
    """A classification example as a prompt strategy sees it (`algorithms.gencls`)."""

    text: str  # the raw text to classify
    label: int  # gold label index into `names`
    names: tuple[str, ...]  # label names, in label order
    cue: str | None = None  # what decides the class, in words (None: the task does not know)
    ambiguous: bool = False  # the text does not decide the class


@dataclasses.dataclass(frozen=True)
class TopicsTask(Task):
    """Six-topic classification decided by the agent of the main verb (module docstring).

    Reward (`score`): 1.0 iff the first `<answer>` content, stripped and case-folded, is the gold
    topic's name, else 0.0 (malformed: 0.0). `verify_batch` labels each completion with its
    predicted topic ("invalid" when it names none) for the outcome metrics.
    """

    name: ClassVar[str] = "topics"
    ambiguous: float = 0.1  # fraction of texts with two agents of different topics
    templates: tuple[str, ...] = ("active", "passive", "fronted")  # sentence forms (TEMPLATES)
    seed: int = 0

    def __post_init__(self):
        if not 0.0 <= self.ambiguous < 1.0:
            raise ValueError(f"topics: ambiguous must be in [0, 1), got {self.ambiguous}")
        object.__setattr__(self, "templates", tuple(self.templates))  # a YAML list -> a tuple
        if not self.templates or len(set(self.templates)) != len(self.templates) or any(
                t not in TEMPLATES for t in self.templates):
            raise ValueError(f"topics: templates must be distinct entries of {list(TEMPLATES)}, "
                             f"got {list(self.templates)}")

    @staticmethod
    def labels() -> tuple[str, ...]:
        """The topic names in label order."""
        return tuple(KEYWORDS)

    @staticmethod
    def definitions() -> tuple[str, ...]:
        """One line per topic, in label order: its person words (the agents that make a text
        of it), e.g. "coach/striker/goalie"."""
        return tuple("/".join(words) for words in KEYWORDS.values())

    def max_text_len(self) -> int:
        """The longest text the generator can write, in characters (= bytes: ASCII)."""
        w = "w" * max(map(len, _TOPIC_OF))
        fill = dict(a=w, b=w, x=w, y=w, v=max(VERBS, key=len), p=max(PREPOSITIONS, key=len))
        forms = [TEMPLATES[t] for t in self.templates] + [AMBIGUOUS_TEMPLATE] * (
            self.ambiguous > 0)
        return max(len(t.format(**fill)) for t in forms)

    @staticmethod
    def max_cue_len() -> int:
        """An upper bound on the length of `view(ex).cue` ("agents WORD WORD")."""
        return len("agents ") + 2 * max(map(len, _TOPIC_OF)) + 1

    def _generate(self, rng: np.random.Generator) -> Example:
        names = self.labels()
        topic = int(rng.integers(len(names)))
        others = [t for t in range(len(names)) if t != topic]
        word = lambda t: KEYWORDS[names[t]][int(rng.integers(len(KEYWORDS[names[t]])))]
        v = VERBS[int(rng.integers(len(VERBS)))]
        p = PREPOSITIONS[int(rng.integers(len(PREPOSITIONS)))]
        if rng.random() < self.ambiguous:  # two agents: the gold label is one of them
            second = others[int(rng.integers(len(others)))]
            rest = [t for t in others if t != second]
            a, b, x = word(topic), word(second), word(rest[int(rng.integers(len(rest)))])
            if rng.random() < 0.5:  # the gold agent is named first or second
                a, b = b, a
            text, agents, template = AMBIGUOUS_TEMPLATE.format(a=a, b=b, v=v, x=x), (a, b), \
                "ambiguous"
        else:  # the two other people: distractor topics, drawn independently (may coincide)
            x, y = (word(others[int(rng.integers(len(others)))]) for _ in range(2))
            template = self.templates[int(rng.integers(len(self.templates)))]
            a = word(topic)
            text = TEMPLATES[template].format(a=a, x=x, y=y, v=v, p=p)
            agents = (a,)
        prompt = CLASSIFY_TEMPLATE.format(text=text, labels=", ".join(names))
        return Example(prompt=prompt, answer=names[topic],
                       meta=TopicMeta(topic, names, text, agents, template))

    def view(self, ex: Example) -> ClassView:
        """The example's text, label and cue (its agent: what decides the topic)."""
        m = TopicMeta(*ex.meta)
        cue = "agents " + " ".join(m.agents) if len(m.agents) > 1 else f"agent {m.agents[0]}"
        return ClassView(m.text, m.label, m.names, cue, len(m.agents) > 1)

    def solution(self, ex: Example) -> str:
        return answer_tags(ex.answer)

    def score(self, completion: str, ex: Example) -> float:
        return string_match(extract_answer(completion), ex.answer, normalize=str.casefold)

    def verify_batch(self, completions: Sequence[str], examples: Sequence[Example]) -> Verdicts:
        verdicts = super().verify_batch(completions, examples)
        names = {n.casefold(): n for n in self.labels()}
        outcomes = [names.get((extract_answer(c) or "").casefold(), "invalid")
                    for c in completions]
        return Verdicts(verdicts.scores, outcomes)


def keyword_topic(text: str) -> str | None:
    """A bag-of-keywords matcher: the topic with the most person words in `text`, ties broken by
    the first mention (None: no person word). Word order plays no part beyond the tie-break."""
    counts: dict[str, int] = {}
    for w in _WORD.findall(text.lower()):
        if w in _TOPIC_OF:
            counts[_TOPIC_OF[w]] = counts.get(_TOPIC_OF[w], 0) + 1  # insertion order = mentions
    return max(counts, key=counts.get) if counts else None  # max keeps the first of ties


def keyword_baseline_accuracy(task: TopicsTask, split: str = "test", n: int = 1000) -> float:
    """Accuracy of `keyword_topic` on the first `n` examples of `split`: what keywords alone
    decide (about 0.3 here, against 1/6 by chance and 1 - ambiguous/2 for a perfect reader)."""
    examples = task.examples(split, 0, n)
    return float(np.mean([keyword_topic(TopicMeta(*e.meta).text) == e.answer for e in examples]))


TASKS.register(TopicsTask.name, TopicsTask)

__all__ = ["KEYWORDS", "ClassView", "TopicMeta", "TopicsTask", "keyword_baseline_accuracy",
           "keyword_topic"]

"""Dialects: which of two invented dialects a sentence is in, a task that unlabelled text teaches.

Each dialect has its own vocabulary of `words_per_dialect` pseudo-words, drawn (once, from the
task's seed) from one shared syllable inventory, so that no letter or length tells the dialects
apart. A sentence mixes `content_words` words of its dialect with shared function words:

    "the lomira saw a tekuvo near kasi"  -> A
    "of the vanoku took pelisa and ro"   -> B

The label is the dialect; only word identity decides it. A classifier trained from scratch on a
few hundred labelled sentences meets each content word a few times and must memorise the word ->
dialect map word by word (it is at chance on a sentence whose words it never saw). Unlabelled
sentences reveal the map through co-occurrence: the content words of one sentence are always of
one dialect, so next-token prediction on a corpus of sentences (the weak-to-strong experiment's
pretraining, `algorithms.w2s`) groups the vocabulary into its two dialects, and a pretrained
model needs few labels to name the groups. This is the task where "the strong model's
pretraining makes the task much easier than the weak model finds it" (Burns et al. 2023,
arXiv:2312.09390).

Prompt: the sentence; answer: "A" or "B"; meta: `DialectMeta`.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import numpy as np

from jaxrl_suite.envs.text.base import TASKS, Example, Task
from jaxrl_suite.rewards.format import answer_tags, extract_answer
from jaxrl_suite.rewards.match import string_match

DIALECTS = ("A", "B")
FUNCTION_WORDS = ("the", "a", "of", "and", "near", "with", "saw", "took", "to", "by")
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z")
_VOWELS = ("a", "e", "i", "o", "u")


class DialectMeta(NamedTuple):
    """The dialect index and the sentence's content words (in order)."""

    label: int
    content: tuple[str, ...]


def dialect_vocab(seed: int, words_per_dialect: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The two vocabularies: 2 * words_per_dialect distinct pseudo-words of 2-3 CV syllables,
    shuffled and dealt alternately to A and B (a pure function of seed)."""
    rng = np.random.default_rng([seed, 7331])
    words: list[str] = []
    seen = set(FUNCTION_WORDS)
    while len(words) < 2 * words_per_dialect:
        n = int(rng.integers(2, 4))
        w = "".join(_ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))]
                    for _ in range(n))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return tuple(words[0::2]), tuple(words[1::2])


@dataclasses.dataclass(frozen=True)
class DialectsTask(Task):
    """Two-dialect sentence classification, balanced (module docstring).

    Reward (`score`): 1.0 iff the first `<answer>` content is the gold dialect's name.
    """

    name: ClassVar[str] = "dialects"
    seed: int = 0
    words_per_dialect: int = 48  # content vocabulary of each dialect
    content_words: int = 2  # content words per sentence
    function_words: int = 3  # shared function words per sentence

    def __post_init__(self):
        if self.words_per_dialect < 2:
            raise ValueError(f"dialects: words_per_dialect must be >= 2, got "
                             f"{self.words_per_dialect}")
        if self.content_words < 1 or self.function_words < 0:
            raise ValueError(f"dialects: need content_words >= 1 and function_words >= 0, got "
                             f"{self.content_words}, {self.function_words}")

    def vocab(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return dialect_vocab(self.seed, self.words_per_dialect)

    def max_text_len(self) -> int:
        """The longest sentence, in bytes (content words have at most 6 letters)."""
        longest_fn = max(map(len, FUNCTION_WORDS))
        n = self.content_words + self.function_words
        return 6 * self.content_words + longest_fn * self.function_words + n - 1

    def _generate(self, rng: np.random.Generator) -> Example:
        label = int(rng.integers(2))
        vocab = self.vocab()[label]
        content = tuple(vocab[i] for i in rng.integers(len(vocab), size=self.content_words))
        fillers = [FUNCTION_WORDS[i] for i in
                   rng.integers(len(FUNCTION_WORDS), size=self.function_words)]
        words = list(content) + fillers
        order = rng.permutation(len(words))
        text = " ".join(words[i] for i in order)
        content = tuple(words[i] for i in order if i < self.content_words)
        return Example(prompt=text, answer=DIALECTS[label], meta=DialectMeta(label, content))

    def solution(self, ex: Example) -> str:
        return answer_tags(ex.answer)

    def score(self, completion: str, ex: Example) -> float:
        return string_match(extract_answer(completion), ex.answer)


TASKS.register(DialectsTask.name, DialectsTask)

__all__ = ["DIALECTS", "FUNCTION_WORDS", "DialectMeta", "DialectsTask", "dialect_vocab"]

"""Lexical retrieval for the text tasks: the shared tokeniser and a BM25 `Retriever`.

`tokenize` (lowercase alphanumeric words, bm25s' English stop words removed, Harman's
S-stemmer) serves the `code_search` tool's index (`tools.code_search.RepoIndex`) and the
`Retriever` over a passage corpus (the generated fact world, `envs.text.facts`).

BM25 (Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond", 2009),
as `bm25s` computes it (its default "lucene" variant):

    score(q, d) = sum_{t in q} idf(t) * tf(t, d) * (k1 + 1)
                  / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))

over the distinct tokens t of the query.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import numpy as np

STOPWORDS = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it",
    "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these",
    "they", "this", "to", "was", "will", "with",  # bm25s' STOPWORDS_EN
))
_WORD_RE = re.compile(r"[a-z0-9]+")


def _stem(word: str) -> str:
    """Harman's S-stemmer: plural and third-person -s forms onto the base ("merges" -> "merge",
    "entries" -> "entry"; "class", "status" unchanged)."""
    if word.endswith("ies") and not word.endswith(("eies", "aies")):
        return word[:-3] + "y"
    if word.endswith("es") and not word.endswith(("aes", "ees", "oes")):
        return word[:-1]
    if word.endswith("s") and not word.endswith(("us", "ss")) and len(word) > 3:
        return word[:-1]
    return word


def tokenize(text: str) -> list[str]:
    """Lowercase alphanumeric words (so `_` and `.` split names), stopwords removed, stemmed."""
    return [_stem(w) for w in _WORD_RE.findall(text.lower()) if w not in STOPWORDS]


class Retriever:
    """BM25 (`bm25s`) over a fixed list of passages; passage ids are their list positions.

    `search(query, k)` returns the ids of the (at most k) passages with a positive score, best
    first, ties broken by the lower id. A query none of whose tokens is in the corpus' vocabulary
    (empty, stop words only, punctuation, non-ASCII letters only, unknown words) returns [];
    every `str` query is answered without raising, in time linear in its length.
    """

    def __init__(self, passages: Sequence[str], *, k1: float = 1.5, b: float = 0.75):
        import bm25s  # deferred: a second or so of imports, only needed once a retriever is built

        logging.getLogger("bm25s").setLevel(logging.WARNING)  # it sets itself to DEBUG

        if isinstance(passages, str) or not passages:
            raise ValueError("Retriever: passages must be a non-empty sequence of strings")
        self.passages: tuple[str, ...] = tuple(passages)
        self._bm25 = bm25s.BM25(k1=k1, b=b)
        self._bm25.index([tokenize(p) for p in self.passages], show_progress=False)

    def __len__(self) -> int:
        return len(self.passages)

    def scores(self, query: str) -> np.ndarray:
        """The BM25 score of each passage for `query`, [P] float32 (zeros if no query token is in
        the vocabulary)."""
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, got {type(query).__name__}")
        ids = self._bm25.get_tokens_ids(list(dict.fromkeys(tokenize(query))))
        if not ids:
            return np.zeros(len(self.passages), np.float32)
        return np.asarray(self._bm25.get_scores_from_ids(ids), np.float32)

    def search(self, query: str, k: int) -> list[int]:
        """Ids of the top-`k` passages with a positive score, best first (ties: lower id)."""
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        scores = self.scores(query)
        top = np.argsort(-scores, kind="stable")[:k]
        return [int(i) for i in top if scores[i] > 0]

    def search_batch(self, queries: Sequence[str], k: int) -> list[list[int]]:
        """`[search(q, k) for q in queries]`."""
        return [self.search(q, k) for q in queries]


__all__ = ["STOPWORDS", "Retriever", "tokenize"]

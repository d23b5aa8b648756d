"""SQuAD answer metrics: the answer normalisation, exact match (EM) and token F1.

As in the official SQuAD v1.1 evaluation script (Rajpurkar et al., "SQuAD: 100,000+ Questions for
Machine Comprehension of Text", arXiv 1606.05250), written from its description:
normalize(s) = lowercase, remove punctuation, remove the articles a/an/the, collapse whitespace;
EM = 1[normalize(pred) == normalize(gold)]; F1 over the multisets of normalised tokens, with the
SQuAD v2.0 script's convention (Rajpurkar, Jia, Liang, arXiv 1806.03822) when a side has no
tokens. Against several accepted answers, take the best (`rewards.match.best_match`).
`span_match` is the answer-containment check of retrieval-augmented QA (DPR's `has_answers`, as
s3 scores its generator): the normalised gold appears as a run of whole tokens in the normalised
prediction. `QA_METRICS` holds them by the names QA tasks take in their config ("em", "f1",
"span").
"""

from __future__ import annotations

import re
import string
from collections import Counter

from jaxrl_suite.core.registry import Registry
from jaxrl_suite.rewards.match import Matcher, string_match

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lowercase, drop punctuation, drop the articles a/an/the, collapse
    whitespace. "The  Eiffel-Tower!" -> "eiffeltower"."""
    text = "".join(c for c in text.lower() if c not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str | None, gold: str) -> float:
    """SQuAD EM: 1.0 iff the normalised strings are equal, else 0.0 (None: 0.0)."""
    return string_match(prediction, gold, normalize=normalize_answer)


def token_f1(prediction: str | None, gold: str) -> float:
    """SQuAD's token F1 of the normalised strings.

        P = |pred ∩ gold| / |pred|,  R = |pred ∩ gold| / |gold|,  F1 = 2PR / (P + R)

    over the multisets of whitespace tokens. If either side normalises to no tokens, 1.0 iff both
    do. A None prediction (no answer) scores 0.0.
    """
    if prediction is None:
        return 0.0
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def span_match(prediction: str | None, gold: str) -> float:
    """1.0 iff the normalised gold's tokens occur as a contiguous run of the normalised
    prediction's tokens ("born in Veldor ." contains "veldor"; "Veldoria" does not), else 0.0.
    A gold with no tokens, or a None prediction, scores 0.0."""
    if prediction is None:
        return 0.0
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    n = len(ref)
    if not n:
        return 0.0
    return float(any(pred[i: i + n] == ref for i in range(len(pred) - n + 1)))


QA_METRICS: Registry[Matcher] = Registry("QA metric")
QA_METRICS.register("em", exact_match)
QA_METRICS.register("f1", token_f1)
QA_METRICS.register("span", span_match)

__all__ = ["QA_METRICS", "exact_match", "normalize_answer", "span_match", "token_f1"]

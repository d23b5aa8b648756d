"""Sampling-based evaluation metrics: unbiased pass@k and majority-vote maj@k.

pass@k (Chen et al., "Evaluating Large Language Models Trained on Code", arXiv 2107.03374): with n
samples per problem of which c are correct, the unbiased estimate of the chance that at least one
of k samples drawn without replacement is correct is

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i)

(the product form avoids huge binomials; it is 1 when n - c < k), averaged over problems.

maj@k (self-consistency, Wang et al., arXiv 2203.11171): the most frequent parsed answer among k
samples is the prediction; a problem counts as solved when that answer is correct. Unparsable
samples (None) do not vote; ties go to the answer that appeared first. With n > k samples we vote
over the first k, which, the samples being i.i.d., is one unbiased draw of k.

`ranking_agreement` asks how well a scorer (a value model, a reward) orders several samples of
one prompt against a ground truth: the share of within-group pairs it orders alike, and Pearson r.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Sequence

import numpy as np


def pass_at_k(n, c, k: int) -> np.ndarray:
    """Unbiased pass@k per problem from `n` samples with `c` correct (arrays broadcast).

    Raises ValueError when k > n or c is outside [0, n] (the estimator needs k <= n)."""
    n = np.asarray(n, np.int64)
    c = np.asarray(c, np.int64)
    if k < 1 or np.any(k > n):
        raise ValueError(f"pass@k needs 1 <= k <= n samples, got k={k}, n={n.min()}")
    if np.any((c < 0) | (c > n)):
        raise ValueError("pass@k: the number of correct samples c must lie in [0, n]")
    n, c = np.broadcast_arrays(n, c)
    out = np.ones(n.shape, np.float64)
    for idx in np.ndindex(n.shape):
        ni, ci = int(n[idx]), int(c[idx])
        if ni - ci >= k:
            out[idx] = 1.0 - np.prod(1.0 - k / np.arange(ni - ci + 1, ni + 1, dtype=np.float64))
    return out


def majority_answer(answers: Sequence[Hashable | None]) -> Hashable | None:
    """The most frequent non-None answer (ties: the first to appear), or None if there is none."""
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return None
    best = max(votes.values())
    return next(a for a in answers if a is not None and votes[a] == best)


def maj_at_k(
    answers: Sequence[Sequence[Hashable | None]],
    k: int,
    is_correct: Callable[[int, Hashable], bool],
) -> np.ndarray:
    """Per problem i: 1.0 if the majority of `answers[i][:k]` satisfies `is_correct(i, answer)`.

    `answers[i]` holds the parsed answers of problem i's samples (None = unparsable)."""
    out = np.zeros(len(answers), np.float64)
    for i, row in enumerate(answers):
        if len(row) < k:
            raise ValueError(f"maj@k needs k <= samples per problem; problem {i} has {len(row)}")
        winner = majority_answer(row[:k])
        out[i] = float(winner is not None and bool(is_correct(i, winner)))
    return out


def ranking_agreement(scores, truth, group_size: int) -> dict[str, float]:
    """How `scores` order samples against `truth` (both [G * group_size], group g's samples at
    [g * group_size, (g + 1) * group_size)).

    Over every pair (a, b) of samples of one group whose truths differ (P pairs in all):
    pair_agreement = (1 / P) * sum [ 1 if (x_a - x_b)(q_a - q_b) > 0, 1/2 if x_a = x_b, else 0 ]
    (nan when P = 0); corr = Pearson r of scores and truth over all samples (nan when either is
    constant). Returns {"pair_agreement", "corr", "pairs": P}.
    """
    x, q = np.asarray(scores, np.float64), np.asarray(truth, np.float64)
    if x.shape != q.shape or x.ndim != 1 or len(x) % group_size:
        raise ValueError(f"scores {x.shape} and truth {q.shape} must be equal [G * "
                         f"{group_size}]")
    a, b = np.triu_indices(group_size, k=1)  # the pairs a < b within a group
    xg, qg = x.reshape(-1, group_size), q.reshape(-1, group_size)
    dx, dq = xg[:, a] - xg[:, b], qg[:, a] - qg[:, b]
    counted = dq != 0
    agree = np.where(dx * dq > 0, 1.0, np.where(dx == 0, 0.5, 0.0))[counted]
    total = float(counted.sum())
    ok = np.std(x) > 0 and np.std(q) > 0
    return {"pair_agreement": float(agree.sum()) / total if total else float("nan"),
            "corr": float(np.corrcoef(x, q)[0, 1]) if ok else float("nan"), "pairs": total}


__all__ = ["maj_at_k", "majority_answer", "pass_at_k", "ranking_agreement"]

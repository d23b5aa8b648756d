"""pass@k against brute-force enumeration; maj@k and ranking_agreement against hand cases."""

import itertools
from math import comb

import numpy as np
import pytest

from jaxrl_suite.sampling.evaluate import (
    maj_at_k,
    majority_answer,
    pass_at_k,
    ranking_agreement,
)


def brute_force_pass_at_k(n, c, k):
    """Fraction of the k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_equals_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            want = brute_force_pass_at_k(n, c, k)
            assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12), (n, c, k)
            assert want == pytest.approx(1 - comb(n - c, k) / comb(n, k))


def test_pass_at_k_is_vectorised_and_pass_at_1_is_the_mean_accuracy():
    n = np.array([10, 10, 10])
    c = np.array([0, 3, 10])
    np.testing.assert_allclose(pass_at_k(n, c, 1), c / n)
    got = pass_at_k(n, c, 4)
    assert got.shape == (3,)
    assert got[0] == 0.0 and got[2] == 1.0 and 0.3 < got[1] < 1.0
    # Large n stays finite (no huge binomials).
    assert 0.0 < float(pass_at_k(10_000, 3, 100)) < 1.0


def test_pass_at_k_rejects_bad_counts():
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="correct samples"):
        pass_at_k(4, 5, 2)


def test_majority_answer_ignores_none_and_breaks_ties_by_first_appearance():
    assert majority_answer(["3", None, "4", "4", "3"]) == "3"  # 2-2 tie: "3" came first
    assert majority_answer([None, "7", None]) == "7"
    assert majority_answer([None, None]) is None
    assert majority_answer(["1", "2", "2"]) == "2"


def test_maj_at_k_votes_over_the_first_k_samples():
    truth = ["5", "9", "2"]
    answers = [
        ["5", "6", "5", "6", "6"],  # first 3: 5 wins; all 5: 6 wins
        ["1", None, "9", "9", "1"],  # first 3: 1 and 9 tie, 1 first; all 5: 9 and 1 tie -> 1
        [None, None, None, "2", "2"],  # first 3: no vote
    ]
    ok = lambda i, a: a == truth[i]
    np.testing.assert_array_equal(maj_at_k(answers, 3, ok), [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(maj_at_k(answers, 5, ok), [0.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="problem 0 has 5"):
        maj_at_k(answers, 6, ok)


def test_ranking_agreement_by_hand():
    # group 0: truths 1, 2, 2 -> pairs (0,1), (0,2) count, (1,2) ties in truth and is skipped;
    #   scores 0.1 < 0.5 agrees (1), scores 0.1 = 0.1 ties (1/2)
    # group 1: truths 3, 1, 2 -> all 3 pairs count; scores 0, 1, 2: (0,1) disagrees (0),
    #   (0,2) disagrees (0), (1,2) agrees (1)
    scores = [0.1, 0.5, 0.1, 0.0, 1.0, 2.0]
    truth = [1.0, 2.0, 2.0, 3.0, 1.0, 2.0]
    got = ranking_agreement(scores, truth, 3)
    assert got["pairs"] == 5
    assert got["pair_agreement"] == pytest.approx((1 + 0.5 + 0 + 0 + 1) / 5)
    assert got["corr"] == pytest.approx(np.corrcoef(scores, truth)[0, 1])
    flat = ranking_agreement([1.0, 1.0], [0.0, 1.0], 2)  # constant scores: every pair ties
    assert flat["pair_agreement"] == 0.5 and np.isnan(flat["corr"])
    none = ranking_agreement([0.0, 1.0], [2.0, 2.0], 2)  # no pair with different truths
    assert none["pairs"] == 0 and np.isnan(none["pair_agreement"])
    with pytest.raises(ValueError, match="must be equal"):
        ranking_agreement([0.0, 1.0, 2.0], [0.0, 1.0, 2.0], 2)

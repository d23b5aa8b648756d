"""curricula.rest: ReST-GRPO's std filter, line prefixes and decayed prefix sampling."""

import math

import numpy as np
import pytest

from jaxrl_suite.curricula.rest import (
    dpo_pairs,
    filter_stats,
    keep_problem,
    line_prefixes,
    rest_grpo_prompts,
    sample_prefixes,
)

CODE = "def f(x):\n    y = x + 1\n\n    return y\n\n  \n"  # 4 lines; the trailing ones don't count


def test_keep_problem_threshold_is_inclusive():
    assert keep_problem([0.0, 1.0], min_std=0.5)  # std exactly 0.5
    assert keep_problem([0.0, 0.0, 1.0, 1.0], min_std=0.5)
    assert not keep_problem([0.0, 0.0, 0.0, 1.0], min_std=0.5)  # std sqrt(3)/4 = 0.433
    assert not keep_problem([1.0] * 5)  # all solved: GRPO learns nothing
    assert not keep_problem([0.0, 0.0, 0.0, 0.0, 0.1])  # std 0.04 < 0.05
    assert keep_problem([0.0, 0.0, 0.0, 0.0, 0.2])  # std 0.08
    assert not keep_problem([0.7])  # one sample: std 0
    assert keep_problem([0.7], min_std=0.0)
    with pytest.raises(ValueError, match="rewards"):
        keep_problem([])
    with pytest.raises(ValueError, match="finite"):
        keep_problem([0.0, np.nan])
    with pytest.raises(ValueError, match="min_std"):
        keep_problem([0.0, 1.0], min_std=-0.1)


def test_line_prefixes():
    assert line_prefixes(CODE) == [
        "def f(x):\n",
        "def f(x):\n    y = x + 1\n",
        "def f(x):\n    y = x + 1\n\n",  # an interior empty line is a line
        "def f(x):\n    y = x + 1\n\n    return y\n",
    ]
    assert line_prefixes(CODE, include_full=False) == line_prefixes(CODE)[:-1]
    assert line_prefixes("print(1)") == ["print(1)\n"]
    assert line_prefixes("print(1)\n \n", include_full=False) == []  # single line: no prefix
    assert line_prefixes("") == line_prefixes(" \n\n") == []
    assert all(p.endswith("\n") for p in line_prefixes(CODE))


def test_sample_prefixes_sizes_and_edge_cases():
    rng = np.random.default_rng(0)
    assert sample_prefixes([], rng) == []
    assert len(sample_prefixes(["a\n"] * 5, rng)) == 3  # ceil(0.5 * 5)
    assert len(sample_prefixes(["a\n"] * 30, rng, frac=0.1)) == 3  # not 4 from float error
    assert len(sample_prefixes(["a\n"], rng)) == 1
    assert len(sample_prefixes(["a\n"] * 7, rng, frac=1.0)) == 7
    assert sample_prefixes(["a\n"] * 3, rng, frac=1.0, decay=1e-12) == [0, 0, 0]
    with pytest.raises(ValueError, match="frac"):
        sample_prefixes(["a\n"], rng, frac=0.0)
    with pytest.raises(ValueError, match="decay"):
        sample_prefixes(["a\n"], rng, decay=1.5)


def test_sample_prefixes_frequencies_follow_decay():
    n, decay, trials = 20, 0.95, 2000
    rng = np.random.default_rng(1)
    draws = np.concatenate([sample_prefixes(["x\n"] * n, rng, decay=decay)
                            for _ in range(trials)])  # 2000 * 10 draws
    assert draws.min() >= 0 and draws.max() < n
    p = decay ** np.arange(1, n + 1)
    p /= p.sum()
    freq = np.bincount(draws, minlength=n) / len(draws)
    se = np.sqrt(p * (1 - p) / len(draws))
    assert np.all(np.abs(freq - p) < 4 * se), (freq - p) / se
    assert freq[:5].sum() > freq[-5:].sum()  # short prefixes are favoured


def test_sample_prefixes_is_deterministic_given_the_seed():
    prefixes = line_prefixes("\n".join(f"line{i}" for i in range(12)))
    a = sample_prefixes(prefixes, np.random.default_rng(7))
    b = sample_prefixes(prefixes, np.random.default_rng(7))
    assert a == b and len(a) == 6


PROMPTS = ["P0:", "P1:", "P2:", "P3:"]
COMPLETIONS = [
    ["a\nb\n", "c\n", "solved0\nx\ny\n", "d\n", "solved0b\n"],
    ["s1\n", "s1\n", "s1\n", "s1\n", "s1\n"],  # all solved: dropped by the std filter
    ["u\n", "v\n", "w\n", "z\n", "q\n"],  # varied but best 0.5 < 0.9
    ["first\nbest\n", "x\n", "tied\nbest\n", "y\n", "z\n"],  # tie at 1.0: first wins
]
REWARDS = [
    [0.0, 0.2, 1.0, 0.0, 1.0],
    [1.0, 1.0, 1.0, 1.0, 1.0],
    [0.0, 0.5, 0.0, 0.5, 0.0],
    [1.0, 0.0, 1.0, 0.0, 0.0],
]


def test_rest_grpo_prompts_hand_case():
    kept, partial = rest_grpo_prompts(PROMPTS, COMPLETIONS, REWARDS, np.random.default_rng(0),
                                      frac=1.0, decay=1.0)
    assert kept == [0, 2, 3]
    # problem 0: best is completion 2 (first of the two 1.0s), 3 lines -> 3 draws among its
    # prefixes; problem 3: completion 0 ("first"), 2 lines -> 2 draws; 1 and 2 add none.
    assert [i for i, _ in partial] == [0, 0, 0, 3, 3]
    assert {p for i, p in partial if i == 0} <= {"P0:solved0\n", "P0:solved0\nx\n",
                                                 "P0:solved0\nx\ny\n"}
    assert {p for i, p in partial if i == 3} <= {"P3:first\n", "P3:first\nbest\n"}
    # without the full completion, problem 3 has one prefix and problem 0 two
    _, partial = rest_grpo_prompts(PROMPTS, COMPLETIONS, REWARDS, np.random.default_rng(0),
                                   frac=1.0, include_full=False)
    assert [i for i, _ in partial] == [0, 0, 3]
    assert partial[-1] == (3, "P3:first\n")
    # a stricter std filter drops problem 2 too; a higher bar gives no prefix at all
    kept, partial = rest_grpo_prompts(PROMPTS, COMPLETIONS, REWARDS, np.random.default_rng(0),
                                      min_std=0.3, best_threshold=1.01)
    assert kept == [0, 3] and partial == []


def test_rest_grpo_prompts_default_count_and_determinism():
    args = (PROMPTS, COMPLETIONS, REWARDS)
    a = rest_grpo_prompts(*args, np.random.default_rng(3))
    b = rest_grpo_prompts(*args, np.random.default_rng(3))
    assert a == b
    counts = [sum(i == p for i, _ in a[1]) for p in range(4)]
    assert counts == [math.ceil(0.5 * 3), 0, 0, math.ceil(0.5 * 2)]


def test_rest_grpo_prompts_bad_inputs_raise():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="one entry per problem"):
        rest_grpo_prompts(PROMPTS[:3], COMPLETIONS, REWARDS, rng)
    with pytest.raises(ValueError, match="problem 1"):
        rest_grpo_prompts(PROMPTS, COMPLETIONS, [REWARDS[0], [1.0], *REWARDS[2:]], rng)


def test_filter_stats_filter_raises_variance():
    stats = filter_stats(REWARDS)
    variances = [np.var(r) for r in REWARDS]
    assert stats["kept_fraction"] == 0.75 and stats["n_kept"] == 3 and stats["n_problems"] == 4
    np.testing.assert_allclose(stats["reward_var_before"], np.mean(variances))
    np.testing.assert_allclose(stats["reward_var_after"], np.mean(np.array(variances)[[0, 2, 3]]))
    assert stats["reward_var_after"] > stats["reward_var_before"]
    none_kept = filter_stats([[1.0, 1.0], [0.0, 0.0]])
    assert none_kept["kept_fraction"] == 0.0 and math.isnan(none_kept["reward_var_after"])


def test_dpo_pairs_hand_case():
    texts = [["a", "b", "c"], ["d", "e", "f"], ["g", "h", "i"]]
    rewards = [[0.0, 1.0, 1.0], [0.5, 0.5, 0.5], [0.2, 0.0, 0.0]]  # 1 is dropped (no variance)
    assert dpo_pairs(texts, rewards, min_std=0.05) == [(0, "b", "a"), (2, "g", "h")]  # first ties
    assert dpo_pairs(texts, rewards, min_std=0.5) == []  # no std reaches 0.5
    with pytest.raises(ValueError, match="rewards"):
        dpo_pairs(texts, rewards[:2])

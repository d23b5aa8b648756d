"""SpatialTree's auto-think rules (rewards/auto_think.py) on hand-worked groups, against a
per-item loop of the rules as written in the docstring."""

import numpy as np
import pytest

from jaxrl_suite.rewards import (
    auto_think_level_rewards,
    auto_think_probe_rewards,
    is_thinking,
    level_mode_term,
)


@pytest.mark.parametrize("completion, expected", [
    ("<think>look</think><answer>3</answer>", True),
    ("<answer>3</answer>", False),
    ("<think></think><answer>3</answer>", False),  # empty think: a direct answer
    ("<think> \n </think><answer>3</answer>", False),
    ("<think>still going", True),  # cut off mid-thought
    ("<answer>3</answer><think>x</think>", True),  # thinking after the answer still counts
    ("think</think><answer>3</answer>", False),  # no open tag in the completion
    ("", False),
], ids=range(8))
def test_is_thinking(completion, expected):
    assert is_thinking(completion) is expected


def test_level_rule_hand_worked():
    # levels        1     1      2     2      3     3      4     4
    thinking = [True, False, True, False, True, False, True, False]
    levels = [1, 1, 2, 2, 3, 3, 4, 4]
    correct = [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    np.testing.assert_array_equal(level_mode_term(thinking, levels),
                                  [-1, 0, 0, 0, 0, -1, 0, -1])
    np.testing.assert_allclose(auto_think_level_rewards(correct, thinking, levels, penalty=0.5),
                               [0.5, 1.0, 0.0, 1.0, 1.0, 0.5, 0.0, -0.5])
    # the naive think-everywhere rule is the same function with other level sets
    everywhere = level_mode_term(thinking, levels, think_levels=(1, 2, 3, 4), direct_levels=())
    np.testing.assert_array_equal(everywhere, [0, -1, 0, -1, 0, -1, 0, -1])
    # and the no-think control: thinking costs the penalty on every level
    nowhere = auto_think_level_rewards(correct, thinking, levels, penalty=0.5, think_levels=(),
                                       direct_levels=(1, 2, 3, 4))
    np.testing.assert_allclose(nowhere, [0.5, 1.0, -0.5, 1.0, 0.5, 1.0, -0.5, 0.0])


def test_probe_rule_hand_worked():
    thinking = np.array([[True, True, False, False],   # a direct sample is right: thinkers pay
                         [True, True, False, False],   # no direct sample is right: no penalty
                         [True, True, True, True],     # no probe in the group: no penalty
                         [False, False, False, True]])
    correct = np.array([[1.0, 0.0, 1.0, 0.0],
                        [1.0, 0.0, 0.0, 0.0],
                        [1.0, 1.0, 0.0, 1.0],
                        [0.0, 0.5, 0.0, 1.0]])  # 0.5 is not "right"
    expected = np.array([[0.7, -0.3, 1.0, 0.0],
                         [1.0, 0.0, 0.0, 0.0],
                         [1.0, 1.0, 0.0, 1.0],
                         [0.0, 0.5, 0.0, 1.0]])
    np.testing.assert_allclose(auto_think_probe_rewards(correct, thinking, penalty=0.3), expected)


def test_probe_rule_equals_a_loop():
    rng = np.random.default_rng(0)
    thinking = rng.random((50, 8)) < 0.5
    correct = (rng.random((50, 8)) < 0.5).astype(float)
    got = auto_think_probe_rewards(correct, thinking, penalty=0.25)
    for b in range(50):
        probe = any(not thinking[b, k] and correct[b, k] == 1.0 for k in range(8))
        for j in range(8):
            assert got[b, j] == correct[b, j] - (0.25 if thinking[b, j] and probe else 0.0)


def test_bad_shapes_and_levels_raise():
    with pytest.raises(ValueError, match="levels must be in"):
        level_mode_term([True], [5])
    with pytest.raises(ValueError, match="equal 1-d shapes"):
        level_mode_term([True, False], [1])
    with pytest.raises(ValueError, match="overlap"):
        level_mode_term([True], [1], think_levels=(1,), direct_levels=(1,))
    with pytest.raises(ValueError, match="correct must have shape"):
        auto_think_level_rewards([1.0, 0.0], [True], [1])
    with pytest.raises(ValueError, match=r"\[B, G\]"):
        auto_think_probe_rewards([1.0, 0.0], [True, False])

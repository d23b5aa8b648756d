"""rewards.expression: the safe arithmetic parser with and without a number restriction, and the
countdown reward (exact and graded), on hand-worked cases."""

from fractions import Fraction

import pytest

from jaxrl_suite.rewards import MAX_EXPRESSION_CHARS, expression_reward, parse_expression


@pytest.mark.parametrize("text, expected", [
    ("2*(3+4)", 14),
    ("2*3+4", 10),
    ("10-4-3", 3),  # left associative
    ("12/3/2", 2),
    ("1/3+1/6", Fraction(1, 2)),  # exact
    (" ( 7 ) ", 7),
    ("1000000*1000000", 10**12),
])
def test_parse_expression_without_restriction(text, expected):
    assert parse_expression(text) == expected


@pytest.mark.parametrize("text", [
    "", "-1", "2**3", "2^3", "1e3", "007", "1.5", "(1", "1)", "1/0", "1/(2-2)",
    "__import__('os')", "abs(1)", "1 2", "١+١", "x" * (MAX_EXPRESSION_CHARS + 1),
])
def test_parse_expression_refuses(text):
    with pytest.raises(ValueError):
        parse_expression(text)


def test_parse_expression_number_restriction():
    assert parse_expression("3*(5+7)", [7, 5, 3]) == 36
    assert parse_expression("3+3", [3, 3, 9]) == 6  # each copy once
    with pytest.raises(ValueError, match="not available"):
        parse_expression("3+3", [3, 9])
    with pytest.raises(ValueError, match="not available"):
        parse_expression("4", [3])


def test_expression_reward_exact():
    numbers, target = (3, 5, 7), 56
    assert expression_reward("(3+5)*7", numbers, target) == 1.0
    assert expression_reward("7*(5+3)", numbers, target) == 1.0
    assert expression_reward("3*5+7", numbers, target) == 0.0  # 22, ungraded
    assert expression_reward("8*7", numbers, target) == 0.0  # 8 is not given
    assert expression_reward(None, numbers, target) == 0.0


def test_expression_reward_graded():
    numbers, target = (3, 5, 7), 56
    kw = dict(graded=True)
    assert expression_reward("(3+5)*7", numbers, target, **kw) == 1.0
    # 22: 0.5 * (1 - 34/56) = 11/56
    assert expression_reward("3*5+7", numbers, target, **kw) == pytest.approx(11 / 56)
    # 105: 0.5 * (1 - 49/56) = 1/16
    assert expression_reward("3*5*7", numbers, target, **kw) == pytest.approx(1 / 16)
    # 7/3 against 2: 0.5 * (1 - (1/3)/2) = 5/12
    assert expression_reward("7/3", (7, 3), 2, **kw) == pytest.approx(5 / 12)
    # a miss of more than the target is clipped to 0
    assert expression_reward("10*20*30", (10, 20, 30), 10, **kw) == 0.0
    assert expression_reward("3*", numbers, target, **kw) == 0.0  # invalid
    assert expression_reward(None, numbers, target, **kw) == 0.0

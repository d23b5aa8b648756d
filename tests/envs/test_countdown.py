"""Tests for the countdown task and its safe expression parser."""

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl_suite.envs.text import CountdownMeta, CountdownTask, Example, parse_expression
from jaxrl_suite.envs.text.countdown import MAX_PAREN_DEPTH

EX = Example(prompt="3 5 7->56:", answer="56", meta=CountdownMeta((3, 5, 7), 56, "(3+5)*7"))
TASK = CountdownTask()


def score(content, ex=EX, task=TASK):
    return task.score(f"<answer>{content}</answer>", ex)


def test_example_is_deterministic_and_well_formed():
    task = CountdownTask(num_numbers=4, max_number=10, max_target=50, seed=2)
    batch = task.examples("train", 10, 50)
    assert batch == CountdownTask(num_numbers=4, max_number=10, max_target=50, seed=2).examples(
        "train", 10, 50
    )
    for ex in batch:
        numbers, target, _ = ex.meta
        assert len(numbers) == 4 and all(1 <= n <= 10 for n in numbers)
        assert 1 <= target <= 50 and ex.answer == str(target)
        assert ex.prompt == f"{' '.join(map(str, numbers))}->{target}:"
        hash(ex)


def test_train_and_test_are_disjoint():
    task = CountdownTask()
    key = lambda ex: (tuple(sorted(ex.meta.numbers)), ex.meta.target)
    train = {key(ex) for ex in task.examples("train", 0, 2000)}
    test = {key(ex) for ex in task.examples("test", 0, 500)}
    assert train and test and not train & test


def test_bad_split_and_params_raise():
    with pytest.raises(ValueError, match="'dev'"):
        TASK.example("dev", 0)
    with pytest.raises(ValueError, match="num_numbers"):
        CountdownTask(num_numbers=1)
    with pytest.raises(ValueError, match="max_target"):
        CountdownTask(max_target=0)


@pytest.mark.parametrize("num_numbers", [2, 3, 5])
def test_solution_always_scores_one(num_numbers):
    task = CountdownTask(num_numbers=num_numbers)
    for split in ("train", "test"):
        for ex in task.examples(split, 0, 200):
            assert task.score(task.solution(ex), ex) == 1.0, (ex, task.solution(ex))
            assert parse_expression(ex.meta.expression, ex.meta.numbers) == ex.meta.target


@pytest.mark.parametrize(
    "content, expected",
    [
        ("(3+5)*7", 1.0),
        (" ( 3 + 5 ) * 7 ", 1.0),
        ("7*(5+3)", 1.0),
        ("((((3+5))))*7", 1.0),
        ("7*8", 0.0),  # 8 is not in the list
        ("3*5+7", 0.0),  # wrong value
        ("(3+5)*7*1", 0.0),  # 1 is not in the list
        ("(3+3)*7", 0.0),  # 3 used twice but given once
        ("07*(3+5)", 0.0),  # leading zero
        ("(3+5)*7)", 0.0),
        ("((3+5)*7", 0.0),
        ("(3+5)7", 0.0),
        ("-3+5", 0.0),  # no unary minus
        ("", 0.0),
        ("56", 0.0),
        ("3/(5-5)", 0.0),  # 5 used twice
        ("2**100", 0.0),
        ("(3+5)*7=56", 0.0),
        ("(3+5)×7", 0.0),
    ],
)
def test_score_hand_cases(content, expected):
    assert score(content) == expected


def test_score_needs_answer_tags():
    assert TASK.score("(3+5)*7", EX) == 0.0
    assert TASK.score("<answer>(3+5)*7", EX) == 0.0
    assert TASK.score("so: <answer>(3+5)*7</answer> done", EX) == 1.0


def test_multiplicity_and_division():
    ex = Example("3 3 4->4:", "4", CountdownMeta((3, 3, 4), 4, "3/3*4"))
    assert score("3/3*4", ex) == 1.0
    assert score("4/(3-3)", ex) == 0.0  # division by zero
    assert score("4*3/3", ex) == 1.0  # exact rationals, any order
    assert score("4/3*3", ex) == 1.0  # non-integer intermediate is fine when scoring
    assert score("3/3*4*3", ex) == 0.0  # third 3


def test_parse_expression_values_and_errors():
    assert parse_expression("1+2*3", [1, 2, 3]) == 7
    assert parse_expression("10-4-3", [10, 4, 3]) == 3  # left associative
    assert parse_expression("12/3/2", [12, 3, 2]) == 2
    assert parse_expression("2/3", [2, 3]) == Fraction(2, 3)
    for bad, why in [("1/(2-2)", "zero"), ("9", "not available"), ("1+", "end"), ("1 a", "'a'")]:
        with pytest.raises(ValueError, match=why):
            parse_expression(bad, [1, 2, 2])


def test_nesting_limit():
    depth = MAX_PAREN_DEPTH
    assert parse_expression("(" * depth + "1" + ")" * depth, [1]) == 1
    with pytest.raises(ValueError, match="deeper"):
        parse_expression("(" * (depth + 1) + "1" + ")" * (depth + 1), [1])
    assert score("(" * 40 + "3" + ")" * 40) == 0.0
    assert score("(" * 5000 + "3" + ")" * 5000) == 0.0  # also too long


def test_long_garbage_is_rejected():
    """Megabyte-long garbage scores 0 (how fast: benchmarks/bench_hostile.py)."""
    long_answer = "<answer>" + "7*" * 500_000 + "</answer>"
    for text in ["(" * 10**6, "1+" * 500_000, long_answer, "x" * 10**6, "<answer>" * 125_000]:
        assert TASK.score(text, EX) == 0.0
        assert TASK.score(f"<answer>{text}</answer>", EX) == 0.0


def test_graded_partial_credit():
    graded = CountdownTask(graded=True)
    assert score("(3+5)*7", task=graded) == 1.0
    assert score("3*5*7", task=graded) == pytest.approx(0.5 * (1 - 49 / 56))  # 105
    far = Example("3 5 7->10:", "10", CountdownMeta((3, 5, 7), 10, "3+7"))
    assert score("3*5*7", far, graded) == 0.0  # |105 - 10| / 10 > 1: no credit
    # 7*5+3 = 38: 0.5 * (1 - 18/56)
    assert score("7*5+3", task=graded) == pytest.approx(0.5 * (1 - 18 / 56))
    assert score("7*(5+3)+", task=graded) == 0.0  # malformed: no credit
    assert score("7*8", task=graded) == 0.0  # invalid number: no credit
    assert score("7*5+3", task=TASK) == 0.0


@settings(max_examples=300, deadline=None)
@given(text=st.text(), graded=st.booleans())
def test_score_never_raises_on_random_text(text, graded):
    task = CountdownTask(graded=graded)
    for completion in (text, f"<answer>{text}</answer>"):
        assert 0.0 <= task.score(completion, EX) <= 1.0
        assert 0.0 <= task.reward(completion, EX, format_weight=0.5) <= 1.5


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="0123456789+-*/() 357", max_size=60), graded=st.booleans())
def test_score_never_raises_on_expression_like_text(text, graded):
    task = CountdownTask(graded=graded)
    assert 0.0 <= task.score(f"<answer>{text}</answer>", EX) <= 1.0

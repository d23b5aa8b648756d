"""Tests for the task base (splits, determinism, answer parsing) and the arithmetic task."""

import pytest

from jaxrl_suite.envs.text import (
    TASKS,
    ArithmeticTask,
    CountdownTask,
    Example,
    extract_answer,
    format_reward,
    make_task,
)


def test_registry_builds_tasks_with_kwargs():
    assert {"arithmetic", "countdown"} <= set(TASKS.names())
    assert make_task("arithmetic", digits=2, seed=3) == ArithmeticTask(digits=2, seed=3)
    assert isinstance(make_task("countdown"), CountdownTask)
    with pytest.raises(LookupError, match="arithmetic"):
        make_task("no_such_task")


@pytest.mark.parametrize("digits", [0, -1])
def test_bad_digits_raise(digits):
    with pytest.raises(ValueError, match="digits"):
        ArithmeticTask(digits=digits)


def test_bad_min_digits_raise():
    with pytest.raises(ValueError, match="min_digits"):
        ArithmeticTask(digits=2, min_digits=3)


@pytest.mark.parametrize("split", ["valid", "Train", ""])
def test_bad_split_raises_naming_it(split):
    with pytest.raises(ValueError, match=repr(split)):
        ArithmeticTask().example(split, 0)


def test_example_is_deterministic_and_random_access():
    task = ArithmeticTask(digits=3, seed=7)
    batch = task.examples("train", 100, 20)
    assert batch == [ArithmeticTask(digits=3, seed=7).example("train", i) for i in range(100, 120)]
    assert task.example("train", 105) == batch[5]
    assert ArithmeticTask(digits=3, seed=8).examples("train", 100, 20) != batch


def test_train_and_test_are_disjoint():
    task = ArithmeticTask(digits=2)
    key = lambda ex: tuple(sorted(ex.meta))  # a+b and b+a are the same problem
    train = {key(ex) for ex in task.examples("train", 0, 3000)}
    test = {key(ex) for ex in task.examples("test", 0, 1000)}
    assert train and test and not train & test


def test_operands_have_the_requested_digit_counts():
    task = ArithmeticTask(digits=4, min_digits=2, seed=1)
    lengths = set()
    for ex in task.examples("train", 0, 500):
        a, b = ex.meta
        assert ex.prompt == f"{a}+{b}=" and ex.answer == str(a + b)
        lengths |= {len(str(a)), len(str(b))}
    assert lengths == {2, 3, 4}
    one_digit = {ex.meta[0] for ex in ArithmeticTask(digits=1).examples("train", 0, 300)}
    assert one_digit <= set(range(10)) and len(one_digit) > 5


def test_solution_always_scores_one():
    task = ArithmeticTask(digits=3, min_digits=1)
    for split in ("train", "test"):
        for ex in task.examples(split, 0, 300):
            assert task.score(task.solution(ex), ex) == 1.0
            assert task.is_correct(task.solution(ex), ex)


EX = Example(prompt="123+456=", answer="579", meta=(123, 456))


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<answer>579</answer>", 1.0),
        ("  <answer> 579 </answer>\n", 1.0),
        ("I think <answer>579</answer> is it", 1.0),  # extra text: correct, but format 0
        ("<answer>579</answer><answer>1</answer>", 1.0),  # first answer counts
        ("<answer>578</answer>", 0.0),
        ("<answer>0579</answer>", 0.0),  # leading zeros are not the canonical answer
        ("<answer>579.0</answer>", 0.0),
        ("579", 0.0),  # missing tags
        ("<answer>579", 0.0),
        ("", 0.0),
        ("<answer>" * 100_000, 0.0),
    ],
)
def test_score_hand_cases(completion, expected):
    assert ArithmeticTask().score(completion, EX) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer>579</answer>", 1.0),
        (" \n<answer>anything</answer>\t", 1.0),
        ("<answer></answer>", 1.0),
        ("x<answer>579</answer>", 0.0),
        ("<answer>579</answer>.", 0.0),
        ("<answer>1</answer><answer>2</answer>", 0.0),
        ("<answer>579", 0.0),
        ("579", 0.0),
        ("", 0.0),
    ],
)
def test_format_reward(text, expected):
    assert format_reward(text) == expected


def test_extract_answer():
    assert extract_answer("a <answer> 12 </answer> b <answer>3</answer>") == "12"
    assert extract_answer("<answer>12") is None
    assert extract_answer("12</answer>") is None
    assert extract_answer("</answer><answer>7</answer>") == "7"


def test_reward_adds_weighted_format_reward():
    task = ArithmeticTask()
    assert task.reward("<answer>579</answer>", EX) == 1.0
    assert task.reward("<answer>579</answer>", EX, format_weight=0.1) == pytest.approx(1.1)
    assert task.reward("so <answer>579</answer>", EX, format_weight=0.1) == 1.0
    assert task.reward("<answer>5</answer>", EX, format_weight=0.1) == pytest.approx(0.1)


def test_lsb_digit_order_writes_the_sum_reversed_in_the_same_split():
    msb, lsb = ArithmeticTask(digits=3), ArithmeticTask(digits=3, digit_order="lsb")
    for split in ("train", "test"):
        for a, b in zip(msb.examples(split, 0, 50), lsb.examples(split, 0, 50), strict=True):
            x, y = a.meta
            assert a.prompt == b.prompt and a.meta == b.meta  # same problems, same split
            assert a.answer == str(x + y) and b.answer == str(x + y)[::-1]
    ex = Example(prompt="47+85=", answer="231", meta=(47, 85))
    assert lsb.score("<answer>231</answer>", ex) == 1.0
    assert lsb.score("<answer>132</answer>", ex) == 0.0
    assert lsb.answer_places(ex) == [0, 1, 2]
    assert msb.answer_places(Example("47+85=", "132", (47, 85))) == [2, 1, 0]
    with pytest.raises(ValueError, match="digit_order"):
        ArithmeticTask(digit_order="reversed")


def test_task_config_passes_the_digit_order_and_names_it():
    from jaxrl_suite.algorithms.lm_study import TaskConfig

    cfg = TaskConfig(name="arithmetic", digits=2, digit_order="lsb")
    assert cfg.build() == ArithmeticTask(digits=2, digit_order="lsb")
    assert "least-significant" in cfg.title
    with pytest.raises(Exception, match="digit_order"):
        TaskConfig(name="arithmetic", digit_order="up").build()

"""Sort task: generation, splits, graded score by positions in place, feedback."""

import numpy as np
import pytest

from jaxrl_suite.envs.text import Example, SortTask, make_task, parse_numbers


def test_examples_are_deterministic_and_the_solution_scores_one():
    task = make_task("sort", num_items=5, max_value=30, seed=3)
    ex = task.example("train", 7)
    assert ex == SortTask(num_items=5, max_value=30, seed=3).example("train", 7)
    nums = [int(x) for x in ex.prompt.removeprefix("sort ").removesuffix(":").split()]
    assert len(nums) == 5 and all(0 <= x <= 30 for x in nums)
    assert ex.answer == " ".join(map(str, sorted(nums)))
    assert task.score(task.solution(ex), ex) == 1.0 and task.is_correct(task.solution(ex), ex)


def test_train_and_test_splits_do_not_share_a_multiset():
    task = SortTask(num_items=3, max_value=9)
    key = lambda ex: tuple(sorted(ex.meta))
    train = {key(e) for e in task.examples("train", 0, 300)}
    test = {key(e) for e in task.examples("test", 0, 60)}
    assert not train & test


@pytest.mark.parametrize("answer, want, message", [
    ("<answer>3 7 19 42</answer>", 1.0, "4 of 4 in place"),
    ("<answer>3 19 7 42</answer>", 0.5, "2 of 4 in place"),
    ("<answer>3 7</answer>", 0.5, "2 of 4 in place"),            # short: the rest are missing
    ("<answer>3 7 19 42 50</answer>", 1.0, "4 of 4 in place"),   # long: cut at num_items
    ("<answer>42 19 7 3</answer>", 0.0, "0 of 4 in place"),
    ("<answer>3, 7, 19, 42</answer>", 0.0, "malformed"),
    ("3 7 19 42", 0.0, "malformed"),
])
def test_score_is_the_fraction_in_place(answer, want, message):
    task = SortTask(num_items=4)
    ex = Example(prompt="sort 42 7 19 3:", answer="3 7 19 42", meta=(42, 7, 19, 3))
    assert task.score(answer, ex) == pytest.approx(want)
    assert task.feedback(answer, ex) == message


def test_score_matches_a_numpy_count_on_random_answers():
    task = SortTask(num_items=6, max_value=20)
    rng = np.random.default_rng(0)
    for i in range(50):
        ex = task.example("train", i)
        guess = rng.permutation(list(ex.meta))
        want = np.mean(guess == np.sort(ex.meta))
        got = task.score(f"<answer>{' '.join(map(str, guess))}</answer>", ex)
        assert got == pytest.approx(want)


def test_parse_numbers_and_bad_config():
    assert parse_numbers(" 3  7 19 ") == [3, 7, 19]
    assert parse_numbers("3 -7") is None and parse_numbers("") is None
    with pytest.raises(ValueError, match="num_items must be >= 2"):
        SortTask(num_items=1)

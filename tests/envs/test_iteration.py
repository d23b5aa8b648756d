"""Self-iteration prompts (ExIt): turn 0, improve / diverge steps, and each task's feedback."""

import pytest

from jaxrl_suite.envs.text import (
    CountdownMeta,
    Example,
    iteration_prompt,
    make_task,
    previous_answer,
)


def test_turn_zero_is_the_task_prompt():
    task = make_task("arithmetic", digits=2)
    ex = task.example("train", 0)
    assert iteration_prompt(task, ex, None) == ex.prompt
    assert iteration_prompt(task, ex, None, divergent=True) == ex.prompt


def test_countdown_prompt_shows_value_and_target_but_not_the_solution():
    task = make_task("countdown", graded=True)
    ex = Example(prompt="3 7 9->25:", answer="25", meta=CountdownMeta((3, 7, 9), 25, "3*9-7+5"))
    p = iteration_prompt(task, ex, "<answer>3*7+9</answer>")
    score = task.score("<answer>3*7+9</answer>", ex)  # 0.5 * (1 - 5/25)
    assert score == pytest.approx(0.4)
    assert p == "3 7 9->25: | prev 3*7+9 | score 0.40, value 30, target 25 | improve:"
    assert task.feedback("<answer>3*8</answer>", ex) == "invalid expression"  # 8 not given
    assert task.feedback("<answer>9/7</answer>", ex) == "value 1.286, target 25"
    assert task.feedback("no tags", ex) == "no answer"


def test_sort_diverge_prompt_and_arithmetic_feedback_hides_the_answer():
    sort = make_task("sort", num_items=4)
    ex = Example(prompt="sort 42 7 19 3:", answer="3 7 19 42", meta=(42, 7, 19, 3))
    assert (iteration_prompt(sort, ex, "<answer>3 19 7 42</answer>", divergent=True)
            == "sort 42 7 19 3: | prev 3 19 7 42 | score 0.50, 2 of 4 in place | diverge:")
    add = make_task("arithmetic", digits=2)
    ex = Example(prompt="12+30=", answer="42", meta=(12, 30))
    p = iteration_prompt(add, ex, "<answer>41</answer>")
    assert p == "12+30= | prev 41 | score 0.00, wrong | improve:" and "42" not in p
    assert add.feedback("<answer>42</answer>", ex) == "correct"


def test_previous_answer_is_bounded():
    assert previous_answer("<answer>" + "1" * 100 + "</answer>", 10) == "1" * 10
    assert previous_answer("garbage") == "none"


def test_iteration_mix_shows_a_share_as_iteration_steps_with_the_true_target():
    from jaxrl_suite.envs.text import IterationMix

    base = make_task("sort", num_items=4)
    mix = IterationMix(base, p_iter=0.5)
    exs = [mix.example("train", i) for i in range(200)]
    iters = [e for e in exs if " | prev " in e.prompt]
    assert 0.35 < len(iters) / len(exs) < 0.65
    for i, e in enumerate(exs):
        plain = base.example("train", i)
        assert e.answer == plain.answer and mix.solution(e) == base.solution(plain)
        assert e.prompt.startswith(plain.prompt)
    assert mix.example("train", 3) == mix.example("train", 3)  # deterministic
    with pytest.raises(ValueError, match="p_iter must be in"):
        IterationMix(base, p_iter=2.0)

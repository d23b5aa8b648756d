"""Model output is hostile input: every verifier and every task's score / feedback / reward, on
junk, huge and odd-Unicode completions, returns a value in range and never raises (how quickly:
benchmarks/bench_hostile.py)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl_suite.envs.text import (
    AgNewsTask,
    ArithmeticTask,
    CountdownTask,
    Example,
    Gsm8kTask,
    IterationMix,
    JsonlTask,
    SortTask,
    TriviaQaTask,
)
from jaxrl_suite.rewards import (
    exact_match,
    expression_reward,
    extract_answer,
    format_reward,
    normalize_answer,
    normalize_text,
    numeric_match,
    parse_number,
    parse_numbers,
    string_match,
    token_f1,
)

HUGE = 200_000
_rng = np.random.default_rng(0)
JUNK = [
    "", " ", "\x00" * 1000, "<answer>", "</answer>", "<answer>" * 10_000, "</answer>" * 10_000,
    bytes(_rng.integers(0, 256, 5000, dtype=np.uint8)).decode("latin-1"),
    "<answer>" + "9" * HUGE + "</answer>",
    "<answer>" + "(" * HUGE + "</answer>",
    "<answer>" + "(" * 15 + "1" + ")" * 15 + "</answer>",
    "<answer>" + "1+" * (HUGE // 2) + "1</answer>",
    "<answer>" + "the a " * (HUGE // 6) + "</answer>",
    "<answer>" + "1," * (HUGE // 2) + "</answer>",
    "x" * HUGE,
    "<answer>٣²①Ⅻ１２</answer>", "<answer>² 3</answer>", "<answer>\ud800\udfff</answer>",
    "<answer>🙂 the Éiffel</answer>", "<answer>\u202e12\u202c</answer>", "<answer>1\u0301</answer>",
    "<answer>NaN</answer>", "<answer>Infinity</answer>", "<answer>1e999999</answer>",
    "<answer>-0</answer>", "<answer>__import__('os').system('ls')</answer>",
    "<answer>9**9**9**9</answer>", "<answer>" + "9" * 99 + "*" + "9" + "</answer>",
]


def _ex(answer, meta):
    return Example(prompt="q", answer=answer, meta=meta)


_sort = SortTask(num_items=4, seed=0)
TASKS = [
    (ArithmeticTask(digits=3), None),
    (CountdownTask(num_numbers=4), None),
    (CountdownTask(num_numbers=4, graded=True), None),
    (_sort, None),
    (IterationMix(base=_sort), None),
    (Gsm8kTask(), _ex("72", ("steps",))),
    (AgNewsTask(), _ex("Sports", (1, ("World", "Sports", "Business", "Sci/Tech")))),
    (TriviaQaTask(metric="em"), _ex("Eiffel Tower", ("Eiffel Tower", "tour eiffel"))),
    (TriviaQaTask(metric="f1"), _ex("Eiffel Tower", ("Eiffel Tower", "tour eiffel"))),
    (JsonlTask(path="unused.jsonl"), _ex("1,234", ("1,234", "one thousand"))),
]
TASK_EXAMPLES = [(t, ex if ex is not None else t.example("train", 0)) for t, ex in TASKS]
TASK_IDS = [f"{type(t).__name__}{i}" for i, (t, _) in enumerate(TASKS)]

VERIFIERS = [
    lambda c: string_match(c, "579"),
    lambda c: string_match(c, "579", normalize=normalize_text),
    lambda c: numeric_match(c, "72"),
    lambda c: exact_match(c, "Eiffel Tower"),
    lambda c: token_f1(c, "Eiffel Tower"),
    lambda c: expression_reward(c, (3, 5, 7), 56),
    lambda c: expression_reward(c, (3, 5, 7), 56, graded=True),
]


def _check_task(task, ex, completion):
    score = task.score(completion, ex)
    assert 0.0 <= score <= 1.0
    assert isinstance(task.feedback(completion, ex), str)
    assert math.isfinite(task.reward(completion, ex, format_weight=0.5))


@pytest.mark.parametrize("task, ex", TASK_EXAMPLES, ids=TASK_IDS)
def test_tasks_survive_junk(task, ex):
    for completion in JUNK:  # how fast: benchmarks/bench_hostile.py
        _check_task(task, ex, completion)
    assert task.score(task.solution(ex), ex) == 1.0  # and still solve their own problem


def test_verifiers_survive_junk():
    for completion in JUNK:  # how fast: benchmarks/bench_hostile.py
        content = extract_answer(completion)
        assert format_reward(completion) in (0.0, 1.0)
        for verify in VERIFIERS:
            for x in (content, completion):
                assert 0.0 <= verify(x) <= 1.0
        for text in (completion, content or ""):
            assert parse_number(text) is None or parse_number(text).is_finite()
            assert parse_numbers(text) is None or all(n >= 0 for n in parse_numbers(text))
            assert isinstance(normalize_answer(text), str)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=80), st.sampled_from(["", "<answer>", "<answer>1"]),
       st.sampled_from(["", "</answer>"]))
def test_tasks_survive_fuzzed_completions(body, prefix, suffix):
    completion = prefix + body + suffix
    for task, ex in TASK_EXAMPLES:
        _check_task(task, ex, completion)

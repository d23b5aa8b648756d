"""CountTask: the prompt names the answer's length; graded, hostile-input-safe score."""

import numpy as np
import pytest

from jaxrl_suite.envs.text import TASKS, CountTask, Example


def test_examples_solutions_and_length_spread():
    task = TASKS.get("count")(max_count=12, seed=3)
    examples = task.examples("train", 0, 200)
    for ex in examples[:20]:
        start, end = (int(x) for x in ex.prompt[len("count "):-1].split(" to "))
        assert ex.meta == tuple(range(start, end + 1))
        assert task.score(task.solution(ex), ex) == 1.0
    lengths = np.array([len(task.solution(ex)) for ex in examples])
    assert lengths.max() >= 2 * lengths.min()  # a wide spread of answer lengths
    test = {ex.prompt for ex in task.examples("test", 0, 50)}
    assert not test & {ex.prompt for ex in examples}  # disjoint splits


@pytest.mark.parametrize("completion, expected", [
    ("<answer>17 18 19</answer>", 1.0),
    ("<answer>17 18</answer>", 2 / 3),  # stops early
    ("<answer>17 18 19 20</answer>", 3 / 4),  # runs on
    ("<answer>17 99 19</answer>", 2 / 3),
    ("<answer>seventeen</answer>", 0.0),
    ("<answer></answer>", 0.0),
    ("17 18 19", 0.0),  # no answer tags
    ("<answer>" + "9" * 10_000 + "</answer>", 0.0),  # hostile: too many digits
], ids=range(8))
def test_score_hand_cases(completion, expected):
    task = CountTask()
    ex = Example(prompt="count 17 to 19:", answer="17 18 19", meta=(17, 18, 19))
    assert task.score(completion, ex) == pytest.approx(expected)


def test_bad_options_raise():
    with pytest.raises(ValueError, match="max_count must be >= 1"):
        CountTask(max_count=0)

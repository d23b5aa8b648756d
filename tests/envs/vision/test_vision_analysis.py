"""The R1-Zero trace analysis (envs/vision/analysis.py) on hand-written traces about a
hand-built scene."""

import math

import pytest

from jaxrl_suite.envs.vision import (
    Scene,
    SceneObject,
    SpatialQATask,
    grounded_fact_rate,
    grounded_facts,
    is_trivial_trace,
    self_corrections,
)
from jaxrl_suite.rewards import think_span

# red square at (0,1) covered by the blue circle at (1,1); green triangle at (3,3); red circle
# at (2,0)
SCENE = Scene((SceneObject("square", "red", 0, 1, 12, 0),
               SceneObject("circle", "blue", 1, 1, 12, 1),
               SceneObject("triangle", "green", 3, 3, 8, 2),
               SceneObject("circle", "red", 2, 0, 8, 3)))


@pytest.mark.parametrize("text, holds", [
    ("the red square at (0,1).", [True]),
    ("Red Square is at ( 0 , 1 )", [True]),  # case and spaces
    ("a red square at (1,1).", [False]),
    ("a purple square at (0,1).", [False]),  # no such object
    ("red square left of blue circle.", [True]),
    ("the red square is right of the blue circle.", [False]),
    ("green triangle below red circle. red circle above green triangle.", [True, True]),
    ("blue circle covers red square.", [True]),
    ("red square covers blue circle.", [False]),
    ("the blue circle is in front of the green triangle.", [False]),  # they do not touch
    ("2 red objects. 2 circles. 1 green triangle. 4 objects.", [True, True, True, True]),
    ("3 red objects. 1 circle.", [False, False]),
    ("so the answer is left.", []),
], ids=range(13))
def test_grounded_facts_hand_cases(text, holds):
    assert [f.holds for f in grounded_facts(text, SCENE)] == holds


def test_grounded_fact_rate():
    text = "red square at (0,1). blue circle at (2,2). red square left of blue circle. 2 circles."
    assert grounded_fact_rate(text, SCENE) == pytest.approx(3 / 4)
    assert math.isnan(grounded_fact_rate("I think it is left.", SCENE))


def test_self_corrections_hand_cases():
    text = ("a red square at (1,1), wait, no: at (0,1). a blue circle at (1,1), actually at "
            "(3,3). 3 circles, no, 2 circles. wait")
    corrections = self_corrections(text, SCENE)
    assert [c.mark for c in corrections] == ["wait, no:", "actually", "no,", "wait"]
    assert [c.fixes for c in corrections] == [True, False, True, False]
    first = corrections[0]
    assert (first.before.cell, first.after.cell) == ((1, 1), (0, 1))
    assert first.after.subject == "red square"  # the partial fact inherits its subject
    assert corrections[1].before.holds and not corrections[1].after.holds  # made it wrong
    assert corrections[3].after is None  # a trailing mark has no fact after it
    # the completed partial facts count as stated facts
    assert [f.holds for f in grounded_facts(text, SCENE)] == [False, True, True, False, False,
                                                              True]
    assert self_corrections("no red objects here", SCENE) == []  # "no" without , or :
    assert self_corrections("wait, no: at (0,1)", SCENE)[0].after is None  # nothing to fix


@pytest.mark.parametrize("trace, trivial", [
    (None, True),
    ("", True),
    ("it is left", True),  # under four words
    ("The answer is the red square.", True),  # restates the question and its options
    ("Let me look at the image. Which is closer to the camera? the red square", True),
    ("red square at (0,1). blue circle at (1,1). blue circle covers red square.", False),
    ("the blue circle hides part of the red square", False),  # new words
], ids=range(7))
def test_is_trivial_trace(trace, trivial):
    prompt = ("<image>User: Which is closer to the camera, the red square or the blue circle? "
              "Options: red square or blue circle\nAssistant: <think>")
    assert is_trivial_trace(trace, prompt) is trivial


def test_the_tasks_traces_are_grounded_and_not_trivial():
    task = SpatialQATask()
    for ex in task.examples("train", 0, 40) + task.examples("test", 0, 20):
        span = think_span(task.solution(ex))
        assert grounded_fact_rate(span, ex.meta.scenes[0]) == 1.0
        assert not is_trivial_trace(span, ex.prompt)
        assert self_corrections(span, ex.meta.scenes[0]) == []


def test_trace_stats_counts_by_hand():
    from jaxrl_suite.envs.vision import SpatialQATask, trace_stats

    task = SpatialQATask()
    ex = task.examples("test", 0, 3)
    o = ex[0].meta.scenes[0].objects[0]
    wrong = (o.x + 1) % 4
    texts = [task.solution(ex[0]),  # true facts only
             f" {o.name} at ({wrong},{o.y}), wait, no: at ({o.x},{o.y}).</think><answer>1</answer>",
             "<answer>1</answer>"]  # no closed think block: trivial
    s = trace_stats(texts, [ex[0]] * 3)
    n_true = len(grounded_facts(texts[0][: texts[0].index("</think>")], ex[0].meta.scenes[0]))
    assert s["think_rate"] == pytest.approx(2 / 3) and s["trivial_rate"] == pytest.approx(1 / 3)
    assert s["facts"] == n_true + 2
    assert s["grounded_fact_rate"] == pytest.approx((n_true + 1) / (n_true + 2))
    assert s["self_correction_rate"] == pytest.approx(1 / 3)
    assert s["corrections"] == 1 and s["correction_fix_share"] == 1.0
    empty = trace_stats(["<answer>1</answer>"], ex[:1])
    assert empty["grounded_fact_rate"] is None and empty["correction_fix_share"] is None
    with pytest.raises(ValueError, match="2 completions for 3"):
        trace_stats(texts[:2], ex)


@pytest.mark.parametrize("curve, want", [
    ([10, 8, 6, 5, 5, 6, 8, 10], True),  # dips, then grows
    ([10, 10, 10, 10], False),  # flat
    ([5, 6, 7, 8, 9], False),  # only grows
    ([10, 8, 6, 5, 4, 3], False),  # only dips
])
def test_dip_then_grow(curve, want):
    from jaxrl_suite.envs.vision import dip_then_grow

    assert dip_then_grow(curve, window=1) is want

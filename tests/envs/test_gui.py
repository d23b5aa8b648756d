"""The text GUI-grounding task (envs/text/gui.py): determinism, splits, held-out phrasings,
solutions, prompt lengths, the designed rewards and hostile completions."""

import itertools
import math

import numpy as np
import pytest

from jaxrl_suite.envs.text import TASKS, make_task
from jaxrl_suite.envs.text.gui import (
    CONCEPTS,
    FAMILIES,
    FAMILY,
    GRID,
    GuiTask,
    phrasings,
    screen_text,
)
from jaxrl_suite.rewards.aepo import any_collinear, inside

N = 200


@pytest.fixture(scope="module")
def multi():
    task = GuiTask(mode="multi")
    return task, task.examples("train", 0, N), task.examples("test", 0, N)


def _screen_key(ex):
    return screen_text(ex.meta.screen.elements)


def test_registered():
    assert "gui_grounding" in TASKS
    assert make_task("gui_grounding", mode="single").mode == "single"


def test_deterministic_and_seeded(multi):
    task, train, test = multi
    again = GuiTask(mode="multi")
    assert again.examples("train", 0, N) == train and again.examples("test", 0, N) == test
    other = GuiTask(mode="multi", seed=1).examples("train", 0, N)
    assert sum(a.prompt == b.prompt for a, b in zip(train, other, strict=True)) < 5


def test_train_and_test_screens_are_disjoint(multi):
    _, train, test = multi
    assert not {_screen_key(e) for e in train} & {_screen_key(e) for e in test}
    assert len({_screen_key(e) for e in test}) == N  # screens do not repeat


def test_phrasing_pools_partition_each_concept():
    for c, concept in CONCEPTS.items():
        seen, unseen, every = (set(phrasings(c, p)) for p in ("seen", "unseen", "all"))
        assert seen and unseen and not seen & unseen and seen | unseen == every
        assert len(every) == len(concept.verbs) * len(concept.objects)
        # compositional: each held-out phrasing's verb and object occur in seen phrasings
        for v, o in itertools.product(concept.verbs, concept.objects):
            if f"{v} {o}" in unseen:
                assert any(p.startswith(v + " ") for p in seen), (c, v)
                assert any(p.endswith(" " + o) for p in seen), (c, o)
    # a phrasing names one concept only
    owners = [p for c in CONCEPTS for p in phrasings(c, "all")]
    assert len(owners) == len(set(owners))


def test_unseen_phrasings_never_in_training():
    unseen = {p for c in CONCEPTS for p in phrasings(c, "unseen")}
    for mode in ("multi", "single", "mix"):
        for eval_split in ("seen", "unseen"):
            task = GuiTask(mode=mode, eval_split=eval_split)
            train = task.examples("train", 0, 300)
            assert all(e.meta.pool == "seen" and e.meta.phrase not in unseen for e in train)
    held = GuiTask(eval_split="unseen").examples("test", 0, N)
    assert all(e.meta.pool == "unseen" and e.meta.phrase in unseen for e in held)
    assert len({e.meta.phrase for e in held}) > 30  # many distinct held-out phrasings


def test_eval_splits_share_screens_and_differ_in_phrasing(multi):
    _, _, seen = multi
    unseen = GuiTask(mode="multi", eval_split="unseen").examples("test", 0, N)
    for a, b in zip(seen, unseen, strict=True):
        assert a.meta.screen == b.meta.screen
        assert b.meta.phrase in phrasings(b.meta.screen.elements[b.meta.screen.target].concept,
                                          "unseen")
        assert a.meta.phrase != b.meta.phrase


def test_screens_are_well_formed(multi):
    task, train, test = multi
    for ex in train + test:
        s = ex.meta.screen
        assert task.min_elements <= len(s.elements) <= task.max_elements
        target = s.elements[s.target]
        assert target.concept and target.label in CONCEPTS[target.concept].labels
        assert ex.meta.phrase in phrasings(target.concept, "all")
        assert target.label not in ex.meta.phrase.split()  # named by function, not label
        concepts = [e.concept for e in s.elements if e.concept]
        assert len(concepts) == len(set(concepts))  # one element per concept: a unique answer
        for a, b in itertools.combinations(s.elements, 2):  # boxes do not overlap
            ax1, ay1, ax2, ay2 = a.box
            bx1, by1, bx2, by2 = b.box
            assert ax2 < bx1 or bx2 < ax1 or ay2 < by1 or by2 < ay1
        for e in s.elements:
            x1, y1, x2, y2 = e.box
            assert 0 <= x1 <= x2 < GRID and 0 <= y1 <= y2 < GRID
    # every screen shows the target's whole family (same object words: the verb decides)
    def family_members(ex):
        target = ex.meta.screen.elements[ex.meta.screen.target].concept
        return sum(bool(e.concept) and FAMILY[e.concept] == FAMILY[target]
                   for e in ex.meta.screen.elements)
    assert all(family_members(ex) == len(FAMILIES[FAMILY[ex.meta.screen.elements[
        ex.meta.screen.target].concept]]) for ex in train)


def test_prompts_are_compact_and_fit(multi):
    task, train, test = multi
    single = GuiTask(mode="single").examples("test", 0, N)
    for ex in train + test + single:
        assert len(ex.prompt.encode()) <= task.max_prompt_len <= 160
        assert ex.prompt.endswith("|points:" if ex.meta.mode == "multi" else "|point:")
        assert ex.prompt.startswith(ex.meta.phrase + "|")
    assert np.mean([len(e.prompt) for e in train]) < 140


def test_mix_mode_alternates():
    ex = GuiTask(mode="mix").examples("train", 0, 8)
    assert [e.meta.mode for e in ex] == ["multi", "single"] * 4
    assert [e.prompt.endswith("points:") for e in ex] == [True, False] * 4


@pytest.mark.parametrize("reward", ["aepo", "binary"])
def test_solutions_score_one(multi, reward):
    task, train, test = multi
    task = GuiTask(mode="multi", reward=reward)
    single_task = GuiTask(mode="single", reward=reward)
    single = single_task.examples("test", 0, N)
    for t, examples in ((task, train + test), (single_task, single)):
        texts = [t.solution(e) for e in examples]
        v = t.verify_batch(texts, examples)
        assert v.scores == [1.0] * len(examples)
        n = [len(e.meta.points) for e in examples]
        want = [1 + 1 / math.sqrt(k) for k in n] if reward == "aepo" else [1.0] * len(n)
        np.testing.assert_allclose(v.rewards, want)
        assert v.components["n_points"] == [float(k) for k in n]
        assert v.components["format"] == v.components["first_hit"] == [1.0] * len(n)


def test_multi_solutions(multi):
    _, train, test = multi
    counts = {1: 0, 2: 0, 3: 0}
    for ex in train + test:
        pts = ex.meta.points
        counts[len(pts)] += 1
        assert inside(pts[0], ex.meta.box) and pts[0] == ex.meta.box[:2]  # the top-left corner
        assert not any(inside(p, ex.meta.box) for p in pts[1:])  # the others are distractors
        assert not any_collinear(pts)
        corners = {e.box[:2] for e in ex.meta.screen.elements}
        assert set(pts) <= corners and len(set(pts)) == len(pts)
    assert all(c > 0.2 * sum(counts.values()) for c in counts.values())  # N in {1, 2, 3}
    assert all(len(e.meta.points) == 1 for e in GuiTask(mode="single").examples("test", 0, 50))


def test_first_point_decides_score_and_modes_format(multi):
    _, _, test = multi
    ex = test[0]
    box = ex.meta.box
    hit = f"({box[0]},{box[1]})"
    other = next(e.box for e in ex.meta.screen.elements if e.box != box)
    miss = f"({other[0]},{other[1]})"
    far = "(99,0)" if not inside((99, 0), box) and not inside((99, 0), other) else "(0,99)"
    task = GuiTask(mode="multi")
    texts = [f"<answer>{hit},{miss}</answer>", f"<answer>{miss},{hit}</answer>",
             f"<answer>{miss}</answer>", f"<answer>{miss},{far}</answer>"]
    v = task.verify_batch(texts, [ex] * 4)
    assert v.scores == [1.0, 0.0, 0.0, 0.0]
    assert v.components["hit_any"] == [1.0, 1.0, 0.0, 0.0]
    assert v.components["n_points"] == [2.0, 2.0, 1.0, 2.0]
    np.testing.assert_allclose(v.rewards, [1 + 1 / math.sqrt(2), 1.5, 0.0, 0.5])
    single = GuiTask(mode="single", reward="binary").render(ex.meta.screen, "seen", "single")
    b = GuiTask(mode="single", reward="binary").verify_batch(
        [f"<answer>{hit}</answer>", f"<answer>{hit},{miss}</answer>", f"<answer>{miss}</answer>"],
        [single] * 3)
    assert b.scores == b.rewards == [1.0, 0.0, 0.0]  # one point only in single mode
    assert b.components["format"] == [1.0, 0.0, 1.0]


HUGE = 200_000
JUNK = ["", "<answer>", "<answer></answer>", "<answer>(1,2),</answer>", "<answer>(a,b)</answer>",
        "x" * HUGE, "<answer>" + "(1,2)," * (HUGE // 6) + "(1,2)</answer>",
        "<answer>(" + "9" * HUGE + ",9)</answer>", "\x00\xff" * 1000, "<answer>(٣,٣)</answer>",
        bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8)).decode("latin-1")]


@pytest.mark.parametrize("reward, bad", [("aepo", -1.0), ("binary", 0.0)])
def test_malformed_completions_score_zero_and_never_raise(multi, reward, bad):
    _, _, test = multi
    task = GuiTask(mode="multi", reward=reward)
    rng = np.random.default_rng(1)
    texts = JUNK + [bytes(rng.integers(0, 256, int(rng.integers(0, 60)), dtype=np.uint8)
                          ).decode("latin-1") for _ in range(200)]
    examples = [test[i % len(test)] for i in range(len(texts))]
    v = task.verify_batch(texts, examples)  # its time: benchmarks/bench_hostile.py
    assert v.scores == [0.0] * len(texts) and v.rewards == [bad] * len(texts)
    assert all(task.score(t, e) == 0.0 for t, e in zip(texts, examples, strict=True))
    assert v.components["format"] == [0.0] * len(texts)


@pytest.mark.parametrize("field, value", [("mode", "both"), ("eval_split", "test"),
                                          ("reward", "dense"), ("min_elements", 2),
                                          ("max_elements", 9), ("max_screen_chars", 60)])
def test_bad_fields_name_the_field(field, value):
    with pytest.raises(ValueError, match=field.split("_")[0]):
        GuiTask(**{field: value})


def test_verify_batch_lengths_must_match(multi):
    _, _, test = multi
    with pytest.raises(ValueError, match="completions"):
        GuiTask().verify_batch(["a"], test[:2])

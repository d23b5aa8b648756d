"""The spatial QA task (envs/vision/spatial_qa.py): answers recomputed from the scene by the test's
own code, disjoint splits, held-out phrasings and object counts, images, solutions, the anchor's
rewards in verify_batch, hostile completions."""

import re

import numpy as np
import pytest
from vision_helpers import shape_pixels

from jaxrl_suite.envs.text import TASKS, make_task
from jaxrl_suite.envs.text.base import stable_hash
from jaxrl_suite.envs.vision import (
    CATEGORIES,
    IMAGE_MARKER,
    TEMPLATES,
    SpatialQATask,
    accuracy_by,
)
from jaxrl_suite.envs.vision.scene import OBJECT_COLOURS, PALETTE, SHAPES, render, scene_key

N_TRAIN, N_TEST = 2000, 500
_NAME = rf"(?:{'|'.join(OBJECT_COLOURS)}) (?:{'|'.join(SHAPES)})"


@pytest.fixture(scope="module")
def data():
    task = SpatialQATask()
    return task, task.examples("train", 0, N_TRAIN), task.examples("test", 0, N_TEST)


def _obj(scene, name):
    (o,) = [o for o in scene.objects if f"{o.colour} {o.shape}" == name]
    return o


def _names(question):
    return re.findall(_NAME, question)


def _expected(ex):
    """The answer recomputed from the scene's fields (and, for depth, its pixels)."""
    scene, q = ex.meta.scenes[0], ex.meta.question
    names = _names(q)
    if ex.meta.category == "count":
        colour = next((c for c in OBJECT_COLOURS if f"{c} objects" in q), None)
        shape = next((s for s in SHAPES if f"{s}s" in q), None)
        assert (colour is None) != (shape is None)
        return str(sum(1 for o in scene.objects if o.colour == colour or o.shape == shape))
    if ex.meta.category == "relation":
        if q.startswith("Relative to the"):  # test: "Relative to the B, where is the A?"
            names = names[::-1]
        a, b = _obj(scene, names[0]), _obj(scene, names[1])
        if set(ex.meta.options) == {"left", "right"}:
            assert a.x != b.x
            return "left" if a.x < b.x else "right"
        assert a.y != b.y
        return "above" if a.y < b.y else "below"
    if ex.meta.category == "depth":
        a, b = _obj(scene, names[0]), _obj(scene, names[1])
        img = render(scene)
        shared = shape_pixels(a, scene) & shape_pixels(b, scene)
        colours = {tuple(int(v) for v in img[i, j]) for i, j in shared}
        near, far = (a, b) if a.z > b.z else (b, a)
        # where the two shapes meet, the nearer one is seen and the farther one never is
        assert PALETTE[near.colour] in colours and PALETTE[far.colour] not in colours
        return near.name
    if "closer to the" in q:  # train: "... closer to the C, the A or the B?"
        c, a, b = (_obj(scene, n) for n in names)
    else:  # test: "Which of the A and the B is nearer to the C?"
        a, b, c = (_obj(scene, n) for n in names)
    da = (a.x - c.x) ** 2 + (a.y - c.y) ** 2
    db = (b.x - c.x) ** 2 + (b.y - c.y) ** 2
    assert max(da, db) >= 2 * min(da, db)
    return a.name if da < db else b.name


def test_registered():
    assert "spatial_qa" in TASKS
    assert make_task("spatial_qa", prompt_style="direct").prompt_style == "direct"


def test_deterministic_and_seeded(data):
    task, train, test = data
    again = SpatialQATask()
    assert again.examples("train", 0, 50) == train[:50]
    assert again.example("test", 7) == test[7]
    other = SpatialQATask(seed=1).examples("train", 0, 50)
    assert sum(a.prompt == b.prompt for a, b in zip(train, other, strict=False)) < 5


def test_every_answer_equals_an_independent_recomputation(data):
    task, train, test = data
    for ex in train[:400] + test[:200]:
        assert ex.answer == _expected(ex), ex.prompt
        assert ex.answer in ex.meta.options and task.score(task.solution(ex), ex) == 1.0


def test_categories_cycle_by_index(data):
    task, train, test = data
    assert [e.meta.category for e in train[:8]] == list(CATEGORIES) * 2
    assert [e.meta.category for e in test[:4]] == list(CATEGORIES)
    scores = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert accuracy_by([e.meta.category for e in train[:8]], scores) == {
        "count": 0.5, "depth": 0.5, "distance": 1.0, "relation": 0.0}


def test_splits_are_disjoint_by_scene(data):
    _, train, test = data
    train_keys = {scene_key(e.meta.scenes[0]) for e in train}
    test_keys = {scene_key(e.meta.scenes[0]) for e in test}
    assert not train_keys & test_keys
    assert all(stable_hash(k) % 10 == 0 for k in test_keys)
    assert all(stable_hash(k) % 10 != 0 for k in train_keys)


def test_held_out_phrasings_and_object_counts(data):
    _, train, test = data

    def pattern(template):
        return re.compile(re.escape(template).replace(r"\{what\}", ".+?").replace(
            r"\{pair\}", ".+?").replace(r"\{a\}", ".+?").replace(r"\{b\}", ".+?").replace(
            r"\{c\}", ".+?"))

    for c in CATEGORIES:
        assert not set(TEMPLATES[c]["train"]) & set(TEMPLATES[c]["test"])
    held_out = [pattern(t) for c in CATEGORIES for t in TEMPLATES[c]["test"]]
    seen = [pattern(t) for c in CATEGORIES for t in TEMPLATES[c]["train"]]
    for ex in train:
        assert not any(p.fullmatch(ex.meta.question) for p in held_out)
        assert 3 <= len(ex.meta.scenes[0].objects) <= 4 and "(A)" not in ex.prompt
    for ex in test:
        assert any(p.fullmatch(ex.meta.question) for p in held_out)
        assert not any(p.fullmatch(ex.meta.question) for p in seen)
        assert 5 <= len(ex.meta.scenes[0].objects) <= 6 and "(A)" in ex.prompt
        letter = "ABCD"[ex.meta.options.index(ex.answer)]
        assert ex.meta.golds == (ex.answer, letter)


def test_images_and_prompts(data):
    task, train, test = data
    for ex in train[:20] + test[:20]:
        images = task.images(ex)
        assert images.shape == (1, 32, 32, 3) and images.dtype == np.uint8
        assert ex.prompt.count(IMAGE_MARKER) == len(images) == 1
        assert ex.prompt.startswith(IMAGE_MARKER) and ex.prompt.endswith("Assistant: <think>")
        assert ex.prompt.isascii()
    assert max(len(e.prompt) for e in train + test) <= task.max_prompt_len


def test_direct_style_is_answer_only():
    task = SpatialQATask(prompt_style="direct")
    ex = task.example("train", 1)
    assert ex.prompt.endswith("Assistant:") and task.solution(ex) == f"<answer>{ex.answer}</answer>"
    assert task.score(task.solution(ex), ex) == 1.0
    assert task.verify_batch([task.solution(ex)], [ex]).rewards == [2.0]


def test_verify_batch_is_the_anchors_sum(data):
    task, train, test = data
    task = SpatialQATask(length_per_token=0.001)
    ex = test[1]  # a relation question with lettered options
    letter = ex.meta.golds[1]
    completions = [
        f"{ex.meta.trace}</think><answer>{ex.answer}</answer>",   # right, formatted
        f"x</think><answer>{letter}</answer>",                    # the letter, formatted
        f"<answer>{ex.answer}</answer>",                          # right, no think close
        "x</think><answer>nowhere</answer> trailing",             # wrong, bad format
    ]
    v = task.verify_batch(completions, [ex] * 4)
    assert v.scores == [1.0, 1.0, 1.0, 0.0]
    assert v.components["format"] == [1.0, 1.0, 0.0, 0.0]
    lengths = [len(c) for c in completions]
    np.testing.assert_allclose(v.rewards, [2 + 0.001 * lengths[0], 2 + 0.001 * lengths[1],
                                           1 + 0.001 * lengths[2], 0.001 * lengths[3]])


@pytest.mark.parametrize("junk", ["", "<answer>", "</think>" * 1000, "<answer>" * 5000,
                                  "x</think><answer>\x00</answer>", "\ud800", "A" * 100_000])
def test_hostile_completions(data, junk):
    task, train, _ = data
    assert task.score(junk, train[0]) in (0.0, 1.0)
    assert len(task.verify_batch([junk], [train[0]]).rewards) == 1


def test_bad_options_raise():
    with pytest.raises(ValueError, match="prompt_style must be one of"):
        SpatialQATask(prompt_style="cot")
    with pytest.raises(ValueError, match="categories must be a non-empty subset"):
        SpatialQATask(categories=("colour",))
    with pytest.raises(ValueError, match="test_objects must satisfy"):
        SpatialQATask(test_objects=(5, 9))

"""Generated videos (envs/vision/video.py): the renderer against hand-computed pixels, events and
distractors seen in the frames, questions recomputed from the video spec by the test's own code,
disjoint splits, the built-in frame rules, contrast views and event recall."""

import re

import numpy as np
import pytest

from jaxrl_suite.envs.text import TASKS, make_task
from jaxrl_suite.envs.text.base import TEST_BUCKETS, stable_hash
from jaxrl_suite.envs.vision import IMAGE_MARKER, render_scenes
from jaxrl_suite.envs.vision.scene import PALETTE
from jaxrl_suite.envs.vision.video import (
    BACKGROUND,
    FAMILIES,
    SUB,
    Event,
    Video,
    VideoObject,
    VideoQATask,
    event_recall,
    select_frames,
    shuffled,
    uniform_frames,
    with_frames,
)

N = 400


@pytest.fixture(scope="module")
def draws():
    task = VideoQATask()  # (video, question, options, answer, evidence, an rng) per example
    return task, [(m.video, m.question, m.options, e.answer, m.evidence,
                   np.random.default_rng(i)) for i in range(N)
                  for e in [task.example("train", i)] for m in [e.meta]]


def test_render_a_square_by_hand():
    # a 6 px square centred at x = 12.25 px, y = 12 px: columns [9.25, 15.25), rows [9, 15)
    red = PALETTE["red"]
    v = Video((VideoObject("square", "red", x=49, y=48),), frames=2, size=24)
    img = v.render_frame(0).astype(int)
    assert img.shape == (24, 24, 3) and img.dtype == np.int64
    np.testing.assert_array_equal(img[9:15, 10:15], np.broadcast_to(red, (6, 5, 3)))
    # column 9 covers 3 of its 4 quarter columns, column 15 one: rounded means
    cover = lambda q, c: (q * c + (SUB - q) * BACKGROUND + SUB // 2) // SUB
    np.testing.assert_array_equal(img[9:15, 9], [[cover(3, c) for c in red]] * 6)
    np.testing.assert_array_equal(img[9:15, 15], [[cover(1, c) for c in red]] * 6)
    assert (img[:9] == BACKGROUND).all() and (img[15:] == BACKGROUND).all()
    np.testing.assert_array_equal(v.render_frame(1), v.render_frame(0))  # nothing moves
    whole = v.render()  # every frame, rendered once and kept read-only
    np.testing.assert_array_equal(whole, np.stack([v.render_frame(0), v.render_frame(1)]))
    assert v.render() is whole and not whole.flags.writeable


def test_events_and_distractors_in_the_pixels():
    obj = (VideoObject("square", "red", x=48, y=48), VideoObject("circle", "blue", x=16, y=16))
    events = (Event("flash", 0, 3, 2, "green"), Event("vanish", 1, 5), Event("jump", 0, 7, dx=4))
    v = Video(obj, events, frames=10, size=24)
    at = lambda t, y, x: tuple(v.render_frame(t)[y, x])
    assert at(2, 12, 12) == PALETTE["red"] and at(3, 12, 12) == PALETTE["green"]
    assert at(4, 12, 12) == PALETTE["green"] and at(5, 12, 12) == PALETTE["red"]
    assert at(4, 4, 4) == PALETTE["blue"] and at(5, 4, 4) == (BACKGROUND,) * 3
    assert at(7, 12, 12) == (BACKGROUND,) * 3 and at(7, 12, 16) == PALETTE["red"]  # jumped 4 px
    appear = Video(obj, (Event("appear", 1, 4),), frames=6, size=24)
    assert tuple(appear.render_frame(3)[4, 4]) == (BACKGROUND,) * 3
    assert tuple(appear.render_frame(4)[4, 4]) == PALETTE["blue"]
    # flicker: every pixel brighter by the gain; camera: everything shifted from camera_t on
    base = Video(obj, frames=6, size=24)
    flick = Video(obj, frames=6, size=24, flicker=(2,), flicker_gain=20)
    np.testing.assert_array_equal(flick.render_frame(2).astype(int),
                                  np.minimum(base.render_frame(2).astype(int) + 20, 255))
    np.testing.assert_array_equal(flick.render_frame(3), base.render_frame(3))
    cam = Video(obj, frames=6, size=24, camera_t=3, camera_dx=2, camera_dy=-1)
    np.testing.assert_array_equal(cam.render_frame(2), base.render_frame(2))
    np.testing.assert_array_equal(cam.render_frame(3)[:-1, 2:], base.render_frame(3)[1:, :-2])
    # noise: seeded per frame, bounded, the same bytes twice
    noisy = Video(obj, frames=6, size=24, noise=3, seed=5)
    d = noisy.render_frame(1).astype(int) - base.render_frame(1).astype(int)
    assert np.abs(d).max() <= 3 and d.std() > 0.5
    np.testing.assert_array_equal(noisy.render_frame(1), noisy.render_frame(1))
    assert not np.array_equal(noisy.render_frame(1), noisy.render_frame(2))
    # drift: the object's centre moves by D t^2 / (T-1)^2 quarter pixels
    drift = Video((VideoObject("square", "red", x=48, y=48, dx=36),), frames=4, size=24)
    assert [drift._state(t)[0][2] for t in range(4)] == [48, 52, 64, 84]
    with pytest.raises(ValueError, match="render_frame"):
        v.render_frame(10)
    with pytest.raises(ValueError, match="kind"):
        Event("explode", 0, 1)


def _answer(family: str, video: Video, question: str, options) -> str:
    """The answer recomputed from the spec: the test's own reading of each family."""
    named = {o.shape: (i, o) for i, o in enumerate(video.objects)}
    if family == "static":
        return named[re.search(r"the (\w+)\?", question).group(1)][1].colour
    if family in ("content", "count"):
        i, _ = named[re.search(r"the (\w+) flash", question).group(1)]
        flashes = [e for e in video.events if e.obj == i and e.kind == "flash"]
        if family == "count":
            assert all(e.colour == "white" for e in flashes)
        return flashes[0].colour if family == "content" else str(len(flashes))
    a, b = options
    first = {}
    for e in video.events:
        first.setdefault(video.objects[e.obj].name, e.t)
    return a if first[a] < first[b] else b


def test_questions_match_their_videos(draws):
    task, rows = draws
    seen = set()
    for i, (video, question, options, answer, evidence, _) in enumerate(rows):
        family = task.family(i)
        seen.add(family)
        assert answer in options and len(set(options)) == len(options)
        assert _answer(family, video, question, options) == answer, (i, question)
        assert 2 <= len(video.objects) <= 4
        assert len({o.shape for o in video.objects}) == len(video.objects)
        assert len({o.colour for o in video.objects}) == len(video.objects)
        for e in video.events:  # events inside the picture's time range, away from the ends
            assert 2 <= e.t < video.frames - 3
        ts = sorted(e[0] for e in evidence)
        assert all(b - a >= 4 for a, b in zip(ts, ts[1:], strict=False))
        if family == "static":
            assert evidence == ()
        for e in video.events:  # a flash shows a colour no object has
            assert e.kind != "flash" or e.colour not in {o.colour for o in video.objects}
        if family in ("content", "static"):  # the other options: colours no frame shows
            shown = {o.colour for o in video.objects} | {e.colour for e in video.events}
            assert not (set(options) - {answer}) & shown
        if family == "order":
            assert {e.kind for e in video.events[:2]} <= {"flash", "appear", "vanish"}
    assert seen == set(FAMILIES)
    # order questions: the first-named event comes first in about half of them (no text cue)
    firsts = [a == re.search(r"first: the (\w+ \w+)", q).group(1) for i, (_, q, _, a, _, _)
              in enumerate(rows) if task.family(i) == "order"]
    assert 0.35 < np.mean(firsts) < 0.65, np.mean(firsts)
    counts = [a for i, (_, _, _, a, _, _) in enumerate(rows) if task.family(i) == "count"]
    assert set(counts) == {"1", "2", "3"}


def test_examples_are_pure_and_splits_disjoint():
    task = make_task("video_qa", seed=3)
    assert TASKS.get("video_qa") is VideoQATask
    a, b = task.example("train", 7), task.example("train", 7)
    assert a.prompt == b.prompt and a.meta.video == b.meta.video
    train = {task.example("train", i).meta.video.key for i in range(200)}
    test = [task.example("test", i).meta.video for i in range(40)]
    assert not train & {v.key for v in test}
    assert all(stable_hash(v.key) % TEST_BUCKETS == 0 for v in test)


def test_prompts_solutions_and_scores():
    task = VideoQATask(k=4)
    for i in range(8):
        ex = task.example("train", i)
        assert ex.prompt.count(IMAGE_MARKER) == 4 and ex.prompt.startswith(IMAGE_MARKER * 4)
        assert ex.prompt.endswith("\nAssistant:") and ex.meta.frames == (4, 12, 20, 28)
        assert task.score(task.solution(ex), ex) == 1.0
        wrong = next(o for o in ex.meta.options if o != ex.answer)
        assert task.score(f"<answer>{wrong}</answer>", ex) == 0.0
        v = task.verify_batch([task.solution(ex), "junk"], [ex, ex])
        assert v.scores == [1.0, 0.0] and v.rewards == [1.5, 0.0]
        images = render_scenes(ex.meta.scenes)
        assert images.shape == (4, 24, 24, 3)
        np.testing.assert_array_equal(images[1], ex.meta.video.render_frame(12))
    every = task.with_frames("all").example("train", 0)
    assert every.prompt.count(IMAGE_MARKER) == 32 and task.with_frames("all").max_images == 32
    with pytest.raises(ValueError, match="frames"):
        VideoQATask(frames="best")
    with pytest.raises(ValueError, match="objects"):
        VideoQATask(objects=(1, 3))


def test_frame_rules_and_recall(draws):
    task, rows = draws
    np.testing.assert_array_equal(uniform_frames(32, 4), [4, 12, 20, 28])
    np.testing.assert_array_equal(uniform_frames(10, 3), [1, 5, 8])  # 1.67, 5, 8.33 floored
    for video, _, _, _, evidence, rng in rows[:40]:
        firsts = {e[0] for e in evidence}
        oracle = select_frames(video, "oracle", 4, evidence=evidence)
        assert firsts <= set(oracle) and len(set(oracle)) == 4 and list(oracle) == sorted(oracle)
        sft = select_frames(video, "sft", 4, evidence=evidence, rng=rng)
        assert firsts <= set(sft) and len(set(sft)) == 4
        assert event_recall(oracle, evidence) in (None, 1.0)
    # oracle fill: the uniform frames farthest from the evidence
    assert select_frames(rows[0][0], "oracle", 4, evidence=((13,),)) == (4, 13, 20, 28)
    assert event_recall([4, 12], [(3, 4), (20,)]) == 0.5
    assert event_recall([4, 12], []) is None
    learned = task.with_selector(lambda v: (30, 1, 2, 3), "mine")
    assert learned.example("train", 0).meta.frames == (1, 2, 3, 30)
    assert learned.frames == "mine"


def test_contrast_views():
    ex = VideoQATask().example("train", 1)
    rng = np.random.default_rng(0)
    mixed = shuffled(ex, rng)
    assert sorted(mixed.meta.frames) == list(ex.meta.frames) and mixed.meta.frames != \
        ex.meta.frames and mixed.prompt == ex.prompt
    other = with_frames(ex, [0, 1, 2, 3])
    assert other.meta.frames == (0, 1, 2, 3) and other.answer == ex.answer
    with pytest.raises(ValueError, match="with_frames"):
        with_frames(ex, [0, 1])

"""Generated videos with short events among distractors, and questions about them (issue 47,
ChronoForge-RL's keyframe study; the whole generator is our reconstruction: the paper gives
only an abstract).

A `Video` is a hashable spec: `frames` frames (32) of `size` x `size` pixels (24) on a dark
gray background, 2 to 4 objects with distinct shapes and colours, and `Event`s on them:

  flash   the object takes a colour that no object of the video has, for `duration` (1 or 2)
          frames from `t`
  appear  the object is invisible before frame t
  vanish  the object is invisible from frame t
  jump    the object moves by (dx, dy) pixels from frame t on

and distractors that make frame selection non-trivial, so that raw frame difference is not an
oracle for the events:

  drift   every object drifts with a constant acceleration: its centre at frame t is
          p0 + D t^2 / (T - 1)^2 quarter-pixels (D per object and axis), so the change between
          frames grows linearly over the video (change without an apex)
  noise   every pixel gets uniform integer noise in [-noise, noise], drawn per frame
  flicker on the frames in `flicker` every pixel brightens by `flicker_gain` (an irrelevant,
          global spike)
  camera  from frame `camera_t` on, the whole picture is shifted by (camera_dx, camera_dy) px
          (an irrelevant, global jump)

Rendering is integer arithmetic only, so every platform renders the same bytes: objects are
painted (in list order, later ones nearer) on a canvas `SUB` = 4 times finer, with
`scene.shape_mask`'s shapes at quarter-pixel centres, and each output pixel is the rounded mean
of its SUB x SUB block (so sub-pixel drift changes pixels gradually); then flicker and noise
(`np.random.default_rng([video.seed, t])`), clipped to 0..255. `VideoFrame(video, t)` is one
frame as an item of `Example.meta.scenes` (`scene.render_scenes` renders it), so the runner
puts the chosen frames into the prompt as images, in temporal order; their M-RoPE positions
carry that order.

`VideoQATask` asks four families in turn (example index % 4):

  content  "What colour did the square flash?"  (one flash of it; options: the flash colour,
           the object's own colour, one more)
  order    "Which happened first: the red square vanished or the blue circle flashed?"
           (two events on two objects, >= MIN_GAP frames apart; options: the two objects)
  count    "How many times did the triangle flash?"  (1 to 3 one-frame flashes, >= MIN_GAP
           frames apart; options 1, 2, 3)
  static   "What colour is the circle?"  (no event on it; a control any frame answers)

Every video also holds a distractor event on another object in half of the draws. Which frames
the prompt shows is the task's `frames` rule, a pure function of the video: built in
(`SELECTORS`, `select_frames`) uniform, the oracle (the question's evidence frames:
`VideoMeta.evidence`), all frames, or "sft" (the evidence frames plus random ones: the SFT data
rule of docs/chronoforge.md); or any function of the video given to `with_selector` (the
keyframe selectors of `sampling.keyframes`, a learned one).
Prompts are answer-only ("direct"): "<image>...<image>User: <question> Options: <options>
\\nAssistant:", solved by "<answer>x</answer>"; the score is the exact option text.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import ClassVar, NamedTuple

import numpy as np

from jaxrl_suite.envs.text.base import (
    TASKS,
    Example,
    Verdicts,
)
from jaxrl_suite.envs.vision.base import IMAGE_MARKER, VisionTask, options_text
from jaxrl_suite.envs.vision.scene import OBJECT_COLOURS, PALETTE, SHAPES, shape_mask
from jaxrl_suite.rewards.format import answer_tags, format_reward
from jaxrl_suite.rewards.r1zero import r1zero_accuracy

FAMILIES = ("content", "order", "count", "static")
EVENT_KINDS = ("flash", "appear", "vanish", "jump")
VERBS = {"flash": "flashed white", "appear": "appeared", "vanish": "vanished",
         "jump": "jumped"}
ORDER_KINDS = ("flash", "appear", "vanish")  # the events an order question asks about
FLASH = "white"  # the flash of count and order questions; no object is white
SELECTORS = ("uniform", "oracle", "all", "sft")  # built in; others: `VideoQATask.with_selector`
SUB = 4  # supersampling factor of the renderer (quarter pixels)
BACKGROUND = 40  # gray level of the background
MIN_GAP = 4  # frames between two events a question asks about
FIRST, LAST_MARGIN = 2, 3  # events start in [FIRST, frames - LAST_MARGIN)


@dataclasses.dataclass(frozen=True)
class VideoObject:
    """An object: `shape` in SHAPES, `colour` in OBJECT_COLOURS, centre (`x`, `y`) at frame 0
    in quarter pixels, drift (`dx`, `dy`): quarter pixels travelled by the last frame
    (accelerating), `size` in pixels (even)."""

    shape: str
    colour: str
    x: int
    y: int
    size: int = 6
    dx: int = 0
    dy: int = 0

    @property
    def name(self) -> str:
        return f"{self.colour} {self.shape}"


@dataclasses.dataclass(frozen=True)
class Event:
    """An event on object `obj` (its index) at frame `t` (module docstring): `kind` in
    EVENT_KINDS; a flash's `colour` and `duration`; a jump's (`dx`, `dy`) in pixels."""

    kind: str
    obj: int
    t: int
    duration: int = 1
    colour: str = ""
    dx: int = 0
    dy: int = 0

    def __post_init__(self):
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"Event: kind must be one of {list(EVENT_KINDS)}, got {self.kind!r}")

    @property
    def frames(self) -> tuple[int, ...]:
        """The frames that show the event: a flash's, else its first frame."""
        return tuple(range(self.t, self.t + self.duration)) if self.kind == "flash" else (self.t,)


@dataclasses.dataclass(frozen=True)
class Video:
    """A hashable video spec (module docstring); `render_frame(t)` draws frame t."""

    objects: tuple[VideoObject, ...]
    events: tuple[Event, ...] = ()
    frames: int = 32
    size: int = 24
    noise: int = 0
    flicker: tuple[int, ...] = ()
    flicker_gain: int = 60
    camera_t: int = -1  # no camera jump
    camera_dx: int = 0
    camera_dy: int = 0
    seed: int = 0

    def __post_init__(self):
        for e in self.events:
            if not 0 <= e.obj < len(self.objects) or not 0 <= e.t < self.frames:
                raise ValueError(f"Video: event {e} outside the video's objects or frames")

    @property
    def key(self) -> str:
        """Canonical text of the spec (the task's split hash)."""
        return repr(self)

    def _state(self, t: int) -> list[tuple[VideoObject, str, int, int, bool]]:
        """Each object at frame t: (object, colour, centre x, centre y in quarter px, shown)."""
        out, span = [], max(1, (self.frames - 1) ** 2)
        cam = (self.camera_dx, self.camera_dy) if 0 <= self.camera_t <= t else (0, 0)
        for i, o in enumerate(self.objects):
            x = o.x + (2 * o.dx * t * t + span) // (2 * span) + SUB * cam[0]
            y = o.y + (2 * o.dy * t * t + span) // (2 * span) + SUB * cam[1]
            colour, shown = o.colour, True
            for e in self.events:
                if e.obj != i:
                    continue
                if e.kind == "flash" and e.t <= t < e.t + e.duration:
                    colour = e.colour
                elif (e.kind == "appear" and t < e.t) or (e.kind == "vanish" and t >= e.t):
                    shown = False
                elif e.kind == "jump" and t >= e.t:
                    x, y = x + SUB * e.dx, y + SUB * e.dy
            out.append((o, colour, x, y, shown))
        return out

    def render_frame(self, t: int) -> np.ndarray:
        """uint8 [size, size, 3]: frame t (integer arithmetic, module docstring)."""
        if not 0 <= t < self.frames:
            raise ValueError(f"Video.render_frame: t={t} outside 0..{self.frames - 1}")
        n = self.size * SUB
        canvas = np.full((n, n, 3), BACKGROUND, np.int64)
        idx = 2 * np.arange(n, dtype=np.int64) + 1  # doubled sub-pixel centres
        for o, colour, x, y, shown in self._state(t):
            if shown:
                canvas[shape_mask(o.shape, (idx - 2 * x)[None, :], (idx - 2 * y)[:, None],
                                  o.size * SUB)] = PALETTE[colour]
        half = SUB * SUB // 2
        img = (canvas.reshape(self.size, SUB, self.size, SUB, 3).sum((1, 3)) + half) // (SUB * SUB)
        if t in self.flicker:
            img = img + self.flicker_gain
        if self.noise:
            img = img + np.random.default_rng([self.seed, t]).integers(
                -self.noise, self.noise + 1, img.shape)
        return np.clip(img, 0, 255).astype(np.uint8)

    def render(self) -> np.ndarray:
        """uint8 [frames, size, size, 3]: every frame (read-only; the last RENDER_CACHE videos
        are kept, so a step's selection and saliency render each video once)."""
        return _rendered(self)


RENDER_CACHE = 256  # videos: 256 x 55 KB at 32 frames of 24 x 24


@functools.lru_cache(maxsize=RENDER_CACHE)
def _rendered(video: Video) -> np.ndarray:
    frames = np.stack([video.render_frame(t) for t in range(video.frames)])
    frames.flags.writeable = False
    return frames


@dataclasses.dataclass(frozen=True)
class VideoFrame:
    """Frame `t` of `video` as an image of an example (`scene.render_scenes` renders it)."""

    video: Video
    t: int

    @property
    def size(self) -> int:
        return self.video.size

    def render(self) -> np.ndarray:
        return self.video.render_frame(self.t)


class VideoMeta(NamedTuple):
    """`Example.meta` of a video question (`Example.answer`: the correct option's text)."""

    scenes: tuple[VideoFrame, ...]  # the frames the prompt shows, in temporal order
    video: Video
    family: str  # one of FAMILIES
    question: str
    options: tuple[str, ...]
    evidence: tuple[tuple[int, ...], ...]  # per event the question asks about: its frames

    @property
    def frames(self) -> tuple[int, ...]:
        return tuple(f.t for f in self.scenes)


# ---- drawing ----
def _draw_video(rng: np.random.Generator, n_objects: int, frames: int, size: int
                ) -> Video:
    """Objects in distinct cells of a 3 x 3 grid, distinct shapes and colours, with random
    drift, noise, flicker and camera jump (no events yet)."""
    cell = size // 3
    cells = rng.choice(9, size=n_objects, replace=False)
    shapes = rng.choice(len(SHAPES), size=n_objects, replace=False)
    colours = rng.choice(len(OBJECT_COLOURS), size=n_objects, replace=False)
    objects = tuple(VideoObject(
        SHAPES[int(s)], OBJECT_COLOURS[int(c)],
        x=SUB * (int(k) % 3 * cell + cell // 2) + int(rng.integers(-2, 3)),
        y=SUB * (int(k) // 3 * cell + cell // 2) + int(rng.integers(-2, 3)),
        size=6, dx=int(rng.integers(-10, 11)), dy=int(rng.integers(-10, 11)))
        for k, s, c in zip(cells, shapes, colours, strict=True))
    flicker = tuple(sorted(int(t) for t in rng.choice(frames - 2, size=int(rng.integers(0, 3)),
                                                      replace=False) + 1))
    cam = rng.integers(2) == 1
    shift = [int(v) for v in rng.integers(1, 3, 2) * rng.choice((-1, 1), 2)]
    return Video(objects, (), frames, size, noise=int(rng.integers(2, 7)), flicker=flicker,
                 flicker_gain=int(rng.integers(40, 80)),
                 camera_t=int(rng.integers(FIRST, frames - LAST_MARGIN)) if cam else -1,
                 camera_dx=shift[0] if cam else 0, camera_dy=shift[1] if cam else 0,
                 seed=int(rng.integers(2**31)))


def _event(rng: np.random.Generator, kind: str, video: Video, obj: int, t: int,
           duration: int = 1, colour: str | None = None) -> Event:
    """An event of `kind` on object `obj` at frame t: a flash to `colour` (default: an object
    colour no object of the video has, never white: white is the count and order questions'
    flash), a jump of 4 or 5 px along one axis towards the centre (so it stays in the
    picture)."""
    o = video.objects[obj]
    if kind == "flash":
        if colour is None:
            free = [c for c in OBJECT_COLOURS if c not in {x.colour for x in video.objects}]
            colour = free[int(rng.integers(len(free)))]
        return Event("flash", obj, t, duration, colour)
    if kind == "jump":
        axis, d = int(rng.integers(2)), int(rng.integers(4, 6))
        d = d if (o.x, o.y)[axis] < SUB * video.size // 2 else -d
        return Event("jump", obj, t, dx=d if axis == 0 else 0, dy=d if axis == 1 else 0)
    return Event(kind, obj, t)


def _times(rng: np.random.Generator, n: int, frames: int) -> list[int] | None:
    """n sorted event frames in [FIRST, frames - LAST_MARGIN), >= MIN_GAP apart (None: none)."""
    for _ in range(100):
        t = np.sort(rng.choice(np.arange(FIRST, frames - LAST_MARGIN), size=n, replace=False))
        if n < 2 or np.diff(t).min() >= MIN_GAP:
            return [int(v) for v in t]
    return None


def _distractor(rng: np.random.Generator, video: Video, busy: Sequence[int], avoid: Sequence[int]
                ) -> list[Event]:
    """In half of the draws, one event on an object not in `busy`, >= MIN_GAP frames from the
    frames in `avoid`."""
    free = [i for i in range(len(video.objects)) if i not in busy]
    if not free or rng.integers(2) == 0:
        return []
    ok = [t for t in range(FIRST, video.frames - LAST_MARGIN)
          if all(abs(t - a) >= MIN_GAP for a in avoid)]
    if not ok:
        return []
    i = free[int(rng.integers(len(free)))]
    kind = EVENT_KINDS[int(rng.integers(len(EVENT_KINDS)))]
    return [_event(rng, kind, video, i, ok[int(rng.integers(len(ok)))])]


def _unseen_options(rng: np.random.Generator, answer: str, video: Video,
                    events: Sequence[Event]) -> tuple[str, ...] | None:
    """Three colour options in a random order: `answer` and two colours that no frame of the
    video shows (neither an object's nor a flash's), so that seeing the answer's colour in a
    chosen frame answers the question; None if fewer than two colours are unseen."""
    shown = {o.colour for o in video.objects} | {e.colour for e in events if e.kind == "flash"}
    unseen = [c for c in (*OBJECT_COLOURS, FLASH) if c not in shown and c != answer]
    if len(unseen) < 2:
        return None
    picked = rng.choice(len(unseen), size=2, replace=False)
    options = [answer, *(unseen[int(i)] for i in picked)]
    return tuple(options[int(i)] for i in rng.permutation(3))


def _ask(rng: np.random.Generator, family: str, video: Video):
    """(video with its events, question, options, answer, evidence frames), or None."""
    objs, n = video.objects, len(video.objects)
    target = int(rng.integers(n))
    o = objs[target]
    if family == "content":
        (t,) = _times(rng, 1, video.frames)
        e = _event(rng, "flash", video, target, t, duration=int(rng.integers(1, 3)))
        events = [e, *_distractor(rng, video, [target], [t])]
        options = _unseen_options(rng, e.colour, video, events)
        return None if options is None else (events, f"What colour did the {o.shape} flash?",
                                             options, e.colour, (e.frames,))
    if family == "count":
        k = int(rng.integers(1, 4))
        times = _times(rng, k, video.frames)
        if times is None:
            return None
        flashes = [Event("flash", target, t, 1, FLASH) for t in times]
        events = [*flashes, *_distractor(rng, video, [target], times)]
        return (events, f"How many times did the {o.shape} flash {FLASH}?", ("1", "2", "3"),
                str(k), tuple(e.frames for e in flashes))
    if family == "order":
        if n < 2:
            return None
        a, b = (int(i) for i in rng.choice(n, size=2, replace=False))
        times = _times(rng, 2, video.frames)
        if rng.integers(2):  # either object's event may come first
            times = times[::-1]
        kinds = rng.choice(len(ORDER_KINDS), size=2)
        ea, eb = (_event(rng, ORDER_KINDS[int(kd)], video, i, t, colour=FLASH)
                  for kd, i, t in zip(kinds, (a, b), times, strict=True))
        events = [ea, eb, *_distractor(rng, video, [a, b], times)]
        first = objs[a] if ea.t < eb.t else objs[b]
        pa, pb = f"the {objs[a].name} {VERBS[ea.kind]}", f"the {objs[b].name} {VERBS[eb.kind]}"
        options = (objs[a].name, objs[b].name) if rng.integers(2) else (objs[b].name,
                                                                         objs[a].name)
        return (events, f"Which happened first: {pa} or {pb}?", options, first.name,
                (ea.frames, eb.frames))
    events = _distractor(rng, video, [target], [])  # static: the target never changes
    options = _unseen_options(rng, o.colour, video, events)
    return None if options is None else (events, f"What colour is the {o.shape}?", options,
                                         o.colour, ())


# ---- frame selection ----
def uniform_frames(num_frames: int, k: int) -> np.ndarray:
    """The centres of k equal segments of a video of `num_frames` frames, int64 [k]:
    floor((i + 0.5) * T / k) (T = 32, k = 4: 4, 12, 20, 28)."""
    if num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    if not 1 <= k <= num_frames:
        raise ValueError(f"k must lie in [1, num_frames={num_frames}], got {k}")
    i = np.arange(k, dtype=np.int64)
    return (2 * i + 1) * num_frames // (2 * k)


def select_frames(video: Video, selector: str, k: int, *,
                  evidence: Sequence[Sequence[int]] = (),
                  rng: np.random.Generator | None = None) -> tuple[int, ...]:
    """The k frames (ascending) that a built-in `selector` (SELECTORS) picks from `video`:
    "uniform" (`uniform_frames`), "oracle" (the first frame of each `evidence` event, then the
    uniform frames farthest from those), "all" (every frame; k ignored), "sft" (those first
    frames plus random frames from `rng`). The keyframe selectors of `sampling.keyframes` come in
    through `VideoQATask.with_selector`."""
    n = video.frames
    if selector == "all":
        return tuple(range(n))
    if selector == "uniform":
        return tuple(int(t) for t in uniform_frames(n, k))
    if selector not in ("oracle", "sft"):
        raise ValueError(f"select_frames: selector must be one of {list(SELECTORS)}, got "
                         f"{selector!r}")
    chosen = sorted({int(e[0]) for e in evidence})[:k]
    rest = [t for t in range(n) if t not in chosen]
    if selector == "sft":
        if rng is None:
            raise ValueError("select_frames: the 'sft' selector needs an rng")
        picked = rng.choice(len(rest), k - len(chosen), replace=False)
        return tuple(sorted(chosen + [rest[int(i)] for i in picked]))
    fill = [int(t) for t in uniform_frames(n, k) if t not in chosen]  # then by distance
    fill.sort(key=lambda t: (-min((abs(t - c) for c in chosen), default=n), t))
    return tuple(sorted(chosen + fill[: k - len(chosen)]))


@dataclasses.dataclass(frozen=True)
class VideoQATask(VisionTask):
    """Questions about generated videos (module docstring). Fields: `frames` (the selector),
    `k` frames per prompt (`frames="all"`: every frame), `families` asked in turn by example
    index, `objects` (inclusive range per video), the video's `num_frames` and `size`, and
    `format_weight` of the designed reward (accuracy + format_weight * format)."""

    name: ClassVar[str] = "video_qa"
    seed: int = 0
    frames: str = "uniform"
    k: int = 4
    families: tuple[str, ...] = FAMILIES
    objects: tuple[int, int] = (2, 4)
    num_frames: int = 32
    size: int = 24
    format_weight: float = 0.5
    selector_fn: Callable[[Video], Sequence[int]] | None = dataclasses.field(
        default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.frames not in SELECTORS and self.selector_fn is None:
            raise ValueError(f"video_qa: frames must be one of {list(SELECTORS)}, got "
                             f"{self.frames!r}")
        if not self.families or not set(self.families) <= set(FAMILIES):
            raise ValueError(f"video_qa: families must be a non-empty subset of "
                             f"{list(FAMILIES)}, got {self.families!r}")
        lo, hi = self.objects
        if not 2 <= lo <= hi <= 4:
            raise ValueError(f"video_qa: objects must satisfy 2 <= lo <= hi <= 4, got "
                             f"{self.objects}")
        if not 1 <= self.k <= self.num_frames:
            raise ValueError(f"video_qa: k must be in 1..num_frames={self.num_frames}, got "
                             f"{self.k}")
        if self.size % 8:
            raise ValueError(f"video_qa: size must be a multiple of 8, got {self.size}")

    @property
    def max_images(self) -> int:  # type: ignore[override]
        return self.num_frames if self.frames == "all" else self.k

    def family(self, index: int) -> str:
        return self.families[index % len(self.families)]

    def with_frames(self, frames: str) -> VideoQATask:
        """This task with another built-in selector (same videos and questions)."""
        return dataclasses.replace(self, frames=frames, selector_fn=None)

    def with_selector(self, fn: Callable[[Video], Sequence[int]], name: str = "learned"
                      ) -> VideoQATask:
        """This task with frames chosen by `fn(video) -> k frame indices` (e.g. a trained
        scorer's hard top-k); `name` is recorded as `frames`."""
        return dataclasses.replace(self, frames=name, selector_fn=fn)

    # ---- generation (`VisionTask.example`: draw, split by the video's hash, then build) ----
    def _draw_scenes(self, rng, split, index):
        """(video, question, options, answer, evidence) of example `index`, or None: the draw
        that the split is decided on. Frame selection does not enter, so every selector sees
        the same videos."""
        base = _draw_video(rng, int(rng.integers(self.objects[0], self.objects[1] + 1)),
                           self.num_frames, self.size)
        made = _ask(rng, self.family(index), base)
        if made is None:
            return None
        events, question, options, answer, evidence = made
        return (dataclasses.replace(base, events=tuple(events)), question, options, answer,
                tuple(evidence))

    def _split_key(self, drawn) -> str:
        return drawn[0].key  # the video's spec

    def _build(self, rng, drawn, split, index):
        """The example on the frames that `frames` (or `selector_fn`) chooses."""
        video, question, options, answer, evidence = drawn
        if self.selector_fn is not None:
            chosen = tuple(sorted(int(t) for t in self.selector_fn(video)))
        else:
            chosen = select_frames(video, self.frames, self.k, evidence=evidence, rng=rng)
        prompt = (IMAGE_MARKER * len(chosen) + f"User: {question} Options: "
                  f"{options_text(options, False)}\nAssistant:")
        meta = VideoMeta(tuple(VideoFrame(video, t) for t in chosen), video, self.family(index),
                         question, options, evidence)
        return Example(prompt, answer, meta)

    def _problem_key(self, ex: Example) -> str:
        return ex.meta.video.key

    # ---- solutions and verification ----
    def solution(self, ex: Example) -> str:
        return answer_tags(ex.answer)

    def score(self, completion: str, ex: Example) -> float:
        """1.0 iff the answer is the correct option's text (`r1zero_accuracy`)."""
        return r1zero_accuracy(completion, (ex.answer,))

    def verify_batch(self, completions: Sequence[str], examples: Sequence[Example]) -> Verdicts:
        """Scores (accuracy) and the designed reward accuracy + format_weight * format
        (`format_reward`: one <answer> block)."""
        if len(completions) != len(examples):
            raise ValueError(f"{len(completions)} completions for {len(examples)} examples")
        acc = [self.score(c, e) for c, e in zip(completions, examples, strict=True)]
        fmt = [format_reward(c) for c in completions]
        return Verdicts(acc, rewards=[a + self.format_weight * f for a, f in zip(
            acc, fmt, strict=True)], components={"accuracy": acc, "format": fmt})


def shuffled(ex: Example, rng: np.random.Generator) -> Example:
    """`ex` with its frames in a random order other than the temporal one (when there are two
    or more distinct frames): KF-GRPO's and T-GRPO's temporal contrast."""
    frames = ex.meta.scenes
    if len({f.t for f in frames}) < 2:
        return ex
    while True:
        order = rng.permutation(len(frames))
        if any(frames[int(i)].t != f.t for i, f in zip(order, frames, strict=True)):
            break
    return dataclasses.replace(ex, meta=ex.meta._replace(
        scenes=tuple(frames[int(i)] for i in order)))


def with_frames(ex: Example, frames: Sequence[int]) -> Example:
    """`ex` showing `frames` of its video instead (as many as it shows now; kept in the order
    given): KF-GRPO's content contrast (uniform frames) or a learned selector's choice."""
    if len(frames) != len(ex.meta.scenes):
        raise ValueError(f"with_frames: {len(frames)} frames for a prompt of "
                         f"{len(ex.meta.scenes)} images")
    video = ex.meta.video
    return dataclasses.replace(ex, meta=ex.meta._replace(
        scenes=tuple(VideoFrame(video, int(t)) for t in frames)))


def event_recall(chosen: Sequence[int], evidence: Sequence[Sequence[int]]) -> float | None:
    """The share of the question's events (`VideoMeta.evidence`) that some chosen frame
    shows; None for a question without events (the static control)."""
    if not evidence:
        return None
    chosen = set(int(t) for t in chosen)
    return sum(bool(chosen & set(e)) for e in evidence) / len(evidence)


TASKS.register(VideoQATask.name, VideoQATask)

__all__ = ["EVENT_KINDS", "FAMILIES", "SELECTORS", "Event", "Video", "VideoFrame", "VideoMeta",
           "VideoObject", "VideoQATask", "event_recall", "select_frames", "shuffled",
           "uniform_frames", "with_frames"]

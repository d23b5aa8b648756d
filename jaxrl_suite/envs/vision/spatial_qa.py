"""Spatial QA: the SAT-like training questions and the CVBench-like held-out set of
VisualThinker-R1-Zero (arXiv 2503.05132), on rendered scenes (envs/vision/scene.py).

Four categories, one per example index in turn (index % 4, so every batch is balanced and the
held-out accuracy splits evenly by category); each question is multiple choice, answered by the
option's text inside `<answer>...</answer>`:

  count     how many objects of a colour or of a shape ("red objects", "circles")
  relation  is a left or right of b (their columns differ) / above or below (their rows differ)
  depth     which of two objects is nearer the viewer: the one that visibly occludes the other
  distance  which of two objects is closer to a third (cell centres; the far one at least
            sqrt(2) times as far, so the answer is clear at a glance)

Train and test differ as in the anchor's SAT -> CVBench transfer: the test split asks with its
own phrasings (no test template is ever a train template), labels its options (A), (B), ... as
CVBench does (the letter is accepted too), holds more objects (`test_objects`, default 5..6,
against `train_objects`, 3..4), and its scenes are disjoint from training's by the Task hash
rule on the scene (`VisionTask`).

Prompts follow the anchor's base-model prompt, shortened for byte-level models (about 100
bytes): "<image>User: <question> Options: <options>\\nAssistant: <think>" with
`prompt_style="think"` (R1-Zero: the prompt ends inside the think block) or without the final
"<think>" with "direct" (the answer-only SFT baseline, whose solution is "<answer>x</answer>").
The think-style solution is a cell-level trace of true facts (the grammar of
envs/vision/analysis.py) then the answer; R1-Zero never trains on it, it is there for SFT
ablations and as a reference trace.

`score` is the anchor's accuracy reward (`rewards.r1zero.r1zero_accuracy`: exact option text,
its letter on lettered prompts, or the same number). `verify_batch`'s designed reward is the
anchor's sum: accuracy + format_weight * format + length_per_token * |completion|, the format
being `think_answer_format` (think style; the prompt's `<think>` counted) or the answer-only
`format_reward` (direct style), and |completion| its UTF-8 bytes (the byte tokenizer's tokens;
0.001 is the anchor's naive length reward, off by default).
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Sequence
from typing import ClassVar, NamedTuple

import numpy as np

from jaxrl_suite.envs.text.base import TASKS, Example, Verdicts
from jaxrl_suite.envs.vision.base import IMAGE_MARKER, VisionTask, options_text
from jaxrl_suite.envs.vision.scene import (
    OBJECT_COLOURS,
    RELATION_PHRASES,
    RELATIONS,
    SHAPES,
    Scene,
    SceneObject,
    at_text,
    distance2,
    draw_scene,
    legible,
    relation,
    visible_occlusions,
)
from jaxrl_suite.rewards.format import answer_tags, format_reward
from jaxrl_suite.rewards.r1zero import THINK_CLOSE, r1zero_accuracy, think_answer_format

CATEGORIES = ("count", "relation", "depth", "distance")
PROMPT_STYLES = ("think", "direct")
MAX_OBJECTS = 8

# category -> split -> question templates; {what} is "red objects" or "circles".
TEMPLATES: dict[str, dict[str, tuple[str, ...]]] = {
    "count": {
        "train": ("How many {what} are there?", "Count the {what}."),
        "test": ("What is the number of {what} in the image?",),
    },
    "relation": {
        "train": ("Is the {a} {pair} the {b}?", "Where is the {a}, {pair} the {b}?"),
        "test": ("Relative to the {b}, where is the {a}?",),
    },
    "depth": {
        "train": ("Which is closer to the camera, the {a} or the {b}?",
                  "Which is in front, the {a} or the {b}?"),
        "test": ("Which object is nearer to the viewer: the {a} or the {b}?",),
    },
    "distance": {
        "train": ("Which is closer to the {c}, the {a} or the {b}?",),
        "test": ("Which of the {a} and the {b} is nearer to the {c}?",),
    },
}
_PAIR = ("left or right of", "above or below")  # the question's choice, by axis


class SpatialMeta(NamedTuple):
    """`Example.meta` of a spatial_qa example (`Example.answer` is the correct option's text)."""

    scenes: tuple[Scene, ...]  # one scene
    category: str  # one of CATEGORIES
    question: str
    options: tuple[str, ...]  # in prompt order
    golds: tuple[str, ...]  # accepted answers: the option's text (and its letter on test)
    trace: str  # the cell-level think trace (true facts, analysis.py's grammar)


def _listing(objects: Sequence[SceneObject]) -> str:
    return " ".join(at_text(o) for o in objects)


def _shuffled(rng: np.random.Generator, options: Sequence[str]) -> tuple[str, ...]:
    return tuple(options[int(i)] for i in rng.permutation(len(options)))


def _ask_count(rng: np.random.Generator, scene: Scene):
    anchor = scene.objects[int(rng.integers(len(scene.objects)))]
    if rng.integers(2):
        n, noun = sum(o.colour == anchor.colour for o in scene.objects), f"{anchor.colour} object"
    else:
        n, noun = sum(o.shape == anchor.shape for o in scene.objects), anchor.shape
    wrong = [k for k in range(max(0, n - 2), n + 4) if k != n]
    picked = rng.choice(len(wrong), size=2, replace=False)
    options = _shuffled(rng, [str(n)] + [str(wrong[int(i)]) for i in picked])
    trace = f"{_listing(scene.objects)} {n} {noun}{'' if n == 1 else 's'}."
    return {"what": f"{noun}s"}, options, str(n), trace


def _ask_relation(rng: np.random.Generator, scene: Scene):
    i, j = rng.choice(len(scene.objects), size=2, replace=False)
    a, b = scene.objects[int(i)], scene.objects[int(j)]
    axes = [k for k in (0, 1) if a.cell[k] != b.cell[k]]  # cells are distinct: never empty
    axis = axes[int(rng.integers(len(axes)))]
    answer = relation(a, b, axis)
    trace = f"{_listing((a, b))} {a.name} {RELATION_PHRASES[answer]} {b.name}."
    return ({"a": a.name, "b": b.name, "pair": _PAIR[axis]}, _shuffled(rng, RELATIONS[axis]),
            answer, trace)


def _ask_depth(rng: np.random.Generator, scene: Scene):
    pairs = visible_occlusions(scene)
    if not pairs:
        return None
    near, far = pairs[int(rng.integers(len(pairs)))]
    a, b = (near, far) if rng.integers(2) else (far, near)
    trace = f"{_listing((a, b))} {near.name} covers {far.name}."
    return {"a": a.name, "b": b.name}, _shuffled(rng, (a.name, b.name)), near.name, trace


def _ask_distance(rng: np.random.Generator, scene: Scene):
    objs = scene.objects
    triples = [(a, b, c) for c in objs for a in objs for b in objs
               if len({a, b, c}) == 3 and a.name < b.name
               and max(distance2(a, c), distance2(b, c))
               >= 2 * min(distance2(a, c), distance2(b, c))]
    if not triples:
        return None
    a, b, c = triples[int(rng.integers(len(triples)))]
    if rng.integers(2):
        a, b = b, a
    near = a if distance2(a, c) < distance2(b, c) else b
    trace = f"{_listing((c, a, b))} {near.name} is closer."
    return ({"a": a.name, "b": b.name, "c": c.name}, _shuffled(rng, (a.name, b.name)),
            near.name, trace)


# category -> (rng, scene) -> (template fields, options, answer, trace), or None: no question
_ASK = {"count": _ask_count, "relation": _ask_relation, "depth": _ask_depth,
        "distance": _ask_distance}


@dataclasses.dataclass(frozen=True)
class SpatialQATask(VisionTask):
    """SAT-like spatial questions with a CVBench-like held-out split (module docstring).

    Fields: `prompt_style` "think" | "direct"; `categories` asked in turn by example index;
    `train_objects` / `test_objects` inclusive ranges of objects per scene; `format_weight` and
    `length_per_token` weigh the designed reward's format and length terms.
    """

    name: ClassVar[str] = "spatial_qa"
    max_images: ClassVar[int] = 1
    seed: int = 0
    prompt_style: str = "think"
    categories: tuple[str, ...] = CATEGORIES
    train_objects: tuple[int, int] = (3, 4)
    test_objects: tuple[int, int] = (5, 6)
    format_weight: float = 1.0
    length_per_token: float = 0.0

    def __post_init__(self):
        if self.prompt_style not in PROMPT_STYLES:
            raise ValueError(f"spatial_qa: prompt_style must be one of {list(PROMPT_STYLES)}, "
                             f"got {self.prompt_style!r}")
        if not self.categories or not set(self.categories) <= set(CATEGORIES):
            raise ValueError(f"spatial_qa: categories must be a non-empty subset of "
                             f"{list(CATEGORIES)}, got {self.categories!r}")
        for field in ("train_objects", "test_objects"):
            lo, hi = getattr(self, field)
            if not 3 <= lo <= hi <= MAX_OBJECTS:
                raise ValueError(f"spatial_qa: {field} must satisfy 3 <= lo <= hi <= "
                                 f"{MAX_OBJECTS}, got {getattr(self, field)}")

    def category(self, index: int) -> str:
        """The category of example `index` (either split)."""
        return self.categories[index % len(self.categories)]

    # ---- generation ----
    def _draw_scenes(self, rng, split, index):
        lo, hi = self.train_objects if split == "train" else self.test_objects
        n = int(rng.integers(lo, hi + 1))
        return (draw_scene(rng, n, occluding_pair=self.category(index) == "depth"),)

    def _build(self, rng, scenes, split, index):
        (scene,) = scenes
        if not legible(scene):
            return None
        category = self.category(index)
        made = _ASK[category](rng, scene)
        if made is None:
            return None
        fields, options, answer, trace = made
        templates = TEMPLATES[category][split]
        question = templates[int(rng.integers(len(templates)))].format(**fields)
        letters = split == "test"
        golds = (answer, string.ascii_uppercase[options.index(answer)]) if letters else (answer,)
        prompt = (f"{IMAGE_MARKER}User: {question} Options: {options_text(options, letters)}"
                  f"\nAssistant:" + (" <think>" if self.prompt_style == "think" else ""))
        return Example(prompt, answer, SpatialMeta(scenes, category, question, options, golds,
                                                   trace))

    # ---- solutions and verification ----
    def solution(self, ex: Example) -> str:
        """Think style: the trace, "</think>" and the answer; direct: the answer alone."""
        if self.prompt_style == "think":
            return f"{ex.meta.trace}{THINK_CLOSE}{answer_tags(ex.answer)}"
        return answer_tags(ex.answer)

    def score(self, completion: str, ex: Example) -> float:
        """The anchor's accuracy (`r1zero_accuracy` against the example's golds)."""
        return r1zero_accuracy(completion, ex.meta.golds)

    def format_score(self, completion: str) -> float:
        """The style's format reward: `think_answer_format` (the prompt's `<think>` counted) or
        the answer-only `format_reward`."""
        if self.prompt_style == "think":
            return think_answer_format(completion)
        return format_reward(completion)

    def verify_batch(self, completions: Sequence[str], examples: Sequence[Example]) -> Verdicts:
        """Scores (accuracy), the designed reward accuracy + format_weight * format +
        length_per_token * bytes, and its components accuracy, format, length (bytes)."""
        if len(completions) != len(examples):
            raise ValueError(f"{len(completions)} completions for {len(examples)} examples")
        acc = [self.score(c, e) for c, e in zip(completions, examples, strict=True)]
        fmt = [self.format_score(c) for c in completions]
        length = [float(len(c.encode("utf-8", "surrogatepass"))) for c in completions]
        rewards = [a + self.format_weight * f + self.length_per_token * n
                   for a, f, n in zip(acc, fmt, length, strict=True)]
        return Verdicts(acc, rewards=rewards,
                        components={"accuracy": acc, "format": fmt, "length": length})

    @property
    def max_prompt_len(self) -> int:
        """An upper bound on this task's prompt length in bytes."""
        name = max((f"{c} {s}" for c in OBJECT_COLOURS for s in SHAPES), key=len)
        longest = {"what": max([f"{c} objects" for c in OBJECT_COLOURS]
                               + [f"{s}s" for s in SHAPES], key=len),
                   "a": name, "b": name, "c": name, "pair": max(_PAIR, key=len)}
        question = max(len(t.format(**longest)) for c in self.categories
                       for split in TEMPLATES[c].values() for t in split)
        options = max(len(options_text((name, name), True)), len(options_text(("99",) * 3,
                                                                                 True)))
        return len(f"{IMAGE_MARKER}User:  Options: \nAssistant: <think>") + question + options


TASKS.register(SpatialQATask.name, SpatialQATask)

__all__ = ["CATEGORIES", "PROMPT_STYLES", "TEMPLATES", "SpatialMeta", "SpatialQATask"]

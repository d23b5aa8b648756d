"""`VisionTask`: a verifiable task whose examples carry scenes and render images on demand.

An example's `meta` is a NamedTuple whose first field is `scenes`, a tuple of `Scene`s, one per
image; its prompt holds one IMAGE_MARKER per image, in the order of `scenes` (the model's
integration replaces each marker with that image's tokens). `task.images(ex)` renders them:
uint8 [n_images, H, W, 3], n_images = prompt.count(IMAGE_MARKER).

Splits follow `Task`'s rule on the scenes themselves: an example belongs to "test" iff
stable_hash(scenes_key(scenes)) % TEST_BUCKETS == 0, so a test scene (or frame sequence) never
appears in training, whatever question is asked about it. Unlike `Task._generate`, the draw may
depend on the split (held-out phrasings, more objects): `_draw_scenes(rng, split, index)` draws
the scenes, the split is checked on them, and only then `_build(rng, scenes, split, index)` asks
the question (so rejected draws are cheap); both are pure functions of their arguments, and the
example stays a pure function of (params, seed, split, index).
"""

from __future__ import annotations

import abc
import string
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from jaxrl_suite.envs.text.base import TEST_BUCKETS, Example, Task, split_index, stable_hash
from jaxrl_suite.envs.vision.scene import Scene, render_scenes, scenes_key

IMAGE_MARKER = "<image>"  # one per image in a prompt, in the order of meta.scenes
MAX_DRAWS = 10_000  # resampling bound of `VisionTask.example`


def options_text(options: Sequence[str], letters: bool) -> str:
    """A question's option list as prompts write it: "(A) red (B) blue" when `letters` (as the
    CVBench-like held-out set), else "red, green or blue"."""
    if letters:
        return " ".join(f"({string.ascii_uppercase[i]}) {o}" for i, o in enumerate(options))
    return ", ".join(options[:-1]) + " or " + options[-1]


class VisionTask(Task):
    """A `Task` over scenes (module docstring). Subclasses implement `_draw_scenes`, `_build`,
    `solution` and `score`, and set `max_images` (the most images one example can hold)."""

    max_images: ClassVar[int] = 1

    @abc.abstractmethod
    def _draw_scenes(self, rng: np.random.Generator, split: str,
                     index: int) -> tuple[Scene, ...] | None:
        """Draws an example's scenes (None: no valid draw, try again)."""

    @abc.abstractmethod
    def _build(self, rng: np.random.Generator, scenes: tuple[Scene, ...], split: str,
               index: int) -> Example | None:
        """The example asking about `scenes` (None: no question fits, try again)."""

    def _generate(self, rng: np.random.Generator) -> Example:
        scenes = self._draw_scenes(rng, "train", 0)
        ex = None if scenes is None else self._build(rng, scenes, "train", 0)
        if ex is None:
            raise RuntimeError(f"{self!r}: no example in this draw")
        return ex

    def _split_key(self, scenes) -> str:
        """The text whose hash puts a draw of `_draw_scenes` in a split (the scenes')."""
        return scenes_key(scenes)

    def _problem_key(self, ex: Example) -> str:
        return scenes_key(ex.meta.scenes)

    def example(self, split: str, index: int) -> Example:
        """Example `index` of `split`: a pure function of (params, seed, split, index); its
        scenes lie in `split` by the hash rule (module docstring)."""
        split_id = split_index(split)
        if index < 0:
            raise ValueError(f"index must be >= 0, got {index}")
        for attempt in range(MAX_DRAWS):
            rng = np.random.default_rng([self.seed, split_id, index, attempt])
            scenes = self._draw_scenes(rng, split, index)
            if scenes is None:
                continue
            if (stable_hash(self._split_key(scenes)) % TEST_BUCKETS == 0) != (split == "test"):
                continue
            ex = self._build(rng, scenes, split, index)
            if ex is not None:
                return ex
        raise RuntimeError(f"{self!r}: no {split!r} example found in {MAX_DRAWS} draws")

    def images(self, ex: Example) -> np.ndarray:
        """uint8 [n_images, H, W, 3]: the example's scenes rendered, in prompt order (a pure
        function of `ex.meta.scenes`, so `render_scenes(ex.meta.scenes)` serves a wrapper such
        as `ExampleList` too)."""
        return render_scenes(ex.meta.scenes)


def batch_images(examples: Sequence[Example], max_images: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """A batch's images at a fixed shape: (uint8 [B, max_images, H, W, 3], bool [B,
    max_images]), example b's images first in its slots (prompt order), zeros and False after.
    ValueError if an example has more than `max_images` images."""
    rendered = [render_scenes(ex.meta.scenes) for ex in examples]
    most = max((len(r) for r in rendered), default=0)
    if most > max_images:
        raise ValueError(f"batch_images: an example has {most} images, max_images={max_images}")
    images = np.zeros((len(examples), max_images, 32, 32, 3), np.uint8)
    mask = np.zeros((len(examples), max_images), bool)
    for b, r in enumerate(rendered):
        images[b, : len(r)] = r
        mask[b, : len(r)] = True
    return images, mask


def accuracy_by(labels: Sequence, scores: Sequence[float]) -> dict[str, float]:
    """Mean score per label, e.g. per category (`meta.category`) or level (`meta.level`):
    {str(label): mean of the scores with that label}, labels sorted."""
    if len(labels) != len(scores):
        raise ValueError(f"accuracy_by: {len(labels)} labels for {len(scores)} scores")
    out: dict[str, list[float]] = {}
    for label, score in zip(labels, scores, strict=True):
        out.setdefault(str(label), []).append(float(score))
    return {k: float(np.mean(v)) for k, v in sorted(out.items())}


__all__ = ["IMAGE_MARKER", "MAX_DRAWS", "VisionTask", "accuracy_by", "batch_images",
           "options_text"]

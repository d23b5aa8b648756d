"""Text GUI grounding: point at the screen element that an instruction describes by its function.

A screen is a short list of elements, each a type letter (B button, L link, F field, C checkbox),
a label and an inclusive box x1 y1 x2 y2 in a 100 x 100 grid; the answer is a point inside the
element the instruction means. The instruction names the element by its FUNCTION, never by its
label ("store edits" -> the element labelled save, apply or commit), so the task is semantic
alignment (InfiGUI-G1 / AEPO, arXiv 2508.05731), made hard on purpose:

  * every concept (save, discard, login, logout, ...) shows one of 2-3 synonym labels;
  * concepts come in families that share the instruction's object ("keep changes" is save, "drop
    changes" discard) and verbs recur across families ("leave account" is logout, "leave
    dialog" close), so both words matter;
  * every screen shows the target's whole family (so the verb decides), and look-alike labels
    (login / logout, signin / signup, import / export, upload / download) are likelier
    distractors than the rest.

A prompt (5-6 elements, about 130 bytes; the phrase, the screen, the answer mode) and its
single-point solution, the top-left corner of the upload button labelled attach:

    share photo|B export 71 48 94 54;B revert 32 48 40 50;L home 2 54 21 57;B attach 21 24 29 28;
    B remove 72 27 82 33;L settings 86 85 93 90|point:                (one line)
    <answer>(21,24)</answer>

Instructions are verb-object phrasings, verbs x objects of the concept. Each object's phrasings
are split deterministically into "seen" (about 2/3) and "unseen" (the rest, a diagonal of the
verb x object grid, so every verb and every object still occurs in some seen phrasing): training
(split "train") only ever draws seen phrasings, and the held-out split is the task's `eval_split`:
"seen" (new screens, phrasings that training uses) or "unseen" (new screens, phrasings training
never draws: compositional paraphrases, the "generalisation" split). Screens are split by the
Task's hash of the screen itself, so a test screen is never a training screen.

Two answer modes, written into the prompt so one model serves both: "point:" (single: exactly one
point) and "points:" (multi: a list of 1..MAX_POINTS points, `rewards.aepo`). `mode="mix"`
alternates them by example index (even: multi), for one SFT on both. The SFT solution is the
target box's top-left corner (inside the inclusive box: the difficulty is which element, not
arithmetic); in multi mode it is a list of N in {1, 2, 3} points (N drawn per example), the
correct one first, then the top-left corners of the most similar distractors, never three
collinear.

`score` = 1.0 iff the answer is well formed for its mode and its FIRST point lies inside the
target box (the paper's evaluation: only the first point counts); malformed -> 0.0. The training
reward (`verify_batch(...).rewards`) is the task's `reward`: "aepo" (`rewards.aepo.aepo_reward`)
or "binary" (naive RLVR: 1.0 iff well formed and the first point hits).
"""

from __future__ import annotations

import dataclasses
import itertools
import zlib
from collections.abc import Sequence
from typing import ClassVar, NamedTuple

import numpy as np

from jaxrl_suite.envs.text.base import TASKS, Example, Task, Verdicts
from jaxrl_suite.rewards.aepo import (
    MAX_POINTS,
    aepo_reward,
    any_collinear,
    first_hit_rank,
    parse_completion,
)
from jaxrl_suite.rewards.format import answer_tags

GRID = 100  # coordinates lie in 0..GRID-1
MODES = ("multi", "single", "mix")
EVAL_SPLITS = ("seen", "unseen")
REWARDS = ("aepo", "binary")
SUFFIX = {"multi": "points:", "single": "point:"}
_MAX_BOX_TRIES = 1000


class Concept(NamedTuple):
    """An element's function: its type letter, synonym labels, and the verbs x objects of the
    instructions that mean it."""

    kind: str
    labels: tuple[str, ...]
    verbs: tuple[str, ...]
    objects: tuple[str, ...]


# Families share their objects: the verb picks the concept within a family.
FAMILIES: dict[str, dict[str, Concept]] = {  # family -> its concepts
    "edit": {
        "save": Concept("B", ("save", "apply", "commit"), ("keep", "store", "confirm"),
                        ("changes", "edits", "draft")),
        "discard": Concept("B", ("discard", "revert", "reset"), ("drop", "toss", "undo"),
                           ("changes", "edits", "draft")),
    },
    "account": {
        "login": Concept("B", ("login", "signin"), ("enter", "access", "open"),
                         ("account", "profile")),
        "logout": Concept("B", ("logout", "signout"), ("leave", "exit", "end"),
                          ("account", "profile")),
        "signup": Concept("L", ("signup", "register", "join"), ("create", "make", "start"),
                          ("account", "profile")),
    },
    "file": {
        "upload": Concept("B", ("upload", "import", "attach"), ("add", "share", "provide"),
                          ("file", "photo", "report")),
        "download": Concept("B", ("download", "export"), ("fetch", "grab", "obtain"),
                            ("file", "photo", "report")),
        "delete": Concept("B", ("delete", "remove", "trash"), ("erase", "destroy", "bin"),
                          ("file", "photo", "report")),
    },
    "window": {
        "close": Concept("B", ("close", "cancel", "dismiss"), ("leave", "shut", "hide"),
                         ("dialog", "window", "popup")),
        "maximize": Concept("B", ("maximize", "expand", "zoom"), ("enlarge", "grow", "widen"),
                            ("dialog", "window", "popup")),
    },
    "page": {
        "next": Concept("B", ("next", "continue", "forward"), ("advance", "skip", "pass"),
                        ("page", "step", "screen")),
        "back": Concept("B", ("back", "previous", "return"), ("revisit", "retrace", "reopen"),
                        ("page", "step", "screen")),
        "refresh": Concept("B", ("refresh", "reload", "update"), ("renew", "redraw", "restart"),
                           ("page", "step", "screen")),
    },
    "message": {
        "send": Concept("B", ("send", "submit", "post"), ("deliver", "dispatch", "mail"),
                        ("message", "note", "reply")),
        "compose": Concept("B", ("compose", "new", "write"), ("draft", "begin", "author"),
                           ("message", "note", "reply")),
    },
    "items": {
        "search": Concept("F", ("search", "find", "query"), ("seek", "locate", "look up"),
                          ("items", "results", "products")),
        "filter": Concept("B", ("filter", "sort", "refine"), ("narrow", "order", "limit"),
                          ("items", "results", "products")),
    },
    "terms": {
        "agree": Concept("C", ("agree", "accept", "consent"), ("approve", "allow", "okay"),
                         ("terms", "rules", "policy")),
        "decline": Concept("B", ("decline", "reject", "deny"), ("refuse", "oppose", "veto"),
                           ("terms", "rules", "policy")),
    },
    "news": {
        "subscribe": Concept("C", ("notify", "alerts", "subscribe"), ("get", "receive", "want"),
                             ("updates", "news", "emails")),
        "unsubscribe": Concept("L", ("optout", "mute", "unsubscribe"), ("stop", "block", "silence"),
                               ("updates", "news", "emails")),
    },
}
CONCEPTS: dict[str, Concept] = {c: v for fam in FAMILIES.values() for c, v in fam.items()}
FAMILY: dict[str, str] = {c: f for f, fam in FAMILIES.items() for c in fam}
# Elements no instruction asks for (distractors only), with their types.
FILLERS: tuple[tuple[str, str], ...] = (("L", "home"), ("B", "menu"), ("L", "help"),
                                        ("B", "cart"), ("F", "name"), ("F", "email"),
                                        ("L", "about"), ("L", "settings"))


def phrasings(concept: str, pool: str) -> tuple[str, ...]:
    """The instructions of `concept` in `pool` ("seen", "unseen" or "all"): "verb object" for
    verb i and object j, unseen iff (i + j + h) % len(verbs) == 0 with h the CRC-32 of the
    concept's name (one held-out verb per object; every verb and object also occurs seen)."""
    c = CONCEPTS[concept]
    h = zlib.crc32(concept.encode()) % len(c.verbs)
    out = []
    for (i, v), (j, o) in itertools.product(enumerate(c.verbs), enumerate(c.objects)):
        unseen = (i + j + h) % len(c.verbs) == 0
        if pool == "all" or (pool == "unseen") == unseen:
            out.append(f"{v} {o}")
    return tuple(out)


def _similar(a: str, b: str) -> bool:
    """Look-alike labels: a shared 3-letter prefix or 3-letter suffix (login / logout, upload /
    download, signin / signup)."""
    return a != b and (a[:3] == b[:3] or a[-3:] == b[-3:])


def _confusable(concept: str) -> set[str]:
    """Concepts with a label that looks like one of `concept`'s."""
    mine = CONCEPTS[concept].labels
    return {c for c, v in CONCEPTS.items() if c != concept
            and any(_similar(a, b) for a in mine for b in v.labels)}


_CONFUSABLE = {c: _confusable(c) for c in CONCEPTS}


class Element(NamedTuple):
    kind: str  # type letter
    label: str
    box: tuple[int, int, int, int]  # x1, y1, x2, y2 (inclusive)
    concept: str  # "" for a filler

    def text(self) -> str:
        return f"{self.kind} {self.label} {' '.join(map(str, self.box))}"


class Screen(NamedTuple):
    """What the generator draws (split-independent): the elements, the target's index, and the
    draws that pick the phrasing and the multi-answer length."""

    elements: tuple[Element, ...]
    target: int
    phrase_draw: int
    n_points: int  # N of the multi-mode solution, 1..3


class GuiMeta(NamedTuple):
    """`Example.meta` of a gui_grounding problem."""

    screen: Screen
    phrase: str
    pool: str  # "seen" | "unseen"
    mode: str  # "multi" | "single"
    points: tuple[tuple[int, int], ...]  # the SFT answer (multi: N points, correct first)

    @property
    def box(self) -> tuple[int, int, int, int]:
        return self.screen.elements[self.screen.target].box


def screen_text(elements: Sequence[Element]) -> str:
    return ";".join(e.text() for e in elements)


def _format_points(points) -> str:
    return ",".join(f"({x},{y})" for x, y in points)


def _boxes(rng: np.random.Generator, n: int) -> list[tuple[int, int, int, int]]:
    """n non-overlapping boxes (1 cell apart), widths 6..24 and heights 3..8."""
    boxes: list[tuple[int, int, int, int]] = []
    for _ in range(_MAX_BOX_TRIES):
        w, h = int(rng.integers(6, 25)), int(rng.integers(3, 9))
        x1, y1 = int(rng.integers(0, GRID - w + 1)), int(rng.integers(0, GRID - h + 1))
        box = (x1, y1, x1 + w - 1, y1 + h - 1)
        if all(box[0] > b[2] + 1 or b[0] > box[2] + 1 or box[1] > b[3] + 1 or b[1] > box[3] + 1
               for b in boxes):
            boxes.append(box)
            if len(boxes) == n:
                return boxes
    raise RuntimeError(f"no layout of {n} boxes found in {_MAX_BOX_TRIES} tries")


@dataclasses.dataclass(frozen=True)
class GuiTask(Task):
    """Text GUI grounding (module docstring). Meta is `GuiMeta`; the problem key is the screen.

    Fields: `mode` "multi" | "single" | "mix" (alternating by index, for SFT); `eval_split`
    "seen" | "unseen" (the phrasings of the test split; train always draws seen ones); `reward`
    "aepo" | "binary" (the designed GRPO reward of `verify_batch`); `min_elements` ..
    `max_elements` elements per screen (the target, every other concept of its family, then
    distractors drawn without replacement with weight 3 for look-alike labels and 1 for other
    concepts and fillers), redrawn while the screen is longer than `max_screen_chars`.
    """

    name: ClassVar[str] = "gui_grounding"
    seed: int = 0
    mode: str = "multi"
    eval_split: str = "seen"
    reward: str = "aepo"
    min_elements: int = 5
    max_elements: int = 6
    max_screen_chars: int = 128  # longer screens are redrawn (bounds the prompt: max_prompt_len)

    def __post_init__(self):
        for field, allowed in (("mode", MODES), ("eval_split", EVAL_SPLITS),
                               ("reward", REWARDS)):
            if getattr(self, field) not in allowed:
                raise ValueError(f"gui_grounding: {field} must be one of {list(allowed)}, got "
                                 f"{getattr(self, field)!r}")
        if not 3 <= self.min_elements <= self.max_elements <= 8:
            raise ValueError(f"gui_grounding: need 3 <= min_elements <= max_elements <= 8, got "
                             f"{self.min_elements}..{self.max_elements}")
        if self.max_screen_chars < 22 * self.min_elements:
            raise ValueError(f"gui_grounding: max_screen_chars must be >= 22 * min_elements = "
                             f"{22 * self.min_elements}, got {self.max_screen_chars}")

    @property
    def max_prompt_len(self) -> int:
        """The longest prompt this task can produce, in bytes (ASCII: byte tokens)."""
        phrase = max(len(p) for c in CONCEPTS for p in phrasings(c, "all"))
        return phrase + 1 + self.max_screen_chars + 1 + max(map(len, SUFFIX.values()))

    # ---- generation ----
    def _generate(self, rng: np.random.Generator) -> Example:
        for _ in range(_MAX_BOX_TRIES):
            screen = self._draw_screen(rng)
            text = screen_text(screen.elements)
            if len(text) <= self.max_screen_chars:
                return Example(prompt=text, answer="", meta=screen)
        raise RuntimeError(f"{self!r}: no screen of <= {self.max_screen_chars} characters found")

    def _draw_screen(self, rng: np.random.Generator) -> Screen:
        n = int(rng.integers(self.min_elements, self.max_elements + 1))
        names = sorted(CONCEPTS)
        target = names[int(rng.integers(len(names)))]
        family = [c for c in names if c != target and FAMILY[c] == FAMILY[target]]
        others = [c for c in names if FAMILY[c] != FAMILY[target]] + [
            f"filler:{i}" for i in range(len(FILLERS))]
        weight = np.array([3.0 if c in _CONFUSABLE[target] else 1.0 for c in others])
        picked = rng.choice(len(others), size=n - 1 - len(family), replace=False,
                            p=weight / weight.sum())
        chosen = [target, *family] + [others[int(i)] for i in picked]
        boxes = _boxes(rng, n)
        elements = []
        for c, box in zip(chosen, boxes, strict=True):
            if c.startswith("filler:"):
                kind, label = FILLERS[int(c.split(":")[1])]
                elements.append(Element(kind, label, box, ""))
            else:
                labels = CONCEPTS[c].labels
                elements.append(Element(CONCEPTS[c].kind, labels[int(rng.integers(len(labels)))],
                                        box, c))
        order = rng.permutation(n)
        elements = tuple(elements[int(i)] for i in order)
        return Screen(elements, int(np.flatnonzero(order == 0)[0]), int(rng.integers(1 << 30)),
                      int(rng.integers(1, 4)))

    def _problem_key(self, ex: Example) -> str:
        return screen_text(ex.meta.elements)  # the screen alone: a test screen is never trained

    def example(self, split: str, index: int) -> Example:
        """Problem `index` of `split`: the hash-split screen, phrased from the seen pool (train)
        or `eval_split`'s (test), in `mode` (mix: multi at even indices, single at odd)."""
        screen: Screen = super().example(split, index).meta
        pool = "seen" if split == "train" else self.eval_split
        mode = self.mode if self.mode != "mix" else ("multi", "single")[index % 2]
        return self.render(screen, pool, mode)

    def render(self, screen: Screen, pool: str, mode: str) -> Example:
        """The example of `screen` phrased from `pool` in `mode`."""
        target = screen.elements[screen.target]
        options = phrasings(target.concept, pool)
        phrase = options[screen.phrase_draw % len(options)]
        points = (target.box[:2],) if mode == "single" else _candidates(screen)
        meta = GuiMeta(screen, phrase, pool, mode, points)
        prompt = f"{phrase}|{screen_text(screen.elements)}|{SUFFIX[mode]}"
        return Example(prompt=prompt, answer=_format_points(points[:1]), meta=meta)

    def solution(self, ex: Example) -> str:
        return answer_tags(_format_points(ex.meta.points))

    # ---- verification ----
    def parse(self, completion: str, ex: Example) -> list[tuple[int, int]] | None:
        """The answer's points if well formed for the example's mode (single: exactly one
        point; multi: 1..MAX_POINTS), else None (`rewards.aepo.parse_completion`)."""
        points = parse_completion(completion, max_points=MAX_POINTS)
        if not points or (ex.meta.mode == "single" and len(points) != 1):
            return None
        return points

    def score(self, completion: str, ex: Example) -> float:
        """1.0 iff the answer is well formed and its first point lies inside the target box."""
        points = self.parse(completion, ex)
        return float(points is not None and first_hit_rank(points[:1], ex.meta.box) == 1)

    def verify_batch(self, completions: Sequence[str], examples: Sequence[Example]) -> Verdicts:
        """Scores (first-point hits), the designed reward of `self.reward` and its components:
        format (well formed for the mode), n_points (N, 0 if malformed), first_hit, hit_any
        (some point inside), collinear (a multi answer with three collinear points)."""
        if len(completions) != len(examples):
            raise ValueError(f"{len(completions)} completions for {len(examples)} examples")
        scores, rewards = [], []
        comps: dict[str, list[float]] = {k: [] for k in ("format", "n_points", "first_hit",
                                                           "hit_any", "collinear")}
        for text, ex in zip(completions, examples, strict=True):
            points = self.parse(text, ex)
            box = ex.meta.box
            rank = 0 if points is None else first_hit_rank(points, box)
            first = float(rank == 1)
            scores.append(first)
            if self.reward == "aepo":
                rewards.append(aepo_reward(points, box).reward)
            else:
                rewards.append(first)
            comps["format"].append(float(points is not None))
            comps["n_points"].append(float(len(points or ())))
            comps["first_hit"].append(first)
            comps["hit_any"].append(float(rank > 0))
            comps["collinear"].append(float(points is not None and any_collinear(points)))
        return Verdicts(scores, rewards=rewards, components=comps)


def _candidates(screen: Screen) -> tuple[tuple[int, int], ...]:
    """The multi-mode SFT answer: the target's top-left corner, then those of the most similar
    distractors (same family, then look-alike labels, then screen order) up to N points, skipping
    any that would make three points collinear."""
    target = screen.elements[screen.target]

    def rank(e: Element) -> int:
        if e.concept and FAMILY[e.concept] == FAMILY[target.concept]:
            return 0
        return 1 if e.concept in _CONFUSABLE[target.concept] else 2

    points = [target.box[:2]]
    others = [e for i, e in enumerate(screen.elements) if i != screen.target]
    for e in sorted(others, key=rank):
        if len(points) == screen.n_points:
            break
        if not any_collinear(points + [e.box[:2]]):
            points.append(e.box[:2])
    return tuple(points)


TASKS.register(GuiTask.name, GuiTask)

__all__ = ["CONCEPTS", "EVAL_SPLITS", "FAMILIES", "FAMILY", "GRID", "MODES", "REWARDS",
           "Concept", "Element", "GuiMeta", "GuiTask", "Screen", "phrasings", "screen_text"]

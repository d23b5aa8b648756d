"""A generated story world whose coherence and plot quality a program can check.

COS(M+O)S (Materzok 2025, arXiv 2501.17104) searches over plot continuations with MCTS and
judges finished stories with GPT-4o. Here the judge is a program: a small world of characters,
places and items, a grammar of one-sentence plot steps, a state tracker that finds every
contradiction, and a fixed hidden quality score that the policy never sees.

The world (one per prompt, `StoryTask.world(ex)`):
  characters  `characters` names, each at a place; a character may leave the story
  places      `places` places; a storm can flood one, and nobody can go to a flooded place
  items       `items` items, each on the ground at a place or held by a character
  goals       `goals` goals, one per character from the first: "C wants the I." (done when C
              comes to hold I) or "C wants to reach the P." (done when C arrives at P)

The prompt states the world ("At the tower: Mira, the lamp. ... Mira wants the lamp.") and ends in a
newline; a plot is K lines, one step per line, each one of the sentences

  C goes to the P.        C takes the I.        C drops the I.        C gives the I to D.
  C meets D.              C leaves the story.   A storm floods the P. The water drains from the P.

A step is coherent iff it has no contradiction. The contradictions (`contradictions`):
  malformed        not a sentence of the grammar, or it names no character / place / item of
                   this world
  gone             its subject has left the story
  recipient_gone   the other character of "gives" / "meets" has left the story
  self             "gives ... to" or "meets" oneself
  apart            the other character is at another place
  same_place       "goes to" the place one is at
  flooded          "goes to" a flooded place
  item_held        "takes" an item that someone holds (oneself included)
  item_elsewhere   "takes" an item lying at another place
  not_holding      "drops" / "gives" an item one does not hold
  already_flooded  a storm floods a flooded place
  not_flooded      the water drains from a place that is not flooded
  repeat_goal      a step that would finish a goal again once it is finished
  missing          (in a checked plot) one of the K lines is absent
An incoherent step leaves the state as it was. A character who leaves drops what they hold.

The scripted storyteller (`canonical_step`) is coherent but bland: it works on the first goal
it can advance (drain a flood in its way, go to the item or its holder, take it, have the holder
give it), and when no goal can advance it lets the first character still there leave, then
floods a place. Its step is the *most predictable continuation* of a state. The SFT data
(`solution`) takes that step with probability 1 - `novelty`, and otherwise a coherent step drawn
uniformly at random, so the policy learns a bland storyteller that knows a few other moves.

Hidden quality of a finished plot (`quality`), fixed before any experiment ran:

    Q = coherence + progress + 0.5 * variety - 0.5 * predictability          in [-0.5, 2.5]

  coherence       coherent steps / K              (missing steps, below K lines, are incoherent)
  progress        finished goals / goals          (after the coherent steps)
  variety         distinct kinds among the coherent steps / min(K, 8)   (8 kinds of sentence)
  predictability  coherent steps equal to the storyteller's step at their state / K

Only the first K lines count; lines after them are ignored. The policy sees none of this: the
step value of COS(M+O)S (`rewards.curiosity`) uses the policy's own surprisal and the
contradiction count alone.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import ClassVar, NamedTuple

import numpy as np

from jaxrl_suite.envs.text.base import TASKS, Example, Task, stable_hash

CHARACTERS = ("Mira", "Ode", "Tam", "Lio", "Rhea", "Bram", "Sela", "Kit")
PLACES = ("tower", "mill", "harbor", "forest", "market", "well", "bridge", "cave")
ITEMS = ("lamp", "key", "map", "rope", "coin", "flute", "bell", "book")
KINDS = ("go", "take", "drop", "give", "meet", "leave", "storm", "drain")
QUALITY_WEIGHTS = {"coherence": 1.0, "progress": 1.0, "variety": 0.5, "predictability": -0.5}
CONTRADICTIONS = ("malformed", "gone", "recipient_gone", "self", "apart", "same_place", "flooded",
                  "item_held", "item_elsewhere", "not_holding", "already_flooded", "not_flooded",
                  "repeat_goal", "missing")

_WORD = r"([A-Za-z]+)"
_GRAMMAR = (
    ("go", re.compile(rf"{_WORD} goes to the {_WORD}\.")),
    ("take", re.compile(rf"{_WORD} takes the {_WORD}\.")),
    ("drop", re.compile(rf"{_WORD} drops the {_WORD}\.")),
    ("give", re.compile(rf"{_WORD} gives the {_WORD} to {_WORD}\.")),
    ("meet", re.compile(rf"{_WORD} meets {_WORD}\.")),
    ("leave", re.compile(rf"{_WORD} leaves the story\.")),
    ("storm", re.compile(rf"A storm floods the {_WORD}\.")),
    ("drain", re.compile(rf"The water drains from the {_WORD}\.")),
)


class Step(NamedTuple):
    """A parsed plot step: its kind and arguments (names as written)."""

    kind: str  # one of KINDS
    args: tuple[str, ...]  # go: (C, P); take/drop: (C, I); give: (C, I, D); meet: (C, D);
    # leave: (C,); storm/drain: (P,)


def parse_step(sentence: str) -> Step | None:
    """The step a sentence states, or None if it is not a sentence of the grammar (never
    raises; surrounding whitespace is ignored)."""
    text = sentence.strip()
    for kind, pattern in _GRAMMAR:
        m = pattern.fullmatch(text)
        if m:
            return Step(kind, m.groups())
    return None


def render_step(step: Step) -> str:
    """The sentence of a step (the inverse of `parse_step`)."""
    a = step.args
    return {
        "go": lambda: f"{a[0]} goes to the {a[1]}.",
        "take": lambda: f"{a[0]} takes the {a[1]}.",
        "drop": lambda: f"{a[0]} drops the {a[1]}.",
        "give": lambda: f"{a[0]} gives the {a[1]} to {a[2]}.",
        "meet": lambda: f"{a[0]} meets {a[1]}.",
        "leave": lambda: f"{a[0]} leaves the story.",
        "storm": lambda: f"A storm floods the {a[0]}.",
        "drain": lambda: f"The water drains from the {a[0]}.",
    }[step.kind]()


class Goal(NamedTuple):
    who: str
    kind: str  # "item" (C wants the I) or "reach" (C wants to reach the P)
    target: str  # the item or the place

    def sentence(self) -> str:
        if self.kind == "item":
            return f"{self.who} wants the {self.target}."
        return f"{self.who} wants to reach the {self.target}."


@dataclasses.dataclass(frozen=True)
class World:
    """A story world's cast and starting state (immutable; `State` tracks a plot)."""

    characters: tuple[str, ...]
    places: tuple[str, ...]
    items: tuple[str, ...]
    start_location: tuple[str, ...]  # per character
    start_item: tuple[tuple[str, str], ...]  # per item: ("at", place) or ("held", character)
    goals: tuple[Goal, ...]

    def opening(self) -> str:
        """The prompt: who and what is at each place ("At the mill: Ode, the lamp."), who holds
        what ("Ode has the key."), the goals, then a newline."""
        parts = []
        for place in self.places:
            here = [c for c, p in zip(self.characters, self.start_location, strict=True)
                    if p == place]
            here += [f"the {i}" for i, (how, w) in zip(self.items, self.start_item, strict=True)
                     if how == "at" and w == place]
            if here:
                parts.append(f"At the {place}: {', '.join(here)}.")
        parts += [f"{w} has the {i}." for i, (how, w) in zip(self.items, self.start_item,
                                                            strict=True) if how == "held"]
        parts += [g.sentence() for g in self.goals]
        return " ".join(parts) + "\n"

    def initial_state(self) -> State:
        holder = {i: (w if how == "held" else None) for i, (how, w) in zip(
            self.items, self.start_item, strict=True)}
        ground = {i: (w if how == "at" else None) for i, (how, w) in zip(
            self.items, self.start_item, strict=True)}
        return State(self, dict(zip(self.characters, self.start_location, strict=True)),
                     set(self.characters), holder, ground, set(), set())


@dataclasses.dataclass
class State:
    """The tracked state of a plot: `contradictions(step)` checks a step, `apply` takes it."""

    world: World
    location: dict[str, str]  # character -> place
    present: set[str]  # characters still in the story
    holder: dict[str, str | None]  # item -> character holding it, or None
    ground: dict[str, str | None]  # item -> place it lies at, or None
    flooded: set[str]
    done: set[int]  # indices of finished goals

    def copy(self) -> State:
        return State(self.world, dict(self.location), set(self.present), dict(self.holder),
                     dict(self.ground), set(self.flooded), set(self.done))

    def _goals_finished_by(self, step: Step) -> list[int]:
        """Indices of the goals the (coherent) step would finish."""
        out = []
        for k, g in enumerate(self.world.goals):
            if g.kind == "item" and ((step.kind == "take" and step.args == (g.who, g.target)) or
                                     (step.kind == "give" and step.args[1:] == (g.target, g.who))):
                out.append(k)
            if g.kind == "reach" and step.kind == "go" and step.args == (g.who, g.target):
                out.append(k)
        return out

    def contradictions(self, step: Step | None) -> list[str]:
        """Every contradiction of `step` with this state (empty = coherent); see the module
        docstring. None (an unparsed sentence) is ["malformed"]."""
        w = self.world
        if step is None:
            return ["malformed"]
        a = step.args
        chars = [x for x, role in zip(a, _roles(step.kind), strict=True) if role == "C"]
        if any(x not in w.characters for x in chars) or \
                any(x not in w.places for x, r in zip(a, _roles(step.kind), strict=True)
                    if r == "P") or \
                any(x not in w.items for x, r in zip(a, _roles(step.kind), strict=True)
                    if r == "I"):
            return ["malformed"]
        out = []
        if step.kind in ("go", "take", "drop", "give", "meet", "leave") and \
                a[0] not in self.present:
            out.append("gone")
        if step.kind == "go":
            if self.location[a[0]] == a[1]:
                out.append("same_place")
            if a[1] in self.flooded:
                out.append("flooded")
        elif step.kind == "take":
            if self.holder[a[1]] is not None:
                out.append("item_held")
            elif self.ground[a[1]] != self.location[a[0]]:
                out.append("item_elsewhere")
        elif step.kind == "drop":
            if self.holder[a[1]] != a[0]:
                out.append("not_holding")
        elif step.kind in ("give", "meet"):
            other = a[-1]
            if other not in self.present:
                out.append("recipient_gone")
            if other == a[0]:
                out.append("self")
            elif self.location[other] != self.location[a[0]]:
                out.append("apart")
            if step.kind == "give" and self.holder[a[1]] != a[0]:
                out.append("not_holding")
        elif step.kind == "storm":
            if a[0] in self.flooded:
                out.append("already_flooded")
        elif step.kind == "drain":
            if a[0] not in self.flooded:
                out.append("not_flooded")
        if not out and any(k in self.done for k in self._goals_finished_by(step)):
            out.append("repeat_goal")
        return out

    def apply(self, step: Step) -> None:
        """Take a coherent step (the caller checks `contradictions` first)."""
        a = step.args
        if step.kind == "go":
            self.location[a[0]] = a[1]
        elif step.kind == "take":
            self.holder[a[1]], self.ground[a[1]] = a[0], None
        elif step.kind == "drop":
            self.holder[a[1]], self.ground[a[1]] = None, self.location[a[0]]
        elif step.kind == "give":
            self.holder[a[1]] = a[2]
        elif step.kind == "leave":
            self.present.discard(a[0])
            for item, h in self.holder.items():
                if h == a[0]:
                    self.holder[item], self.ground[item] = None, self.location[a[0]]
        elif step.kind == "storm":
            self.flooded.add(a[0])
        elif step.kind == "drain":
            self.flooded.discard(a[0])
        self.done.update(self._goals_finished_by(step))

    def coherent_steps(self) -> list[Step]:
        """Every coherent step, in a fixed order (the storyteller's random moves)."""
        w, out = self.world, []
        for c in w.characters:
            out += [Step("go", (c, p)) for p in w.places]
            out += [Step(kind, (c, i)) for kind in ("take", "drop") for i in w.items]
            out += [Step("give", (c, i, d)) for i in w.items for d in w.characters]
            out += [Step("meet", (c, d)) for d in w.characters]
            out.append(Step("leave", (c,)))
        out += [Step(kind, (p,)) for kind in ("storm", "drain") for p in w.places]
        return [s for s in out if not self.contradictions(s)]

    def canonical_step(self) -> Step:
        """The bland storyteller's step: the most predictable continuation (module docstring).
        Always coherent."""
        for k, g in enumerate(self.world.goals):
            if k in self.done or g.who not in self.present:
                continue
            step = self._advance(g)
            if step is not None and not self.contradictions(step):
                return step
        for c in self.world.characters:
            if c in self.present:
                return Step("leave", (c,))
        for p in self.world.places:
            if p not in self.flooded:
                return Step("storm", (p,))
        return Step("drain", (self.world.places[0],))

    def _advance(self, g: Goal) -> Step | None:
        here = self.location[g.who]
        if g.kind == "reach":
            dest = g.target
        else:
            holder, ground = self.holder[g.target], self.ground[g.target]
            if holder is not None:
                if self.location[holder] == here:
                    return Step("give", (holder, g.target, g.who))
                dest = self.location[holder]
            else:
                if ground == here:
                    return Step("take", (g.who, g.target))
                dest = ground
        if dest in self.flooded:
            return Step("drain", (dest,))
        return Step("go", (g.who, dest))


def _roles(kind: str) -> tuple[str, ...]:
    """The role of each argument of a step kind: C(haracter), P(lace), I(tem)."""
    return {"go": ("C", "P"), "take": ("C", "I"), "drop": ("C", "I"), "give": ("C", "I", "C"),
            "meet": ("C", "C"), "leave": ("C",), "storm": ("P",), "drain": ("P",)}[kind]


class PlotCheck(NamedTuple):
    """The world's verdict on a plot: per step (the first K lines, missing ones included) and the
    hidden quality with its parts."""

    steps: list[str]  # the K lines as written ("" for a missing one)
    contradictions: list[list[str]]  # per step; a missing step is ["missing"]
    predictable: list[bool]  # per step: coherent and equal to the storyteller's step
    kinds: list[str | None]  # per step: its kind if coherent, else None
    progress: float  # finished goals / goals
    quality: float  # Q (module docstring)
    parts: dict[str, float]  # coherence, progress, variety, predictability


def split_steps(plot: str, num_steps: int) -> list[str]:
    """The first `num_steps` lines of a plot, "" for each missing one."""
    lines = plot.split("\n")[:num_steps]
    return lines + [""] * (num_steps - len(lines))


def check_plot(world: World, plot: str, num_steps: int) -> PlotCheck:
    """Track the first `num_steps` lines of `plot` through the world (never raises)."""
    state = world.initial_state()
    lines = plot.split("\n")[:num_steps]
    contra, predictable, kinds = [], [], []
    for line in lines:
        step = parse_step(line)
        found = state.contradictions(step)
        contra.append(found)
        kinds.append(None if found else step.kind)
        predictable.append(not found and step == state.canonical_step())
        if not found:
            state.apply(step)
    for _ in range(num_steps - len(lines)):
        contra.append(["missing"])
        kinds.append(None)
        predictable.append(False)
    coherent = [not c for c in contra]
    parts = {
        "coherence": sum(coherent) / num_steps,
        "progress": len(state.done) / len(world.goals) if world.goals else 0.0,
        "variety": len({k for k in kinds if k}) / min(num_steps, len(KINDS)),
        "predictability": sum(predictable) / num_steps,
    }
    quality = float(sum(QUALITY_WEIGHTS[k] * v for k, v in parts.items()))
    return PlotCheck(split_steps(plot, num_steps), contra, predictable, kinds,
                     parts["progress"], quality, parts)


def step_contradictions(world: World, plot: str, num_steps: int) -> list[int]:
    """The number of contradictions of each of the first `num_steps` steps (a missing step
    counts one): what the step value's coherence penalty sees."""
    return [len(c) for c in check_plot(world, plot, num_steps).contradictions]


@dataclasses.dataclass(frozen=True)
class StoryTask(Task):
    """Plots of `num_steps` steps in generated worlds (module docstring).

    `Example.meta` holds the `World`; `solution` is a plot of the bland storyteller (canonical
    step with probability 1 - novelty, else a random coherent step), seeded by the prompt, so
    SFT data are fixed per example. `score` is the hidden quality scaled to [0, 1],
    (Q + 0.5) / 3: the judge's verdict, for reports; the COS(M+O)S search never calls it.
    """

    name: ClassVar[str] = "story"
    num_steps: int = 6
    characters: int = 3
    places: int = 3
    items: int = 2
    goals: int = 2
    novelty: float = 0.3
    seed: int = 0

    def __post_init__(self):
        for field, hi in (("characters", len(CHARACTERS)), ("places", len(PLACES)),
                          ("items", len(ITEMS))):
            if not 1 <= getattr(self, field) <= hi:
                raise ValueError(f"story.{field} must lie in 1..{hi}, got {getattr(self, field)}")
        if self.places < 2:
            raise ValueError(f"story.places must be >= 2, got {self.places}")
        if not 1 <= self.goals <= self.characters:
            raise ValueError(f"story.goals must lie in 1..characters={self.characters}, got "
                             f"{self.goals}")
        if self.num_steps < 1:
            raise ValueError(f"story.num_steps must be >= 1, got {self.num_steps}")
        if not 0.0 <= self.novelty <= 1.0:
            raise ValueError(f"story.novelty must lie in [0, 1], got {self.novelty}")

    def _generate(self, rng: np.random.Generator) -> Example:
        chars = tuple(str(x) for x in rng.choice(CHARACTERS, self.characters, replace=False))
        places = tuple(str(x) for x in rng.choice(PLACES, self.places, replace=False))
        items = tuple(str(x) for x in rng.choice(ITEMS, self.items, replace=False))
        location = tuple(str(rng.choice(places)) for _ in chars)
        start_item = []
        for _ in items:
            if rng.random() < 0.3:
                start_item.append(("held", str(rng.choice(chars))))
            else:
                start_item.append(("at", str(rng.choice(places))))
        goals = []
        for who, here in zip(chars[: self.goals], location, strict=False):
            wanted = [i for i, (how, w) in zip(items, start_item, strict=True)
                      if not (how == "held" and w == who)]
            elsewhere = [p for p in places if p != here]
            if wanted and (rng.random() < 0.6 or not elsewhere):
                goals.append(Goal(who, "item", str(rng.choice(wanted))))
            else:
                goals.append(Goal(who, "reach", str(rng.choice(elsewhere))))
        world = World(chars, places, items, location, tuple(start_item), tuple(goals))
        return Example(prompt=world.opening(), answer="", meta=(world,))

    @staticmethod
    def world(ex: Example) -> World:
        return ex.meta[0]

    def storyteller(self, world: World, rng: np.random.Generator) -> list[str]:
        """A plot of the bland storyteller: `num_steps` sentences."""
        state, lines = world.initial_state(), []
        for _ in range(self.num_steps):
            step = state.canonical_step()
            if rng.random() < self.novelty:
                options = state.coherent_steps()
                step = options[int(rng.integers(len(options)))]
            state.apply(step)
            lines.append(render_step(step))
        return lines

    def solution(self, ex: Example) -> str:
        rng = np.random.default_rng([self.seed, 17, _prompt_seed(ex.prompt)])
        return "\n".join(self.storyteller(self.world(ex), rng))

    def canonical_plot(self, ex: Example) -> str:
        """The storyteller at novelty 0: every step the most predictable one."""
        state, lines = self.world(ex).initial_state(), []
        for _ in range(self.num_steps):
            step = state.canonical_step()
            state.apply(step)
            lines.append(render_step(step))
        return "\n".join(lines)

    def check(self, completion: str, ex: Example) -> PlotCheck:
        return check_plot(self.world(ex), completion, self.num_steps)

    def score(self, completion: str, ex: Example) -> float:
        return (self.check(completion, ex).quality + 0.5) / 3.0


def _prompt_seed(prompt: str) -> int:
    return stable_hash(prompt) % (2**31)


def plot_stats(checks: Sequence[PlotCheck]) -> dict[str, float]:
    """Means over plots: hidden quality and its parts, the contradiction rate (share of
    incoherent steps, missing ones included) and contradictions per step."""
    n = max(1, len(checks))
    steps = [c for p in checks for c in p.contradictions]
    return {
        "quality": sum(p.quality for p in checks) / n,
        **{k: sum(p.parts[k] for p in checks) / n for k in QUALITY_WEIGHTS},
        "contradiction_rate": float(np.mean([bool(c) for c in steps])) if steps else 0.0,
        "contradictions_per_step": float(np.mean([len(c) for c in steps])) if steps else 0.0,
    }


TASKS.register(StoryTask.name, StoryTask)

__all__ = ["CHARACTERS", "CONTRADICTIONS", "ITEMS", "KINDS", "PLACES", "QUALITY_WEIGHTS",
           "Goal", "PlotCheck", "State", "Step", "StoryTask", "World", "check_plot",
           "parse_step", "plot_stats", "render_step", "split_steps", "step_contradictions"]

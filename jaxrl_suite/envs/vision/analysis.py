"""The R1-Zero study's trace analysis: which facts a think trace states, whether they hold in the
scene, trivial traces, and self-corrections (VisualThinker-R1-Zero, arXiv 2503.05132: response
length, "aha" self-reflection, trivial reasoning of RL on an instruct model).

Take the think text with `rewards.r1zero.think_span(completion)`. Facts are read by this
grammar (case-insensitive; [x] optional, | alternatives, INT decimal digits):

    OBJ      := [a | an | the] COLOUR SHAPE                      "the red square"
    POS      := OBJ [is] at "(" INT "," INT ")"                  "red square at (0,1)"
    REL      := OBJ [is] (left of | right of | above | below) OBJ
    OCC      := OBJ [is] (covers | occludes | in front of) OBJ
    COUNT    := INT [COLOUR] (SHAPE[s] | object[s])              "2 red objects", "3 circles"
    MARK     := (wait | actually)[, | :] [no[, | :]]  |  no(, | :)
    PARTIAL  := at "(" INT "," INT ")"

COLOUR and SHAPE are the scene vocabulary (scene.OBJECT_COLOURS, SHAPES); cells are (x, y) =
(column, row). The text is scanned left to right for the first matching rule at each point
(POS, REL, OCC, COUNT, MARK, PARTIAL); everything else is ignored. A PARTIAL counts only right
after a MARK and only if the fact before the MARK is a POS: it restates that object at a new
cell ("red square at (0,1), wait, no: at (1,1)").

A fact holds in the scene iff: POS, an object of that name has that cell; REL, both objects
exist and their cells compare so (left of: x_a < x_b, above: y_a < y_b, ...); OCC, both exist
and the first occludes the second in the rendered pixels (`scene.occludes`); COUNT, exactly
INT objects have that colour and shape (an absent one matches any).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from jaxrl_suite.envs.vision.scene import (
    OBJECT_COLOURS,
    SHAPES,
    Scene,
    count,
    find,
    occludes,
)
from jaxrl_suite.rewards.r1zero import think_span

_COLOUR = "|".join(OBJECT_COLOURS)
_SHAPE = "|".join(SHAPES)
_OBJ = rf"(?:(?:a|an|the)\s+)?({_COLOUR})\s+({_SHAPE})"
_CELL = r"\(\s*(\d{1,3})\s*,\s*(\d{1,3})\s*\)"
_RULES = {  # rule -> pattern; the scan tries them in this order
    "pos": rf"\b{_OBJ}\s+(?:is\s+)?at\s+{_CELL}",
    "rel": rf"\b{_OBJ}\s+(?:is\s+)?(left of|right of|above|below)\s+{_OBJ}",
    "occ": rf"\b{_OBJ}\s+(?:is\s+)?(covers|occludes|in front of)\s+{_OBJ}",
    "count": rf"\b(\d{{1,3}})\s+(?:({_COLOUR})\s+)?(?:({_SHAPE})s?|objects?)\b",
    "mark": r"\b(?:wait|actually)\b(?:\s*[,:])?(?:\s*no\b(?:\s*[,:])?)?|\bno\s*[,:]",
    "partial": rf"\bat\s+{_CELL}",
}
_SCAN = re.compile("|".join(f"(?P<{k}>{v})" for k, v in _RULES.items()))
_GROUPS = {k: re.compile(v) for k, v in _RULES.items()}
_WORD = re.compile(r"[a-z0-9]+")
# words a trace may add to the prompt's and still only restate it (`is_trivial_trace`)
FILLER_WORDS = frozenset(
    "a an the is it its so thus therefore answer final think thinking i let me us we solve this "
    "step by of to and or in on image picture question option options which what where look "
    "looking see at be must should correct".split())


class Fact(NamedTuple):
    """A stated fact: its rule ("pos", "rel", "occ", "count"), the text it was read from, where
    it starts and ends, whether it holds in the scene, and (pos) the object and cell."""

    kind: str
    text: str
    start: int
    end: int
    holds: bool
    subject: str = ""  # pos: the object's name
    cell: tuple[int, int] = (-1, -1)  # pos: the stated cell


class Correction(NamedTuple):
    """A MARK with the fact stated before it and the one after it (None where there is none);
    `fixes`: the fact before is false and the one after holds."""

    mark: str
    before: Fact | None
    after: Fact | None

    @property
    def fixes(self) -> bool:
        return (self.before is not None and not self.before.holds and self.after is not None
                and self.after.holds)


def _pos(scene: Scene, name: str, cell: tuple[int, int]) -> bool:
    return any(o.name == name and o.cell == cell for o in scene.objects)


def _fact(kind: str, m: re.Match, scene: Scene) -> Fact:
    g = _GROUPS[kind].fullmatch(m.group(kind)).groups()
    text, start, end = m.group(kind), m.start(kind), m.end(kind)
    if kind == "pos":
        name, cell = f"{g[0]} {g[1]}", (int(g[2]), int(g[3]))
        return Fact(kind, text, start, end, _pos(scene, name, cell), name, cell)
    if kind == "count":
        holds = count(scene, colour=g[1], shape=g[2]) == int(g[0])
        return Fact(kind, text, start, end, holds)
    a, b = find(scene, f"{g[0]} {g[1]}"), find(scene, f"{g[3]} {g[4]}")
    if a is None or b is None or a == b:
        return Fact(kind, text, start, end, False)
    if kind == "occ":
        return Fact(kind, text, start, end, occludes(scene, a, b))
    holds = {"left of": a.x < b.x, "right of": a.x > b.x, "above": a.y < b.y,
             "below": a.y > b.y}[g[2]]
    return Fact(kind, text, start, end, holds)


def _scan(text: str, scene: Scene) -> tuple[list[Fact], list[Correction]]:
    facts: list[Fact] = []
    corrections: list[Correction] = []
    open_mark: tuple[str, Fact | None] | None = None  # a MARK still waiting for its fact
    for m in _SCAN.finditer(text.lower()):
        kind = m.lastgroup
        if kind == "mark":
            if open_mark is not None:
                corrections.append(Correction(open_mark[0], open_mark[1], None))
            open_mark = (m.group(kind), facts[-1] if facts else None)
            continue
        if kind == "partial":
            before = open_mark[1] if open_mark else None
            if before is None or before.kind != "pos":
                continue
            cell = tuple(int(v) for v in _GROUPS[kind].fullmatch(m.group(kind)).groups())
            fact = Fact("pos", m.group(kind), m.start(kind), m.end(kind),
                        _pos(scene, before.subject, cell), before.subject, cell)
        else:
            fact = _fact(kind, m, scene)
        facts.append(fact)
        if open_mark is not None:
            corrections.append(Correction(open_mark[0], open_mark[1], fact))
            open_mark = None
    if open_mark is not None:
        corrections.append(Correction(open_mark[0], open_mark[1], None))
    return facts, corrections


def grounded_facts(think_text: str, scene: Scene) -> list[Fact]:
    """The facts `think_text` states (module docstring), in order, each with whether it holds."""
    return _scan(think_text, scene)[0]


def grounded_fact_rate(think_text: str, scene: Scene) -> float:
    """The share of stated facts that hold in `scene`; nan when the text states none (so
    np.nanmean over completions averages the traces that state facts)."""
    facts = grounded_facts(think_text, scene)
    return sum(f.holds for f in facts) / len(facts) if facts else float("nan")


def self_corrections(think_text: str, scene: Scene) -> list[Correction]:
    """One `Correction` per MARK ("wait", "wait, no:", "actually", "no,"), with the fact before
    it and the fact after it; `fixes` says whether it turned a false fact into a true one."""
    return _scan(think_text, scene)[1]


def is_trivial_trace(think_text: str | None, prompt: str = "", *, min_words: int = 4) -> bool:
    """Whether a think trace is trivial: None (no think block), fewer than `min_words` words, or
    every word of it is a word of `prompt` (the question and its options) or a FILLER_WORD, so
    it only restates the question ("The answer is the red square."). Words are runs of [a-z0-9]
    after lower-casing, so stating a cell "(0,1)" or a count the prompt lacks is not trivial."""
    if think_text is None:
        return True
    words = _WORD.findall(think_text.lower())
    if len(words) < min_words:
        return True
    return set(words) <= set(_WORD.findall(prompt.lower())) | FILLER_WORDS


def trace_stats(completions: Sequence[str], examples: Sequence, *,
                prompt_opens: bool = True) -> dict[str, float | int | None]:
    """The R1-Zero study's trace measurements over completions of one-scene examples (each
    `ex.meta.scenes[0]` the scene, `ex.prompt` the question and options), the think text taken
    by `think_span(completion, prompt_opens=...)`:

      think_rate            share of completions with a closed think block
      trivial_rate          share whose trace `is_trivial_trace` (no trace counts as trivial)
      facts                 stated facts in all traces; grounded_fact_rate: the share that hold
                            (pooled over completions; None when no fact is stated)
      self_correction_rate  share of completions with at least one `self_corrections` mark
      corrections           marks in all traces; correction_fix_share: the share that turn a
                            false fact into a true one (None when there is no mark)
    """
    if len(completions) != len(examples):
        raise ValueError(f"trace_stats: {len(completions)} completions for {len(examples)} "
                         f"examples")
    if not completions:
        raise ValueError("trace_stats: no completions")
    think = trivial = holds = facts = corrected = fixes = marks = 0
    for c, ex in zip(completions, examples, strict=True):
        span = think_span(c, prompt_opens=prompt_opens)
        trivial += is_trivial_trace(span, ex.prompt)
        if span is None:
            continue
        think += 1
        stated, corrections = _scan(span, ex.meta.scenes[0])
        facts += len(stated)
        holds += sum(f.holds for f in stated)
        corrected += bool(corrections)
        marks += len(corrections)
        fixes += sum(c.fixes for c in corrections)
    n = len(completions)
    return {"think_rate": think / n, "trivial_rate": trivial / n, "facts": facts,
            "grounded_fact_rate": holds / facts if facts else None,
            "self_correction_rate": corrected / n, "corrections": marks,
            "correction_fix_share": fixes / marks if marks else None}


def dip_then_grow(curve, *, window: int | None = None, margin: float = 0.1) -> bool:
    """Whether a response-length curve [steps] first dips, then grows (R1-Zero's length
    dynamics): smoothed by a trailing mean over `window` points (default a tenth of the
    curve), its minimum lies at least `margin` below the first point, before the last, and
    the last point lies at least `margin` above the minimum (relative)."""
    x = np.asarray(curve, np.float64)
    if x.ndim != 1 or len(x) < 3:
        raise ValueError(f"dip_then_grow: a curve of >= 3 points, got shape {x.shape}")
    w = window or max(1, len(x) // 10)
    smooth = np.convolve(x, np.ones(w) / w, mode="valid")
    low = int(np.argmin(smooth))
    return bool(smooth[low] <= (1 - margin) * smooth[0] and low < len(smooth) - 1
                and smooth[-1] >= (1 + margin) * smooth[low])


__all__ = [
    "FILLER_WORDS",
    "Correction",
    "Fact",
    "dip_then_grow",
    "grounded_fact_rate",
    "grounded_facts",
    "is_trivial_trace",
    "self_corrections",
    "trace_stats",
]

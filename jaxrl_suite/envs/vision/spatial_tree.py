"""SpatialTree's ability tree (arXiv 2512.20617) as eleven generated sub-abilities on four levels,
each item with a direct answer and a think trace, a level label and a verifier.

  L1 perception   geometry      which of two objects is larger (sizes differ by >= 4 px)
                  motion        two frames, one object moved one cell: which way it went
                  relation      is a left or right of b / above or below b
                  localisation  which cell an object is in: "(x,y)"
                  orientation   which way a triangle points
  L2 mapping      understanding map reading: what is at a cell of a grid map (wall/free/agent/goal)
                  memory        two frames, the objects rearranged: where was an object in frame 1
  L3 simulation   causal        everything falls down (gravity, stacking): where does an object land
                  planning      shortest path length from the agent to the goal (BFS)
  L4 agentic      goal_execution  moves (U/D/L/R) that take the agent to the goal; any legal
                                sequence ending on the goal scores (checked by simulation)
                  exploration   how many cells the agent can reach (flood fill, its own included)

Grid maps (understanding, planning, goal_execution, exploration) are `maze.grid_scene`s on a
`maze_grid` x `maze_grid` board (8 x 8 cells of 4 px, one ViT patch each, by default); the rest
are `scene.draw_scene`s on 4 x 4 cells of 8 px. Every question is computed from the scenes.

Dependencies between levels, built in on purpose (the tree's claim is that higher levels compose
lower ones; here the composition is by construction, so transfer has a path to follow):
  * L2 memory asks an L1 localisation question about a frame no longer shown, over the two-frame
    format of L1 motion;
  * L2 understanding reads the very maps that L3 planning and both L4 abilities act on: reading a
    cell of the map is a sub-step of every search over it;
  * L3 causal composes L1 localisation and relation (which objects are below in the same column);
  * L3 planning's path is L4 goal_execution's answer written as moves, and its search is L4
    exploration's flood fill stopped at the goal;
  * all levels share the object vocabulary and the "(x,y)" cell convention.
L1 items are independent of each other (different attributes of the same kind of scene).

Think traces verbalise the scene at cell resolution: objects by name and cell, maps as the cells
of the agent, goal and walls, then the computation over those facts (a path, a fall, a count).
So a trace can lose detail that direct perception keeps: sizes, facings and sub-cell extents are
not in the transcript, and for geometry and orientation the trace's last step ("the red square
is larger", "it points left") is a perceptual judgment it cannot derive from what it wrote. On
L3/L4 the answer is a computation over the transcript, which is where thinking can help; on L1
the transcript adds nothing the answer needs (SpatialTree: thinking hurts perception).

Prompts: one IMAGE_MARKER per frame, then "User: <question>\\nAssistant:"; the model picks its
mode. `solution_style` writes the SFT target with the trace ("think": "<think>trace</think>
<answer>a</answer>"), without it ("direct"), by level ("level": think on THINK_LEVELS, direct
elsewhere) or "mixed": with the trace on a fixed half of the items of every level and without it
on the other half (the item thinks iff stable_hash("mode " + scenes_key + prompt) is even, so an
SFT start knows both modes and an RL reward can pick one; the key holds the scenes because many
prompts are one fixed question, e.g. planning's, and "mode " keeps it independent of the split's
hash of the scenes alone). `score`: the first `<answer>` compared with the answer after
lower-casing and removing whitespace (numbers by value); goal_execution simulates the moves.
`reward` picks the designed training reward of `verify_batch` (rewards/auto_think.py):
"accuracy", the naive "think_everywhere" (thinking required on every level), "auto_level",
"auto_probe" (groups = runs of equal consecutive examples, as GRPO lays out its G samples per
prompt) or the control "no_think" (the level rule with no think level and every level a direct
one: thinking costs `penalty` everywhere).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import ClassVar, NamedTuple

import numpy as np

from jaxrl_suite.envs.text.base import TASKS, Example, Verdicts, stable_hash
from jaxrl_suite.envs.vision.base import IMAGE_MARKER, VisionTask
from jaxrl_suite.envs.vision.maze import (
    MOVES,
    GridMap,
    bfs,
    draw_grid,
    fall,
    grid_of,
    grid_scene,
    simulate,
)
from jaxrl_suite.envs.vision.scene import (
    FACINGS,
    RELATION_PHRASES,
    RELATIONS,
    Scene,
    at_text,
    cell_text,
    draw_scene,
    legible,
    relation,
    scenes_key,
)
from jaxrl_suite.rewards.auto_think import (
    LEVELS,
    THINK_LEVELS,
    auto_think_level_rewards,
    auto_think_probe_rewards,
    is_thinking,
)
from jaxrl_suite.rewards.format import answer_tags, extract_answer
from jaxrl_suite.rewards.match import numeric_match, parse_number
from jaxrl_suite.rewards.r1zero import THINK_CLOSE, THINK_OPEN

LEVEL_OF: dict[str, int] = {
    "geometry": 1, "motion": 1, "relation": 1, "localisation": 1, "orientation": 1,
    "understanding": 2, "memory": 2,
    "causal": 3, "planning": 3,
    "goal_execution": 4, "exploration": 4,
}
ABILITIES = tuple(LEVEL_OF)
SOLUTION_STYLES = ("think", "direct", "level", "mixed")
TREE_REWARDS = ("accuracy", "think_everywhere", "auto_level", "auto_probe", "no_think")
CELL_KINDS = ("wall", "free", "agent", "goal")
_SMALL = (6, 8)  # object sizes of the multi-frame and falling scenes: no overlaps


class TreeMeta(NamedTuple):
    """`Example.meta` of a spatial_tree item (`Example.answer` is the direct answer)."""

    scenes: tuple[Scene, ...]  # one per image, in prompt order
    level: int  # 1..4
    ability: str  # one of ABILITIES
    question: str
    trace: str  # the cell-level think trace


class _Item(NamedTuple):
    question: str
    answer: str
    trace: str


def _listing(scene: Scene) -> str:
    return " ".join(at_text(o) for o in scene.objects)


def _map_text(grid: GridMap) -> str:
    walls = " ".join(cell_text(*c) for c in sorted(grid.walls, key=lambda c: (c[1], c[0])))
    return (f"agent at {cell_text(*grid.agent)}. goal at {cell_text(*grid.goal)}. "
            f"walls {walls or 'none'}.")


# ---- L1 perception ----
def _draw_objects(task, rng):
    return (draw_scene(rng, int(rng.integers(2, 5))),)


def _ask_geometry(rng, scenes):
    objs = scenes[0].objects
    pairs = [(a, b) for a in objs for b in objs if a.size >= b.size + 4]
    if not pairs:
        return None
    big, small = pairs[int(rng.integers(len(pairs)))]
    a, b = (big, small) if rng.integers(2) else (small, big)
    return _Item(f"Which is larger, the {a.name} or the {b.name}?", big.name,
                 f"{at_text(a)} {at_text(b)} {big.name} is larger.")


def _draw_motion(task, rng):
    first = draw_scene(rng, int(rng.integers(2, 4)), sizes=_SMALL)
    obj = first.objects[int(rng.integers(len(first.objects)))]
    move = list(MOVES)[int(rng.integers(len(MOVES)))]
    cell = (obj.x + MOVES[move][0], obj.y + MOVES[move][1])
    taken = {o.cell for o in first.objects}
    if not (0 <= cell[0] < first.grid and 0 <= cell[1] < first.grid) or cell in taken:
        return None
    moved = dataclasses.replace(obj, x=cell[0], y=cell[1])
    second = dataclasses.replace(first, objects=tuple(moved if o == obj else o
                                                      for o in first.objects))
    return first, second


_DIRECTION = {(0, -1): "up", (0, 1): "down", (-1, 0): "left", (1, 0): "right"}


def _ask_motion(rng, scenes):
    first, second = scenes
    (a, b), = [(a, b) for a, b in zip(first.objects, second.objects, strict=True) if a != b]
    direction = _DIRECTION[(b.x - a.x, b.y - a.y)]
    return _Item(f"Which way did the {a.name} move: up, down, left or right?", direction,
                 f"image 1: {at_text(a)} image 2: {at_text(b)} it moved {direction}.")


def _ask_relation(rng, scenes):
    objs = scenes[0].objects
    i, j = rng.choice(len(objs), size=2, replace=False)
    a, b = objs[int(i)], objs[int(j)]
    axes = [k for k in (0, 1) if a.cell[k] != b.cell[k]]
    axis = axes[int(rng.integers(len(axes)))]
    answer = relation(a, b, axis)
    pair = " or ".join(RELATIONS[axis]) + (" of" if axis == 0 else "")
    return _Item(f"Is the {a.name} {pair} the {b.name}?", answer,
                 f"{at_text(a)} {at_text(b)} {a.name} {RELATION_PHRASES[answer]} {b.name}.")


def _ask_localisation(rng, scenes):
    objs = scenes[0].objects
    a = objs[int(rng.integers(len(objs)))]
    return _Item(f"Where is the {a.name}? Answer (x,y).", cell_text(*a.cell), at_text(a))


def _draw_orientation(task, rng):
    scene = draw_scene(rng, int(rng.integers(2, 4)))
    triangles = [o for o in scene.objects if o.shape == "triangle"]
    if len(triangles) != 1 or triangles[0].size < 8:  # one triangle, big enough to point
        return None
    t = triangles[0]
    turned = dataclasses.replace(t, facing=FACINGS[int(rng.integers(len(FACINGS)))])
    return (dataclasses.replace(scene, objects=tuple(turned if o == t else o
                                                     for o in scene.objects)),)


def _ask_orientation(rng, scenes):
    (t,) = [o for o in scenes[0].objects if o.shape == "triangle"]
    return _Item(f"Which way does the {t.colour} triangle point?", t.facing,
                 f"{at_text(t)} it points {t.facing}.")


# ---- L2 mental mapping ----
def _draw_map(task, rng):
    return (grid_scene(draw_grid(rng, task.maze_grid, task.wall_p)),)


def _cell_kind(grid: GridMap, cell) -> str:
    if cell == grid.agent:
        return "agent"
    if cell == grid.goal:
        return "goal"
    return "wall" if cell in grid.walls else "free"


def _ask_understanding(rng, scenes):
    grid = grid_of(scenes[0])
    cells = [(x, y) for y in range(grid.n) for x in range(grid.n)]
    kinds = {k: [c for c in cells if _cell_kind(grid, c) == k] for k in CELL_KINDS}
    present = [k for k in CELL_KINDS if kinds[k]]
    kind = present[int(rng.integers(len(present)))]
    cell = kinds[kind][int(rng.integers(len(kinds[kind])))]
    return _Item(f"What is at {cell_text(*cell)}: wall, free, agent or goal?", kind,
                 f"{_map_text(grid)} {cell_text(*cell)} is {kind}.")


def _draw_memory(task, rng):
    first = draw_scene(rng, 3, sizes=_SMALL)
    order = rng.permutation(first.grid * first.grid)[: len(first.objects)]
    cells = [(int(i) % first.grid, int(i) // first.grid) for i in order]
    second = dataclasses.replace(first, objects=tuple(
        dataclasses.replace(o, x=c[0], y=c[1]) for o, c in zip(first.objects, cells,
                                                                strict=True)))
    if all(a.cell == b.cell for a, b in zip(first.objects, second.objects, strict=True)):
        return None
    return first, second


def _ask_memory(rng, scenes):
    first, second = scenes
    moved = [(a, b) for a, b in zip(first.objects, second.objects, strict=True)
             if a.cell != b.cell]
    a, b = moved[int(rng.integers(len(moved)))]
    return _Item(f"Where was the {a.name} in the first image? Answer (x,y).",
                 cell_text(*a.cell),
                 f"image 1: {_listing(first)} image 2: {_listing(second)} "
                 f"the {a.name} was at {cell_text(*a.cell)}.")


# ---- L3 mental simulation ----
def _draw_falling(task, rng):
    return (draw_scene(rng, int(rng.integers(3, 6)), sizes=_SMALL),)


def _ask_causal(rng, scenes):
    scene = scenes[0]
    after = fall({o.name: o.cell for o in scene.objects}, scene.grid)
    a = scene.objects[int(rng.integers(len(scene.objects)))]
    column = sorted((o for o in scene.objects if o.x == a.x), key=lambda o: o.y)
    land = cell_text(*after[a.name])
    return _Item(f"If everything falls down, where does the {a.name} land? Answer (x,y).",
                 land, f"column {a.x}: {' '.join(at_text(o) for o in column)} "
                       f"the {a.name} lands at {land}.")


def _draw_solvable(task, rng):
    grid = draw_grid(rng, task.maze_grid, task.wall_p)
    reached = bfs(grid)
    if grid.goal not in reached or reached[grid.goal][0] < 2:
        return None
    return (grid_scene(grid),)


def _path_text(grid: GridMap, moves: str) -> str:
    cells, cell = [grid.agent], grid.agent
    for m in moves:
        cell = (cell[0] + MOVES[m][0], cell[1] + MOVES[m][1])
        cells.append(cell)
    return "path " + " ".join(cell_text(*c) for c in cells) + "."


def _ask_planning(rng, scenes):
    grid = grid_of(scenes[0])
    dist, moves = bfs(grid)[grid.goal]
    return _Item("How many steps from the agent to the goal?", str(dist),
                 f"{_map_text(grid)} {_path_text(grid, moves)} {dist} steps.")


# ---- L4 agentic ----
def _ask_goal_execution(rng, scenes):
    grid = grid_of(scenes[0])
    _, moves = bfs(grid)[grid.goal]
    return _Item("Which moves take the agent to the goal? Use U, D, L, R.", moves,
                 f"{_map_text(grid)} {_path_text(grid, moves)} moves {moves}.")


def _ask_exploration(rng, scenes):
    grid = grid_of(scenes[0])
    reached = bfs(grid)
    rows = []
    for y in range(grid.n):
        xs = sorted(c[0] for c in reached if c[1] == y)
        if xs:
            rows.append(f"row {y}: {' '.join(map(str, xs))}.")
    return _Item("How many cells can the agent reach?", str(len(reached)),
                 f"{_map_text(grid)} reach {' '.join(rows)} {len(reached)} cells.")


# ability -> (draw the scenes (task, rng), ask about them (rng, scenes)); None: draw again
_GENERATORS: dict[str, tuple[Callable, Callable]] = {
    "geometry": (_draw_objects, _ask_geometry),
    "motion": (_draw_motion, _ask_motion),
    "relation": (_draw_objects, _ask_relation),
    "localisation": (_draw_objects, _ask_localisation),
    "orientation": (_draw_orientation, _ask_orientation),
    "understanding": (_draw_map, _ask_understanding),
    "memory": (_draw_memory, _ask_memory),
    "causal": (_draw_falling, _ask_causal),
    "planning": (_draw_solvable, _ask_planning),
    "goal_execution": (_draw_solvable, _ask_goal_execution),
    "exploration": (_draw_map, _ask_exploration),
}
_SPACES = re.compile(r"\s+")


def _norm(text: str) -> str:
    return _SPACES.sub("", text).casefold()


@dataclasses.dataclass(frozen=True)
class SpatialTreeTask(VisionTask):
    """SpatialTree's eleven sub-abilities (module docstring).

    Fields: `abilities` asked in turn by example index (a single one for the per-ability SFT of
    the transfer study, all for the blend; repeats weigh an ability, e.g. a 1:3 mix);
    `solution_style` "think" | "direct" | "level" | "mixed"; `reward` "accuracy" |
    "think_everywhere" | "auto_level" | "auto_probe" | "no_think"; `penalty` the auto-think
    rules' cost of the wrong mode; `maze_grid` (4 or 8) and `wall_p` the grid maps;
    `max_solution_len` (None: no cap) the longest think-style solution in characters (bytes,
    the byte tokenizer's tokens): a longer item (a few exploration traces of open 8 x 8 maps)
    is drawn again, so every solution fits a fixed generation length.
    """

    name: ClassVar[str] = "spatial_tree"
    max_images: ClassVar[int] = 2
    seed: int = 0
    abilities: tuple[str, ...] = ABILITIES
    solution_style: str = "think"
    reward: str = "accuracy"
    penalty: float = 0.5
    maze_grid: int = 8
    wall_p: float = 0.3
    max_solution_len: int | None = None

    def __post_init__(self):
        if not self.abilities or not set(self.abilities) <= set(ABILITIES):
            raise ValueError(f"spatial_tree: abilities must be a non-empty subset of "
                             f"{list(ABILITIES)}, got {self.abilities!r}")
        for field, allowed in (("solution_style", SOLUTION_STYLES), ("reward", TREE_REWARDS)):
            if getattr(self, field) not in allowed:
                raise ValueError(f"spatial_tree: {field} must be one of {list(allowed)}, got "
                                 f"{getattr(self, field)!r}")
        if self.maze_grid not in (4, 8):
            raise ValueError(f"spatial_tree: maze_grid must be 4 or 8, got {self.maze_grid}")
        if not 0.0 <= self.wall_p < 1.0:
            raise ValueError(f"spatial_tree: wall_p must be in [0, 1), got {self.wall_p}")
        if self.max_solution_len is not None and self.max_solution_len < 64:
            raise ValueError(f"spatial_tree: max_solution_len must be >= 64 or None, got "
                             f"{self.max_solution_len}")

    def ability(self, index: int) -> str:
        """The ability of example `index` (either split)."""
        return self.abilities[index % len(self.abilities)]

    # ---- generation ----
    def _draw_scenes(self, rng, split, index):
        return _GENERATORS[self.ability(index)][0](self, rng)

    def _build(self, rng, scenes, split, index):
        if not all(legible(s) for s in scenes):
            return None
        ability = self.ability(index)
        item = _GENERATORS[ability][1](rng, scenes)
        if item is None or (self.max_solution_len is not None and len(
                f"{THINK_OPEN}{item.trace}{THINK_CLOSE}{answer_tags(item.answer)}")
                > self.max_solution_len):
            return None
        prompt = f"{IMAGE_MARKER * len(scenes)}User: {item.question}\nAssistant:"
        return Example(prompt, item.answer, TreeMeta(scenes, LEVEL_OF[ability], ability,
                                                     item.question, item.trace))

    # ---- solutions and verification ----
    def solution_thinks(self, ex: Example) -> bool:
        """Whether `solution(ex)` holds the think trace (`solution_style`, module docstring)."""
        if self.solution_style == "mixed":
            return stable_hash(f"mode {scenes_key(ex.meta.scenes)} {ex.prompt}") % 2 == 0
        return self.solution_style == "think" or (self.solution_style == "level"
                                                  and ex.meta.level in THINK_LEVELS)

    def solution(self, ex: Example) -> str:
        """The SFT target in `solution_style` (module docstring)."""
        answer = answer_tags(ex.answer)
        if self.solution_thinks(ex):
            return f"{THINK_OPEN}{ex.meta.trace}{THINK_CLOSE}{answer}"
        return answer

    def score(self, completion: str, ex: Example) -> float:
        """1.0 iff the first `<answer>` is right: goal_execution, its moves (U/D/L/R, spaces and
        commas ignored, case-insensitive, at most 4 n^2) are legal and end on the goal; a
        numeric answer, the same number; else equal to the answer up to case and whitespace."""
        pred = extract_answer(completion)
        if pred is None:
            return 0.0
        if ex.meta.ability == "goal_execution":
            grid = grid_of(ex.meta.scenes[0])
            moves = pred.replace(",", "").replace(" ", "").upper()
            return float(len(moves) <= 4 * grid.n**2 and simulate(grid, moves) == grid.goal)
        if parse_number(ex.answer) is not None:
            return numeric_match(pred, ex.answer)
        return float(_norm(pred) == _norm(ex.answer))

    def verify_batch(self, completions: Sequence[str], examples: Sequence[Example]) -> Verdicts:
        """Scores, the designed reward of `self.reward` (module docstring) and its components:
        thinking (1.0 where the completion thinks, `rewards.auto_think.is_thinking`)."""
        if len(completions) != len(examples):
            raise ValueError(f"{len(completions)} completions for {len(examples)} examples")
        scores = [self.score(c, e) for c, e in zip(completions, examples, strict=True)]
        thinking = np.array([is_thinking(c) for c in completions], bool)
        levels = np.array([e.meta.level for e in examples], np.int64)
        correct = np.array(scores, np.float64)
        rewards = _REWARDS[self.reward](correct, thinking, levels, _runs(examples), self.penalty)
        return Verdicts(scores, rewards=[float(r) for r in rewards],
                        components={"thinking": thinking.astype(float).tolist()})


def mix_abilities(targets: Sequence[str], share: float) -> tuple[str, ...]:
    """The `abilities` of a targeted data mix: ABILITIES m times plus each target k more times,
    with the smallest m for which the targets' share of the tuple is exactly `share` (3/4, i.e.
    general:target = 1:3: 11 + 29 for one target, 2 x 11 + 2 x 25 for two), spread evenly so
    that every window of the data holds the mix. No targets: ABILITIES."""
    if not targets:
        return ABILITIES
    n, t, s = len(ABILITIES), len(targets), Fraction(share).limit_denominator(1000)
    if not set(targets) <= set(ABILITIES) or not t / n < s < 1:
        raise ValueError(f"mix_abilities: targets must be abilities and share in ({t}/{n}, 1), "
                         f"got {list(targets)} and {share}")
    m = next(m for m in range(1, 1001) if (m * (n * s - t) / (t * (1 - s))).denominator == 1)
    k = int(m * (n * s - t) / (t * (1 - s)))
    slots = [((i + 0.5) / (m * n), a) for i, a in enumerate(ABILITIES * m)]
    slots += [((j + 0.5) / (k * t), a) for j, a in enumerate(tuple(targets) * k)]
    return tuple(a for _, a in sorted(slots, key=lambda x: x[0]))


def _runs(examples: Sequence[Example]) -> list[tuple[int, int]]:
    """[start, end) of each maximal run of equal consecutive examples (GRPO's groups)."""
    out, lo = [], 0
    for i in range(1, len(examples) + 1):
        if i == len(examples) or examples[i] != examples[lo]:
            out.append((lo, i))
            lo = i
    return out


def _probe(correct, thinking, levels, runs, penalty):
    out = np.empty(len(correct))
    for lo, hi in runs:
        out[lo:hi] = auto_think_probe_rewards(correct[None, lo:hi], thinking[None, lo:hi],
                                              penalty=penalty)[0]
    return out


# reward -> (correct [N], thinking [N], levels [N], groups as runs, penalty) -> rewards [N]
_REWARDS: dict[str, Callable] = {
    "accuracy": lambda correct, thinking, levels, runs, penalty: correct,
    "think_everywhere": lambda correct, thinking, levels, runs, penalty: auto_think_level_rewards(
        correct, thinking, levels, penalty=penalty, think_levels=LEVELS, direct_levels=()),
    "auto_level": lambda correct, thinking, levels, runs, penalty: auto_think_level_rewards(
        correct, thinking, levels, penalty=penalty),
    "auto_probe": _probe,
    "no_think": lambda correct, thinking, levels, runs, penalty: auto_think_level_rewards(
        correct, thinking, levels, penalty=penalty, think_levels=(), direct_levels=LEVELS),
}
assert tuple(_REWARDS) == TREE_REWARDS

TASKS.register(SpatialTreeTask.name, SpatialTreeTask)

__all__ = ["ABILITIES", "CELL_KINDS", "LEVEL_OF", "SOLUTION_STYLES", "TREE_REWARDS",
           "SpatialTreeTask", "TreeMeta", "mix_abilities"]

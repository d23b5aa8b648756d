"""Grid worlds for SpatialTree's L2-L4 items: a map of walls with an agent and a goal, drawn as a
scene, solved by breadth-first search and checked by simulation.

A `GridMap` is n x n cells (x = column, y = row, from the top left), a set of wall cells, the
agent's cell and the goal's. Moves are U (y - 1), D (y + 1), L (x - 1), R (x + 1); a move into
a wall or off the map is illegal. `grid_scene` draws walls as gray squares, the agent as a blue
circle and the goal as a green square, each filling its cell, and `grid_of` reads the map back
from such a scene (the scene is the example's only state; questions are computed from it).
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np

from jaxrl_suite.envs.vision.scene import Scene, SceneObject

MOVES: dict[str, tuple[int, int]] = {"U": (0, -1), "D": (0, 1), "L": (-1, 0), "R": (1, 0)}
WALL = ("square", "gray")
AGENT = ("circle", "blue")
GOAL = ("square", "green")


class GridMap(NamedTuple):
    """n x n cells; `walls` a frozenset of cells; `agent` and `goal` cells (not walls)."""

    n: int
    walls: frozenset[tuple[int, int]]
    agent: tuple[int, int]
    goal: tuple[int, int]

    def free(self, cell: tuple[int, int]) -> bool:
        """Inside the map and not a wall."""
        x, y = cell
        return 0 <= x < self.n and 0 <= y < self.n and cell not in self.walls


def step(grid: GridMap, cell: tuple[int, int], move: str) -> tuple[int, int] | None:
    """The cell one `move` from `cell`, or None if that is a wall or off the map."""
    dx, dy = MOVES[move]
    nxt = (cell[0] + dx, cell[1] + dy)
    return nxt if grid.free(nxt) else None


def bfs(grid: GridMap, start: tuple[int, int] | None = None
        ) -> dict[tuple[int, int], tuple[int, str]]:
    """Breadth-first search from `start` (default: the agent): reached cell -> (distance, the
    moves of a shortest path to it). Moves are tried in the order U, D, L, R, so the path is the
    first shortest one in that order."""
    start = grid.agent if start is None else start
    seen = {start: (0, "")}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        dist, path = seen[cell]
        for move in MOVES:
            nxt = step(grid, cell, move)
            if nxt is not None and nxt not in seen:
                seen[nxt] = (dist + 1, path + move)
                queue.append(nxt)
    return seen


def simulate(grid: GridMap, moves: str) -> tuple[int, int] | None:
    """The agent's cell after `moves` (a string over U, D, L, R), or None if a move is illegal
    or unknown."""
    cell = grid.agent
    for move in moves:
        if move not in MOVES:
            return None
        cell = step(grid, cell, move)
        if cell is None:
            return None
    return cell


def draw_grid(rng: np.random.Generator, n: int, wall_p: float) -> GridMap:
    """Walls on each cell with probability `wall_p`, then the agent and the goal on two distinct
    other cells (at least two cells must be free: else all walls are cleared)."""
    walled = rng.random((n, n)) < wall_p  # [y, x]
    free = [(x, y) for y in range(n) for x in range(n) if not walled[y, x]]
    if len(free) < 2:
        walled[:] = False
        free = [(x, y) for y in range(n) for x in range(n)]
    a, g = rng.choice(len(free), size=2, replace=False)
    walls = frozenset((x, y) for y in range(n) for x in range(n) if walled[y, x])
    return GridMap(n, walls, free[int(a)], free[int(g)])


def grid_scene(grid: GridMap, size: int = 32) -> Scene:
    """The map drawn on black: gray wall squares, the blue agent circle, the green goal square,
    each the size of a cell."""
    cell = size // grid.n
    objects = [SceneObject(WALL[0], WALL[1], x, y, cell, z)
               for z, (x, y) in enumerate(sorted(grid.walls, key=lambda c: (c[1], c[0])))]
    k = len(objects)
    objects.append(SceneObject(GOAL[0], GOAL[1], *grid.goal, cell, k))
    objects.append(SceneObject(AGENT[0], AGENT[1], *grid.agent, cell, k + 1))
    return Scene(tuple(objects), size=size, grid=grid.n)


def grid_of(scene: Scene) -> GridMap:
    """The map drawn by `grid_scene` (ValueError if the scene has no single agent and goal)."""
    walls = frozenset(o.cell for o in scene.objects if (o.shape, o.colour) == WALL)
    agents = [o.cell for o in scene.objects if (o.shape, o.colour) == AGENT]
    goals = [o.cell for o in scene.objects if (o.shape, o.colour) == GOAL]
    if len(agents) != 1 or len(goals) != 1:
        raise ValueError(f"grid_of: need one agent and one goal, got {len(agents)} and "
                         f"{len(goals)}")
    return GridMap(scene.grid, walls, agents[0], goals[0])


def fall(cells: dict[str, tuple[int, int]], n: int) -> dict[str, tuple[int, int]]:
    """Gravity on an n x n board, one object per cell: every object drops straight down until it
    rests on the floor (row n - 1) or on another object. name -> cell before, name -> cell
    after: in each column the k-th object from the bottom lands on row n - 1 - k."""
    out = {}
    for x in sorted({c[0] for c in cells.values()}):
        column = sorted((c[1], name) for name, c in cells.items() if c[0] == x)
        for k, (_, name) in enumerate(reversed(column)):
            out[name] = (x, n - 1 - k)
    return out


__all__ = ["AGENT", "GOAL", "MOVES", "WALL", "GridMap", "bfs", "draw_grid", "fall", "grid_of",
           "grid_scene", "simulate", "step"]

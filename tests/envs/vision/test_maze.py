"""Grid worlds (envs/vision/maze.py): BFS against a brute-force search over every self-avoiding
walk on small maps, simulation, gravity against a step-by-step fall, the map through a scene."""

import numpy as np

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


def _walks(grid):
    """{cell: shortest length} over all self-avoiding walks from the agent (exhaustive DFS)."""
    best = {}

    def dfs(cell, visited, length):
        if length < best.get(cell, 1 << 30):
            best[cell] = length
        x, y = cell
        for nxt in ((x, y - 1), (x, y + 1), (x - 1, y), (x + 1, y)):
            if (0 <= nxt[0] < grid.n and 0 <= nxt[1] < grid.n and nxt not in grid.walls
                    and nxt not in visited):
                dfs(nxt, visited | {nxt}, length + 1)

    dfs(grid.agent, {grid.agent}, 0)
    return best


def test_bfs_equals_brute_force_on_small_maps():
    rng = np.random.default_rng(0)
    for n in (3, 4):
        for _ in range(40):
            grid = draw_grid(rng, n, 0.3)
            reached = bfs(grid)
            assert {c: d for c, (d, _) in reached.items()} == _walks(grid)
            for cell, (dist, moves) in reached.items():
                assert len(moves) == dist
                assert simulate(GridMap(n, grid.walls, grid.agent, cell), moves) == cell


def test_hand_worked_map():
    # . # .      agent (0,0), goal (2,0): around the wall through row 1 or 2
    # . # .
    # . . .
    grid = GridMap(3, frozenset({(1, 0), (1, 1)}), (0, 0), (2, 0))
    dist, moves = bfs(grid)[grid.goal]
    assert (dist, moves) == (6, "DDRRUU")
    assert len(bfs(grid)) == 7
    assert simulate(grid, "R") is None  # into a wall
    assert simulate(grid, "U") is None  # off the map
    assert simulate(grid, "DDRRUX") is None  # an unknown move
    assert simulate(grid, "DDRRUUDU") == (2, 0)
    walled = GridMap(3, frozenset({(1, 0), (1, 1), (1, 2)}), (0, 0), (2, 0))
    assert walled.goal not in bfs(walled) and len(bfs(walled)) == 3


def test_fall_equals_a_step_by_step_simulation():
    rng = np.random.default_rng(1)
    for _ in range(100):
        n = 4
        k = int(rng.integers(1, 8))
        flat = rng.choice(n * n, size=k, replace=False)
        cells = {f"o{i}": (int(c) % n, int(c) // n) for i, c in enumerate(flat)}
        state = dict(cells)
        moved = True
        while moved:  # drop any object with a free cell under it, one row at a time
            moved = False
            taken = set(state.values())
            for name, (x, y) in state.items():
                if y + 1 < n and (x, y + 1) not in taken:
                    state[name] = (x, y + 1)
                    moved = True
                    break
        assert fall(cells, n) == state


def test_map_round_trips_through_its_scene():
    rng = np.random.default_rng(2)
    for n in (4, 8):
        grid = draw_grid(rng, n, 0.35)
        scene = grid_scene(grid)
        assert scene.grid == n and scene.cell == 32 // n
        assert grid_of(scene) == grid
        assert set(MOVES) == {"U", "D", "L", "R"}

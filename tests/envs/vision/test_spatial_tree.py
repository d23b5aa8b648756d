"""SpatialTree's sub-abilities (envs/vision/spatial_tree.py): every answer recomputed from the
scenes by the test's own code (maps by relaxation, falls step by step, facings from pixels),
levels, solutions by style, splits, goal execution by simulation, the auto-think rewards."""

import re

import numpy as np
import pytest
from vision_helpers import shape_pixels

from jaxrl_suite.envs.text import TASKS
from jaxrl_suite.envs.text.base import stable_hash
from jaxrl_suite.envs.vision import (
    IMAGE_MARKER,
    LEVEL_OF,
    SpatialTreeTask,
    batch_images,
    mix_abilities,
)
from jaxrl_suite.envs.vision.scene import scenes_key

K = 11  # abilities
PER_ABILITY = 30


@pytest.fixture(scope="module")
def data():
    task = SpatialTreeTask()
    return task, task.examples("train", 0, K * PER_ABILITY), task.examples("test", 0, K * 8)


def _cell(text):
    x, y = re.fullmatch(r"\((\d+),(\d+)\)", text).groups()
    return int(x), int(y)


def _named(scene, question):
    for o in scene.objects:
        if f"the {o.colour} {o.shape}" in question:
            return o
    raise AssertionError(question)


def _map(scene):
    """(n, walls, agent, goal) read from the scene's objects by colour."""
    walls = {o.cell for o in scene.objects if o.colour == "gray"}
    (agent,) = [o.cell for o in scene.objects if o.colour == "blue"]
    (goal,) = [o.cell for o in scene.objects if o.colour == "green"]
    return scene.grid, walls, agent, goal


def _distances(n, walls, start):
    """Shortest distances by relaxation to a fixed point (Bellman-Ford), not a queue."""
    inf = 10**9
    dist = {(x, y): inf for x in range(n) for y in range(n) if (x, y) not in walls}
    dist[start] = 0
    changed = True
    while changed:
        changed = False
        for (x, y), d in dist.items():
            for nb in ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1)):
                if nb in dist and dist[nb] + 1 < d:
                    d = dist[nb] + 1
                    dist[(x, y)] = d
                    changed = True
    return {c: d for c, d in dist.items() if d < inf}


def _walk(n, walls, start, moves):
    x, y = start
    for m in moves:
        dx, dy = {"U": (0, -1), "D": (0, 1), "L": (-1, 0), "R": (1, 0)}[m]
        x, y = x + dx, y + dy
        if not (0 <= x < n and 0 <= y < n) or (x, y) in walls:
            return None
    return x, y


def _expected(ex):
    """The answer recomputed from the scenes, per ability."""
    scenes, q, ability = ex.meta.scenes, ex.meta.question, ex.meta.ability
    if ability == "geometry":
        names = re.findall(r"the (\w+ \w+)", q)
        a, b = (next(o for o in scenes[0].objects if o.name == n) for n in names)
        assert abs(a.size - b.size) >= 4
        return (a if a.size > b.size else b).name
    if ability == "motion":
        o = _named(scenes[0], q)
        (p,) = [p for p in scenes[1].objects if p.name == o.name]
        return {(0, -1): "up", (0, 1): "down", (-1, 0): "left", (1, 0): "right"}[
            (p.x - o.x, p.y - o.y)]
    if ability == "relation":
        names = re.findall(r"the (\w+ \w+)", q)
        a, b = (next(o for o in scenes[0].objects if o.name == n) for n in names)
        if "left or right" in q:
            return "left" if a.x < b.x else "right"
        return "above" if a.y < b.y else "below"
    if ability == "localisation":
        o = _named(scenes[0], q)
        return f"({o.x},{o.y})"
    if ability == "orientation":
        (t,) = [o for o in scenes[0].objects if o.shape == "triangle"]
        pix = shape_pixels(t, scenes[0])
        ci, cj = (np.mean([p[k] for p in pix]) for k in (0, 1))
        mid_i, mid_j = (t.y + 0.5) * scenes[0].cell - 0.5, (t.x + 0.5) * scenes[0].cell - 0.5
        # the apex side holds less of the mass: the centroid shifts away from it
        return max({"up": ci - mid_i, "down": mid_i - ci, "left": cj - mid_j,
                    "right": mid_j - cj}.items(), key=lambda kv: kv[1])[0]
    if ability == "understanding":
        n, walls, agent, goal = _map(scenes[0])
        cell = _cell(re.search(r"\(\d+,\d+\)", q).group())
        return ("agent" if cell == agent else "goal" if cell == goal
                else "wall" if cell in walls else "free")
    if ability == "memory":
        return f"({_named(scenes[0], q).x},{_named(scenes[0], q).y})"
    if ability == "causal":
        o = _named(scenes[0], q)
        below = sum(1 for p in scenes[0].objects if p.x == o.x and p.y > o.y)
        return f"({o.x},{scenes[0].grid - 1 - below})"
    n, walls, agent, goal = _map(scenes[0])
    dist = _distances(n, walls, agent)
    if ability == "planning":
        return str(dist[goal])
    if ability == "exploration":
        return str(len(dist))
    assert ability == "goal_execution"
    assert len(ex.answer) == dist[goal] and _walk(n, walls, agent, ex.answer) == goal
    return ex.answer


def test_registered_and_levels():
    assert "spatial_tree" in TASKS
    assert LEVEL_OF == {"geometry": 1, "motion": 1, "relation": 1, "localisation": 1,
                        "orientation": 1, "understanding": 2, "memory": 2, "causal": 3,
                        "planning": 3, "goal_execution": 4, "exploration": 4}


def test_every_answer_equals_an_independent_recomputation(data):
    task, train, test = data
    for ex in train + test:
        assert ex.answer == _expected(ex), (ex.meta.ability, ex.prompt)
        assert ex.meta.level == LEVEL_OF[ex.meta.ability]
        assert task.score(task.solution(ex), ex) == 1.0


def test_abilities_cycle_images_and_prompts(data):
    task, train, _ = data
    assert [e.meta.ability for e in train[:K]] == list(LEVEL_OF)
    for ex in train[:K]:
        images = task.images(ex)
        assert images.dtype == np.uint8 and images.shape[1:] == (32, 32, 3)
        assert ex.prompt.count(IMAGE_MARKER) == len(images) == len(ex.meta.scenes)
        assert len(images) == (2 if ex.meta.ability in ("motion", "memory") else 1)
        assert ex.prompt.isascii() and ex.prompt.endswith("Assistant:")
    assert task.max_images == 2


def test_batch_images_pads_to_a_fixed_shape(data):
    task, train, _ = data
    batch = train[:3]  # geometry (1 image), motion (2), relation (1)
    images, mask = batch_images(batch, task.max_images)
    assert images.shape == (3, 2, 32, 32, 3) and images.dtype == np.uint8
    np.testing.assert_array_equal(mask, [[True, False], [True, True], [True, False]])
    for b, ex in enumerate(batch):
        np.testing.assert_array_equal(images[b, mask[b]], task.images(ex))
    assert not images[0, 1].any()
    with pytest.raises(ValueError, match="max_images=1"):
        batch_images(batch, 1)


def test_splits_are_disjoint(data):
    _, train, test = data
    train_keys = {scenes_key(e.meta.scenes) for e in train}
    test_keys = {scenes_key(e.meta.scenes) for e in test}
    assert not train_keys & test_keys
    assert all(stable_hash(k) % 10 == 0 for k in test_keys)


def test_solution_styles(data):
    _, train, _ = data
    by_style = {s: SpatialTreeTask(solution_style=s) for s in ("think", "direct", "level")}
    for ex in train[:K]:
        think, direct, level = (by_style[s].solution(ex) for s in ("think", "direct", "level"))
        assert think == f"<think>{ex.meta.trace}</think><answer>{ex.answer}</answer>"
        assert direct == f"<answer>{ex.answer}</answer>"
        assert level == (think if ex.meta.level in (3, 4) else direct)


def test_mixed_style_thinks_on_a_fixed_half_of_every_level(data):
    _, train, test = data
    mixed = SpatialTreeTask(solution_style="mixed")
    think, direct = (SpatialTreeTask(solution_style=s) for s in ("think", "direct"))
    for level in (1, 2, 3, 4):
        items = [e for e in train + test if e.meta.level == level]
        modes = [mixed.solution_thinks(e) for e in items]
        assert 0.3 < np.mean(modes) < 0.7, (level, np.mean(modes))
        for ex, m in zip(items, modes, strict=True):
            assert mixed.solution(ex) == (think if m else direct).solution(ex)
            assert m == (stable_hash(f"mode {scenes_key(ex.meta.scenes)} {ex.prompt}") % 2 == 0)
    # deterministic: a new task object, other abilities and rewards give the same modes
    again = SpatialTreeTask(solution_style="mixed", reward="no_think")
    assert [again.solution_thinks(e) for e in train] == [mixed.solution_thinks(e) for e in train]
    # planning asks one fixed question: the scenes, not the prompt, split its items
    planning = [mixed.solution_thinks(e) for e in train if e.meta.ability == "planning"]
    assert len(set(planning)) == 2


def test_mix_abilities_makes_a_one_to_three_mix():
    assert mix_abilities((), 0.75) == tuple(LEVEL_OF)
    one = mix_abilities(("relation",), 0.75)
    assert len(one) == 40 and one.count("relation") == 30  # 11 + 29: 30/40 = 3/4
    assert all(one.count(a) == 1 for a in LEVEL_OF if a != "relation")
    two = mix_abilities(("localisation", "relation"), 0.75)
    assert len(two) == 72 and two.count("localisation") == two.count("relation") == 27
    assert all(two.count(a) == 2 for a in LEVEL_OF if a not in ("localisation", "relation"))
    # spread evenly: every window of 8 holds 5-7 of the 6 expected targets
    for i in range(len(one)):
        window = (one * 2)[i: i + 8]
        assert 5 <= window.count("relation") <= 7, i
    task = SpatialTreeTask(abilities=one)
    assert [task.ability(i) for i in range(40)] == list(one)
    for bad in ((("flying",), 0.75), (("relation",), 0.05), (("relation",), 1.0)):
        with pytest.raises(ValueError, match="mix_abilities"):
            mix_abilities(*bad)


def test_goal_execution_accepts_any_legal_path(data):
    task, train, _ = data
    ex = next(e for e in train if e.meta.ability == "goal_execution")
    n, walls, agent, goal = _map(ex.meta.scenes[0])
    back = {"U": "D", "D": "U", "L": "R", "R": "L"}[ex.answer[0]]
    detour = ex.answer[0] + back + ex.answer  # out and back, then the path
    assert task.score(f"<answer>{detour}</answer>", ex) == 1.0
    assert task.score(f"<answer>{' '.join(ex.answer.lower())}</answer>", ex) == 1.0
    assert task.score(f"<answer>{ex.answer[:-1]}</answer>", ex) == 0.0  # stops short
    assert task.score(f"<answer>{ex.answer}X</answer>", ex) == 0.0
    assert task.score("<answer>" + "UD" * 10_000 + "</answer>", ex) == 0.0  # too long


def test_auto_think_rewards_in_verify_batch(data):
    _, train, _ = data
    l1 = train[0]  # geometry
    l3 = train[8]  # planning
    assert (l1.meta.level, l3.meta.level) == (1, 3)
    think = lambda ex, a: f"<think>x</think><answer>{a}</answer>"  # noqa: E731
    direct = lambda ex, a: f"<answer>{a}</answer>"  # noqa: E731
    batch = [l1, l1, l1, l3, l3, l3]
    comps = [think(l1, l1.answer), direct(l1, l1.answer), direct(l1, "no"),
             think(l3, l3.answer), direct(l3, l3.answer), think(l3, "no")]
    expected = {
        "accuracy": [1, 1, 0, 1, 1, 0],
        "think_everywhere": [1, 0.5, -0.5, 1, 0.5, 0],
        "auto_level": [0.5, 1, 0, 1, 0.5, 0],
        # groups [l1 x3], [l3 x3]: a direct sample is right in both
        "auto_probe": [0.5, 1, 0, 0.5, 1, -0.5],
        # thinking costs 0.5 on every level, whatever the answer
        "no_think": [0.5, 1, 0, 0.5, 1, -0.5],
    }
    for reward, want in expected.items():
        v = SpatialTreeTask(reward=reward, penalty=0.5).verify_batch(comps, batch)
        assert v.scores == [1, 1, 0, 1, 1, 0]
        np.testing.assert_allclose(v.rewards, want, err_msg=reward)
        assert v.components["thinking"] == [1, 0, 0, 1, 0, 1]


def test_no_think_reward_charges_thinking_on_every_level(data):
    _, train, _ = data
    l2, l4 = train[5], train[9]  # understanding, goal_execution
    assert (l2.meta.level, l4.meta.level) == (2, 4)
    batch = [l2, l2, l4, l4]
    comps = [f"<think>x</think><answer>{l2.answer}</answer>", f"<answer>{l2.answer}</answer>",
             f"<think>x</think><answer>{l4.answer}</answer>", "<answer>X</answer>"]
    no_think = SpatialTreeTask(reward="no_think", penalty=0.25).verify_batch(comps, batch)
    auto = SpatialTreeTask(reward="auto_level", penalty=0.25).verify_batch(comps, batch)
    assert no_think.scores == auto.scores == [1, 1, 1, 0]
    np.testing.assert_allclose(no_think.rewards, [0.75, 1, 0.75, 0])
    np.testing.assert_allclose(auto.rewards, [1, 1, 1, -0.25])  # L2 free, L4 must think


@pytest.mark.parametrize("junk", ["", "<answer>", "<answer>" * 5000, "<think>" * 5000,
                                  "<answer>(1,\x00)</answer>", "<answer>" + "9" * 5000])
def test_hostile_completions(data, junk):
    task, train, _ = data
    for ex in train[:K]:
        assert task.score(junk, ex) in (0.0, 1.0)


def test_bad_options_raise():
    with pytest.raises(ValueError, match="abilities must be a non-empty subset"):
        SpatialTreeTask(abilities=("flying",))
    with pytest.raises(ValueError, match="reward must be one of"):
        SpatialTreeTask(reward="think")
    with pytest.raises(ValueError, match="solution_style must be one of"):
        SpatialTreeTask(solution_style="cot")
    with pytest.raises(ValueError, match="maze_grid must be 4 or 8"):
        SpatialTreeTask(maze_grid=6)
    with pytest.raises(ValueError, match="max_solution_len must be >= 64"):
        SpatialTreeTask(max_solution_len=10)


def test_max_solution_len_redraws_only_the_longer_items():
    # exploration traces of open 8 x 8 maps are the longest solutions (up to ~385 characters)
    kw = dict(abilities=("exploration",), solution_style="think")
    free, capped = SpatialTreeTask(**kw), SpatialTreeTask(**kw, max_solution_len=340)
    a, b = free.examples("train", 0, 300), capped.examples("train", 0, 300)
    long = [i for i, ex in enumerate(a) if len(free.solution(ex)) > 340]
    assert long  # the cap binds on this sample
    assert all(len(capped.solution(ex)) <= 340 for ex in b)
    # every item within the cap is the same item; the longer ones are drawn again
    assert [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y] == long

"""AEPO's Adaptive Exploration Reward (rewards/aepo.py): hand cases, the parser, hostile input,
and an independent numpy reference over random point lists and completions."""

import math

import numpy as np
import pytest

from jaxrl_suite.rewards.aepo import (
    BAD_REWARD,
    MAX_POINTS,
    aepo_reward,
    aepo_text_reward,
    any_collinear,
    first_hit_rank,
    inside,
    parse_completion,
    parse_points,
)

BOX = (10, 20, 30, 25)  # x1, y1, x2, y2 (inclusive)


@pytest.mark.parametrize("points, expected", [
    ([(10, 20)], 2.0),  # one point, a hit at its corner: 1 + 1/sqrt(1*1)
    ([(30, 25)], 2.0),  # the opposite corner is inside too (inclusive box)
    ([(31, 25)], 0.0),  # one miss: 1 - 1/1
    ([(11, 21), (50, 60)], 1 + 1 / math.sqrt(2)),  # hit at rank 1 of 2
    ([(50, 60), (11, 21)], 1.5),  # hit at rank 2 of 2: 1 + 1/sqrt(4)
    ([(0, 0), (50, 61), (11, 21)], 1 + 1 / 3),  # hit at rank 3 of 3: 1 + 1/sqrt(9)
    ([(0, 0), (11, 21), (29, 24)], 1 + 1 / math.sqrt(6)),  # the FIRST hit's rank counts
    ([(0, 0), (50, 61)], 0.5),  # no hit among 2: 1 - 1/2
    ([(0, 0), (50, 61), (3, 90)], 1 - 1 / 3),  # no hit among 3
    ([(10, 20), (11, 21), (12, 22)], BAD_REWARD),  # collinear (a diagonal), though it hits
    ([(10, 20), (40, 20), (70, 20)], BAD_REWARD),  # collinear on a row
    ([(5, 1), (5, 9), (5, 50)], BAD_REWARD),  # collinear on a column
    ([(10, 20), (10, 20), (70, 3)], BAD_REWARD),  # a repeated point is collinear with any third
    ([(10, 20), (10, 20)], 2.0 - 1 + 1 / math.sqrt(2)),  # two points are never collinear
    ([(0, 0), (1, 2), (3, 7), (9, 9)], 0.75),  # four, no three collinear, no hit: 1 - 1/4
    ([], BAD_REWARD),  # an empty list
    (None, BAD_REWARD),  # malformed
])
def test_hand_cases(points, expected):
    r = aepo_reward(points, BOX)
    assert r.reward == pytest.approx(expected)
    assert (r.format == 1.0) == (r.reward != BAD_REWARD)
    assert r.n_points == (len(points) if r.format else 0)


def test_components():
    r = aepo_reward([(0, 0), (11, 21), (29, 24)], BOX)
    assert (r.format, r.n_points, r.rank, r.collinear) == (1.0, 3, 2, False)
    assert aepo_reward([(1, 1), (2, 2), (3, 3)], BOX).collinear
    assert not aepo_reward([], BOX).collinear
    assert first_hit_rank([(0, 0), (1, 1)], BOX) == 0
    assert inside((10, 25), BOX) and not inside((9, 25), BOX) and not inside((10, 26), BOX)


@pytest.mark.parametrize("content, expected", [
    ("(1,2)", [(1, 2)]),
    ("(1,2),(33,4)", [(1, 2), (33, 4)]),
    (" ( 1 , 2 ) ,  (3,4) ", [(1, 2), (3, 4)]),
    ("(0,0),(9999,9999)", [(0, 0), (9999, 9999)]),
    ("", []),
    ("   ", []),
    (None, None),
    ("(1,2),", None),  # trailing comma
    ("(1,2)(3,4)", None),  # missing comma
    ("(1,2);(3,4)", None),
    ("[(1,2)]", None),
    ("(1,2,3)", None),
    ("(1)", None),
    ("(1,2", None),
    ("1,2", None),
    ("(-1,2)", None),
    ("(+1,2)", None),
    ("(1.5,2)", None),
    ("(1e3,2)", None),
    ("(12345,1)", None),  # more than MAX_COORD_DIGITS digits
    ("(٣,1)", None),  # a non-ASCII decimal digit
    ("(１,2)", None),  # a fullwidth digit
    ("(,)", None),
    ("()", None),
    (",".join(["(1,2)"] * MAX_POINTS), [(1, 2)] * MAX_POINTS),
    (",".join(["(1,2)"] * (MAX_POINTS + 1)), None),  # too many points
])
def test_parse_points(content, expected):
    assert parse_points(content) == expected


def test_parse_points_max_points():
    assert parse_points("(1,2),(3,4)", max_points=1) is None
    assert parse_points("(1,2)", max_points=1) == [(1, 2)]


@pytest.mark.parametrize("text, expected", [
    ("<answer>(1,2)</answer>", [(1, 2)]),
    ("  <answer>(1,2),(3,4)</answer>\n", [(1, 2), (3, 4)]),
    ("<answer></answer>", []),
    ("x<answer>(1,2)</answer>", None),  # anything outside the answer block
    ("<answer>(1,2)</answer>(3,4)", None),
    ("<answer>(1,2)</answer><answer>(1,2)</answer>", None),
    ("<answer>(1,2)", None),
    ("(1,2)", None),
    ("", None),
])
def test_parse_completion(text, expected):
    assert parse_completion(text) == expected


HUGE = 200_000
_rng = np.random.default_rng(0)
JUNK = [
    "", " ", "\x00" * 1000, "<answer>", "</answer>", "<answer>" * 10_000,
    bytes(_rng.integers(0, 256, 5000, dtype=np.uint8)).decode("latin-1"),
    "<answer>" + "(1,2)," * (HUGE // 6) + "(1,2)</answer>",
    "<answer>(" + "9" * HUGE + ",1)</answer>",
    "<answer>" + "(" * HUGE + "</answer>",
    "<answer>" + " " * HUGE + "(1,2)</answer>",
    "x" * HUGE, "<answer>(1,2)</answer>" * 10_000,
    "<answer>(\ud800,1)</answer>", "<answer>🙂</answer>", "<answer>(1\u0301,2)</answer>",
    "<answer>__import__('os').system('ls')</answer>", "<answer>[{'point_2d': [1, 2]}]</answer>",
]


@pytest.mark.parametrize("text", JUNK, ids=range(len(JUNK)))
def test_hostile_input_is_bad_format(text):
    r = aepo_text_reward(text, BOX)  # how fast: benchmarks/bench_hostile.py
    assert r.reward == BAD_REWARD and r.format == 0.0 and r.n_points == 0


# ---- an independent numpy reference ----
def reference_reward(points, box) -> float:
    """R(y) of the paper, vectorised: all triples' cross products at once."""
    if points is None or len(points) == 0:
        return -1.0
    p = np.asarray(points, np.int64)  # [N, 2]
    n = len(p)
    if n >= 3:
        d = p[None, :, :] - p[:, None, :]  # [N, N, 2]: d[i, j] = p_j - p_i
        # cross[i, j, k] = (y_j - y_i)(x_k - x_i) - (y_k - y_i)(x_j - x_i)
        cross = d[:, :, None, 1] * d[:, None, :, 0] - d[:, None, :, 1] * d[:, :, None, 0]
        i, j, k = np.meshgrid(*(np.arange(n),) * 3, indexing="ij")
        if np.any((cross == 0) & (i < j) & (j < k)):
            return -1.0
    x1, y1, x2, y2 = box
    hit = (p[:, 0] >= x1) & (p[:, 0] <= x2) & (p[:, 1] >= y1) & (p[:, 1] <= y2)  # [N]
    if not hit.any():
        return 1.0 - 1.0 / n
    k = int(np.argmax(hit)) + 1
    return 1.0 + 1.0 / np.sqrt(n * k)


def _random_case(rng):
    n = int(rng.integers(0, 7))
    grid = int(rng.choice([5, 12, 100]))  # small grids: collinear triples and hits are common
    points = [(int(x), int(y)) for x, y in rng.integers(0, grid, (n, 2))]
    x1, y1 = (int(v) for v in rng.integers(0, grid, 2))
    w, h = (int(v) for v in rng.integers(0, grid // 2 + 1, 2))
    box = (x1, y1, x1 + w, y1 + h)
    return points, box


def test_matches_numpy_reference_on_random_lists():
    rng = np.random.default_rng(1)
    kinds = set()
    for _ in range(3000):
        points, box = _random_case(rng)
        got = aepo_reward(points, box).reward
        want = reference_reward(points, box)
        assert got == pytest.approx(want, abs=1e-12), (points, box)
        kinds.add("bad" if want == -1 else "hit" if want > 1 else "miss")
    assert kinds == {"bad", "hit", "miss"}  # the random cases reach every branch


def test_collinear_matches_reference():
    rng = np.random.default_rng(2)
    for _ in range(2000):
        points, _ = _random_case(rng)
        far = (10_000, 10_000, 10_001, 10_001)  # no hits: -1 only from collinearity (N >= 1)
        if points:
            assert any_collinear(points) == (reference_reward(points, far) == -1.0)


def _render(points, rng) -> str:
    sp = lambda: " " * int(rng.integers(0, 2))  # noqa: E731
    body = ",".join(f"{sp()}({sp()}{x}{sp()},{sp()}{y}{sp()}){sp()}" for x, y in points)
    return f"<answer>{body}</answer>"


def _corrupt(text: str, rng) -> str:
    """One random edit that breaks the format (a character dropped from a bracket or comma,
    junk outside the block, or a letter in a number)."""
    kind = int(rng.integers(3))
    if kind == 0:
        idx = [i for i, ch in enumerate(text) if ch in "(),"]
        i = idx[int(rng.integers(len(idx)))]
        return text[:i] + text[i + 1:]
    if kind == 1:
        return "x" + text
    i = text.index("(") + 1
    return text[:i] + "a" + text[i:]


def test_text_reward_matches_reference_on_random_completions():
    rng = np.random.default_rng(3)
    for _ in range(2000):
        points, box = _random_case(rng)
        text = _render(points, rng)
        assert aepo_text_reward(text, box).reward == pytest.approx(
            reference_reward(points, box), abs=1e-12), text
        if points:
            bad = _corrupt(text, rng)
            assert aepo_text_reward(bad, box).reward == BAD_REWARD, bad

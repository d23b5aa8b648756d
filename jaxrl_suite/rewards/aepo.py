"""AEPO's Adaptive Exploration Reward (AER) for multi-answer GUI grounding.

AEPO (InfiGUI-G1, Liu et al. 2025, arXiv 2508.05731) lets the policy answer a grounding query with
a list of N candidate points instead of one, and rewards the list by how early the first hit
comes and how many candidates it spent, as in the authors' `recipe/infigui-g1/reward_fn.py`:

    R(y) = -1                          bad format, an empty list, or any three collinear points
    R(y) = 1 + acc(y)                  otherwise (1 = the format reward), with
    acc  = 1 / sqrt(N * k)             if the first point inside the target box is at rank k
                                       (1-based) of the N points
    acc  = -1 / N                      if no point lies inside the box

So a single correct point earns 2, a hit at rank k of N earns 1 + 1/sqrt(Nk) (an efficiency
penalty for spreading out), and a miss costs less the more it explored (1 - 1/N). Collinearity
(the authors' guard against degenerate lists such as points marching along a line) is tested on
every triple with the integer cross product (y2 - y1)(x3 - x1) - (y3 - y1)(x2 - x1) = 0, so a
repeated point and any third point are collinear.

Completions are hostile input: `parse_points` is a linear-time scanner of
"(x1,y1),(x2,y2),..." (ASCII digits only, at most `MAX_COORD_DIGITS` per coordinate and
`max_points` points; contents longer than `MAX_ANSWER_CHARS` are malformed), never `eval`, and
nothing here raises on a `str`. Boxes are inclusive integer (x1, y1, x2, y2).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import NamedTuple

from jaxrl_suite.rewards.format import extract_answer, format_reward

MAX_POINTS = 10  # longer lists are malformed (and the collinearity test stays <= 120 triples)
MAX_COORD_DIGITS = 4  # a coordinate is 1..4 ASCII digits
MAX_ANSWER_CHARS = MAX_POINTS * (2 * MAX_COORD_DIGITS + 6)  # a longer answer is malformed
BAD_REWARD = -1.0  # R of a malformed, empty or collinear answer

Point = tuple[int, int]
Box = tuple[int, int, int, int]  # x1, y1, x2, y2, inclusive


def parse_points(content: str | None, *, max_points: int = MAX_POINTS) -> list[Point] | None:
    """The points of "(x1,y1),(x2,y2),...", or None if malformed; "" is the empty list [].

    Spaces are allowed around every token; coordinates are non-negative ASCII integers of at
    most MAX_COORD_DIGITS digits; points are separated by single commas, with no trailing one.
    More than `max_points` points, or content longer than MAX_ANSWER_CHARS, is malformed. A
    None `content` (no answer) is malformed. Linear time; never raises on a str.
    """
    if content is None or len(content) > MAX_ANSWER_CHARS:
        return None
    s, n, i = content, len(content), 0
    points: list[Point] = []

    def skip(i: int) -> int:
        while i < n and s[i] == " ":
            i += 1
        return i

    def number(i: int) -> tuple[int | None, int]:
        j = i
        while j < n and "0" <= s[j] <= "9" and j - i < MAX_COORD_DIGITS + 1:
            j += 1
        if j == i or j - i > MAX_COORD_DIGITS:
            return None, j
        return int(s[i:j]), j

    i = skip(i)
    if i == n:
        return []
    while True:
        if len(points) == max_points or i >= n or s[i] != "(":
            return None
        x, i = number(skip(i + 1))
        i = skip(i)
        if x is None or i >= n or s[i] != ",":
            return None
        y, i = number(skip(i + 1))
        i = skip(i)
        if y is None or i >= n or s[i] != ")":
            return None
        points.append((x, y))
        i = skip(i + 1)
        if i == n:
            return points
        if s[i] != ",":
            return None
        i = skip(i + 1)


def parse_completion(text: str, *, max_points: int = MAX_POINTS) -> list[Point] | None:
    """The point list of a completion that is exactly one `<answer>...</answer>` block
    (`format_reward` = 1) holding `parse_points` content; None otherwise."""
    if len(text) > 4 * MAX_ANSWER_CHARS or format_reward(text) != 1.0:
        return None
    return parse_points(extract_answer(text), max_points=max_points)


def inside(point: Point, box: Box) -> bool:
    """x1 <= x <= x2 and y1 <= y <= y2 (the box is inclusive)."""
    x, y = point
    x1, y1, x2, y2 = box
    return x1 <= x <= x2 and y1 <= y <= y2


def any_collinear(points: Sequence[Point]) -> bool:
    """Whether some three of `points` lie on one line: for a triple (p1, p2, p3),
    (y2 - y1)(x3 - x1) == (y3 - y1)(x2 - x1) in exact integers (a repeated point counts)."""
    for (x1, y1), (x2, y2), (x3, y3) in itertools.combinations(points, 3):
        if (y2 - y1) * (x3 - x1) == (y3 - y1) * (x2 - x1):
            return True
    return False


def first_hit_rank(points: Sequence[Point], box: Box) -> int:
    """k: the 1-based rank of the first point inside `box`, 0 if none is."""
    return next((k for k, p in enumerate(points, 1) if inside(p, box)), 0)


class AERResult(NamedTuple):
    """The AEPO reward of one answer and its parts (the logged components)."""

    reward: float  # R(y)
    format: float  # 1.0 iff the answer is a non-empty, non-collinear point list
    n_points: int  # N (0 when malformed)
    rank: int  # k of the first hit, 0 for none (or malformed)
    collinear: bool  # rejected for three collinear points


def aepo_reward(points: Sequence[Point] | None, box: Box) -> AERResult:
    """The Adaptive Exploration Reward of parsed `points` (None = malformed) for target `box`:
    -1 for None, [] or any three collinear points; else 1 + 1/sqrt(N k) at first-hit rank k,
    1 - 1/N without a hit (module docstring)."""
    if not points:
        return AERResult(BAD_REWARD, 0.0, 0, 0, False)
    if any_collinear(points):
        return AERResult(BAD_REWARD, 0.0, 0, 0, True)
    n, k = len(points), first_hit_rank(points, box)
    acc = 1.0 / math.sqrt(n * k) if k else -1.0 / n
    return AERResult(1.0 + acc, 1.0, n, k, False)


def aepo_text_reward(text: str, box: Box, *, max_points: int = MAX_POINTS) -> AERResult:
    """`aepo_reward` of a decoded completion (`parse_completion`)."""
    return aepo_reward(parse_completion(text, max_points=max_points), box)


__all__ = [
    "BAD_REWARD",
    "MAX_ANSWER_CHARS",
    "MAX_COORD_DIGITS",
    "MAX_POINTS",
    "AERResult",
    "Box",
    "Point",
    "aepo_reward",
    "aepo_text_reward",
    "any_collinear",
    "first_hit_rank",
    "inside",
    "parse_completion",
    "parse_points",
]

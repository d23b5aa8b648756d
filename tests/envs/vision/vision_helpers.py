"""Independent references for the vision tests: a shape's pixels by a per-pixel loop in plain
floats (the scene module's rules restated in pixels, without its doubled coordinates)."""

import numpy as np

from jaxrl_suite.envs.vision.scene import PALETTE


def in_shape(obj, cell, i, j):
    """Whether pixel (row i, column j) of a scene with `cell`-pixel cells lies in `obj`'s shape."""
    dx = j + 0.5 - (obj.x + 0.5) * cell
    dy = i + 0.5 - (obj.y + 0.5) * cell
    h = obj.size / 2
    box = abs(dx) < h and abs(dy) < h
    if obj.shape == "square":
        return box
    if obj.shape == "circle":
        return dx * dx + dy * dy <= h * h
    if obj.shape == "diamond":
        return abs(dx) + abs(dy) <= h
    apex = {"up": abs(dx) <= (dy + h) / 2, "down": abs(dx) <= (h - dy) / 2,
            "left": abs(dy) <= (dx + h) / 2, "right": abs(dy) <= (h - dx) / 2}[obj.facing]
    return box and apex


def shape_pixels(obj, scene):
    """{(i, j)} of `obj`'s shape in `scene`, by a loop over the object's neighbourhood."""
    c = scene.cell
    lo_i, lo_j = max(0, obj.y * c - obj.size), max(0, obj.x * c - obj.size)
    return {(i, j) for i in range(lo_i, min(scene.size, obj.y * c + c + obj.size))
            for j in range(lo_j, min(scene.size, obj.x * c + c + obj.size))
            if in_shape(obj, c, i, j)}


def render_by_loop(scene):
    """The scene painted far to near, pixel by pixel."""
    img = np.tile(np.array(PALETTE[scene.background], np.uint8), (scene.size, scene.size, 1))
    for obj in sorted(scene.objects, key=lambda o: o.z):
        for i, j in shape_pixels(obj, scene):
            img[i, j] = PALETTE[obj.colour]
    return img

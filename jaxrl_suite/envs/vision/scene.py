"""Scenes: hashable specs of small synthetic images, their renderer and the facts they hold.

Images are data, not text (issue 46): an example keeps a `Scene` and renders it on demand, so
the data cursor stays an integer and resume stays exact. A scene is a square image of `size`
pixels cut into a `grid` x `grid` board of cells (`cell = size // grid` pixels each; 32 px and
4 x 4 cells of 8 px by default), a background colour and a tuple of objects. Each object has a
shape, a colour from a small named palette, an integer cell (x = column, y = row, both from 0 at
the top left), a size in pixels, a depth `z` (larger is nearer the viewer) and, for triangles, a
facing.

Rendering (`render`) is integer arithmetic only, with no anti-aliasing, so every platform
renders the same bytes. An object is centred on its cell's centre; with the centre at pixel
boundary (cx, cy) and half-size h = size / 2, pixel (row i, column j) is tested at its centre in
doubled coordinates u = 2j + 1 - 2cx, v = 2i + 1 - 2cy, s = size (so |u|, |v| < s is the
bounding box):

    square    |u| < s and |v| < s
    circle    u^2 + v^2 <= s^2
    diamond   |u| + |v| <= s
    triangle  |u| < s, |v| < s and, by facing (apex side):
              up 2|u| <= v + s, down 2|u| <= s - v, left 2|v| <= u + s, right 2|v| <= s - u

Objects are painted far to near (painter's order by `z`), so a nearer object occludes a farther
one where they overlap; objects may spill over their cell (size > cell) and are clipped at the
image border. A `Scene` stores its objects sorted far to near and refuses equal depths, so two
equal scenes always render the same pixels and `scene_key` is canonical.

The fact helpers read what a question asks about straight from the spec (cells, counts, depth
order), except `occludes`, which is about pixels: a occludes b iff a is nearer and some pixel of
b's shape is painted by a (`label_map`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

# The palette: colour name -> RGB. Objects take OBJECT_COLOURS; walls of the grid worlds are gray.
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 180, 70),
    "blue": (50, 90, 230),
    "yellow": (230, 210, 40),
    "purple": (160, 70, 200),
    "cyan": (40, 200, 210),
    "gray": (128, 128, 128),
    "white": (255, 255, 255),
    "black": (0, 0, 0),
}
OBJECT_COLOURS = ("red", "green", "blue", "yellow", "purple", "cyan")
BACKGROUNDS = ("black", "white")
SHAPES = ("square", "circle", "triangle", "diamond")
FACINGS = ("up", "down", "left", "right")


@dataclasses.dataclass(frozen=True)
class SceneObject:
    """One object: `shape` in SHAPES, `colour` a PALETTE name, cell (`x`, `y`) (column, row),
    `size` in pixels (even, >= 2), depth `z` (larger is nearer) and `facing` in FACINGS (only a
    triangle may face other than "up": the other shapes look the same every way)."""

    shape: str
    colour: str
    x: int
    y: int
    size: int
    z: int
    facing: str = "up"

    def __post_init__(self):
        if self.shape not in SHAPES:
            raise ValueError(f"SceneObject: shape must be one of {list(SHAPES)}, got "
                             f"{self.shape!r}")
        if self.colour not in PALETTE:
            raise ValueError(f"SceneObject: colour must be one of {list(PALETTE)}, got "
                             f"{self.colour!r}")
        if self.facing not in FACINGS:
            raise ValueError(f"SceneObject: facing must be one of {list(FACINGS)}, got "
                             f"{self.facing!r}")
        if self.facing != "up" and self.shape != "triangle":
            raise ValueError(f"SceneObject: facing must be 'up' for a {self.shape}, got "
                             f"{self.facing!r}")
        if self.size < 2 or self.size % 2:
            raise ValueError(f"SceneObject: size must be even and >= 2, got size={self.size}")

    @property
    def name(self) -> str:
        """How text refers to the object: "red square"."""
        return f"{self.colour} {self.shape}"

    @property
    def cell(self) -> tuple[int, int]:
        return (self.x, self.y)


@dataclasses.dataclass(frozen=True)
class Scene:
    """A hashable image spec (module docstring). `objects` are stored far to near (sorted by
    `z`, which must be distinct), each inside the grid and unlike the background."""

    objects: tuple[SceneObject, ...]
    size: int = 32
    grid: int = 4
    background: str = "black"

    def __post_init__(self):
        if self.background not in BACKGROUNDS:
            raise ValueError(f"Scene: background must be one of {list(BACKGROUNDS)}, got "
                             f"{self.background!r}")
        if self.grid < 1 or self.size % self.grid or (self.size // self.grid) % 2:
            raise ValueError(f"Scene: grid must divide size into cells of an even number of "
                             f"pixels, got size={self.size}, grid={self.grid}")
        objects = tuple(sorted(self.objects, key=lambda o: o.z))
        if len({o.z for o in objects}) != len(objects):
            raise ValueError(f"Scene: objects must have distinct z, got "
                             f"{[o.z for o in self.objects]}")
        for o in objects:
            if not (0 <= o.x < self.grid and 0 <= o.y < self.grid):
                raise ValueError(f"Scene: object {o.name} cell {o.cell} is outside the "
                                 f"{self.grid}x{self.grid} grid")
            if o.colour == self.background:
                raise ValueError(f"Scene: object {o.name} has the background colour "
                                 f"{self.background!r}")
        object.__setattr__(self, "objects", objects)

    @property
    def cell(self) -> int:
        """Cell side in pixels."""
        return self.size // self.grid


def shape_mask(shape: str, u: np.ndarray, v: np.ndarray, s: int,
               facing: str = "up") -> np.ndarray:
    """bool: the pixels of a shape of doubled size `s` at doubled offsets (u, v) of the pixel
    centres from the shape's centre (broadcast), by the rules of the module docstring."""
    box = (np.abs(u) < s) & (np.abs(v) < s)
    if shape == "square":
        return box
    if shape == "circle":
        return u * u + v * v <= s * s
    if shape == "diamond":
        return np.abs(u) + np.abs(v) <= s
    apex = {"up": 2 * np.abs(u) <= v + s, "down": 2 * np.abs(u) <= s - v,
            "left": 2 * np.abs(v) <= u + s, "right": 2 * np.abs(v) <= s - u}
    return box & apex[facing]


def object_mask(scene: Scene, obj: SceneObject) -> np.ndarray:
    """bool [size, size]: the pixels of `obj`'s shape (before occlusion), by the rules of the
    module docstring."""
    c = scene.cell
    cx, cy = obj.x * c + c // 2, obj.y * c + c // 2
    idx = 2 * np.arange(scene.size, dtype=np.int64) + 1
    return shape_mask(obj.shape, (idx - 2 * cx)[None, :], (idx - 2 * cy)[:, None], obj.size,
                      obj.facing)


def label_map(scene: Scene) -> np.ndarray:
    """int32 [size, size]: the index in `scene.objects` of the object seen at each pixel (the
    nearest one covering it), -1 on background."""
    labels = np.full((scene.size, scene.size), -1, np.int32)
    for i, obj in enumerate(scene.objects):  # far to near: nearer objects overwrite
        labels[object_mask(scene, obj)] = i
    return labels


def render(scene: Scene) -> np.ndarray:
    """uint8 [size, size, 3]: the scene painted far to near on its background (integer pixels,
    no anti-aliasing)."""
    colours = np.array([PALETTE[o.colour] for o in scene.objects] + [PALETTE[scene.background]],
                       np.uint8).reshape(-1, 3)
    return colours[label_map(scene)]  # label -1 picks the background row


def render_scenes(scenes: Sequence, size: int | None = None) -> np.ndarray:
    """uint8 [n, size, size, 3]: each scene rendered, stacked: `render` of a `Scene`, or the
    item's own `render()` (e.g. a video frame, `envs.vision.video.VideoFrame`). All items have
    one `size` in pixels (default: the first's; [0, 32, 32, 3] for none)."""
    size = (scenes[0].size if scenes else 32) if size is None else size
    if any(s.size != size for s in scenes):
        raise ValueError(f"render_scenes: every scene must be {size} px, got "
                         f"{sorted({s.size for s in scenes})}")
    if not scenes:
        return np.zeros((0, size, size, 3), np.uint8)
    return np.stack([render(s) if isinstance(s, Scene) else s.render() for s in scenes])


def visible_fractions(scene: Scene) -> np.ndarray:
    """float [n_objects]: the share of each object's in-image pixels that no nearer object
    covers (0.0 for an object wholly outside the image)."""
    labels = label_map(scene)
    out = np.zeros(len(scene.objects))
    for i, obj in enumerate(scene.objects):
        area = object_mask(scene, obj).sum()
        out[i] = (labels == i).sum() / area if area else 0.0
    return out


def scene_key(scene: Scene) -> str:
    """The canonical text of a scene: equal scenes, and only they, have equal keys."""
    objs = ";".join(f"{o.shape},{o.colour},{o.x},{o.y},{o.size},{o.z},{o.facing}"
                    for o in scene.objects)
    return f"{scene.size}/{scene.grid}/{scene.background}/{objs}"


def scenes_key(scenes: Sequence[Scene]) -> str:
    """The key of an example's scenes, in order ("|"-joined `scene_key`s)."""
    return "|".join(scene_key(s) for s in scenes)


# ---- facts ----
def find(scene: Scene, name: str) -> SceneObject | None:
    """The object called `name` ("red square"), None if there is none; the first (farthest) if
    the name is ambiguous."""
    return next((o for o in scene.objects if o.name == name), None)


def object_at(scene: Scene, x: int, y: int) -> SceneObject | None:
    """The nearest object whose cell is (x, y), else None."""
    return next((o for o in reversed(scene.objects) if o.cell == (x, y)), None)


def left_of(a: SceneObject, b: SceneObject) -> bool:
    """a is left of b: a's column is smaller (cells: a.x < b.x)."""
    return a.x < b.x


def above(a: SceneObject, b: SceneObject) -> bool:
    """a is above b: a's row is smaller (cells: a.y < b.y)."""
    return a.y < b.y


def count(scene: Scene, *, colour: str | None = None, shape: str | None = None) -> int:
    """How many objects have `colour` and `shape` (None matches any)."""
    return sum((colour is None or o.colour == colour) and (shape is None or o.shape == shape)
               for o in scene.objects)


def occludes(scene: Scene, a: SceneObject, b: SceneObject) -> bool:
    """a occludes b: a is nearer (a.z > b.z) and paints some pixel of b's shape."""
    if a.z <= b.z:
        return False
    labels = label_map(scene)
    return bool((labels[object_mask(scene, b)] == scene.objects.index(a)).any())


def occlusion_pairs(scene: Scene) -> list[tuple[SceneObject, SceneObject]]:
    """Every (nearer, farther) pair where the nearer occludes the farther."""
    return [(a, b) for a in scene.objects for b in scene.objects if occludes(scene, a, b)]


def distance2(a: SceneObject, b: SceneObject) -> int:
    """Squared Euclidean distance between the cells of a and b, in cells."""
    return (a.x - b.x) ** 2 + (a.y - b.y) ** 2


def cell_text(x: int, y: int) -> str:
    """How text writes a cell: "(x,y)"."""
    return f"({x},{y})"


def at_text(obj: SceneObject) -> str:
    """How a trace states an object's cell, e.g. "red square at (0,1)." (with the period)."""
    return f"{obj.name} at {cell_text(*obj.cell)}."


RELATIONS = (("left", "right"), ("above", "below"))  # by cell axis: 0 = x (column), 1 = y (row)
RELATION_PHRASES = {"left": "left of", "right": "right of", "above": "above", "below": "below"}


def relation(a: SceneObject, b: SceneObject, axis: int) -> str:
    """Where a is relative to b along `axis` (0: "left" / "right", 1: "above" / "below");
    ValueError if their cells agree on that axis."""
    if a.cell[axis] == b.cell[axis]:
        raise ValueError(f"relation: {a.name} and {b.name} share axis {axis}")
    return RELATIONS[axis][0] if a.cell[axis] < b.cell[axis] else RELATIONS[axis][1]


# ---- drawing ----
SIZES = (6, 8, 10, 12)  # object sizes (px) of the drawn 32 px scenes
MIN_VISIBLE = 0.5  # a drawn scene shows at least this share of every object
MIN_OCCLUDED = 3  # pixels of the farther object that a visible occlusion covers


def _neighbours(x: int, y: int, grid: int) -> list[tuple[int, int]]:
    return [(x + dx, y + dy) for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1))
            if 0 <= x + dx < grid and 0 <= y + dy < grid]


def draw_scene(rng: np.random.Generator, n_objects: int, *, grid: int = 4, size: int = 32,
               sizes: Sequence[int] = SIZES, occluding_pair: bool = False) -> Scene:
    """A random scene of `n_objects` objects with distinct names ("red square": colour x shape)
    in distinct cells, sizes from `sizes`, random depths, triangles facing up, on black. With
    `occluding_pair` the first two objects sit in neighbouring cells with the two largest
    sizes, so they likely overlap. Not checked: see `legible` and `visible_occlusions`.

    The draw: names without replacement from OBJECT_COLOURS x SHAPES, cells without replacement
    (the pair first), z a permutation of 0..n-1.
    """
    names = [(c, s) for c in OBJECT_COLOURS for s in SHAPES]
    picked = rng.choice(len(names), size=n_objects, replace=False)
    cells: list[tuple[int, int]] = []
    if occluding_pair:
        x, y = (int(v) for v in rng.integers(0, grid, 2))
        options = _neighbours(x, y, grid)
        cells = [(x, y), options[int(rng.integers(len(options)))]]
    free = [(x, y) for y in range(grid) for x in range(grid) if (x, y) not in cells]
    order = rng.permutation(len(free))[: n_objects - len(cells)]
    cells += [free[int(i)] for i in order]
    big = sorted(sizes)[-2:]
    obj_sizes = [int(rng.choice(big if occluding_pair and i < 2 else sizes))
                 for i in range(n_objects)]
    depths = rng.permutation(n_objects)
    objects = [SceneObject(names[int(k)][1], names[int(k)][0], cx, cy, sz, int(z))
               for k, (cx, cy), sz, z in zip(picked, cells, obj_sizes, depths, strict=True)]
    return Scene(tuple(objects), size=size, grid=grid)


def legible(scene: Scene, min_visible: float = MIN_VISIBLE) -> bool:
    """Every object shows at least `min_visible` of its in-image pixels."""
    return bool((visible_fractions(scene) >= min_visible).all())


def visible_occlusions(scene: Scene, min_occluded: int = MIN_OCCLUDED
                       ) -> list[tuple[SceneObject, SceneObject]]:
    """The (nearer, farther) pairs of different colours where the nearer paints at least
    `min_occluded` pixels of the farther's shape: occlusions a viewer can see (two shapes of one
    colour merge into one blob)."""
    labels = label_map(scene)
    out = []
    for j, far in enumerate(scene.objects):
        seen = labels[object_mask(scene, far)]
        for i in range(j + 1, len(scene.objects)):
            if (scene.objects[i].colour != far.colour
                    and (seen == i).sum() >= min_occluded):
                out.append((scene.objects[i], far))
    return out


__all__ = [
    "BACKGROUNDS",
    "FACINGS",
    "MIN_OCCLUDED",
    "MIN_VISIBLE",
    "OBJECT_COLOURS",
    "PALETTE",
    "RELATIONS",
    "RELATION_PHRASES",
    "SHAPES",
    "SIZES",
    "Scene",
    "SceneObject",
    "above",
    "at_text",
    "cell_text",
    "count",
    "distance2",
    "draw_scene",
    "find",
    "label_map",
    "legible",
    "left_of",
    "object_at",
    "object_mask",
    "relation",
    "occludes",
    "occlusion_pairs",
    "render",
    "render_scenes",
    "scene_key",
    "scenes_key",
    "shape_mask",
    "visible_fractions",
    "visible_occlusions",
]

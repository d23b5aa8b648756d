"""Scenes (envs/vision/scene.py): rendering is deterministic integer pixels, hand-checked pixels,
occlusion by depth, masks against a per-pixel loop in plain floats, canonical specs, errors."""

import hashlib

import numpy as np
import pytest
from vision_helpers import render_by_loop

from jaxrl_suite.envs.vision.scene import (
    PALETTE,
    Scene,
    SceneObject,
    draw_scene,
    legible,
    relation,
    render,
    scene_key,
    visible_occlusions,
)

RED, BLUE, BLACK = (np.array(PALETTE[c], np.uint8) for c in ("red", "blue", "black"))


def _fixed():
    return Scene((SceneObject("square", "red", 1, 2, 8, 0),
                  SceneObject("circle", "blue", 2, 2, 12, 1),
                  SceneObject("triangle", "green", 3, 0, 10, 2, "left"),
                  SceneObject("diamond", "yellow", 0, 0, 8, 3)))


def test_render_is_deterministic_uint8_and_pinned():
    scene = _fixed()
    a, b = render(scene), render(scene)
    assert a.dtype == np.uint8 and a.shape == (32, 32, 3)
    assert a.tobytes() == b.tobytes()
    # the exact bytes, pinned: any platform or numpy that paints differently fails here
    assert hashlib.blake2b(a.tobytes(), digest_size=8).hexdigest() == "09cfd5b8a55af6fa"


def test_hand_checked_pixels():
    img = render(Scene((SceneObject("square", "red", 1, 2, 8, 0),)))
    # cell (1, 2) of 8 px: columns 8..15, rows 16..23
    assert (img[16, 8] == RED).all() and (img[23, 15] == RED).all()
    assert (img[15, 8] == BLACK).all() and (img[24, 15] == BLACK).all()
    assert (img[16, 7] == BLACK).all() and (img[16, 16] == BLACK).all()
    assert (img == RED).all(axis=-1).sum() == 64
    circle = render(Scene((SceneObject("circle", "blue", 0, 0, 8, 0),)))
    assert (circle[0, 0] == BLACK).all()  # the corner: 3.5^2 + 3.5^2 > 4^2
    assert (circle[0, 4] == BLUE).all()  # 0.5^2 + 3.5^2 <= 4^2
    tri = render(Scene((SceneObject("triangle", "red", 0, 0, 8, 0),)))
    on = (tri == RED).all(axis=-1)
    assert on[0].sum() == 0 and on[1, :8].tolist() == [0, 0, 0, 1, 1, 0, 0, 0]
    assert on[7].sum() == 8 and on[8].sum() == 0  # the base row, then nothing


def test_masks_equal_a_per_pixel_loop():
    rng = np.random.default_rng(0)
    scenes = [_fixed()] + [draw_scene(rng, 4) for _ in range(3)]
    scenes.append(Scene(tuple(SceneObject("triangle", c, x, 1, 12, x, f) for x, (c, f) in
                              enumerate(zip(("red", "green", "blue", "cyan"),
                                            ("up", "down", "left", "right"), strict=True)))))
    for scene in scenes:
        np.testing.assert_array_equal(render(scene), render_by_loop(scene))


def test_nearer_objects_occlude_farther_ones():
    def pair(z_red, z_blue):
        return Scene((SceneObject("square", "red", 1, 1, 12, z_red),
                      SceneObject("square", "blue", 2, 1, 12, z_blue)))

    overlap = (slice(6, 18), slice(14, 18))  # rows 6..17, columns 14..17: in both squares
    assert (render(pair(1, 0))[overlap] == RED).all()
    assert (render(pair(0, 1))[overlap] == BLUE).all()
    near, far = visible_occlusions(pair(1, 0))[0]
    assert (near.colour, far.colour) == ("red", "blue")


def test_relation():
    a = SceneObject("square", "red", 0, 2, 8, 0)
    b = SceneObject("circle", "blue", 3, 2, 8, 1)
    assert (relation(a, b, 0), relation(b, a, 0)) == ("left", "right")
    with pytest.raises(ValueError, match="share axis 1"):
        relation(a, b, 1)


def test_scene_is_canonical_and_hashable():
    a = SceneObject("square", "red", 0, 0, 8, 2)
    b = SceneObject("circle", "blue", 1, 0, 8, 1)
    s1, s2 = Scene((a, b)), Scene((b, a))
    assert s1 == s2 and hash(s1) == hash(s2) and scene_key(s1) == scene_key(s2)
    assert s1.objects == (b, a)  # stored far to near
    assert scene_key(Scene((a,))) != scene_key(s1)


def test_draw_scene_and_legibility():
    rng = np.random.default_rng(1)
    scenes = [draw_scene(rng, 5) for _ in range(50)]
    for s in scenes:
        names = [o.name for o in s.objects]
        assert len(set(names)) == 5 and len({o.cell for o in s.objects}) == 5
    assert sum(legible(s) for s in scenes) > 40
    hidden = Scene((SceneObject("circle", "red", 1, 1, 6, 0),
                    SceneObject("square", "blue", 1, 1, 12, 1)))  # covered whole
    assert not legible(hidden)


@pytest.mark.parametrize("kwargs, message", [
    (dict(shape="hexagon"), "shape must be one of"),
    (dict(colour="teal"), "colour must be one of"),
    (dict(size=7), "size must be even"),
    (dict(facing="left"), "facing must be 'up' for a square"),
    (dict(facing="north", shape="triangle"), "facing must be one of"),
], ids=range(5))
def test_bad_objects_raise(kwargs, message):
    args = dict(shape="square", colour="red", x=0, y=0, size=8, z=0) | kwargs
    with pytest.raises(ValueError, match=message):
        SceneObject(**args)


def test_bad_scenes_raise():
    a = SceneObject("square", "red", 0, 0, 8, 0)
    with pytest.raises(ValueError, match="distinct z"):
        Scene((a, SceneObject("circle", "blue", 1, 0, 8, 0)))
    with pytest.raises(ValueError, match="outside the 4x4 grid"):
        Scene((SceneObject("square", "red", 4, 0, 8, 0),))
    with pytest.raises(ValueError, match="background colour"):
        Scene((SceneObject("square", "black", 0, 0, 8, 0),))
    with pytest.raises(ValueError, match="grid must divide size"):
        Scene((a,), grid=3)
    with pytest.raises(ValueError, match="background must be one of"):
        Scene((a,), background="red")

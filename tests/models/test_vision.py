"""The image tower (models/vision.py) against naive numpy loops; HF parity is in
test_hf_qwen2_vl.py."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.models.vision import (
    VisionConfig,
    VisionTower,
    image_grid,
    patch_positions,
    patchify,
    vision_rope_cos_sin,
)

CFG = VisionConfig()  # the studies' tower: 32 x 32 images, patch 4, 64 patches -> 16 tokens


def test_patchify_layout_equals_a_pixel_loop():
    """A float image whose pixel (y, x, c) holds 1000 y + 10 x + c (mean 0, std 1: no
    normalisation): each patch's (C, T, p, p) entries come from the pixels its
    `patch_positions` (row, col) name, every frame the same."""
    cfg = dataclasses.replace(CFG, image_mean=(0.0,) * 3, image_std=(1.0,) * 3)
    h, w, p = 16, 24, cfg.patch_size
    y, x, c = np.meshgrid(np.arange(h), np.arange(w), np.arange(3), indexing="ij")
    image = (1000 * y + 10 * x + c).astype(np.float32)
    patches, grid = patchify(image[None], cfg)
    np.testing.assert_array_equal(grid, [[1, h // p, w // p]])
    rc = patch_positions(grid, cfg)
    assert patches.shape == (h * w // p**2, cfg.patch_dim) and rc.shape == (len(patches), 2)
    for k, (row, col) in enumerate(rc):
        want = np.empty((3, cfg.temporal_patch_size, p, p), np.float32)
        for ch in range(3):
            for t in range(cfg.temporal_patch_size):
                for i in range(p):
                    for j in range(p):
                        want[ch, t, i, j] = image[row * p + i, col * p + j, ch]
        np.testing.assert_array_equal(patches[k], want.ravel())
    # merge-window order: each run of m^2 patches is one 2 x 2 window, windows row by row
    m = cfg.spatial_merge_size
    windows = rc.reshape(-1, m * m, 2) // m
    assert (windows == windows[:, :1]).all()
    np.testing.assert_array_equal(windows[:, 0], [(r, c) for r in range(h // p // m)
                                                   for c in range(w // p // m)])


def test_patchify_normalises_uint8_as_float_and_lists_images_in_order():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    patches, grid = patchify(images, CFG)
    assert patches.shape == (3 * 64, CFG.patch_dim) and patches.dtype == np.float32
    np.testing.assert_array_equal(grid, [[1, 8, 8]] * 3)
    as_float, _ = patchify(images.astype(np.float32) / 255, CFG)
    np.testing.assert_allclose(as_float, patches, atol=1e-6)
    # a list per example (one, then two images) gives the same rows
    listed, _ = patchify([images[0], [images[1], images[2]]], CFG)
    np.testing.assert_array_equal(listed, patches)
    mean, std = np.asarray(CFG.image_mean), np.asarray(CFG.image_std)
    first = (images[0, :4, :4] / 255 - mean) / std  # patch 0: pixels [0:4, 0:4]
    np.testing.assert_allclose(patches[0].reshape(3, 2, 4, 4)[:, 0],
                               first.transpose(2, 0, 1), atol=1e-6)


def test_vision_rope_equals_a_loop():
    hd, theta = 16, 10000.0
    pos = np.array([[0, 0], [3, 5], [7, 2]])
    cos, sin = vision_rope_cos_sin(jnp.asarray(pos), hd, theta)
    for n, (row, col) in enumerate(pos):
        angles = []
        for axis_pos in (row, col):  # first half: row, second: col
            angles += [axis_pos * theta ** (-2 * j / (hd // 2)) for j in range(hd // 4)]
        angles = np.array(angles * 2)
        np.testing.assert_allclose(cos[n], np.cos(angles), atol=1e-6)
        np.testing.assert_allclose(sin[n], np.sin(angles), atol=1e-6)


@pytest.fixture(scope="module")
def tower():
    images = np.random.default_rng(1).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    patches, grid = patchify(images, CFG)
    patches = patches.reshape(3, 64, -1)
    rc = patch_positions(grid, CFG).reshape(3, 64, 2)
    model = VisionTower(CFG)
    params = model.init(jax.random.key(0), patches, rc)
    return jax.jit(model.apply), params, patches, rc


def test_tower_shapes_names_and_images_are_independent(tower):
    apply, params, patches, rc = tower
    p = params["params"]
    assert set(p) == {"patch_embed", "blocks_0", "blocks_1", "merger"}
    assert "bias" not in p["patch_embed"] and p["patch_embed"]["kernel"].shape == (96, 64)
    assert p["blocks_0"]["attn"]["qkv"]["kernel"].shape == (64, 192)
    assert set(p["merger"]) == {"ln_q", "mlp_0", "mlp_2"}
    out = apply(params, patches, rc)
    assert out.shape == (3, 16, 128) and out.dtype == jnp.float32
    # each image attends to itself only: changing image 2 leaves images 0 and 1 as they were
    other = patches.copy()
    other[2] = -other[2]
    out2 = apply(params, other, rc)
    np.testing.assert_array_equal(out2[:2], out[:2])
    assert np.abs(out2[2] - out[2]).max() > 1e-3
    # one [P, 2] position table serves every image of one size
    np.testing.assert_allclose(apply(params, patches, rc[0]), out, atol=1e-6)


@pytest.mark.parametrize("remat", ["none", "block", "full"])
def test_a_scanned_tower_keeps_the_names_and_equals_the_loop(tower, remat):
    """`scan` stacks the blocks' parameters at each call: the same tree (HF's names), the same
    output and the same gradient as the Python loop (float32)."""
    _, params, patches, rc = tower
    scanned = VisionTower(CFG, remat=remat, scan=True)
    assert (jax.tree.structure(scanned.init(jax.random.key(0), patches, rc))
            == jax.tree.structure(params))
    loss = lambda model: jax.jit(jax.value_and_grad(
        lambda p: jnp.sum(jnp.sin(model.apply(p, patches, rc)))))
    (want, want_grad), (got, got_grad) = loss(VisionTower(CFG))(params), loss(scanned)(params)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                 got_grad, want_grad)
    assert float(np.abs(want_grad["params"]["blocks_1"]["mlp"]["fc1"]["kernel"]).max()) > 0


@pytest.mark.parametrize("field, value, match", [
    ("n_heads", 3, "n_heads=3"),
    ("hidden_act", "relu", "hidden_act"),
    ("image_mean", (0.5, 0.5), "image_mean has 2 values"),
    ("image_std", (1.0, 0.0, 1.0), "'vision.image_std\\[1\\]' must be > 0"),
    ("patch_size", 0, "patch_size"),
])
def test_bad_config_names_the_field(field, value, match):
    with pytest.raises(ValueError, match=match) as e:
        dataclasses.replace(CFG, **{field: value})
    assert "\n" not in str(e.value)


def test_bad_inputs_are_one_line_errors():
    with pytest.raises(ValueError, match=r"multiples of patch_size \* spatial_merge_size = 8"):
        image_grid(30, 32, CFG)
    with pytest.raises(ValueError, match=r"must be \[H, W, 3\]"):
        patchify(np.zeros((32, 32, 4), np.uint8), CFG)
    with pytest.raises(ValueError, match="holds no image"):
        patchify([], CFG)
    with pytest.raises(ValueError, match=r"patches must be \[N, P, 96\]"):
        VisionTower(CFG).init(jax.random.key(0), jnp.zeros((1, 4, 95)), jnp.zeros((4, 2), int))

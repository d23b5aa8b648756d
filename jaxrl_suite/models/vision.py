"""A ViT image tower in the layout of Qwen2-VL's (`model.visual`), and the patchify that feeds it.

Qwen2-VL (arXiv:2409.12191; HF `Qwen2VisionTransformerPretrainedModel`). An image [H, W, 3] is
normalised, x = (pixel / 255 - mean) / std, cut into p x p patches on a grid (h, w) = (H/p, W/p),
and the patches are listed in merge-window order: the m x m windows row by row, and inside a
window its m x m patches row by row (m = spatial_merge_size). A patch is flattened (C, T, p, p):
the image is repeated over the T = temporal_patch_size frames of HF's Conv3d, so the Conv3d with
stride = kernel is the bias-free Dense `patch_embed` of the flattened patch. Then

    x_0 = patch_embed(patches)                                  [N, P, E]
    x_l = x_{l-1} + Attn(LN(x_{l-1}));  x_l += MLP(LN(x_l))      pre-LN ViT blocks, fused qkv
    out = mlp_2(gelu(mlp_0(concat_m^2(ln_q(x_L)))))             PatchMerger: [N, P / m^2, D]

Attention is bidirectional within one image (HF's cu_seqlens segments: one per frame), with a
2-D RoPE: head_dim / 4 frequencies inv_freq_j = theta^(-4j / Dh) rotate the first half of each
head by the patch's row and the second half by its column (rotate-half pairs, as HF's
`Qwen2VLVisionRotaryEmbedding`). The MLP is fc2(act(fc1 x)), act quick_gelu = x sigmoid(1.702 x)
for Qwen2-VL; the merger's activation is the exact GELU.

The tower is batched over images of one size ([N, P, .]): every image attends only to itself,
and P is static. The parameter tree follows HF's names (`models/hf.py` maps them):

    patch_embed/kernel            [C*T*p*p, E]   visual.patch_embed.proj.weight [E, C, T, p, p]
    blocks_{i}/norm{1,2}/{scale,bias}            visual.blocks.{i}.norm{1,2}.{weight,bias}
    blocks_{i}/attn/qkv/{kernel,bias}            visual.blocks.{i}.attn.qkv   [3E, E]
    blocks_{i}/attn/proj/{kernel,bias}           visual.blocks.{i}.attn.proj
    blocks_{i}/mlp/fc{1,2}/{kernel,bias}         visual.blocks.{i}.mlp.fc{1,2}
    merger/ln_q/{scale,bias}                     visual.merger.ln_q
    merger/mlp_{0,2}/{kernel,bias}               visual.merger.mlp.{0,2}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Annotated

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.core.config import Count, Positive, Range, check_fields
from jaxrl_suite.models.lm import REMAT_POLICIES, apply_rope
from jaxrl_suite.models.sharding import constrain

# The OpenAI CLIP normalisation (HF's OPENAI_CLIP_MEAN / OPENAI_CLIP_STD), Qwen2-VL's default
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_ACTIVATIONS = {
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),  # HF QuickGELUActivation
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
}


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """Sizes and options of `VisionTower` (HF `Qwen2VLVisionConfig` names in brackets). The
    defaults are the studies' tower: 32 x 32 images, 64 patches of 4 x 4, 16 LM tokens."""

    patch_size: Count = 4  # p: patches are p x p pixels [patch_size]
    temporal_patch_size: Count = 2  # T: frames per patch; an image is repeated T times
    in_channels: Count = 3  # C [in_channels; transformers 4: in_chans]
    embed_dim: Count = 64  # E: the tower's width [embed_dim]
    depth: Count = 2  # number of ViT blocks [depth]
    n_heads: Count = 4  # attention heads; E / n_heads must be a multiple of 4 (2-D RoPE)
    mlp_ratio: Count = 4  # the MLP's hidden width is E * mlp_ratio [mlp_ratio]
    spatial_merge_size: Count = 2  # m: m x m patches merge into one LM token
    out_dim: Count = 128  # D: the merger's output, the LM's d_model [hidden_size]
    rope_theta: Positive = 10000.0  # base of the 2-D RoPE [rope_parameters.rope_theta]
    norm_eps: Positive = 1e-6  # LayerNorm epsilon (HF fixes 1e-6)
    hidden_act: str = "quick_gelu"  # the blocks' MLP activation: "quick_gelu" | "gelu"
    # per-channel normalisation (preprocessor config): any finite mean, a positive scale
    image_mean: tuple[Annotated[float, Range()], ...] = CLIP_MEAN
    image_std: tuple[Positive, ...] = CLIP_STD

    def __post_init__(self):
        check_fields(self, "vision.")
        if self.embed_dim % self.n_heads or (self.embed_dim // self.n_heads) % 4:
            raise ValueError(f"VisionConfig.n_heads={self.n_heads}: embed_dim={self.embed_dim} / "
                             "n_heads must be a whole multiple of 4 (the 2-D RoPE)")
        if self.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"VisionConfig.hidden_act must be one of {sorted(_ACTIVATIONS)}, "
                             f"got {self.hidden_act!r}")
        for name in ("image_mean", "image_std"):
            value = tuple(float(v) for v in getattr(self, name))
            object.__setattr__(self, name, value)  # hashable
            if len(value) != self.in_channels:
                raise ValueError(f"VisionConfig.{name} has {len(value)} values, in_channels is "
                                 f"{self.in_channels}")

    @property
    def head_dim(self) -> int:
        """Per-head width E / n_heads."""
        return self.embed_dim // self.n_heads

    @property
    def patch_dim(self) -> int:
        """Length of a flattened patch, C * T * p * p."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def merge_tokens(self) -> int:
        """Patches per LM token, m^2."""
        return self.spatial_merge_size**2


def image_grid(height: int, width: int, config: VisionConfig) -> tuple[int, int, int]:
    """(t, h, w) = (1, H / p, W / p), HF's `image_grid_thw` of an H x W image; one-line error
    unless H and W are multiples of p * m (no resizing here: resize on the host first)."""
    unit = config.patch_size * config.spatial_merge_size
    if height % unit or width % unit:
        raise ValueError(f"image of {height} x {width} pixels: both sides must be multiples of "
                         f"patch_size * spatial_merge_size = {unit}")
    return 1, height // config.patch_size, width // config.patch_size


def _image_list(images) -> list[np.ndarray]:
    """Images [H, W, C] from an array [N, H, W, C] or [H, W, C], or a (nested) list of them."""
    if isinstance(images, np.ndarray | jax.Array) and np.ndim(images) in (3, 4):
        images = np.asarray(images)
        return [images] if images.ndim == 3 else list(images)
    if isinstance(images, Sequence) and not isinstance(images, str):
        return [im for item in images for im in _image_list(item)]
    raise ValueError(f"images must be arrays [H, W, C] or [N, H, W, C] (or lists of them), got "
                     f"{type(images).__name__} of shape {np.shape(images)}")


def patchify(images, config: VisionConfig) -> tuple[np.ndarray, np.ndarray]:
    """HF `Qwen2VLImageProcessor` without resizing, on the host (numpy).

    images: uint8 [N, H, W, C] (pixel values 0..255, rescaled by 1/255) or float (already in
    [0, 1]), or a list of [H, W, C] / [N, H, W, C] arrays (sizes may differ); N images in order.
    Each is normalised, x = (rescaled - image_mean) / image_std, and cut as the module docstring
    says. Returns (patches [sum_n h_n w_n, C*T*p*p] float32 in merge-window order, one image
    after another, grid_thw [N, 3] int64), equal to the processor's (`pixel_values`,
    `image_grid_thw`) for the same image, mean and std and do_resize=False.
    """
    c, t, p, m = (config.in_channels, config.temporal_patch_size, config.patch_size,
                  config.spatial_merge_size)
    mean = np.asarray(config.image_mean, np.float32)
    std = np.asarray(config.image_std, np.float32)
    patches, grids = [], []
    for im in _image_list(images):
        if im.ndim != 3 or im.shape[-1] != c:
            raise ValueError(f"an image must be [H, W, {c}], got shape {im.shape}")
        _, gh, gw = image_grid(im.shape[0], im.shape[1], config)
        if im.dtype == np.uint8:  # HF rescale: float64 product, then float32
            x = (im.astype(np.float64) * (1 / 255)).astype(np.float32)
        else:
            x = im.astype(np.float32)
        x = ((x - mean) / std).transpose(2, 0, 1)  # [C, H, W]
        x = x.reshape(c, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
        x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], t, p, p))  # (.., C, T, p, p)
        patches.append(x.reshape(gh * gw, c * t * p * p))
        grids.append((1, gh, gw))
    if not patches:
        raise ValueError("images holds no image")
    return np.concatenate(patches).astype(np.float32), np.asarray(grids, np.int64)


def patch_positions(grid_thw, config: VisionConfig) -> np.ndarray:
    """(row, col) of every patch of images with grids [N, 3], in merge-window order, as HF's
    `get_vision_position_ids`: [sum_n t_n h_n w_n, 2] int32 (a frame's grid repeated t times)."""
    m = config.spatial_merge_size
    out = []
    for t, h, w in np.asarray(grid_thw).reshape(-1, 3).tolist():
        rc = np.stack(np.meshgrid(np.arange(h), np.arange(w), indexing="ij"), -1)  # [h, w, 2]
        rc = rc.reshape(h // m, m, w // m, m, 2).transpose(0, 2, 1, 3, 4).reshape(-1, 2)
        out.append(np.tile(rc, (t, 1)))
    return np.concatenate(out).astype(np.int32)


def vision_rope_cos_sin(positions: jax.Array, head_dim: int, theta: float):
    """2-D rotary tables of patch positions [..., 2] (row, col): cos, sin [..., Dh] float32.

    inv_freq_j = theta^(-2j / (Dh/2)), j < Dh/4; angles = [row * inv_freq, col * inv_freq],
    tables = [angles, angles] (HF `Qwen2VLVisionRotaryEmbedding`).
    """
    half = head_dim // 2
    inv_freq = 1.0 / theta ** (jnp.arange(0, half, 2, dtype=jnp.float32) / half)  # [Dh/4]
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [..., 2, Dh/4]
    angles = angles.reshape(*angles.shape[:-2], half)  # [row freqs | col freqs]
    angles = jnp.concatenate([angles, angles], axis=-1)  # [..., Dh]
    return jnp.cos(angles), jnp.sin(angles)


class _Attention(nn.Module):
    """Bidirectional multi-head self-attention within each image, fused qkv, 2-D RoPE on q, k.
    x [N, P, E], cos/sin [N or 1, P, Dh] -> [N, P, E]."""

    config: VisionConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, cos, sin):
        cfg = self.config
        n, p, e = x.shape
        dense = lambda f, name: nn.Dense(f, dtype=self.dtype, param_dtype=self.param_dtype,
                                         name=name)
        qkv = dense(3 * e, "qkv")(x).reshape(n, p, 3, cfg.n_heads, cfg.head_dim)  # HF's order
        # split by heads on a mesh (qkv's columns are split in one piece: models/sharding.py)
        q, k, v = (constrain(qkv[:, :, i], ("batch", None, "heads", None)) for i in range(3))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = jax.nn.dot_product_attention(q, k, v, scale=cfg.head_dim**-0.5)  # [N, P, H, Dh]
        return dense(e, "proj")(out.reshape(n, p, e))


class _MLP(nn.Module):
    """fc2(act(fc1(x))), act = `VisionConfig.hidden_act`. [N, P, E] -> [N, P, E]."""

    config: VisionConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        dense = lambda f, name: nn.Dense(f, dtype=self.dtype, param_dtype=self.param_dtype,
                                         name=name)
        h = _ACTIVATIONS[cfg.hidden_act](dense(cfg.embed_dim * cfg.mlp_ratio, "fc1")(x))
        return dense(cfg.embed_dim, "fc2")(h)


def _layer_norm(cfg: VisionConfig, dtype, param_dtype, name: str) -> nn.LayerNorm:
    """torch's LayerNorm (two-pass variance, eps `norm_eps`), scale and bias."""
    return nn.LayerNorm(cfg.norm_eps, dtype=dtype, param_dtype=param_dtype,
                        use_fast_variance=False, name=name)


class _Block(nn.Module):
    """Pre-LN ViT block: x + attn(norm1(x)), then + mlp(norm2(.)). [N, P, E] -> [N, P, E]."""

    config: VisionConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, cos, sin):
        cfg, dt, pdt = self.config, self.dtype, self.param_dtype
        x = x + _Attention(cfg, dt, pdt, name="attn")(_layer_norm(cfg, dt, pdt, "norm1")(x),
                                                      cos, sin)
        x = x + _MLP(cfg, dt, pdt, name="mlp")(_layer_norm(cfg, dt, pdt, "norm2")(x))
        return constrain(x, ("batch", None, None))  # residual: split by rows, as the LM's


class PatchMerger(nn.Module):
    """LayerNorm, then each m x m window's patches concatenated and mapped to the LM width:
    mlp_2(gelu(mlp_0(concat(ln_q(x))))). [N, P, E] -> [N, P / m^2, out_dim]."""

    config: VisionConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        n, p, e = x.shape
        wide = e * cfg.merge_tokens
        dense = lambda f, name: nn.Dense(f, dtype=self.dtype, param_dtype=self.param_dtype,
                                         name=name)
        x = _layer_norm(cfg, self.dtype, self.param_dtype, "ln_q")(x)
        x = x.reshape(n, p // cfg.merge_tokens, wide)  # a window's m^2 patches side by side
        return dense(cfg.out_dim, "mlp_2")(_ACTIVATIONS["gelu"](dense(wide, "mlp_0")(x)))


class VisionTower(nn.Module):
    """The image tower: patches [N, P, C*T*p*p] (`patchify`, one image per row, P a multiple of
    m^2) and their (row, col) positions [N, P, 2] or [P, 2] (`patch_positions`) -> LM tokens
    [N, P / m^2, out_dim] in `dtype`. See the module docstring for the equations.

    `remat` ("none" | "block" | "full", `LMConfig.remat`'s values and `jax.checkpoint` policies;
    `VisionLM` passes its config's) sets what the backward pass keeps of each block's forward
    (see `models.lm.Block`). `scan` (`VisionLM` passes `LMConfig.scanned`) runs the blocks as one
    `lax.scan` over their parameters stacked on the fly, so a compiled program holds one block;
    without it they are a Python loop. The parameter tree is the same either way (`blocks_{i}`,
    HF's names): the scan stacks the blocks' leaves at each call (a copy of the blocks'
    parameters, the gradient unstacked likewise). XLA may schedule a loop's recomputation early
    and keep it: XLA:CPU's memory estimate of a remat-ed loop (the LM's too) equals no remat's,
    while a scan's backward recomputes one block at a time; use `remat` with `scan`."""

    config: VisionConfig
    dtype: jnp.dtype = jnp.float32  # compute dtype
    param_dtype: jnp.dtype = jnp.float32
    remat: str = "none"
    scan: bool = False

    @nn.compact
    def __call__(self, patches: jax.Array, positions: jax.Array) -> jax.Array:
        cfg = self.config
        if patches.ndim != 3 or patches.shape[-1] != cfg.patch_dim:
            raise ValueError(f"patches must be [N, P, {cfg.patch_dim}] (C*T*p*p), got shape "
                             f"{patches.shape}")
        if patches.shape[1] % cfg.merge_tokens:
            raise ValueError(f"patches per image P={patches.shape[1]} is not a multiple of "
                             f"spatial_merge_size^2 = {cfg.merge_tokens}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"VisionTower.remat must be one of {list(REMAT_POLICIES)}, got "
                             f"{self.remat!r}")
        block = _Block if self.remat == "none" else nn.remat(
            _Block, policy=REMAT_POLICIES[self.remat], prevent_cse=True)  # a Python loop
        x = nn.Dense(cfg.embed_dim, use_bias=False, dtype=self.dtype,
                     param_dtype=self.param_dtype, name="patch_embed")(patches)  # [N, P, E]
        positions = positions.reshape(-1, *positions.shape[-2:])  # [N or 1, P, 2]
        cos, sin = vision_rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
        names = [f"blocks_{i}" for i in range(cfg.depth)]
        if self.scan and not self.is_initializing():  # the blocks' parameters exist: stack them
            stacked = jax.tree.map(lambda *xs: jnp.stack(xs),
                                   *(self.variables["params"][n] for n in names))
            apply = _Block(cfg, self.dtype, self.param_dtype, parent=None).apply

            def step(h, params):
                return apply({"params": params}, h, cos, sin), None

            if self.remat != "none":  # in a scan no CSE can merge the recomputation away
                step = jax.checkpoint(step, policy=REMAT_POLICIES[self.remat], prevent_cse=False)
            x, _ = jax.lax.scan(step, x, stacked)
        else:
            for name in names:
                x = block(cfg, self.dtype, self.param_dtype, name=name)(x, cos, sin)
        return PatchMerger(cfg, self.dtype, self.param_dtype, name="merger")(x).astype(self.dtype)


__all__ = [
    "CLIP_MEAN",
    "CLIP_STD",
    "PatchMerger",
    "VisionConfig",
    "VisionTower",
    "image_grid",
    "patch_positions",
    "patchify",
    "vision_rope_cos_sin",
]

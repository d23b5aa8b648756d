"""A vision-language model in Qwen2-VL's layout: `VisionTower` + the causal LM, M-RoPE positions.

Qwen2-VL (arXiv:2409.12191; HF `Qwen2VLForConditionalGeneration`). The prompt holds, for each
image, vision_start, then n = t h w / m^2 image tokens, then vision_end (Qwen2-VL's chat template;
`expand_image_tokens` turns one placeholder per image into its n tokens). The tower's outputs
replace the image tokens' embeddings, in order (as HF's `masked_scatter`, row by row):

    h_0[b, i] = tower(images of row b)[k]   for the k-th image token of row b
    h_0[b, i] = embed[tokens[b, i]]         otherwise

and the causal LM runs with M-RoPE (`LMConfig.mrope_section`) over positions (time, row, col)
[B, T, 3] from `mrope_positions`, a port of HF's `get_rope_index` for images: text tokens count
up on all three axes; an image starting at position s with LLM grid (t, h / m, w / m) puts its
token (i, j, k) at (s + i, s + j, s + k); the text after it continues from the image's max + 1.
A prompt's positions then end at max + 1 = T_real + rope_delta, so decoding continues at

    position of completion token j = T_real + j + rope_delta    (t = h = w)

`VisionLM` is `CausalLM` with the tower as the subtree `visual`: its parameter tree is the causal
LM's (so every view of the causal model, its sharding table and its HF mapping, serve it) plus
`visual`, and without images it is that causal LM. `models/hf.py` maps it to and from HF
`qwen2_vl` checkpoints.

Defaults (the studies' model): LM 4 x 128 with q/k/v biases (Qwen2) and mrope_section (4, 6, 6)
(Qwen2-VL's 16:24:24 of head_dim 128, for head_dim 32); tower `VisionConfig()`. Special ids on the
ByT5 tokenizer (vocab 384: pad 0, eos 1, bytes 3..258, extra ids 259..383; `DiffusionLM` uses 383
as its mask): vision_start 259, vision_end 260, image 261, video 262 (reserved).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.core.config import Count, NonNegativeInt
from jaxrl_suite.models.lm import CausalLM, KVCache, LMConfig
from jaxrl_suite.models.vision import VisionConfig, VisionTower, patch_positions, patchify


@dataclasses.dataclass(frozen=True)
class VLMConfig(LMConfig):
    """`LMConfig` of the language model (M-RoPE required), the tower's `VisionConfig` and the
    special token ids (HF `Qwen2VLConfig` names: image_token_id, video_token_id,
    vision_start_token_id, vision_end_token_id)."""

    qkv_bias: bool = True  # Qwen2's q/k/v biases
    mrope_section: tuple[Count, ...] | None = (4, 6, 6)  # (time, row, col); sums to head_dim // 2
    vision: VisionConfig = VisionConfig()  # the image tower; vision.out_dim == d_model
    image_token_id: NonNegativeInt = 261  # an image's placeholder tokens
    vision_start_id: NonNegativeInt = 259  # before an image's tokens
    vision_end_id: NonNegativeInt = 260  # after them
    video_token_id: NonNegativeInt = 262  # reserved (HF's config); videos are not supported yet

    def __post_init__(self):
        super().__post_init__()
        if self.mrope_section is None:
            raise ValueError("VLMConfig.mrope_section is null; image tokens need M-RoPE "
                             "(time, row, col), e.g. [4, 6, 6]")
        if not isinstance(self.vision, VisionConfig):
            raise ValueError(f"VLMConfig.vision must be a VisionConfig, got "
                             f"{type(self.vision).__name__}")
        if self.vision.out_dim != self.d_model:
            raise ValueError(f"VLMConfig.vision.out_dim={self.vision.out_dim} must equal "
                             f"d_model={self.d_model} (the merger feeds the LM)")
        ids = {n: getattr(self, n) for n in ("image_token_id", "vision_start_id",
                                              "vision_end_id", "video_token_id")}
        for name, i in ids.items():
            if i >= self.vocab_size:
                raise ValueError(f"VLMConfig.{name}={i} is outside the vocabulary "
                                 f"(vocab_size={self.vocab_size})")
        if len(set(ids.values())) < len(ids):
            raise ValueError(f"VLMConfig special ids must differ, got {ids}")


class VisionLM(CausalLM):
    """`CausalLM` with an image tower (`visual`) whose outputs replace the image tokens'
    embeddings; see the module docstring.

    `__call__(tokens, positions, key_mask, cache, cache_index, return_hidden, return_logits,
    patches=None, patch_positions=None, image_mask=None)`: as `CausalLM.__call__` (positions
    [B, T, 3] M-RoPE or [B, T] text), plus the images of the call, per row: patches
    [B, M, P, C*T*p*p] and patch_positions [B, M, P, 2] (`vision_inputs`): row b's k-th run of
    image tokens takes the tower's tokens of its image slot k (slots it does not use are
    padding and are ignored), so every array has a leading row axis and shards with the batch.
    image_mask [B, T] bool: the tokens that read image embeddings (default: every
    `image_token_id`; the sequence views of prompt + completion pass the prompt's, so a sampled
    image id stays text, as it was when it was sampled). Without patches it is the causal LM on
    tokens alone (a decode step). `init` without patches still creates the tower's parameters.
    """

    config: VLMConfig

    @nn.compact
    def __call__(self, tokens, positions=None, key_mask=None, cache: KVCache | None = None,
                 cache_index=None, return_hidden: bool = False, return_logits: bool = True,
                 patches: jax.Array | None = None, patch_positions: jax.Array | None = None,
                 image_mask: jax.Array | None = None):
        cfg = self.config
        vis = cfg.vision
        tower = VisionTower(vis, cfg.compute_dtype, cfg.param_jnp_dtype, cfg.remat, cfg.scanned,
                            name="visual")
        lm = lambda **kw: super(VisionLM, self).__call__(
            tokens, positions, key_mask, cache, cache_index, return_hidden, return_logits, **kw)
        if patches is None:
            if self.is_initializing():  # one merge window of zeros creates the tower's params
                tower(jnp.zeros((1, vis.merge_tokens, vis.patch_dim)),
                      jnp.zeros((vis.merge_tokens, 2), jnp.int32))
            return lm()
        b, m, p, d = patches.shape  # [B, M, P, C*T*p*p]: each row's image slots
        if b != tokens.shape[0]:
            raise ValueError(f"VisionLM: patches for {b} rows, tokens have {tokens.shape[0]}")
        image = tower(patches.reshape(b * m, p, d), patch_positions.reshape(b * m, p, 2))
        image = image.reshape(b, -1, cfg.d_model)  # [B, M * P / m^2, D]: the row's image tokens
        is_image = tokens == cfg.image_token_id if image_mask is None else image_mask  # [B, T]
        k = jnp.cumsum(is_image, axis=1, dtype=jnp.int32) - 1  # the row's k-th image token
        embeds = jnp.take_along_axis(image, jnp.clip(k, 0, image.shape[1] - 1)[..., None],
                                     axis=1)  # [B, T, D]
        return lm(input_embeds=embeds, embeds_mask=is_image)


# ---------------------------------------------------------------------------------------------
# host side: placeholders, M-RoPE positions, the images of a batch


def _tokens_per_image(grid, config: VLMConfig) -> int:
    t, h, w = (int(g) for g in grid)
    return t * h * w // config.vision.merge_tokens


def expand_image_tokens(ids, grids, config: VLMConfig) -> list[int]:
    """One prompt's ids with each single image placeholder (`image_token_id`, inside
    vision_start ... vision_end) repeated t h w / m^2 times, for the images' grids [n, 3] in
    order (HF's processor does this to `<|image_pad|>`). One-line error if the counts differ."""
    ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    grids = np.asarray(grids).reshape(-1, 3)
    slots = [i for i, t in enumerate(ids) if t == config.image_token_id]
    if len(slots) != len(grids):
        raise ValueError(f"expand_image_tokens: {len(slots)} image placeholders "
                         f"(id {config.image_token_id}) but {len(grids)} grids")
    out, start = [], 0
    for slot, grid in zip(slots, grids, strict=True):
        out += ids[start:slot] + [config.image_token_id] * _tokens_per_image(grid, config)
        start = slot + 1
    return out + ids[start:]


def mrope_positions(tokens, grids, config: VLMConfig, mask=None) -> tuple[np.ndarray, np.ndarray]:
    """M-RoPE positions of a batch with images (HF `Qwen2VLModel.get_rope_index`, images).

    tokens [B, T] (left-padded; mask [B, T] True on real tokens, default all), grids [N, 3]
    (t, h, w) of the N images in the order of the image-token runs, row by row. Each maximal run
    of image tokens is one image and must hold t h w / m^2 tokens. Per row, over its real
    tokens: text at p (all three axes), p += 1; an image at start s gets (s + i, s + j, s + k)
    for its LLM grid (i < t, j < h / m, k < w / m; row-major), then p = its max + 1. Padding
    gets 0. Returns (positions [B, T, 3] int32, rope_delta [B] int32 = max + 1 - T_real: the
    decode-position offset). A row without images gets the text positions and delta 0.
    """
    tokens = np.asarray(tokens)
    b, t = tokens.shape
    mask = np.ones((b, t), bool) if mask is None else np.asarray(mask).astype(bool)
    grids = np.asarray(grids, np.int64).reshape(-1, 3)
    m = config.vision.spatial_merge_size
    positions = np.zeros((b, t, 3), np.int32)
    delta = np.zeros(b, np.int32)
    n = 0  # images used so far
    for row in range(b):
        real = np.flatnonzero(mask[row])
        is_image = tokens[row, real] == config.image_token_id
        edges = np.flatnonzero(np.diff(is_image.astype(np.int8))) + 1
        pos, out = 0, []
        for seg in np.split(np.arange(len(real)), edges):
            if not len(seg):
                continue
            if not is_image[seg[0]]:
                out.append(np.repeat((pos + np.arange(len(seg)))[:, None], 3, axis=1))
                pos += len(seg)
                continue
            if n >= len(grids):
                raise ValueError(f"mrope_positions: row {row} has more image-token runs than "
                                 f"the {len(grids)} grids")
            gt, gh, gw = (int(g) for g in grids[n])
            if len(seg) != gt * gh * gw // m**2:
                raise ValueError(f"mrope_positions: row {row}, image {n}: a run of {len(seg)} "
                                 f"image tokens, but grid ({gt}, {gh}, {gw}) needs "
                                 f"{gt * gh * gw // m**2}")
            grid = np.stack(np.meshgrid(np.arange(gt), np.arange(gh // m), np.arange(gw // m),
                                        indexing="ij"), -1).reshape(-1, 3)
            out.append(pos + grid)
            pos = int(out[-1].max()) + 1
            n += 1
        if out:
            row_pos = np.concatenate(out)
            positions[row, real] = row_pos
            delta[row] = row_pos.max() + 1 - len(real)
    if n != len(grids):
        raise ValueError(f"mrope_positions: {len(grids)} grids but {n} image-token runs in tokens")
    return positions, delta


class VisionInputs(NamedTuple):
    """The images of a batch of prompts, as the jitted model takes them (`vision_inputs`); every
    leaf has a leading row axis, so the batch shards and repeats (a GRPO group) as one pytree."""

    patches: np.ndarray  # [B, M, P, C*T*p*p] float32: row b's image slots (`patchify`; unused 0)
    patch_positions: np.ndarray  # [B, M, P, 2] int32 (row, col), merge-window order
    positions: np.ndarray  # [B, T, 3] int32 M-RoPE positions of the tokens (`mrope_positions`)
    rope_delta: np.ndarray  # [B] int32: decode position = T_real + j + rope_delta


def _image_runs(tokens: np.ndarray, mask: np.ndarray, config: VLMConfig) -> np.ndarray:
    """[B]: the number of maximal runs of image tokens among each row's real tokens."""
    is_image = (tokens == config.image_token_id) & mask
    starts = is_image & ~np.pad(is_image, ((0, 0), (1, 0)))[:, :-1]
    return starts.sum(axis=1)


def vision_inputs(images, tokens, mask, config: VLMConfig, *,
                  max_images: int | None = None) -> VisionInputs:
    """Prepare the images of left-padded tokens [B, T] (mask [B, T]; None = all real) on the
    host, in the per-row layout `VisionLM` takes.

    images: uint8 / float [N, H, W, C] or a list per row (an array [H, W, C] or [n, H, W, C],
    or a list of them; `patchify`), in the order of the image-token runs of `tokens`, row by
    row. Row b's images fill its slots 0, 1, ... of M = max_images (default: the most any row
    holds); the other slots are zeros that no token reads, so a fixed M gives every batch one
    shape. All images of one call have one size (the tower batches them; resize on the host
    first). The same function serves a prompt and a whole [prompt | completion] sequence: text
    after the prompt continues at T_real + j + rope_delta either way (as long as the completion
    holds no `image_token_id`, which would read as an image run).
    """
    tokens = np.asarray(tokens)
    mask = np.ones(tokens.shape, bool) if mask is None else np.asarray(mask).astype(bool)
    flat, grids = patchify(images, config.vision)
    if len({tuple(g) for g in grids.tolist()}) > 1:
        sizes = sorted({f"{h * config.vision.patch_size}x{w * config.vision.patch_size}"
                        for _, h, w in grids.tolist()})
        raise ValueError(f"images of one call must share one size, got {', '.join(sizes)}")
    positions, delta = mrope_positions(tokens, grids, config, mask)  # checks the counts
    counts = _image_runs(tokens, mask, config)
    m = int(counts.max(initial=0)) if max_images is None else max_images
    if counts.max(initial=0) > m:
        raise ValueError(f"vision_inputs: a row holds {counts.max()} images, max_images={m}")
    n, b = len(grids), len(tokens)
    per_image = flat.reshape(n, -1, config.vision.patch_dim)
    patches = np.zeros((b, max(m, 1), *per_image.shape[1:]), np.float32)
    slot_rows = np.repeat(np.arange(b), counts)  # the row of each image, in order
    slot = np.arange(n) - np.repeat(np.cumsum(counts) - counts, counts)
    patches[slot_rows, slot] = per_image
    pos = patch_positions(grids[:1], config.vision)  # one size: every image's positions
    return VisionInputs(patches, np.broadcast_to(pos, (*patches.shape[:3], 2)).copy(),
                        positions, delta)


__all__ = [
    "VLMConfig",
    "VisionInputs",
    "VisionLM",
    "expand_image_tokens",
    "mrope_positions",
    "vision_inputs",
]

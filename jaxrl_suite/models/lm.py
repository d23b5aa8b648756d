"""Decoder-only causal language model with a KV cache (Llama/Qwen2 architecture).

Pre-norm transformer: RMSNorm, rotary position embeddings (RoPE, rotate-half convention as in HF
Llama), grouped-query attention (GQA) and a SwiGLU MLP, with optional tied embeddings.

    h_0 = embed[tokens]
    a_l = h_{l-1} + Attn(RMSNorm(h_{l-1}))           Attn uses RoPE on q, k (Qwen3: after a
                                                     per-head RMSNorm of q and k)
    h_l = a_l + W_down (silu(W_gate x) * W_up x),    x = RMSNorm(a_l)
    logits = RMSNorm(h_L) @ embed.T                  (or @ lm_head when untied)

Papers: Llama (arXiv:2302.13971), RoFormer/RoPE (arXiv:2104.09864), GQA (arXiv:2305.13245),
SwiGLU (arXiv:2002.05202), RMSNorm (arXiv:1910.07467).

With `LMConfig.mrope_section` the rotary frequencies are split into (time, row, col) parts that
rotate by positions [B, T, 3] (Qwen2-VL's M-RoPE, arXiv:2409.12191; `rope_cos_sin`); text tokens
have t = h = w and get exactly 1-D RoPE. `CausalLM` can take input embeddings at chosen positions
(`input_embeds`, `embeds_mask`) in place of the token embeddings: `models.vlm.VisionLM` puts its
image tokens there.

The parameter tree maps one-to-one onto HF Llama/Qwen2/Qwen3 checkpoints (`models/hf.py` loads
and saves them; Dense kernels are the transposed HF `weight`s):

    embed/embedding                          model.embed_tokens.weight
    layer_{i}/attn_norm/scale                model.layers.{i}.input_layernorm.weight
    layer_{i}/attn/{q,k,v,o}/kernel (+bias)  model.layers.{i}.self_attn.{q,k,v,o}_proj
    layer_{i}/attn/{q,k}_norm/scale          model.layers.{i}.self_attn.{q,k}_norm.weight (Qwen3)
    layer_{i}/mlp_norm/scale                 model.layers.{i}.post_attention_layernorm.weight
    layer_{i}/mlp/{gate,up,down}/kernel      model.layers.{i}.mlp.{gate,up,down}_proj
    final_norm/scale                         model.norm.weight
    lm_head/kernel                           lm_head.weight (untied only)

With `LMConfig.scan_layers` (on by default from 8 layers) the blocks run as one `nn.scan` and the
L per-layer subtrees become one subtree `layers` whose leaves carry a leading layer axis:

    layers/attn/q/kernel        [L, D, N*Dh]     = stack of layer_{i}/attn/q/kernel
    layers/attn_norm/scale      [L, D]           (every layer_{i} leaf likewise)

`stack_layers` / `unstack_layers` convert between the two trees (`models/hf.py` maps HF names to
either). Parameters are created in `LMConfig.param_dtype` (float32 master weights by default) and
computed with in `LMConfig.dtype`. `LMConfig.remat` rematerialises each block in the backward pass
(`Block` defines the policies). Attention is `jax.nn.dot_product_attention`, with the
implementation `LMConfig.attention_impl` (JAX's default, XLA; or "cudnn" flash attention on an
NVIDIA GPU; see `Attention`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxrl_suite.core.config import Count, Positive, check_fields
from jaxrl_suite.models.sharding import constrain

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# LMConfig.remat -> the `jax.checkpoint` policy of each block (see `Block`).
REMAT_POLICIES = {
    "none": None,
    "block": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "full": jax.checkpoint_policies.nothing_saveable,
}
SCAN_LAYERS_FROM = 8  # scan_layers=None scans the layers of models with at least this many


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """Sizes and options of `CausalLM`."""

    vocab_size: Count = 384  # ByT5 byte tokenizer size
    d_model: Count = 128  # residual stream width
    n_layers: Count = 4  # number of transformer blocks
    n_heads: Count = 4  # query heads
    n_kv_heads: Count = 4  # key/value heads; GQA when < n_heads; must divide n_heads
    d_ff: Count = 512  # SwiGLU hidden size
    max_len: Count = 512  # max positions (RoPE is computed on the fly; this bounds cache sizes)
    rope_theta: Positive = 10000.0  # RoPE base frequency
    tie_embeddings: bool = True  # logits = h @ embed.T instead of a separate lm_head
    norm_eps: Positive = 1e-6  # RMSNorm epsilon
    dtype: str = "float32"  # compute dtype ("float32" | "bfloat16")
    head_dim: Count | None = None  # per-head width (even, for RoPE); default d_model // n_heads
    qkv_bias: bool = False  # Qwen2-style bias on the q/k/v projections
    qk_norm: bool = False  # Qwen3-style RMSNorm of each query/key head (over Dh) before RoPE
    param_dtype: str = "float32"  # dtype every parameter is created and stored in
    remat: str = "none"  # "none" | "block" | "full": what a block keeps for backward (`Block`)
    scan_layers: bool | None = None  # nn.scan over the blocks; None: on when n_layers >= 8
    # jax.nn.dot_product_attention's implementation: None (JAX's choice: XLA in JAX 0.10 on every
    # backend), "xla", or "cudnn" (cuDNN flash attention; NVIDIA GPUs, bf16/fp16 compute only)
    attention_impl: str | None = None
    # M-RoPE (Qwen2-VL): the head_dim // 2 rotary frequencies split into (time, row, col) parts,
    # each rotated by its own axis of positions [B, T, 3]; None = 1-D RoPE (`rope_cos_sin`)
    mrope_section: tuple[Count, ...] | None = None

    def __post_init__(self):
        # The Ranges declared above (a subclass's fields too: `models.hf.ModelConfig`, the
        # experiments' `model` section).
        check_fields(self, "model.")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"LMConfig.n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}"
            )
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(
                f"LMConfig.head_dim is None, so n_heads={self.n_heads} must divide "
                f"d_model={self.d_model}"
            )
        if self.head_dim is not None and self.head_dim % 2:
            raise ValueError(f"LMConfig.head_dim must be even (RoPE), got {self.head_dim}")
        if self.head_dim is None and (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"LMConfig.head_dim (d_model // n_heads = {self.d_model // self.n_heads}) "
                "must be even for RoPE"
            )
        if self.dtype not in _DTYPES:
            raise ValueError(f"LMConfig.dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.param_dtype not in _DTYPES:
            raise ValueError(f"LMConfig.param_dtype must be one of {sorted(_DTYPES)}, got "
                             f"{self.param_dtype!r}")
        if self.attention_impl not in (None, "xla", "cudnn"):
            raise ValueError(f"LMConfig.attention_impl must be null, 'xla' or 'cudnn', got "
                             f"{self.attention_impl!r}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"LMConfig.remat must be one of {list(REMAT_POLICIES)}, got "
                             f"{self.remat!r}")
        if self.scan_layers not in (None, True, False):
            raise ValueError(f"LMConfig.scan_layers must be true, false or null, got "
                             f"{self.scan_layers!r}")
        if self.mrope_section is not None:
            object.__setattr__(self, "mrope_section", tuple(self.mrope_section))  # hashable
            half = self.resolved_head_dim // 2
            if len(self.mrope_section) != 3 or sum(self.mrope_section) != half:
                raise ValueError(f"LMConfig.mrope_section={list(self.mrope_section)} must be 3 "
                                 f"parts (time, row, col) summing to head_dim // 2 = {half}")

    @property
    def resolved_head_dim(self) -> int:
        """Per-head width: `head_dim`, or d_model // n_heads when None."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def compute_dtype(self):
        """The jnp dtype named by `dtype`."""
        return _DTYPES[self.dtype]

    @property
    def param_jnp_dtype(self):
        """The jnp dtype named by `param_dtype`."""
        return _DTYPES[self.param_dtype]

    @property
    def scanned(self) -> bool:
        """Whether the blocks run as one `nn.scan` (`scan_layers`, or n_layers >= 8 when None)."""
        if self.scan_layers is None:
            return self.n_layers >= SCAN_LAYERS_FROM
        return bool(self.scan_layers)


class KVCache(NamedTuple):
    """Key/value cache, K kv heads, S slots, Dh head dim, in one of two layouts:

    unrolled model: k, v are tuples of L arrays [B, K, S, Dh], one per layer. Two layout choices
      keep decoding fast on CPU: per-layer arrays (a layer slice of a stacked [L, ...] array is
      copied before every attention matmul), and heads before slots (a [B, S, K, Dh] layout is
      transposed, i.e. copied, for the matmul). `jnp.stack(cache.k)` gives the stacked view.
    scanned model (`LMConfig.scanned`): k, v are single arrays [L, B, K, S, Dh], carried through
      the layer scan; layer l writes and reads slice l.
    """

    k: tuple[jax.Array, ...] | jax.Array
    v: tuple[jax.Array, ...] | jax.Array

    @property
    def cache_len(self) -> int:
        """Number of slots S."""
        return (self.k[0] if isinstance(self.k, tuple | list) else self.k).shape[-2]


def init_cache(config: LMConfig, batch_size: int, cache_len: int, dtype=jnp.float32) -> KVCache:
    """Return a zero `KVCache` with S = cache_len slots: L arrays [B, K, S, Dh] each for k and v,
    or one [L, B, K, S, Dh] array each when `config.scanned`."""
    if cache_len > config.max_len:
        raise ValueError(f"cache_len={cache_len} exceeds LMConfig.max_len={config.max_len}")
    shape = (batch_size, config.n_kv_heads, cache_len, config.resolved_head_dim)
    names = ("batch", "kv_heads", None, None)  # rows over the batch axes, kv heads over tensor
    if config.scanned:
        zeros = lambda: constrain(jnp.zeros((config.n_layers, *shape), dtype), (None, *names))
    else:
        zeros = lambda: tuple(constrain(jnp.zeros(shape, dtype), names)
                              for _ in range(config.n_layers))
    return KVCache(k=zeros(), v=zeros())


def _stack(*xs):
    """np.stack for numpy leaves (a loaded checkpoint stays on the host), else jnp.stack."""
    if all(isinstance(x, np.ndarray) for x in xs):
        return np.stack(xs)
    return jnp.stack(xs)


def stack_layers(params, n_layers: int):
    """The scanned tree of an unrolled one: in every mapping of `params` (`{"params": ...}`, the
    inner tree, or any tree holding it) the subtrees layer_0..layer_{L-1} become one subtree
    `layers` whose leaves are the L layer leaves stacked on a new leading axis."""
    if not isinstance(params, Mapping):
        return params
    names = [f"layer_{i}" for i in range(n_layers)]
    if all(n in params for n in names):
        out = {k: v for k, v in params.items() if k not in names}
        out["layers"] = jax.tree.map(_stack, *(params[n] for n in names))
        return out
    return {k: stack_layers(v, n_layers) for k, v in params.items()}


def unstack_layers(params, n_layers: int):
    """The unrolled tree of a scanned one (inverse of `stack_layers`): every `layers` subtree
    with a leading axis of size L becomes layer_0..layer_{L-1}."""
    if not isinstance(params, Mapping):
        return params
    if "layers" in params:
        layers = params["layers"]
        sizes = {x.shape[0] for x in jax.tree.leaves(layers)}
        if sizes != {n_layers}:
            raise ValueError(f"params 'layers' have leading sizes {sorted(sizes)}, but "
                             f"LMConfig.n_layers={n_layers}")
        out = {k: v for k, v in params.items() if k != "layers"}
        for i in range(n_layers):
            out[f"layer_{i}"] = jax.tree.map(lambda x, i=i: x[i], layers)
        return out
    return {k: unstack_layers(v, n_layers) for k, v in params.items()}


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """RMSNorm: x / sqrt(mean(x^2) + eps) * scale, computed in float32, returned in x.dtype.

    x: [..., D]; scale: [D]. Returns [..., D].
    """
    x32 = x.astype(jnp.float32)
    y = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return y.astype(x.dtype) * scale.astype(x.dtype)


def rope_cos_sin(positions: jax.Array, head_dim: int, theta: float,
                 mrope_section: tuple[int, ...] | None = None) -> tuple[jax.Array, jax.Array]:
    """Rotary tables for integer positions [B, T]; returns cos, sin of shape [B, T, Dh] float32.

    inv_freq_i = theta^(-2i/Dh), angle = pos * inv_freq, tables = [angle, angle] (HF Llama).

    M-RoPE (Qwen2-VL, arXiv:2409.12191; HF `Qwen2VLRotaryEmbedding`), with mrope_section
    (s_t, s_h, s_w), s_t + s_h + s_w = Dh/2, and positions [B, T, 3] (time, row, col):
    frequency i takes its angle from axis a(i), the part of the section that i falls in,

        angle_i = pos[a(i)] * inv_freq_i,   a(i) = 0 for i < s_t, 1 for i < s_t + s_h, else 2.

    Positions [B, T] mean t = h = w (text), and then the tables are bit-identical to 1-D RoPE's.
    """
    inv_freq = 1.0 / theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    if mrope_section is None or positions.ndim == 2:
        angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, Dh/2]
    else:
        axis = np.repeat(np.arange(len(mrope_section)), mrope_section)  # [Dh/2] a(i)
        angles = positions[..., axis].astype(jnp.float32) * inv_freq  # [B, T, Dh/2]
    angles = jnp.concatenate([angles, angles], axis=-1)  # [B, T, Dh]
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate-half RoPE: x * cos + rotate_half(x) * sin, rotate_half([a, b]) = [-b, a].

    x: [B, T, H, Dh]; cos, sin: [B, T, Dh]. Returns [B, T, H, Dh] in x.dtype.
    """
    half = x.shape[-1] // 2
    x32 = x.astype(jnp.float32)
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos[:, :, None, :] + rotated * sin[:, :, None, :]).astype(x.dtype)


class RMSNorm(nn.Module):
    """RMSNorm with a learned scale (initialised to ones). [..., D] -> [..., D]."""

    eps: float = 1e-6
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.param_dtype)
        return rms_norm(x, scale, self.eps)


def _dense(cfg: LMConfig, features: int, name: str, bias: bool):
    """A projection x -> x W (+ b) in the compute dtype. The output is cast to it, so a LoRA
    adapter (`models.lora`, whose float32 delta qwix adds to the product) keeps a bf16 model's
    activations in bf16 (and a scanned model's carry in one dtype)."""
    layer = nn.Dense(features, use_bias=bias, dtype=cfg.compute_dtype,
                     param_dtype=cfg.param_jnp_dtype, name=name)
    return lambda x: layer(x).astype(cfg.compute_dtype)


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE and an optional KV cache.

    out = o(concat_n softmax(q_n k_{g(n)}^T / sqrt(Dh) masked) v_{g(n)}), query head n reading
    kv head g(n) = n // (N / K), through `jax.nn.dot_product_attention` with implementation
    `config.attention_impl` (None, JAX's default, is XLA on every backend in JAX 0.10; "cudnn"
    asks for cuDNN flash attention, which needs a GPU and bf16/fp16 compute). A masked score is the
    finite -0.7 * float32 max, so a query row with every key masked (a padding query of a
    left-padded prompt) gets a uniform softmax: finite outputs that nothing downstream uses.
    """

    config: LMConfig

    @nn.compact
    def __call__(self, x, cos, sin, mask, kv=None, cache_index=None, layer=None):
        """Attend; x [B, T, D], cos/sin [B, T, Dh], mask bool broadcastable to [B, 1, T, S].

        Without a cache (kv None), S = T and keys are this call's tokens. With kv = (k, v), this
        layer's cache buffers [B, K, S, Dh] (or, with `layer` an int32 index, the stacked
        buffers [L, B, K, S, Dh] of which slice `layer` is this layer's), the new k, v are
        written at slots cache_index..cache_index+T-1 and the queries attend over all S slots;
        cache_index is an int32 scalar shared by the rows, or a vector [B] with one start slot
        per row.
        Returns (out [B, T, D], the updated (k, v) or None).
        """
        cfg = self.config
        dtype = cfg.compute_dtype
        b, t, _ = x.shape
        nh, nk, hd = cfg.n_heads, cfg.n_kv_heads, cfg.resolved_head_dim
        dense = lambda n, name, bias: _dense(cfg, n, name, bias)
        q = dense(nh * hd, "q", cfg.qkv_bias)(x).reshape(b, t, nh, hd)
        k = dense(nk * hd, "k", cfg.qkv_bias)(x).reshape(b, t, nk, hd)
        if cfg.qk_norm:  # Qwen3: per-head RMSNorm over Dh, one scale per norm shared by heads
            q = RMSNorm(cfg.norm_eps, cfg.param_jnp_dtype, name="q_norm")(q)
            k = RMSNorm(cfg.norm_eps, cfg.param_jnp_dtype, name="k_norm")(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        v = dense(nk * hd, "v", cfg.qkv_bias)(x).reshape(b, t, nk, hd)  # [B, T, K, Dh]
        if kv is not None:
            lead = () if layer is None else (layer,)  # the stacked cache's layer axis
            if jnp.ndim(cache_index) == 0:
                write = lambda buf, new: lax.dynamic_update_slice(
                    buf, new.reshape((1,) * len(lead) + new.shape).astype(buf.dtype),
                    (*lead, 0, 0, cache_index, 0),
                )
            else:  # row b at slots cache_index[b]..+T-1 (one scatter; start clamped like above)
                write = lambda buf, new: jax.vmap(
                    lambda row, upd, i: lax.dynamic_update_slice(
                        row, upd.reshape((1,) * len(lead) + upd.shape),
                        (*lead, 0, i, 0)),
                    in_axes=(len(lead), 0, 0), out_axes=len(lead),
                )(buf, new.astype(buf.dtype), cache_index)
            kv = (write(kv[0], k.transpose(0, 2, 1, 3)), write(kv[1], v.transpose(0, 2, 1, 3)))
            read = (lambda buf: buf) if layer is None else (
                lambda buf: lax.dynamic_index_in_dim(buf, layer, 0, keepdims=False))
            # [B, K, S, Dh] -> [B, S, K, Dh]: XLA folds this transpose into the score matmul
            k, v = (read(buf).astype(dtype).transpose(0, 2, 1, 3) for buf in kv)
        out = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=hd**-0.5,
                                           implementation=cfg.attention_impl)  # [B, T, N, Dh]
        return dense(cfg.d_model, "o", False)(out.reshape(b, t, nh * hd)), kv


class MLP(nn.Module):
    """SwiGLU MLP: down(silu(gate(x)) * up(x)). [B, T, D] -> [B, T, D]."""

    config: LMConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        dense = lambda n, name: _dense(cfg, n, name, False)
        hidden = nn.silu(dense(cfg.d_ff, "gate")(x)) * dense(cfg.d_ff, "up")(x)  # [B, T, F]
        return dense(cfg.d_model, "down")(hidden)


class Block(nn.Module):
    """Pre-norm transformer block: h + attn(norm(h)), then + mlp(norm(.)).

    `LMConfig.remat` sets what the backward pass keeps of a block's forward (`block_class`):
      none   everything autodiff saves (no recomputation);
      block  only the outputs of matmuls without batch dimensions (q, k, v, o, gate, up, down:
             `jax.checkpoint_policies.dots_with_no_batch_dims_saveable`); norms, RoPE, the
             attention scores and probabilities and the SwiGLU product are recomputed;
      full   nothing but the block's inputs (`nothing_saveable`): the whole block is recomputed.
    """

    config: LMConfig

    @nn.compact
    def __call__(self, carry, layer, cos, sin, mask, cache_index):
        """carry = (h [B, T, D], kv) -> ((h, kv), None); see `Attention` for the other
        arguments. kv is this layer's cache (k, v), or the stacked cache of every layer when
        `layer` (an int32 index, the xs of `nn.scan`) is given. The (carry, xs) -> (carry, ys)
        form is the one `nn.scan` needs."""
        cfg = self.config
        h, kv = carry
        norm = lambda name: RMSNorm(cfg.norm_eps, cfg.param_jnp_dtype, name=name)
        a, kv = Attention(cfg, name="attn")(norm("attn_norm")(h), cos, sin, mask, kv,
                                            cache_index, layer)
        h = h + a
        h = h + MLP(cfg, name="mlp")(norm("mlp_norm")(h))
        return (constrain(h, ("batch", None, None)), kv), None  # residual: split by rows


def block_class(config: LMConfig):
    """`Block`, wrapped in `nn.remat` with the policy of `config.remat` unless it is "none"."""
    policy = REMAT_POLICIES[config.remat]
    if config.remat == "none":
        return Block
    # prevent_cse guards remat against XLA's CSE; inside a scan it is not needed and costs speed.
    return nn.remat(Block, policy=policy, prevent_cse=not config.scanned)


def _scan_blocks(config: LMConfig):
    """The L blocks as one `nn.scan` over the layer index (the xs): the carry is (h, stacked
    cache (k, v) [L, ...]), layer l writing and reading its slice in place, and the parameters
    get a leading layer axis (tree `layers`). Carrying the cache rather than scanning it as
    xs/ys saves two copies of the whole cache per call: 2.3x faster decoding (4 x 128 model,
    B = 64, 2-core CPU)."""
    return nn.scan(
        block_class(config),
        variable_axes={"params": 0},
        split_rngs={"params": True},
        in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast),
        length=config.n_layers,
    )


class CausalLM(nn.Module):
    """Decoder-only causal LM (Llama/Qwen2 style) with an optional KV cache.

    `causal` (a class attribute) is the attention pattern of a full forward: each query sees
    the keys at or before it. `models.diffusion_lm.DiffusionLM` subclasses this module with
    causal False (every query sees every real key), so both share every block and parameter."""

    config: LMConfig
    causal = True  # not a field: a subclass sets it

    @nn.compact
    def __call__(
        self,
        tokens: jax.Array,
        positions: jax.Array | None = None,
        key_mask: jax.Array | None = None,
        cache: KVCache | None = None,
        cache_index: jax.Array | int | None = None,
        return_hidden: bool = False,
        return_logits: bool = True,
        input_embeds: jax.Array | None = None,
        embeds_mask: jax.Array | None = None,
    ):
        """Run the model on tokens [B, T] int32.

        Full forward (cache None): positions [B, T] (default arange(T)), key_mask [B, T] bool
        (False = padding key, never attended to); causal mask over the T tokens. With
        `LMConfig.mrope_section`, positions may be [B, T, 3] (time, row, col; `rope_cos_sin`'s
        M-RoPE); [B, T] ones are text, t = h = w.
        Cached (cache a `KVCache` with S slots): the tokens are written at cache slots
        cache_index..cache_index+T-1, key_mask is [B, S] over the slots (default all True), and
        the query in slot i attends to slots j <= i with key_mask[j]. Positions default to
        cache_index + arange(T). cache_index is an int32 scalar shared by all rows, or a vector
        [B] of per-row start slots, so that rows of one batch sit at different places (a
        refilled row of continuous batching, rows of speculative decoding that accepted
        different numbers of draft tokens); the caller keeps cache_index + T <= S. T > 1 with a
        cache is a multi-token cached call (a prefill, or the verification of T draft tokens).

        Returns (logits [B, T, V] float32, new cache or None), plus the final-normed hidden
        states [B, T, D] as a third element when return_hidden. With return_logits False
        (and return_hidden) the [B, T, V] logits are never formed and the first element is None:
        project the hidden states yourself (`output_projection`, `losses.chunked`). Initialise
        params with the default True (an untied lm_head is created where it is used).

        input_embeds [B, T, D] with embeds_mask [B, T] bool replace the token embeddings where
        the mask is True (a vision-language model's image embeddings at its placeholder tokens,
        `models.vlm.VisionLM`): h_0[b, t] = input_embeds[b, t] if embeds_mask[b, t] else
        embed[tokens[b, t]].
        """
        cfg = self.config
        dtype = cfg.compute_dtype
        b, t = tokens.shape
        q_slots = jnp.arange(t, dtype=jnp.int32)  # [T]
        if cache is None:
            k_slots = q_slots
            cache_index = None
        else:
            if cache_index is None:
                raise ValueError("cache_index is required when a cache is given")
            cache_index = jnp.asarray(cache_index, jnp.int32)
            if cache_index.ndim == 0:
                q_slots = q_slots + cache_index  # [T]
            elif cache_index.shape == (b,):
                q_slots = cache_index[:, None] + q_slots  # [B, T], one start slot per row
            else:
                raise ValueError(
                    f"cache_index must be a scalar or have shape (B,) = ({b},), got shape "
                    f"{cache_index.shape}"
                )
            k_slots = jnp.arange(cache.cache_len, dtype=jnp.int32)  # [S]
        if positions is None:
            positions = jnp.broadcast_to(q_slots, (b, t))
        if positions.ndim == 3 and cfg.mrope_section is None:
            raise ValueError(f"positions of shape {positions.shape} (M-RoPE) need "
                             "LMConfig.mrope_section")
        mask = k_slots <= q_slots[..., None]  # [T, S] or [B, T, S] causal
        if not self.causal:
            if cache is not None:
                raise ValueError(f"{type(self).__name__} is bidirectional: it has no KV cache")
            mask = jnp.ones_like(mask)  # every query sees every (real) key
        mask = mask.reshape(-1, 1, *mask.shape[-2:])  # [1 or B, 1, T, S]
        if key_mask is not None:
            mask = mask & key_mask.astype(bool)[:, None, None, :]  # [B, 1, T, S]

        cos, sin = rope_cos_sin(positions, cfg.resolved_head_dim, cfg.rope_theta,
                                cfg.mrope_section)
        embed = nn.Embed(
            cfg.vocab_size,
            cfg.d_model,
            dtype=dtype,
            param_dtype=cfg.param_jnp_dtype,
            embedding_init=nn.initializers.normal(stddev=0.02),
            name="embed",
        )
        residual = ("batch", None, None)  # the residual stream is split by rows only
        # The table's d_model shards (FSDP) are gathered where the table is used; its vocab rows
        # stay split over tensor (a vocab-parallel lookup and, when tied, vocab-parallel logits).
        table = constrain(embed.embedding, ("vocab", None)).astype(dtype)  # [V, D]
        h = jnp.take(table, tokens, axis=0)  # [B, T, D], as nn.Embed
        if input_embeds is not None:
            h = jnp.where(embeds_mask[..., None], input_embeds.astype(dtype), h)
        h = constrain(h, residual)
        if cfg.scanned:  # one scanned block; the stacked cache rides in the carry
            kv = None if cache is None else (cache.k, cache.v)
            layers = jnp.arange(cfg.n_layers, dtype=jnp.int32)
            (h, kv), _ = _scan_blocks(cfg)(cfg, name="layers")((h, kv), layers, cos, sin, mask,
                                                               cache_index)
            cache = None if cache is None else KVCache(*kv)
        else:  # L blocks; the per-layer cache tuple is threaded through them
            block, new = block_class(cfg), []
            for i in range(cfg.n_layers):
                kv = None if cache is None else (cache.k[i], cache.v[i])
                (h, kv), _ = block(cfg, name=f"layer_{i}")((h, kv), None, cos, sin, mask,
                                                           cache_index)
                new.append(kv)
            cache = None if cache is None else KVCache(*map(tuple, zip(*new, strict=True)))
        h = RMSNorm(cfg.norm_eps, cfg.param_jnp_dtype, name="final_norm")(h)
        if not return_logits:
            return None, cache, h
        if cfg.tie_embeddings:
            logits = jnp.dot(h, table.T)  # as nn.Embed.attend
        else:
            logits = nn.Dense(
                cfg.vocab_size,
                use_bias=False,
                dtype=dtype,
                param_dtype=cfg.param_jnp_dtype,
                name="lm_head",
            )(h)
        logits = logits.astype(jnp.float32)  # [B, T, V]
        if return_hidden:
            return logits, cache, h
        return logits, cache


def output_projection(params, config: LMConfig) -> tuple[jax.Array, bool]:
    """The output projection W of a `CausalLM` params tree: (W, transpose_weight).

        logits = h @ W.T   (tied: W = params['params']['embed']['embedding'] [V, D], True)
        logits = h @ W     (untied: W = params['params']['lm_head']['kernel'] [D, V], False)

    as `losses.chunked.project_logits(h, W, transpose_weight=...)` takes it."""
    p = params["params"]
    if config.tie_embeddings:
        return p["embed"]["embedding"], True
    return p["lm_head"]["kernel"], False


__all__ = [
    "CausalLM",
    "KVCache",
    "LMConfig",
    "REMAT_POLICIES",
    "apply_rope",
    "init_cache",
    "output_projection",
    "rms_norm",
    "rope_cos_sin",
    "stack_layers",
    "unstack_layers",
]

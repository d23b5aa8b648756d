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
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from jaxrl_suite.models.sharding import constrain

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# Finite "minus infinity": a fully masked row gives a uniform softmax instead of NaN.
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """Sizes and options of `CausalLM`."""

    vocab_size: int = 384  # ByT5 byte tokenizer size
    d_model: int = 128  # residual stream width
    n_layers: int = 4  # number of transformer blocks
    n_heads: int = 4  # query heads
    n_kv_heads: int = 4  # key/value heads; GQA when < n_heads; must divide n_heads
    d_ff: int = 512  # SwiGLU hidden size
    max_len: int = 512  # max positions (RoPE is computed on the fly; this bounds cache sizes)
    rope_theta: float = 10000.0  # RoPE base frequency
    tie_embeddings: bool = True  # logits = h @ embed.T instead of a separate lm_head
    norm_eps: float = 1e-6  # RMSNorm epsilon
    dtype: str = "float32"  # compute dtype ("float32" | "bfloat16"); params stay float32
    head_dim: int | None = None  # per-head width; default d_model // n_heads
    qkv_bias: bool = False  # Qwen2-style bias on the q/k/v projections
    qk_norm: bool = False  # Qwen3-style RMSNorm of each query/key head (over Dh) before RoPE

    def __post_init__(self):
        for name in (
            "vocab_size",
            "d_model",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "d_ff",
            "max_len",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"LMConfig.{name} must be positive, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"LMConfig.n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}"
            )
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(
                f"LMConfig.head_dim is None, so n_heads={self.n_heads} must divide "
                f"d_model={self.d_model}"
            )
        if self.head_dim is not None and (self.head_dim <= 0 or self.head_dim % 2):
            raise ValueError(f"LMConfig.head_dim must be positive and even, got {self.head_dim}")
        if self.head_dim is None and (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"LMConfig.head_dim (d_model // n_heads = {self.d_model // self.n_heads}) "
                "must be even for RoPE"
            )
        if self.rope_theta <= 0:
            raise ValueError(f"LMConfig.rope_theta must be positive, got {self.rope_theta}")
        if self.norm_eps <= 0:
            raise ValueError(f"LMConfig.norm_eps must be positive, got {self.norm_eps}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"LMConfig.dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")

    @property
    def resolved_head_dim(self) -> int:
        """Per-head width: `head_dim`, or d_model // n_heads when None."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def compute_dtype(self):
        """The jnp dtype named by `dtype`."""
        return _DTYPES[self.dtype]


class KVCache(NamedTuple):
    """Key/value cache: one [B, K, S, Dh] array per layer (K kv heads, S slots, Dh head dim).

    k, v: tuples of L arrays. Two layout choices keep decoding fast on CPU: per-layer arrays
    (a layer slice of a stacked [L, ...] array is copied before every attention matmul), and
    heads before slots (a [B, S, K, Dh] layout is transposed, i.e. copied, for the matmul).
    `jnp.stack(cache.k)` gives the stacked [L, B, K, S, Dh] view when one is needed.
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]

    @property
    def cache_len(self) -> int:
        """Number of slots S."""
        return self.k[0].shape[2]


def init_cache(config: LMConfig, batch_size: int, cache_len: int, dtype=jnp.float32) -> KVCache:
    """Return a zero `KVCache`: L arrays [B, K, S, Dh] each for k and v, S = cache_len."""
    if cache_len > config.max_len:
        raise ValueError(f"cache_len={cache_len} exceeds LMConfig.max_len={config.max_len}")
    shape = (batch_size, config.n_kv_heads, cache_len, config.resolved_head_dim)
    names = ("batch", "kv_heads", None, None)  # rows over the batch axes, kv heads over tensor
    zeros = lambda: tuple(constrain(jnp.zeros(shape, dtype), names)
                          for _ in range(config.n_layers))
    return KVCache(k=zeros(), v=zeros())


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """RMSNorm: x / sqrt(mean(x^2) + eps) * scale, computed in float32, returned in x.dtype.

    x: [..., D]; scale: [D]. Returns [..., D].
    """
    x32 = x.astype(jnp.float32)
    y = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return y.astype(x.dtype) * scale.astype(x.dtype)


def rope_cos_sin(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """Rotary tables for integer positions [B, T]; returns cos, sin of shape [B, T, Dh] float32.

    inv_freq_i = theta^(-2i/Dh), angle = pos * inv_freq, tables = [angle, angle] (HF Llama).
    """
    inv_freq = 1.0 / theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, Dh/2]
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

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
        return rms_norm(x, scale, self.eps)


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE and an optional KV cache."""

    config: LMConfig

    @nn.compact
    def __call__(self, x, cos, sin, mask, cache=None, layer=0, cache_index=None):
        """Attend; x [B, T, D], cos/sin [B, T, Dh], mask broadcastable to [B, 1, 1, T, S].

        Without a cache, S = T and keys are this call's tokens. With `cache` (a `KVCache`) the
        new k, v are written at slots cache_index..cache_index+T-1 of layer `layer` and the
        queries attend over all S slots; cache_index is an int32 scalar shared by the rows, or
        a vector [B] with one start slot per row. Returns (out [B, T, D], cache or None).
        """
        cfg = self.config
        dtype = cfg.compute_dtype
        b, t, _ = x.shape
        nh, nk, hd = cfg.n_heads, cfg.n_kv_heads, cfg.resolved_head_dim
        dense = lambda n, name, bias: nn.Dense(
            n, use_bias=bias, dtype=dtype, param_dtype=jnp.float32, name=name
        )
        q = dense(nh * hd, "q", cfg.qkv_bias)(x).reshape(b, t, nh, hd)
        k = dense(nk * hd, "k", cfg.qkv_bias)(x).reshape(b, t, nk, hd)
        if cfg.qk_norm:  # Qwen3: per-head RMSNorm over Dh, one scale per norm shared by heads
            q = RMSNorm(cfg.norm_eps, name="q_norm")(q)
            k = RMSNorm(cfg.norm_eps, name="k_norm")(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        v = dense(nk * hd, "v", cfg.qkv_bias)(x).reshape(b, t, nk, hd)
        k = k.transpose(0, 2, 1, 3)  # [B, K, T, Dh]
        v = v.transpose(0, 2, 1, 3)
        if cache is not None:
            if jnp.ndim(cache_index) == 0:
                write = lambda buf, new: lax.dynamic_update_slice(
                    buf, new.astype(buf.dtype), (0, 0, cache_index, 0)
                )
            else:  # row b at slots cache_index[b]..+T-1 (one scatter; start clamped like above)
                write = lambda buf, new: jax.vmap(
                    lambda row, upd, i: lax.dynamic_update_slice(row, upd, (0, i, 0))
                )(buf, new.astype(buf.dtype), cache_index)
            k_all, v_all = write(cache.k[layer], k), write(cache.v[layer], v)  # [B, K, S, Dh]
            cache = KVCache(
                k=(*cache.k[:layer], k_all, *cache.k[layer + 1 :]),
                v=(*cache.v[:layer], v_all, *cache.v[layer + 1 :]),
            )
            k, v = k_all.astype(dtype), v_all.astype(dtype)
        # [B, K, G*T, Dh]: the G query heads sharing a kv head, each with its T queries.
        q = q.reshape(b, t, nk, nh // nk, hd).transpose(0, 2, 3, 1, 4).reshape(b, nk, -1, hd)
        q = q * jnp.asarray(hd**-0.5, dtype)
        scores = jnp.einsum("bkqd,bksd->bkqs", q, k, preferred_element_type=jnp.float32)
        scores = scores.reshape(b, nk, nh // nk, t, -1)  # [B, K, G, T, S]
        scores = jnp.where(mask, scores, _MASK_VALUE)
        probs = jax.nn.softmax(scores, axis=-1).astype(dtype).reshape(b, nk, -1, scores.shape[-1])
        out = jnp.einsum("bkqs,bksd->bkqd", probs, v)  # [B, K, G*T, Dh]
        out = out.reshape(b, nh, t, hd).transpose(0, 2, 1, 3).reshape(b, t, nh * hd)
        return dense(cfg.d_model, "o", False)(out), cache


class MLP(nn.Module):
    """SwiGLU MLP: down(silu(gate(x)) * up(x)). [B, T, D] -> [B, T, D]."""

    config: LMConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        dense = lambda n, name: nn.Dense(
            n, use_bias=False, dtype=cfg.compute_dtype, param_dtype=jnp.float32, name=name
        )
        hidden = nn.silu(dense(cfg.d_ff, "gate")(x)) * dense(cfg.d_ff, "up")(x)  # [B, T, F]
        return dense(cfg.d_model, "down")(hidden)


class Block(nn.Module):
    """Pre-norm transformer block: h + attn(norm(h)), then + mlp(norm(.))."""

    config: LMConfig

    @nn.compact
    def __call__(self, h, cos, sin, mask, cache=None, layer=0, cache_index=None):
        """h [B, T, D] -> (h [B, T, D], cache); see `Attention` for the other arguments."""
        cfg = self.config
        a, cache = Attention(cfg, name="attn")(
            RMSNorm(cfg.norm_eps, name="attn_norm")(h), cos, sin, mask, cache, layer, cache_index
        )
        h = h + a
        h = h + MLP(cfg, name="mlp")(RMSNorm(cfg.norm_eps, name="mlp_norm")(h))
        return h, cache


class CausalLM(nn.Module):
    """Decoder-only causal LM (Llama/Qwen2 style) with an optional KV cache."""

    config: LMConfig

    @nn.compact
    def __call__(
        self,
        tokens: jax.Array,
        positions: jax.Array | None = None,
        key_mask: jax.Array | None = None,
        cache: KVCache | None = None,
        cache_index: jax.Array | int | None = None,
        return_hidden: bool = False,
    ):
        """Run the model on tokens [B, T] int32.

        Full forward (cache None): positions [B, T] (default arange(T)), key_mask [B, T] bool
        (False = padding key, never attended to); causal mask over the T tokens.
        Cached (cache a `KVCache` with S slots): the tokens are written at cache slots
        cache_index..cache_index+T-1, key_mask is [B, S] over the slots (default all True), and
        the query in slot i attends to slots j <= i with key_mask[j]. Positions default to
        cache_index + arange(T). cache_index is an int32 scalar shared by all rows, or a vector
        [B] of per-row start slots, so that rows of one batch sit at different places (a
        refilled row of continuous batching, rows of speculative decoding that accepted
        different numbers of draft tokens); the caller keeps cache_index + T <= S. T > 1 with a
        cache is a multi-token cached call (a prefill, or the verification of T draft tokens).

        Returns (logits [B, T, V] float32, new cache or None), plus the final-normed hidden
        states [B, T, D] as a third element when return_hidden.
        """
        cfg = self.config
        dtype = cfg.compute_dtype
        b, t = tokens.shape
        q_slots = jnp.arange(t, dtype=jnp.int32)  # [T]
        if cache is None:
            k_slots = q_slots
            cache_index = 0
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
        mask = k_slots <= q_slots[..., None]  # [T, S] or [B, T, S] causal
        mask = mask.reshape(-1, 1, 1, *mask.shape[-2:])  # [1 or B, 1, 1, T, S]
        if key_mask is not None:
            mask = mask & key_mask.astype(bool)[:, None, None, None, :]  # [B, 1, 1, T, S]

        cos, sin = rope_cos_sin(positions, cfg.resolved_head_dim, cfg.rope_theta)
        embed = nn.Embed(
            cfg.vocab_size,
            cfg.d_model,
            dtype=dtype,
            param_dtype=jnp.float32,
            embedding_init=nn.initializers.normal(stddev=0.02),
            name="embed",
        )
        residual = ("batch", None, None)  # the residual stream is split by rows only
        # The table's d_model shards (FSDP) are gathered where the table is used; its vocab rows
        # stay split over tensor (a vocab-parallel lookup and, when tied, vocab-parallel logits).
        table = constrain(embed.embedding, ("vocab", None)).astype(dtype)  # [V, D]
        h = constrain(jnp.take(table, tokens, axis=0), residual)  # [B, T, D], as nn.Embed
        for i in range(cfg.n_layers):
            h, cache = Block(cfg, name=f"layer_{i}")(h, cos, sin, mask, cache, i, cache_index)
            h = constrain(h, residual)
        h = RMSNorm(cfg.norm_eps, name="final_norm")(h)
        if cfg.tie_embeddings:
            logits = jnp.dot(h, table.T)  # as nn.Embed.attend
        else:
            logits = nn.Dense(
                cfg.vocab_size,
                use_bias=False,
                dtype=dtype,
                param_dtype=jnp.float32,
                name="lm_head",
            )(h)
        logits = logits.astype(jnp.float32)  # [B, T, V]
        if return_hidden:
            return logits, cache, h
        return logits, cache


__all__ = [
    "CausalLM",
    "KVCache",
    "LMConfig",
    "apply_rope",
    "init_cache",
    "rms_norm",
    "rope_cos_sin",
]

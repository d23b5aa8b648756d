"""ELMUR: a transformer whose every layer owns an external memory, updated once per segment.

Cherepanov, Kovalev, Panov, "ELMUR: External Layer Memory with Update/Rewrite" (arXiv 2510.07151);
mechanics checked against the authors' PyTorch code (CognitiveAISystems/RATE,
`offline_rl_baselines/ELMUR/model.py` and `layers/relative_bias.py`); this is our own code.

Per layer, with memory (vec [B, M, D], pos [B, M]; pos = -1 marks an empty slot):

    token track:   h = h + SelfAttn(LN(h))                  causal, learned relative bias
                   h = h + Read(LN(h), vec)                  mem2tok: tokens attend to the slots,
                                                             bias b_h(clip(t_tok - pos_slot))
                   h = h + FFN(LN(h))
    memory track:  u = vec + Write(LN(vec), h)              tok2mem: slots attend to the tokens,
                                                             bias b_h(clip(pos_slot - t_tok))
                   u = u + FFN(LN(u))
    (`pre_norm=False` turns every sublayer x + f(LN(x)) into the post-LN LN(x + f(x)), as the
    authors' `pre_lnorm=False` runs do; it bounds the memory vectors' norm over many rewrites.)
    update:        (vec, pos) = LRU(vec, pos, u, t_first)    kernels/lru_memory.py

A trajectory is processed segment by segment (`ELMUR.scan_segments`, a `lax.scan`), carrying the
memories; the carried memory is under `stop_gradient` unless `detach_memory=False`. Per-step cost
and memory are independent of the trajectory length. Ablations: `use_read`, `use_write`
(no write = memory stays as initialised) and `use_lru` (False: the authors' "replace all slots"
policy, vec <- u with pos unchanged).

Deviations from the authors' code, on purpose: the newly written slot's pos is the segment's
*first* absolute time (their relative-position mode passes the newest token's time); an empty slot
is replaced outright (their code also blends an empty slot with alpha when it happens to be the
argmin of pos); self-attention positions use a learned relative bias instead of Transformer-XL's
relative encodings; no dropout or mixture-of-experts.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxrl_suite.core.config import Count, NonNegative, Probability, check_fields
from jaxrl_suite.kernels.lru_memory import (
    DEFAULT_ALPHA,
    lru_memory_update,
    lru_memory_update_reference,
)


@dataclasses.dataclass(frozen=True)
class ELMURConfig:
    d_model: Count = 64
    n_layers: Count = 2
    n_heads: Count = 4
    d_ff: Count = 256
    mem_slots: Count = 8  # M, per layer
    segment_len: Count = 16  # L, tokens per segment
    max_rel_dist: Count = 1024  # relative-time bias table covers |dt| < max_rel_dist (clipped)
    alpha: Probability = DEFAULT_ALPHA  # LRU blend weight of the candidate for a full slot
    mem_init_std: NonNegative = 0.02  # std of the initial memory vectors
    use_read: bool = True
    use_write: bool = True
    use_lru: bool = True
    detach_memory: bool = True
    use_kernel: bool = True  # Pallas kernel for the LRU update (False: jnp reference)
    pre_norm: bool = True  # False: post-LN sublayers LN(x + f(x)), the authors' T-Maze setting

    def __post_init__(self):
        check_fields(self, "elmur.")  # the Ranges declared above
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must divide by n_heads={self.n_heads}")


class Memory(NamedTuple):
    vec: jax.Array  # [B, M, D]
    pos: jax.Array  # [B, M] int32, -1 = empty


class RelativeBias(nn.Module):
    """Learned per-head scalar b_h(dt) for dt clipped to (-max_dist, max_dist): [..., H]."""

    n_heads: int
    max_dist: int

    @nn.compact
    def __call__(self, dt: jax.Array) -> jax.Array:
        table = self.param("table", nn.initializers.normal(0.02),
                           (2 * self.max_dist - 1, self.n_heads))
        idx = jnp.clip(dt, -self.max_dist + 1, self.max_dist - 1) + self.max_dist - 1
        return table[idx]


class Attention(nn.Module):
    """Multi-head attention q [B, Tq, D] over kv [B, Tk, D] plus a bias [B, H, Tq, Tk]."""

    n_heads: int

    @nn.compact
    def __call__(self, q_in, kv_in, bias=None, mask=None):
        d = q_in.shape[-1]
        dh = d // self.n_heads
        split = lambda x: x.reshape(*x.shape[:-1], self.n_heads, dh)
        q = split(nn.Dense(d, name="q")(q_in))
        k = split(nn.Dense(d, name="k")(kv_in))
        v = split(nn.Dense(d, name="v")(kv_in))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(dh).astype(q.dtype)
        if bias is not None:
            scores = scores + bias
        if mask is not None:
            scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
        out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
        return nn.Dense(d, name="o")(out.reshape(*out.shape[:-2], d))


class FFN(nn.Module):
    d_ff: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(self.d_ff)(x)))


class ELMURLayer(nn.Module):
    cfg: ELMURConfig

    def _sublayer(self, x, norm_name: str, fn):
        """Pre-LN `x + fn(LN(x))` or, with `cfg.pre_norm=False`, post-LN `LN(x + fn(x))`."""
        norm = nn.LayerNorm(name=norm_name)
        return x + fn(norm(x)) if self.cfg.pre_norm else norm(x + fn(x))

    @nn.compact
    def __call__(self, h: jax.Array, mem: Memory, tok_pos: jax.Array):
        cfg = self.cfg
        t = h.shape[1]
        rel_self = RelativeBias(cfg.n_heads, cfg.segment_len, name="self_bias")
        dt = tok_pos[:, None] - tok_pos[None, :]  # [T, T]
        self_bias = jnp.moveaxis(rel_self(dt), -1, 0)[None]  # [1, H, T, T]
        causal = jnp.tril(jnp.ones((t, t), bool))[None, None]
        self_attn = Attention(cfg.n_heads, name="self_attn")
        h = self._sublayer(h, "ln_self", lambda x: self_attn(x, x, self_bias, causal))
        cross = RelativeBias(cfg.n_heads, cfg.max_rel_dist, name="cross_bias")
        if cfg.use_read:
            read_dt = tok_pos[None, :, None] - mem.pos[:, None, :]  # [B, T, M]
            read_bias = jnp.moveaxis(cross(read_dt), -1, 1)  # [B, H, T, M]
            read = Attention(cfg.n_heads, name="read")
            h = self._sublayer(h, "ln_read", lambda x: read(x, mem.vec, read_bias))
        h = self._sublayer(h, "ln_ffn", FFN(cfg.d_ff, name="ffn"))
        if not cfg.use_write:
            return h, mem
        write_dt = mem.pos[:, :, None] - tok_pos[None, None, :]  # [B, M, T]
        write_bias = jnp.moveaxis(cross(write_dt), -1, 1)  # [B, H, M, T]
        write = Attention(cfg.n_heads, name="write")
        u = self._sublayer(mem.vec, "ln_write", lambda v: write(v, h, write_bias))
        u = self._sublayer(u, "ln_mem_ffn", FFN(cfg.d_ff, name="mem_ffn"))
        if not cfg.use_lru:
            return h, Memory(u, mem.pos)
        update = lru_memory_update if cfg.use_kernel else lru_memory_update_reference
        vec, pos = update(mem.vec, mem.pos, u, tok_pos[0], alpha=cfg.alpha)
        return h, Memory(vec, pos)


class ELMUR(nn.Module):
    """Token embeddings [B, L, D] of one segment + per-layer memories -> outputs + memories.

    `__call__(x, memories, t0)`: `x` is one segment of already embedded tokens, `memories` a tuple
    of per-layer `Memory`, `t0` the absolute time of the segment's first token (int scalar).
    Returns (hidden [B, L, D] after a final LayerNorm, new memories).
    """

    cfg: ELMURConfig

    @nn.compact
    def __call__(self, x: jax.Array, memories: tuple[Memory, ...], t0):
        if x.shape[-1] != self.cfg.d_model:
            raise ValueError(f"ELMUR input width {x.shape[-1]} != d_model {self.cfg.d_model}")
        tok_pos = jnp.asarray(t0, jnp.int32) + jnp.arange(x.shape[1], dtype=jnp.int32)
        new = []
        for i in range(self.cfg.n_layers):
            x, mem = ELMURLayer(self.cfg, name=f"layer_{i}")(x, memories[i], tok_pos)
            new.append(mem)
        return nn.LayerNorm(name="ln_out")(x), tuple(new)


def init_memory(cfg: ELMURConfig, key: jax.Array, batch: int) -> tuple[Memory, ...]:
    """Per-layer memories: vec ~ N(0, mem_init_std^2), every slot empty (pos = -1)."""
    keys = jax.random.split(key, cfg.n_layers)
    return tuple(
        Memory(
            cfg.mem_init_std * jax.random.normal(k, (batch, cfg.mem_slots, cfg.d_model)),
            jnp.full((batch, cfg.mem_slots), -1, jnp.int32),
        )
        for k in keys
    )


def scan_segments(model: ELMUR, params, x: jax.Array, memories, t0=0):
    """Runs a [B, T, D] sequence (T a multiple of segment_len) segment by segment in a lax.scan.

    Returns (hidden [B, T, D], final memories). The memory passed between segments is detached
    (`stop_gradient`) when `cfg.detach_memory`.
    """
    cfg = model.cfg
    b, t, d = x.shape
    if t % cfg.segment_len:
        raise ValueError(f"sequence length {t} must be a multiple of segment_len {cfg.segment_len}")
    n = t // cfg.segment_len
    segments = jnp.moveaxis(x.reshape(b, n, cfg.segment_len, d), 1, 0)  # [n, B, L, D]

    def step(carry, inp):
        mems, start = carry
        seg = inp
        out, mems = model.apply(params, seg, mems, start)
        if cfg.detach_memory:
            mems = jax.lax.stop_gradient(mems)
        return (mems, start + cfg.segment_len), out

    (mems, _), outs = jax.lax.scan(step, (memories, jnp.asarray(t0, jnp.int32)), segments)
    return jnp.moveaxis(outs, 0, 1).reshape(b, t, d), mems


class StepState(NamedTuple):
    """Online inference state: memories, the current segment's tokens so far, the next time."""

    memories: tuple[Memory, ...]
    buffer: jax.Array  # [B, L, D] tokens of the current segment (zeros after the last one)
    t: jax.Array  # int32 absolute time of the next token


def init_step_state(cfg: ELMURConfig, key: jax.Array, batch: int) -> StepState:
    return StepState(
        init_memory(cfg, key, batch),
        jnp.zeros((batch, cfg.segment_len, cfg.d_model)),
        jnp.zeros((), jnp.int32),
    )


def inference_step(model: ELMUR, params, state: StepState, x_t: jax.Array):
    """One token [B, D] in, its output [B, D] out, for acting in an environment step by step.

    The token joins the current segment's buffer and the segment is run through the model with
    the memories as they were at the segment's start (causal attention, so the zero padding after
    the token changes nothing); the memory update is committed when the segment is complete.
    Each step costs one segment forward, whatever the time t: O(1) per step and O(T) in total,
    with constant memory. Equals `scan_segments` on the whole sequence (tested).
    """
    cfg = model.cfg
    i = state.t % cfg.segment_len
    buffer = jax.lax.dynamic_update_slice_in_dim(state.buffer, x_t[:, None], i, axis=1)
    out, new_mems = model.apply(params, buffer, state.memories, state.t - i)
    done = i == cfg.segment_len - 1
    memories = jax.tree.map(lambda n, o: jnp.where(done, n, o), new_mems, state.memories)
    buffer = jnp.where(done, jnp.zeros_like(buffer), buffer)
    h_t = jax.lax.dynamic_index_in_dim(out, i, axis=1, keepdims=False)
    return h_t, StepState(memories, buffer, state.t + 1)


__all__ = [
    "ELMUR",
    "ELMURConfig",
    "ELMURLayer",
    "Memory",
    "StepState",
    "inference_step",
    "init_memory",
    "init_step_state",
    "scan_segments",
]

"""ELMUR's LRU layer-memory update: a Pallas kernel and its plain `jax.numpy` reference.

ELMUR (Cherepanov, Kovalev, Panov, "ELMUR: External Layer Memory with Update/Rewrite",
arXiv 2510.07151) gives every layer a memory of M slots, `vec [B, M, D]` and `pos [B, M]`
(int32, -1 = empty, otherwise the absolute time the slot was last written). Once per segment the
memory track proposes one candidate per slot, `cand [B, M, D]`, and exactly one slot per batch row
is written:

    empty_i = pos_i < 0
    j       = min{ i : empty_i }                           if any slot is empty
            = min{ i : pos_i = min_k pos_k }               otherwise (least recently written;
                                                            ties go to the lowest index)
    vec_j  <- cand_j                                       if slot j was empty
    vec_j  <- alpha * cand_j + (1 - alpha) * vec_j         otherwise
    pos_j  <- anchor                                       (the segment's first absolute time)

and every other slot is unchanged. The authors' default blend is alpha = 0.999.

`lru_memory_update` runs the fused kernel (one program per batch row: empty test, argmin over pos,
blend and write) compiled for the default backend on GPU/TPU, and in Pallas interpret mode on
CPU, where it is a correctness check rather than a speed-up. Its gradient is the reference's
(`jax.custom_vjp`), so gradients reach `cand` and `vec` through the blend. `use_reference=True`
(or `JAXRL_LRU_REFERENCE=1` in the environment) forces the reference.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

DEFAULT_ALPHA = 0.999


def _check(vec, pos, cand, anchor):
    if vec.ndim != 3 or cand.shape != vec.shape or pos.shape != vec.shape[:2]:
        raise ValueError(
            "lru_memory_update: expected vec and cand [B, M, D] and pos [B, M], got "
            f"vec {vec.shape}, cand {cand.shape}, pos {pos.shape}"
        )
    if anchor.shape not in ((), (vec.shape[0],)):
        raise ValueError(f"lru_memory_update: anchor must be [] or [B], got {anchor.shape}")


def _select(pos: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(one-hot [B, M] of the slot to write, whether that slot was empty [B, 1])."""
    m = pos.shape[-1]
    iota = jax.lax.broadcasted_iota(jnp.int32, pos.shape, pos.ndim - 1)
    empty = pos < 0
    first_empty = jnp.min(jnp.where(empty, iota, m), axis=-1, keepdims=True)
    oldest = jnp.min(pos, axis=-1, keepdims=True)
    first_oldest = jnp.min(jnp.where(pos == oldest, iota, m), axis=-1, keepdims=True)
    was_empty = first_empty < m
    slot = jnp.where(was_empty, first_empty, first_oldest)
    return iota == slot, was_empty


def lru_memory_update_reference(
    vec: jax.Array, pos: jax.Array, cand: jax.Array, anchor: jax.Array,
    *, alpha: float = DEFAULT_ALPHA,
) -> tuple[jax.Array, jax.Array]:
    """The LRU write in plain `jax.numpy` (see the module docstring); returns (vec, pos)."""
    anchor = jnp.asarray(anchor, jnp.int32)
    _check(vec, pos, cand, anchor)
    onehot, was_empty = _select(pos)
    blended = jnp.where(was_empty[..., None], cand, alpha * cand + (1.0 - alpha) * vec)
    new_vec = jnp.where(onehot[..., None], blended, vec)
    new_pos = jnp.where(onehot, jnp.broadcast_to(anchor, pos.shape[:1])[:, None], pos)
    return new_vec.astype(vec.dtype), new_pos.astype(pos.dtype)


def _kernel(vec_ref, pos_ref, cand_ref, anchor_ref, vec_out, pos_out, *, alpha):
    vec, pos, cand = vec_ref[...], pos_ref[...], cand_ref[...]  # [1, M, D], [1, M], [1, M, D]
    onehot, was_empty = _select(pos)
    blended = jnp.where(was_empty[..., None], cand, alpha * cand + (1.0 - alpha) * vec)
    vec_out[...] = jnp.where(onehot[..., None], blended, vec).astype(vec_out.dtype)
    pos_out[...] = jnp.where(onehot, anchor_ref[...], pos)


def _interpret() -> bool:
    return jax.default_backend() not in ("gpu", "tpu")


@functools.partial(jax.jit, static_argnames=("alpha", "interpret"))
def _pallas_update(vec, pos, cand, anchor, *, alpha, interpret):
    b, m, d = vec.shape
    anchor = jnp.broadcast_to(anchor.astype(pos.dtype), (b,))[:, None]  # [B, 1]
    row3 = pl.BlockSpec((1, m, d), lambda i: (i, 0, 0))
    row2 = pl.BlockSpec((1, m), lambda i: (i, 0))
    return pl.pallas_call(
        functools.partial(_kernel, alpha=alpha),
        grid=(b,),
        in_specs=[row3, row2, row3, pl.BlockSpec((1, 1), lambda i: (i, 0))],
        out_specs=[row3, row2],
        out_shape=[jax.ShapeDtypeStruct(vec.shape, vec.dtype),
                   jax.ShapeDtypeStruct(pos.shape, pos.dtype)],
        interpret=interpret,
    )(vec, pos, cand, anchor)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _update(vec, pos, cand, anchor, alpha, interpret):
    return _pallas_update(vec, pos, cand, anchor, alpha=alpha, interpret=interpret)


def _update_fwd(vec, pos, cand, anchor, alpha, interpret):
    out = _pallas_update(vec, pos, cand, anchor, alpha=alpha, interpret=interpret)
    return out, (vec, pos, cand, anchor)


def _update_bwd(alpha, interpret, residuals, cotangents):
    vec, pos, cand, anchor = residuals
    g_vec, _ = cotangents  # pos is integer: no cotangent flows through it
    _, vjp = jax.vjp(
        lambda v, c: lru_memory_update_reference(v, pos, c, anchor, alpha=alpha)[0], vec, cand
    )
    d_vec, d_cand = vjp(g_vec)
    zero_int = lambda x: np.zeros(x.shape, jax.dtypes.float0)
    return d_vec, zero_int(pos), d_cand, zero_int(anchor)


_update.defvjp(_update_fwd, _update_bwd)


def lru_memory_update(
    vec: jax.Array, pos: jax.Array, cand: jax.Array, anchor: jax.Array,
    *, alpha: float = DEFAULT_ALPHA, use_reference: bool | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The fused LRU write (see the module docstring): returns the new (vec, pos).

    Args:
      vec: [B, M, D] memory slots. pos: [B, M] int32 last-write times, -1 = empty.
      cand: [B, M, D] candidates from the memory track. anchor: [] or [B] int32, the absolute
        time of the segment's first token.
      alpha: blend weight of the candidate when the written slot was full.
      use_reference: force (True) or forbid (False) the plain-jnp path; default: the kernel,
        unless the environment variable JAXRL_LRU_REFERENCE=1 is set.
    """
    anchor = jnp.asarray(anchor, jnp.int32)
    _check(vec, pos, cand, anchor)
    if use_reference is None:
        use_reference = os.environ.get("JAXRL_LRU_REFERENCE", "0") == "1"
    if use_reference:
        return lru_memory_update_reference(vec, pos, cand, anchor, alpha=alpha)
    return _update(vec, pos.astype(jnp.int32), cand, anchor, float(alpha), _interpret())


__all__ = ["DEFAULT_ALPHA", "lru_memory_update", "lru_memory_update_reference"]

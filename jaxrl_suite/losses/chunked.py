"""Per-token statistics of the output softmax, computed chunk by chunk over the sequence.

The full logits of a language model, [B, T, V] float32, are often the largest tensor of an
update (Qwen's V = 151,936 at T = 4,096 is 2.5 GB per sequence). Here the logits are formed
from the final-normed hidden states and the output projection one block of `chunk` positions
at a time, inside `lax.map` with each block under `jax.checkpoint`: the forward pass keeps only
the per-token results, and the backward pass recomputes one [B, chunk, V] block at a time, so
no step holds more than a block's worth of logits (and their cotangent).

    logits[:, t] = (h[:, t] @ W) / temperature      W = table.T (tied) or the lm_head kernel

`project_logits` is that projection, cast as `models.lm.CausalLM` casts it (the weight to the
hidden states' dtype, the product to float32); `chunked_token_map` applies any per-block
callback (logits [B, c, V], per-token inputs [B, c, ...]) -> per-token values [B, c, ...];
`logprobs_and_entropy` is the callback for the log-probability of the targets and the entropy,
and `chunked_logprobs_and_entropy` puts the two together. They agree with
`losses.common.token_logprobs` / `token_entropy` on the full logits. All functions are pure and
jit-compatible (`chunk` and `transpose_weight` are static; `temperature` may be traced).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp

from jaxrl_suite.losses.common import check_rank, check_shape


def project_logits(
    hidden: chex.Array, weight: chex.Array, *, transpose_weight: bool, temperature: float = 1.0
) -> chex.Array:
    """Float32 logits of hidden states under the output projection, at a temperature.

        logits = (h @ W.T) / temperature    (transpose_weight: W is the tied table [V, D])
        logits = (h @ W)   / temperature    (otherwise: W is an lm_head kernel [D, V])

    As in `CausalLM`, the weight is cast to the hidden states' dtype, the product is taken in
    that dtype and then cast to float32; the temperature divides the float32 logits. The
    product is one `dot_general` contracting D of either layout, so a tied table is never
    copied transposed (`jnp.dot(h, W.T)` costs an extra [D, V] buffer on CPU).

    Args:
      hidden: [..., D] final-normed hidden states.
      weight: [V, D] when transpose_weight, else [D, V].
      transpose_weight: whether `weight` is the embedding table (vocab rows).
      temperature: softmax temperature (> 0).

    Returns:
      [..., V] float32 logits.
    """
    w = weight.astype(hidden.dtype)
    contract = 1 if transpose_weight else 0  # the D axis of the weight
    logits = jax.lax.dot_general(hidden, w, (((hidden.ndim - 1,), (contract,)), ((), ())))
    return logits.astype(jnp.float32) / temperature


def logprobs_and_entropy(logits: chex.Array, targets: chex.Array) -> tuple[chex.Array, chex.Array]:
    """Log-probability of each target and entropy of the softmax, from one log-softmax.

        log p(y_t) = logits[t, y_t] - logsumexp_v logits[t, v]
        H_t        = -sum_v p(v) log p(v),   p = softmax(logits[t])

    The same values as `token_logprobs` and `token_entropy` (0 log 0 := 0, so logits of -inf
    give a finite entropy and gradient); usable as a `chunked_token_map` callback.

    Args:
      logits: [N, T, V] unnormalised scores.
      targets: [N, T] integer token ids in [0, V).

    Returns:
      ([N, T] log-probabilities, [N, T] entropies in nats), in at least float32.
    """
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))  # [N, T, V]
    logp = jax.nn.log_softmax(logits, axis=-1)  # [N, T, V]
    picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]  # [N, T]
    p = jnp.exp(logp)
    entropy = -jnp.sum(p * jnp.where(p > 0, logp, 0.0), axis=-1)  # [N, T]
    return picked, entropy


def chunked_token_map(
    fn: Callable[..., Any],
    hidden: chex.Array,
    weight: chex.Array,
    *per_token: chex.Array,
    chunk: int,
    transpose_weight: bool,
    temperature: float = 1.0,
) -> Any:
    """Per-token values of the logits, computed `chunk` positions at a time.

        out[:, s:s+c] = fn(project_logits(h[:, s:s+c], W), *(x[:, s:s+c] for x in per_token))

    for s = 0, chunk, 2 chunk, ... (the last block holds the T mod chunk remaining positions).
    Full blocks go through `lax.map`, each under `jax.checkpoint`, so neither the forward nor
    the backward pass materialises more than one [B, chunk, V] block of logits. Gradients flow
    to `hidden`, `weight` and any float `per_token` inputs. `fn` must treat positions
    independently (the blocking must not change its result).

    Args:
      fn: (logits [B, c, V] float32, *per_token blocks [B, c, ...]) -> pytree of [B, c, ...].
      hidden: [B, T, D] final-normed hidden states.
      weight: [V, D] when transpose_weight (tied embedding table), else [D, V] (lm_head).
      *per_token: arrays [B, T, ...] sliced alongside the hidden states (e.g. targets).
      chunk: positions per block (static, >= 1).
      transpose_weight: whether `weight` is the embedding table.
      temperature: softmax temperature (> 0), may be traced.

    Returns:
      fn's pytree with each leaf [B, T, ...].
    """
    check_rank("hidden", hidden, 3)
    check_rank("weight", weight, 2)
    b, t, d = hidden.shape
    if (weight.shape[1] if transpose_weight else weight.shape[0]) != d:
        layout = "[V, D]" if transpose_weight else "[D, V]"
        raise ValueError(f"weight must be {layout} with D = {d}, got shape {weight.shape}")
    for i, x in enumerate(per_token):
        if jnp.ndim(x) < 2 or jnp.shape(x)[:2] != (b, t):
            raise ValueError(f"per_token[{i}] must have leading shape {(b, t)}, got {jnp.shape(x)}")
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive int, got {chunk!r}")

    @jax.checkpoint
    def block(w, h, xs, temp):  # h [B, c, D], xs [B, c, ...] -> [B, c, ...]
        return fn(project_logits(h, w, transpose_weight=transpose_weight, temperature=temp), *xs)

    n, r = divmod(t, chunk)
    parts = []
    if n:
        def to_blocks(x):  # [B, n * chunk, ...] -> [n, B, chunk, ...]
            x = x[:, : n * chunk]
            return jnp.moveaxis(x.reshape(b, n, chunk, *x.shape[2:]), 1, 0)

        def from_blocks(y):  # [n, B, chunk, ...] -> [B, n * chunk, ...]
            return jnp.moveaxis(y, 0, 1).reshape(b, n * chunk, *y.shape[3:])

        xs = jax.tree.map(to_blocks, (hidden, per_token))
        ys = jax.lax.map(lambda x: block(weight, x[0], x[1], temperature), xs)
        parts.append(jax.tree.map(from_blocks, ys))
    if r:
        tail = jax.tree.map(lambda x: x[:, n * chunk :], (hidden, per_token))
        parts.append(block(weight, tail[0], tail[1], temperature))
    if len(parts) == 1:
        return parts[0]
    return jax.tree.map(lambda *y: jnp.concatenate(y, axis=1), *parts)


def chunked_logprobs_and_entropy(
    hidden: chex.Array,
    weight: chex.Array,
    targets: chex.Array,
    *,
    chunk: int,
    transpose_weight: bool,
    temperature: float = 1.0,
) -> tuple[chex.Array, chex.Array]:
    """Target log-probabilities and entropies without materialising the [B, T, V] logits.

        z_t        = (h_t @ W) / temperature                     (float32, per block of chunk)
        log p(y_t) = z_t[y_t] - logsumexp_v z_t[v]
        H_t        = -sum_v p(v) log p(v),   p = softmax(z_t)

    Equal to `token_logprobs(z, targets)` and `token_entropy(z)` on the full logits z, with
    at most one [B, chunk, V] block of logits live in the forward or backward pass.

    Args:
      hidden: [B, T, D] final-normed hidden states (the model's `return_hidden` output).
      weight: [V, D] tied embedding table when transpose_weight, else [D, V] lm_head kernel.
      targets: [B, T] integer token ids in [0, V).
      chunk: positions per block (static, >= 1; T need not be a multiple of it).
      transpose_weight: whether `weight` is the embedding table.
      temperature: softmax temperature (> 0), may be traced.

    Returns:
      ([B, T] log-probabilities, [B, T] entropies in nats), float32.
    """
    check_rank("targets", targets, 2)
    check_shape("targets", targets, jnp.shape(hidden)[:2])
    chex.assert_type(targets, int)
    return chunked_token_map(
        logprobs_and_entropy, hidden, weight, targets,
        chunk=chunk, transpose_weight=transpose_weight, temperature=temperature,
    )


__all__ = [
    "chunked_logprobs_and_entropy",
    "chunked_token_map",
    "logprobs_and_entropy",
    "project_logits",
]

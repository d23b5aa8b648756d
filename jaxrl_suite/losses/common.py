"""Pure per-token helpers shared by the language-model losses.

All functions here are jit-compatible and take plain arrays. Log-probabilities and entropies
are computed in at least float32 even when the logits are bfloat16.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def check_rank(name: str, x: chex.Array, rank: int) -> None:
    """Asserts `x` has `rank` with chex, raising a ValueError that names the argument."""
    try:
        chex.assert_rank(x, rank)
    except AssertionError as e:
        raise ValueError(f"{name} must have rank {rank}, got shape {jnp.shape(x)}") from e


def check_shape(name: str, x: chex.Array, shape: tuple[int, ...]) -> None:
    """Asserts `x` has exactly `shape` with chex, raising a ValueError that names the argument."""
    try:
        chex.assert_shape(x, shape)
    except AssertionError as e:
        raise ValueError(f"{name} must have shape {shape}, got shape {jnp.shape(x)}") from e


def _float_dtype(x: chex.Array) -> jnp.dtype:
    """The dtype to compute in: x's dtype promoted to at least float32."""
    return jnp.promote_types(jnp.result_type(x), jnp.float32)


def masked_mean(x: chex.Array, mask: chex.Array, axis: int | None = None) -> chex.Array:
    """Mean of `x` over the entries where `mask` is set; 0 where nothing is set.

        masked_mean(x, m) = sum(x * m) / sum(m)      (0 when sum(m) == 0)

    Args:
      x: values, any shape.
      mask: 0/1 (bool or float) or non-negative weights, broadcastable to `x`.
      axis: axis to reduce; None reduces everything to a scalar.

    Returns:
      The masked mean, reduced over `axis`. A zero denominator is replaced by 1, which for
      0/1 masks is the usual `max(count, 1)` guard and keeps gradients finite.
    """
    mask = jnp.asarray(mask, dtype=jnp.result_type(x))
    total = jnp.sum(x * mask, axis=axis)
    count = jnp.sum(jnp.broadcast_to(mask, jnp.shape(x)), axis=axis)
    return total / jnp.where(count > 0, count, 1)


def token_logprobs(logits: chex.Array, targets: chex.Array) -> chex.Array:
    """Log-probability of each target token under a softmax over the vocabulary.

        log p(y_t) = logits[t, y_t] - logsumexp_v logits[t, v]

    Args:
      logits: [N, T, V] unnormalised scores.
      targets: [N, T] integer token ids in [0, V).

    Returns:
      [N, T] log-probabilities, in at least float32.
    """
    check_rank("logits", logits, 3)
    check_rank("targets", targets, 2)
    check_shape("targets", targets, logits.shape[:2])
    chex.assert_type(targets, int)
    logits = logits.astype(_float_dtype(logits))  # [N, T, V]
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]  # [N, T]
    return picked - jax.nn.logsumexp(logits, axis=-1)  # [N, T]


def token_entropy(logits: chex.Array) -> chex.Array:
    """Entropy of the full-vocabulary softmax at each position.

        H_t = -sum_v p(v) log p(v),   p = softmax(logits[t])

    Logits of -inf (masked-out vocabulary) contribute 0 and give finite gradients.

    Args:
      logits: [N, T, V] unnormalised scores.

    Returns:
      [N, T] entropies in nats, in at least float32.
    """
    check_rank("logits", logits, 3)
    logp = jax.nn.log_softmax(logits.astype(_float_dtype(logits)), axis=-1)  # [N, T, V]
    p = jnp.exp(logp)
    logp = jnp.where(p > 0, logp, 0.0)  # 0 * log 0 := 0, without a NaN gradient
    return -jnp.sum(p * logp, axis=-1)  # [N, T]

"""Supervised fine-tuning loss (teacher forcing)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def sft_loss(logp: jax.Array, mask: jax.Array) -> tuple[jax.Array, dict]:
    """Token-level negative log-likelihood of the target tokens.

    loss = -sum_{n,t} mask[n,t] * logp[n,t] / max(sum mask, 1)

    Args:
      logp: [N, T] log-probabilities of the target tokens under the model.
      mask: [N, T] 1 for target tokens that count, 0 for padding.
    Returns:
      (loss, {"nll": loss, "tokens": number of counted tokens}).
    """
    chex.assert_rank([logp, mask], 2)
    chex.assert_equal_shape([logp, mask])
    mask = mask.astype(logp.dtype)
    count = jnp.maximum(mask.sum(), 1.0)
    loss = -(logp * mask).sum() / count
    return loss, {"nll": loss, "tokens": mask.sum()}

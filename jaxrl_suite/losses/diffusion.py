"""The masked-diffusion training objective (LLaDA / MDLM), as pure functions of arrays.

Forward process: draw t ~ U(0, 1) per sequence and mask each completion token independently
with probability t (the prompt is never masked). The model predicts the clean token at every
masked position; the loss is the cross-entropy on the masked tokens weighted by 1/t,

    L = E_t E_{x_t} [ 1/t * sum_{i masked} -log p_theta(x_0^i | prompt, x_t) ] / N,

an upper bound on the completion's negative log-likelihood (MDLM, arXiv 2406.07524, eq. 10;
LLaDA, arXiv 2502.09992, eq. 3 and its SFT form eq. 5, normalised by the answer length N).
t is floored at `eps` (LLaDA's p_mask = (1 - eps) t + eps) so that 1/t stays finite.

A completion in the supervised data is its solution, EOS, then EOS to the end (`fill_after_eos`):
the model learns to end a completion by predicting EOS in the tail, as LLaDA's SFT pads with
EOS, and every one of the N positions is a training target.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxrl_suite.losses.common import check_rank, check_shape, token_logprobs


def fill_after_eos(completion: chex.Array, completion_mask: chex.Array,
                   eos_id: int) -> chex.Array:
    """The completion with every position after its valid tokens (completion_mask 0) set to
    EOS: [B, N] int32. A diffusion LM generates all N positions; its tail is EOS."""
    return jnp.where(completion_mask > 0, completion, eos_id).astype(jnp.int32)


def mask_completion(key: jax.Array, targets: chex.Array, mask_id: int, *,
                    eps: float = 1e-3) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The forward process: (noisy [B, N] int32, masked [B, N] bool, t [B] float32).

    t_b = (1 - eps) u_b + eps with u_b ~ U(0, 1); position i of row b is masked when
    r_bi < t_b, r_bi ~ U(0, 1); a masked position holds `mask_id`."""
    check_rank("targets", targets, 2)
    b, n = targets.shape
    k_t, k_r = jax.random.split(key)
    t = (1.0 - eps) * jax.random.uniform(k_t, (b,)) + eps
    masked = jax.random.uniform(k_r, (b, n)) < t[:, None]
    return jnp.where(masked, mask_id, targets).astype(jnp.int32), masked, t


def masked_diffusion_loss(logits: chex.Array, targets: chex.Array, masked: chex.Array,
                          t: chex.Array, valid: chex.Array | None = None
                          ) -> tuple[jax.Array, dict]:
    """The masked-diffusion loss of one corruption: (loss, metrics).

        loss = 1/B sum_b [ sum_i valid_bi masked_bi (-log softmax(logits_bi)[targets_bi]) / t_b ]
                         / max(sum_i valid_bi, 1)

    Args:
      logits: [B, N, V] the model's logits at the completion positions of the noisy input.
      targets: [B, N] int the clean tokens.
      masked: [B, N] bool which positions were masked (only these are scored).
      t: [B] the masking probability of each row (the weight is 1/t).
      valid: [B, N] which positions count (default all; their count normalises each row).

    Metrics: `masked_nll` (the unweighted mean NLL over masked valid tokens) and
    `masked_frac` (masked valid tokens over valid tokens).
    """
    check_rank("logits", logits, 3)
    b, n, _ = logits.shape
    check_shape("targets", targets, (b, n))
    check_shape("masked", masked, (b, n))
    check_shape("t", t, (b,))
    valid = jnp.ones((b, n), jnp.float32) if valid is None else valid.astype(jnp.float32)
    check_shape("valid", valid, (b, n))
    nll = -token_logprobs(logits, targets)  # [B, N] float32
    scored = valid * masked.astype(jnp.float32)
    per_row = jnp.sum(scored * nll, axis=1) / t / jnp.maximum(jnp.sum(valid, axis=1), 1.0)
    n_scored = jnp.maximum(jnp.sum(scored), 1.0)
    metrics = {"masked_nll": jnp.sum(scored * nll) / n_scored,
               "masked_frac": jnp.sum(scored) / jnp.maximum(jnp.sum(valid), 1.0)}
    return jnp.mean(per_row), metrics


__all__ = ["fill_after_eos", "mask_completion", "masked_diffusion_loss"]

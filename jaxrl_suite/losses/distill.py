"""Knowledge distillation of a drafter LM from the policy, optionally weighted by rewards.

Speculative decoding (Leviathan et al. 2023, arXiv:2211.17192; Chen et al. 2023,
arXiv:2302.01318) is fast when the drafter's next-token distribution q is close to the policy's
p: a drafted token is accepted with probability sum_v min(p_v, q_v) = 1 - TV(p, q) in
expectation. In RL the policy moves every step, so a fixed drafter drifts away from it; ReSpec
(arXiv:2510.26475) keeps it aligned by distilling it from the current actor on the fresh
rollouts (the prefixes it will have to draft on), and weights that update by the rollouts'
rewards. `kd_loss` is the distillation objective (forward KL, as DistillSpec, arXiv:2310.08461,
found a good default), `reward_weights` the per-sequence weights.

Both are pure, jit-compatible functions of arrays.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxrl_suite.losses.advantages import group_advantages
from jaxrl_suite.losses.common import check_rank, check_shape, masked_mean


def _check_positive(name: str, x) -> None:
    """ValueError for a concrete x <= 0 (a tracer passes)."""
    if not isinstance(x, jax.core.Tracer) and not float(x) > 0:
        raise ValueError(f"{name} must be positive, got {x}")


def kd_loss(
    student_logits: chex.Array,
    teacher_logits: chex.Array,
    mask: chex.Array,
    seq_weights: chex.Array | None = None,
    temperature: float | chex.Array = 1.0,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """Forward-KL distillation loss of a student (drafter) towards a teacher (policy).

    With p = softmax(teacher / T) (stop-gradient) and q = softmax(student / T) per token,

        KL_bn = sum_v p_v (log p_v - log q_v)                         (0 log 0 := 0)
        loss  = sum_b w_b sum_n m_bn KL_bn / sum_b w_b sum_n m_bn      (weighted token mean)

    with m the completion mask and w the per-sequence weights (1 when None; ReSpec,
    arXiv:2510.26475, uses reward-based weights, `reward_weights`). Minimising the forward KL
    fits q to p's support (mass-covering), which is what a high speculative acceptance rate
    sum_v min(p_v, q_v) needs. The gradient flows into the student only.

    Args:
      student_logits: [B, N, V] logits of the student at the completion tokens.
      teacher_logits: [B, N, V] logits of the teacher at the same tokens (not differentiated).
      mask: [B, N] 0/1 (bool or float) completion mask.
      seq_weights: [B] non-negative per-sequence weights, or None for unweighted.
      temperature: T > 0, the sampling temperature both distributions are taken at.

    Returns:
      (loss [], metrics) with metrics
        kd_kl:          unweighted token mean of KL_bn over the mask;
        kd_loss:        the (weighted) loss;
        kd_acceptance:  token mean of sum_v min(p_v, q_v), the expected speculative-sampling
                        acceptance rate of a drafted token (Leviathan et al. 2023, alpha).
      A zero denominator (empty mask or zero weights) gives loss 0, not NaN.
    """
    check_rank("student_logits", student_logits, 3)
    check_shape("teacher_logits", teacher_logits, student_logits.shape)
    check_shape("mask", mask, student_logits.shape[:2])
    if seq_weights is not None:
        check_shape("seq_weights", seq_weights, student_logits.shape[:1])
    _check_positive("temperature", temperature)
    dtype = jnp.promote_types(jnp.result_type(student_logits), jnp.float32)
    inv_t = 1.0 / jnp.asarray(temperature, dtype)
    log_q = jax.nn.log_softmax(student_logits.astype(dtype) * inv_t, axis=-1)  # [B, N, V]
    teacher = jax.lax.stop_gradient(teacher_logits)
    log_p = jax.nn.log_softmax(teacher.astype(dtype) * inv_t, axis=-1)  # [B, N, V]
    p = jnp.exp(log_p)
    support = p > 0
    log_ratio = jnp.where(support, log_p, 0.0) - jnp.where(support, log_q, 0.0)
    kl = jnp.sum(p * log_ratio, axis=-1)  # [B, N]

    mask = jnp.asarray(mask, dtype)
    weights = mask if seq_weights is None else mask * jnp.asarray(seq_weights, dtype)[:, None]
    total = jnp.sum(weights)
    loss = jnp.sum(weights * kl) / jnp.where(total > 0, total, 1.0)
    overlap = jnp.sum(jnp.minimum(p, jnp.exp(jax.lax.stop_gradient(log_q))), axis=-1)  # [B, N]
    metrics = {
        "kd_kl": jax.lax.stop_gradient(masked_mean(kl, mask)),
        "kd_loss": jax.lax.stop_gradient(loss),
        "kd_acceptance": masked_mean(overlap, mask),
    }
    return loss, metrics


def reward_weights(rewards: chex.Array, tau: float | chex.Array = 1.0,
                   eps: float = 1e-4) -> chex.Array:
    """Per-sequence distillation weights from group rewards (ReSpec, arXiv:2510.26475).

        A_ij = (r_ij - mean_j r_ij) / (std_j r_ij + eps)       (group advantages, ddof = 1)
        w_ij = G * softmax_j(A_ij / tau)

    Each prompt's G weights sum to G (mean 1), so the update's scale is that of the unweighted
    loss; rollouts with higher reward in their group count more, and equal rewards give w = 1.
    A small tau concentrates the weight on each group's best rollouts, a large one tends to
    uniform weights.

    Args:
      rewards: [B, G] rewards of G >= 2 completions of each of B prompts.
      tau: softmax temperature, > 0.
      eps: added to the group std (as `group_advantages`).

    Returns:
      [B * G] weights, row i * G + j for completion j of prompt i (the rollout's row order).
    """
    _check_positive("tau", tau)
    advantages = group_advantages(rewards, scale="group", eps=eps)  # [B, G], validates rewards
    g = advantages.shape[1]
    return (g * jax.nn.softmax(advantages / tau, axis=1)).reshape(-1)


__all__ = ["kd_loss", "reward_weights"]

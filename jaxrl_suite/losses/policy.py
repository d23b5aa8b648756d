"""The parts every clipped policy-gradient loss is built from (rlax style): pure array functions.

    ratio      = importance_ratio(logp, old_logp, mask, level)      [N, T]  token or sequence
    pg, clip   = clipped_surrogate(ratio, advantages, eps_lo, eps_hi) [N, T]
    kl         = k3_kl(logp, ref_logp, mask)                         [N, T]
    loss       = aggregate(pg, mask, loss_type) + beta * aggregate(kl, mask, loss_type)

`losses.grpo` composes them into the registered policy losses (grpo, gspo, cispo). Shapes: N
sequences of T completion tokens; `mask` is 1 on completion tokens and 0 on padding. Every part
computes in at least float32.
"""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp

from jaxrl_suite.core.registry import Registry
from jaxrl_suite.losses.common import check_rank, check_shape, masked_mean

LEVELS = ("token", "sequence")


def _float_dtype(x: chex.Array) -> jnp.dtype:
    return jnp.promote_types(jnp.result_type(x), jnp.float32)


def importance_ratio(
    logp: chex.Array, old_logp: chex.Array, mask: chex.Array, level: str = "token"
) -> chex.Array:
    """Importance ratio of the current to the sampling policy, per token or per sequence.

        "token":    r_it = exp(logp_it - old_logp_it)                               [PPO, GRPO]
        "sequence": r_it = s_i = exp( sum_t m_it (logp_it - old_logp_it) / sum_t m_it )   [GSPO]

    The sequence ratio s_i = (pi(y_i) / pi_old(y_i))^(1/|y_i|) is GSPO's length-normalised ratio
    (Zheng et al., arXiv 2507.18071), broadcast over the sequence's T positions so that it
    composes with the per-token parts below. Its gradient is GSPO's sequence-level one,
    grad s_i = s_i * mean_t grad logp_it: each position carries the whole sequence's gradient.
    (The paper's GSPO-token, r_it = sg(s_i) * exp(logp_it - sg(logp_it)), has the same value,
    and the same gradient whenever a sequence's positions share one advantage and one weight.)

    `old_logp` is data: the gradient is stopped through it. Positions with mask 0 may hold any
    value (even -inf): their log-ratio is zeroed before the exponential, so they get r = 1, and a
    sequence with no valid token gets s = 1.

    Args:
      logp: [N, T] log-probabilities of the sampled tokens under the current policy.
      old_logp: [N, T] the same under the policy that sampled them.
      mask: [N, T] valid tokens (bool, 0/1 or weights; only mask > 0 matters).
      level: "token" or "sequence" (static).

    Returns:
      [N, T] ratios, in at least float32.
    """
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; valid: {', '.join(map(repr, LEVELS))}")
    check_rank("logp", logp, 2)
    check_shape("old_logp", old_logp, logp.shape)
    check_shape("mask", mask, logp.shape)
    dtype = _float_dtype(logp)
    valid = jnp.asarray(mask) > 0  # [N, T]
    old = jax.lax.stop_gradient(old_logp).astype(dtype)
    log_ratio = jnp.where(valid, logp.astype(dtype) - old, 0.0)  # [N, T]
    if level == "sequence":
        per_seq = masked_mean(log_ratio, valid, axis=-1)  # [N]
        log_ratio = jnp.broadcast_to(per_seq[:, None], logp.shape)  # [N, T]
    return jnp.exp(log_ratio)


def clipped_surrogate(
    ratio: chex.Array, advantages: chex.Array, eps_low: float, eps_high: float
) -> tuple[chex.Array, chex.Array]:
    """PPO's clipped surrogate, as a per-token loss (to be minimised).

        pg_it      = -min(r_it * A_i, clip(r_it, 1 - eps_low, 1 + eps_high) * A_i)
        clipped_it = (r_it < 1 - eps_low and A_i < 0) or (r_it > 1 + eps_high and A_i > 0)

    `clipped` marks the tokens whose clipped branch is active (TRL's definition of the clip
    fraction); their gradient is zero. PPO: Schulman et al., arXiv 1707.06347; the asymmetric
    range eps_high > eps_low is DAPO's clip-higher (arXiv 2503.14476).

    Args:
      ratio: [N, T] importance ratios (`importance_ratio`).
      advantages: [N] one advantage per sequence, or [N, T] one per token.
      eps_low, eps_high: the clip range below and above 1.

    Returns:
      (pg [N, T], clipped [N, T] bool).
    """
    check_rank("ratio", ratio, 2)
    if jnp.ndim(advantages) == 1:
        check_shape("advantages", advantages, ratio.shape[:1])
        adv = jnp.asarray(advantages, ratio.dtype)[:, None]  # [N, 1]
    else:
        check_shape("advantages", advantages, ratio.shape)
        adv = jnp.asarray(advantages, ratio.dtype)  # [N, T]
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)  # [N, T]
    pg = -jnp.minimum(ratio * adv, clipped * adv)  # [N, T]
    is_clipped = ((ratio < 1.0 - eps_low) & (adv < 0)) | ((ratio > 1.0 + eps_high) & (adv > 0))
    return pg, is_clipped


def k3_kl(logp: chex.Array, ref_logp: chex.Array, mask: chex.Array | None = None) -> chex.Array:
    """Schulman's k3 estimator of KL(pi || pi_ref) per token, >= 0 and unbiased under pi.

        d_it  = ref_logp_it - logp_it
        kl_it = exp(d_it) - d_it - 1

    J. Schulman, "Approximating KL Divergence" (2020); the KL penalty of GRPO (arXiv 2402.03300,
    eq. 4). `ref_logp` is data (gradient stopped). Where `mask` is 0, d is zeroed first, so
    padding may hold any value (even inf) and gives kl = 0.

    Args:
      logp: [N, T] log-probabilities under the current policy.
      ref_logp: [N, T] the same under the reference policy.
      mask: optional [N, T] valid tokens (only mask > 0 matters).

    Returns:
      [N, T] per-token KL estimates, in at least float32.
    """
    check_rank("logp", logp, 2)
    check_shape("ref_logp", ref_logp, logp.shape)
    dtype = _float_dtype(logp)
    d = jax.lax.stop_gradient(ref_logp).astype(dtype) - logp.astype(dtype)  # [N, T]
    if mask is not None:
        check_shape("mask", mask, logp.shape)
        d = jnp.where(jnp.asarray(mask) > 0, d, 0.0)
    return jnp.exp(d) - d - 1.0


def _sequence_mean_token_mean(x: chex.Array, mask: chex.Array) -> chex.Array:
    return jnp.mean(masked_mean(x, mask, axis=-1))


def _token_mean(x: chex.Array, mask: chex.Array) -> chex.Array:
    return masked_mean(x, mask)


def _constant_normalizer(x: chex.Array, mask: chex.Array) -> chex.Array:
    return jnp.sum(x * mask) / x.size


# loss_type -> aggregation of a per-token [N, T] loss into a scalar.
AGGREGATIONS: Registry[Callable[[chex.Array, chex.Array], chex.Array]] = Registry("loss_type")
AGGREGATIONS.register("grpo", _sequence_mean_token_mean)
AGGREGATIONS.register("dapo", _token_mean)
AGGREGATIONS.register("bnpo", _token_mean)
AGGREGATIONS.register("dr_grpo", _constant_normalizer)
LOSS_TYPES = ("grpo", "dapo", "bnpo", "dr_grpo")


def aggregate(per_token: chex.Array, mask: chex.Array, loss_type: str = "grpo") -> chex.Array:
    """Reduces a per-token loss [N, T] to a scalar, by `loss_type`:

        "grpo":    mean_i [ sum_t x_it m_it / max(sum_t m_it, 1) ]   per-sequence mean  [GRPO]
        "dapo":    sum_it x_it m_it / max(sum_it m_it, 1)             token mean         [DAPO]
        "bnpo":    same as "dapo" here (TRL's bnpo normalises by the local batch, dapo by the
                   global one; a loss function only sees the arrays passed in)
        "dr_grpo": sum_it x_it m_it / (N * T)                         constant           [Dr. GRPO]

    GRPO arXiv 2402.03300; DAPO arXiv 2503.14476; Dr. GRPO arXiv 2503.20783 (the constant
    normaliser removes GRPO's length bias). `mask` may hold non-negative weights: the "max(., 1)"
    guards apply to zero totals only, so for "grpo", "dapo" and "bnpo" weights give a weighted
    mean, and for "dr_grpo" they scale the sum.

    Args:
      per_token: [N, T] per-token values.
      mask: [N, T] 0/1 mask or non-negative weights (float).
      loss_type: "grpo", "dapo", "bnpo" or "dr_grpo" (static).

    Returns:
      The scalar aggregate.
    """
    if loss_type not in AGGREGATIONS:
        raise ValueError(
            f"unknown loss_type {loss_type!r}; valid: {', '.join(map(repr, LOSS_TYPES))}")
    return AGGREGATIONS.get(loss_type)(per_token, mask)


def tis_weight(
    train_logp: chex.Array, sampler_logp: chex.Array, mask: chex.Array, cap: float = 2.0
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """Truncated importance weight of the trainer's policy over the sampler's, per token (TIS).

        w_it = min(exp(train_logp_it - sampler_logp_it), C)

    Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
    (verl's TIS): a sampler that computes in lower precision (or another engine) draws tokens
    from pi_sampler != pi_train; w corrects the policy gradient towards pi_train, truncated at C
    to bound its variance. Both log-probs are data (no gradient). Padding (mask 0, any value,
    even -inf) gets w = 1 and counts in neither metric.

    Args:
      train_logp: [N, T] log-probs of the sampled tokens under the trainer's (old) policy.
      sampler_logp: [N, T] the same under the sampler that drew them.
      mask: [N, T] valid tokens (only mask > 0 matters).
      cap: C > 0, the truncation.

    Returns:
      (w [N, T] float32, {"tis_weight": mean w, "tis_capped_frac": share of tokens with
      exp(.) > C}, both over the valid tokens).
    """
    check_rank("train_logp", train_logp, 2)
    check_shape("sampler_logp", sampler_logp, train_logp.shape)
    check_shape("mask", mask, train_logp.shape)
    dtype = _float_dtype(train_logp)
    valid = jnp.asarray(mask) > 0
    log_w = jnp.where(valid, jax.lax.stop_gradient(train_logp).astype(dtype)
                      - jax.lax.stop_gradient(sampler_logp).astype(dtype), 0.0)
    raw = jnp.exp(log_w)
    w = jnp.minimum(raw, cap)
    metrics = {"tis_weight": masked_mean(w, valid.astype(dtype)),
               "tis_capped_frac": masked_mean((raw > cap).astype(dtype), valid.astype(dtype))}
    return w, metrics


__all__ = ["AGGREGATIONS", "LEVELS", "LOSS_TYPES", "aggregate", "clipped_surrogate",
           "importance_ratio", "k3_kl", "tis_weight"]

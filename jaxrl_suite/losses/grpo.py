"""GRPO: group-relative advantages and the clipped token-level policy loss.

Papers:
  GRPO     -- Shao et al., DeepSeekMath, arXiv 2402.03300.
  Dr. GRPO -- Liu et al., Understanding R1-Zero-Like Training, arXiv 2503.20783.
  DAPO     -- Yu et al., DAPO, arXiv 2503.14476.
"""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp

from jaxrl_suite.losses.common import check_rank, check_shape, masked_mean


def _group_std(rewards: chex.Array) -> chex.Array:
    return jnp.std(rewards, axis=1, ddof=1, keepdims=True)  # [B, 1]


def _batch_std(rewards: chex.Array) -> chex.Array:
    return jnp.std(rewards, ddof=1)  # []


# scale name -> std used as the advantage denominator (None: no scaling).
_ADVANTAGE_SCALES: dict[str, Callable[[chex.Array], chex.Array] | None] = {
    "group": _group_std,
    "batch": _batch_std,
    "none": None,
}


def group_advantages(rewards: chex.Array, *, scale: str = "group", eps: float = 1e-4) -> chex.Array:
    """Group-relative advantages: each reward minus its group's mean, optionally scaled.

        A_ij = (r_ij - mean_j r_ij) / (s + eps)

    with s, by `scale`:
      "group": std_j r_ij, the std of prompt i's group (ddof=1, as TRL and tunix)   [GRPO]
      "batch": std of all B*G rewards (ddof=1)
      "none":  no division at all, A_ij = r_ij - mean_j r_ij                     [Dr. GRPO]

    GRPO: arXiv 2402.03300. Dr. GRPO (drops the std, which biases towards easy and hard
    prompts): arXiv 2503.20783.

    Args:
      rewards: [B, G] rewards of G completions for each of B prompts.
      scale: "group", "batch" or "none" (static).
      eps: added to the std before dividing; a constant group gives zeros, not NaN.

    Returns:
      [B, G] advantages, in at least float32.

    Raises:
      ValueError: `rewards` is not rank 2, G < 2, or `scale` is unknown.
    """
    if scale not in _ADVANTAGE_SCALES:
        raise ValueError(
            f"unknown scale {scale!r}; valid options: {', '.join(map(repr, _ADVANTAGE_SCALES))}"
        )
    check_rank("rewards", rewards, 2)
    if rewards.shape[1] < 2:
        raise ValueError(
            f"rewards must hold G >= 2 completions per prompt, got shape {rewards.shape}"
        )
    rewards = jnp.asarray(rewards)
    rewards = rewards.astype(jnp.promote_types(rewards.dtype, jnp.float32))  # [B, G]
    centered = rewards - jnp.mean(rewards, axis=1, keepdims=True)  # [B, G]
    std_fn = _ADVANTAGE_SCALES[scale]
    if std_fn is None:
        return centered
    return centered / (std_fn(rewards) + eps)  # [B, G]


def _sequence_mean_token_mean(x: chex.Array, mask: chex.Array) -> chex.Array:
    """GRPO: each sequence's masked token mean, then the mean over all N sequences."""
    return jnp.mean(masked_mean(x, mask, axis=-1))


def _token_mean(x: chex.Array, mask: chex.Array) -> chex.Array:
    """DAPO / BNPO: one mean over all valid tokens of the batch."""
    return masked_mean(x, mask)


def _constant_normalizer(x: chex.Array, mask: chex.Array) -> chex.Array:
    """Dr. GRPO: masked token sum divided by the constant N * T."""
    return jnp.sum(x * mask) / x.size


# loss_type -> aggregation of a per-token [N, T] loss into a scalar.
_AGGREGATIONS: dict[str, Callable[[chex.Array, chex.Array], chex.Array]] = {
    "grpo": _sequence_mean_token_mean,
    "dapo": _token_mean,
    "bnpo": _token_mean,
    "dr_grpo": _constant_normalizer,
}


def _is_static_zero(beta) -> bool:
    try:
        return float(beta) == 0.0
    except TypeError:  # a tracer (jax.errors.ConcretizationTypeError is a TypeError)
        return False


def grpo_loss(
    logp: chex.Array,
    old_logp: chex.Array,
    ref_logp: chex.Array | None,
    advantages: chex.Array,
    mask: chex.Array,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    beta: float = 0.0,
    loss_type: str = "grpo",
    token_weights: chex.Array | None = None,
    entropy_mask: chex.Array | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """Clipped token-level policy-gradient loss of GRPO, with its Dr. GRPO and DAPO variants.

    Per token t of sequence i, with eps_lo = clip_eps and eps_hi = clip_eps_high:

        r_it  = exp(logp_it - old_logp_it)
        pg_it = -min(r_it * A_i, clip(r_it, 1 - eps_lo, 1 + eps_hi) * A_i)
        kl_it = exp(ref_it - logp_it) - (ref_it - logp_it) - 1      (k3 estimator, >= 0)
        loss  = agg(pg * e, m * w) + beta * agg(kl, m)

    where m is `mask`, w is `token_weights` (1 if None), e is `entropy_mask` (1 if None) and agg
    is, by `loss_type`:
      "grpo":    mean_i [ sum_t x_it m_it / max(sum_t m_it, 1) ]  per-sequence mean  [GRPO]
      "dapo":    sum_it x_it m_it / max(sum_it m_it, 1)            token mean       [DAPO]
      "bnpo":    same as "dapo" on one device (TRL's bnpo normalises by the local batch,
                 dapo by the global one; here both see only the arrays passed in)
      "dr_grpo": sum_it x_it m_it / (N * T)                        constant         [Dr. GRPO]

    With w == 1 this is agg(pg + beta * kl, m), since every agg is linear in x.

    Papers: GRPO (DeepSeekMath) arXiv 2402.03300; Dr. GRPO arXiv 2503.20783 (constant
    normaliser, no length bias); DAPO arXiv 2503.14476 (clip-higher eps_hi > eps_lo,
    token-level mean). The k3 KL estimator is from J. Schulman, "Approximating KL Divergence"
    (2020).

    `old_logp` and `ref_logp` are treated as data: gradients are stopped through them, so
    passing `old_logp=logp` gives the on-policy gradient -A * grad logp. Positions with
    mask 0 may hold any value (even -inf): they are zeroed before the exponentials.

    Args:
      logp: [N, T] log-probabilities of the sampled tokens under the current policy.
      old_logp: [N, T] the same under the policy that sampled them.
      ref_logp: [N, T] the same under the reference policy, or None when beta == 0.
      advantages: [N] one advantage per sequence (e.g. `group_advantages(r).reshape(-1)`).
      mask: [N, T] 1 for completion tokens, 0 for padding (bool or float).
      clip_eps: eps_lo, the lower clip range.
      clip_eps_high: eps_hi, the upper clip range; None means clip_eps.
      beta: weight of the KL penalty towards the reference policy.
      loss_type: "grpo", "dapo", "bnpo" or "dr_grpo" (static).
      token_weights: [N, T] optional non-negative weights multiplying the mask of the
        policy-gradient term only (e.g. 1 on high-entropy tokens, 0 elsewhere); a zero weight
        removes a token from the pg term, numerator and denominator alike. The KL term and
        the metrics use the full mask. The "max(., 1)" guards apply to zero totals only, so
        for "grpo", "dapo" and "bnpo" fractional weights give a weighted mean (only their
        ratios matter), while for "dr_grpo" they scale the pg term.
      entropy_mask: [N, T] optional 0/1 mask of the tokens whose pg term is kept: the
        high-entropy-only update of Wang et al., "Beyond the 80/20 Rule" (arXiv 2506.01939),
        TRL's `top_entropy_quantile` (build it with `losses.siren.peak_entropy_mask`). Unlike a
        zero token weight, a dropped token still counts in the normaliser, as in TRL and the
        paper's code. Composes with every `loss_type` and with `token_weights`.

    Returns:
      (loss, metrics): loss is a scalar; metrics holds scalars, all token means over `mask`
      except pg_loss:
        "pg_loss":   the pg term aggregated like the loss,
        "kl":        mean k3 KL (0 when ref_logp is None),
        "ratio":     mean r,
        "clip_frac": fraction of tokens whose clipped branch is active, as TRL defines it:
                     (r < 1 - eps_lo and A < 0) or (r > 1 + eps_hi and A > 0).

    Raises:
      ValueError: a wrong rank or shape, an unknown `loss_type`, or beta != 0 with
        ref_logp None.
    """
    if loss_type not in _AGGREGATIONS:
        raise ValueError(
            f"unknown loss_type {loss_type!r}; valid: {', '.join(map(repr, _AGGREGATIONS))}"
        )
    if ref_logp is None and not _is_static_zero(beta):
        raise ValueError(f"beta={beta!r} needs ref_logp, but ref_logp is None")
    check_rank("logp", logp, 2)
    check_rank("advantages", advantages, 1)
    same_shape = {
        "old_logp": old_logp,
        "ref_logp": ref_logp,
        "mask": mask,
        "token_weights": token_weights,
        "entropy_mask": entropy_mask,
    }
    for name, x in same_shape.items():
        if x is not None:
            check_shape(name, x, logp.shape)
    check_shape("advantages", advantages, logp.shape[:1])

    dtype = jnp.promote_types(logp.dtype, jnp.float32)
    valid = jnp.asarray(mask) > 0  # [N, T]
    mask = valid.astype(dtype)  # [N, T]
    pg_mask = mask if token_weights is None else mask * jnp.asarray(token_weights, dtype)  # [N, T]
    eps_lo = clip_eps
    eps_hi = clip_eps if clip_eps_high is None else clip_eps_high
    adv = jnp.asarray(advantages, dtype)[:, None]  # [N, 1]
    logp = logp.astype(dtype)

    log_ratio = jnp.where(valid, logp - jax.lax.stop_gradient(old_logp).astype(dtype), 0.0)
    ratio = jnp.exp(log_ratio)  # [N, T]
    clipped = jnp.clip(ratio, 1.0 - eps_lo, 1.0 + eps_hi)  # [N, T]
    pg = -jnp.minimum(ratio * adv, clipped * adv)  # [N, T]
    is_clipped = ((ratio < 1.0 - eps_lo) & (adv < 0)) | ((ratio > 1.0 + eps_hi) & (adv > 0))

    if entropy_mask is not None:
        pg = pg * jnp.asarray(entropy_mask, dtype)
    aggregate = _AGGREGATIONS[loss_type]
    pg_loss = aggregate(pg, pg_mask)
    if ref_logp is None:
        kl_mean = jnp.zeros((), dtype)
        loss = pg_loss
    else:
        ref_diff = jax.lax.stop_gradient(ref_logp).astype(dtype) - logp
        ref_diff = jnp.where(valid, ref_diff, 0.0)  # [N, T]
        kl = jnp.exp(ref_diff) - ref_diff - 1.0  # [N, T]
        kl_mean = masked_mean(kl, mask)
        loss = pg_loss + beta * aggregate(kl, mask)

    metrics = {
        "pg_loss": pg_loss,
        "kl": kl_mean,
        "ratio": masked_mean(ratio, mask),
        "clip_frac": masked_mean(is_clipped.astype(dtype), mask),
    }
    return loss, metrics

"""GRPO's policy loss and its variants, composed from `losses.policy`, registered by name.

    grpo   token ratio, clipped surrogate       Shao et al., DeepSeekMath, arXiv 2402.03300
    gspo   sequence ratio, clipped surrogate    Zheng et al., GSPO, arXiv 2507.18071
    cispo  detached clipped token ratio * logp  MiniMax-M1, arXiv 2506.13585

All entries of `POLICY_LOSSES` share one signature,

    loss(logp, old_logp, ref_logp, advantages, mask, **hyperparams) -> (scalar, metrics)

with the hyperparameters of `grpo_loss` (clip_eps, clip_eps_high, beta, loss_type,
token_weights, entropy_mask; each entry has its paper's defaults), and the metrics "pg_loss",
"kl", "ratio" and "clip_frac", so a config picks one by name (`grpo.policy_loss`). The
aggregations (`loss_type`: grpo, dr_grpo, dapo, bnpo) are Dr. GRPO's (arXiv 2503.20783) and
DAPO's (arXiv 2503.14476).
"""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp

from jaxrl_suite.core.registry import Registry
from jaxrl_suite.losses.advantages import group_advantages
from jaxrl_suite.losses.common import check_rank, check_shape, masked_mean
from jaxrl_suite.losses.policy import (
    LOSS_TYPES,
    aggregate,
    clipped_surrogate,
    importance_ratio,
    k3_kl,
)

PolicyLoss = Callable[..., tuple[chex.Array, dict[str, chex.Array]]]
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")

# surrogate(ratio [N, T], logp [N, T] (0 on padding), advantages [N], eps_low, eps_high)
#   -> (pg [N, T] per-token loss, clipped [N, T] bool)
Surrogate = Callable[..., tuple[chex.Array, chex.Array]]


def _is_static_zero(beta) -> bool:
    try:
        return float(beta) == 0.0
    except TypeError:  # a tracer (jax.errors.ConcretizationTypeError is a TypeError)
        return False


def ppo_surrogate(ratio, logp, advantages, eps_low, eps_high):
    """`clipped_surrogate` as a `Surrogate` (it depends on logp through the ratio only)."""
    del logp
    return clipped_surrogate(ratio, advantages, eps_low, eps_high)


def cispo_surrogate(ratio, logp, advantages, eps_low, eps_high):
    """CISPO's per-token loss -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * logp; `clipped`
    marks the tokens whose weight is capped, whatever the sign of A (see `cispo_loss`)."""
    weight = jax.lax.stop_gradient(jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high))  # [N, T]
    pg = -weight * advantages[:, None] * logp  # [N, T]
    return pg, (ratio < 1.0 - eps_low) | (ratio > 1.0 + eps_high)


def compose_policy_loss(
    surrogate: Surrogate, level: str, logp, old_logp, ref_logp, advantages, mask, *,
    clip_eps: float = 0.2, clip_eps_high: float | None = None, beta: float = 0.0,
    loss_type: str = "grpo", token_weights=None, entropy_mask=None, pg_weights=None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """A policy loss from its parts, the body of every `POLICY_LOSSES` entry:

        r        = importance_ratio(logp, old_logp, m, level)            [N, T]
        pg, clip = surrogate(r, logp, A, eps_lo, eps_hi)                 [N, T]
        loss     = aggregate(pg * e * u, m * w, loss_type) + beta * aggregate(k3_kl, m, loss_type)

    with e = `entropy_mask`, w = `token_weights`, u = `pg_weights` (1 if None), eps_lo =
    clip_eps and eps_hi = clip_eps_high (None: clip_eps); `level` is "token" or "sequence".
    Validates the arguments and returns (loss, metrics) as `grpo_loss` documents. A new variant
    is a `surrogate` and/or a `level` passed here, plus one registry line."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(
            f"unknown loss_type {loss_type!r}; valid: {', '.join(map(repr, LOSS_TYPES))}"
        )
    if ref_logp is None and not _is_static_zero(beta):
        raise ValueError(f"beta={beta!r} needs ref_logp, but ref_logp is None")
    check_rank("logp", logp, 2)
    check_rank("advantages", advantages, 1)
    same_shape = {"old_logp": old_logp, "ref_logp": ref_logp, "mask": mask,
                  "token_weights": token_weights, "entropy_mask": entropy_mask,
                  "pg_weights": pg_weights}
    for name, x in same_shape.items():
        if x is not None:
            check_shape(name, x, logp.shape)
    check_shape("advantages", advantages, logp.shape[:1])

    dtype = jnp.promote_types(logp.dtype, jnp.float32)
    valid = jnp.asarray(mask) > 0  # [N, T]
    mask = valid.astype(dtype)  # [N, T]
    pg_mask = mask if token_weights is None else mask * jnp.asarray(token_weights, dtype)
    eps_hi = clip_eps if clip_eps_high is None else clip_eps_high
    logp = logp.astype(dtype)

    ratio = importance_ratio(logp, old_logp, valid, level)  # [N, T]
    logp_valid = jnp.where(valid, logp, 0.0)  # padding may hold -inf
    pg, is_clipped = surrogate(ratio, logp_valid, jnp.asarray(advantages, dtype), clip_eps, eps_hi)
    if entropy_mask is not None:
        pg = pg * jnp.asarray(entropy_mask, dtype)
    if pg_weights is not None:
        pg = pg * jax.lax.stop_gradient(jnp.asarray(pg_weights, dtype))
    pg_loss = aggregate(pg, pg_mask, loss_type)
    if ref_logp is None:
        kl_mean = jnp.zeros((), dtype)
        loss = pg_loss
    else:
        kl = k3_kl(logp, ref_logp, valid)  # [N, T]
        kl_mean = masked_mean(kl, mask)
        loss = pg_loss + beta * aggregate(kl, mask, loss_type)
    metrics = {
        "pg_loss": pg_loss,
        "kl": kl_mean,
        "ratio": masked_mean(ratio, mask),
        "clip_frac": masked_mean(is_clipped.astype(dtype), mask),
    }
    return loss, metrics


@POLICY_LOSSES.register("grpo")
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
    pg_weights: chex.Array | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """Clipped token-level policy-gradient loss of GRPO, with its Dr. GRPO and DAPO variants.

    Per token t of sequence i, with eps_lo = clip_eps and eps_hi = clip_eps_high:

        r_it  = exp(logp_it - old_logp_it)                              importance_ratio
        pg_it = -min(r_it * A_i, clip(r_it, 1 - eps_lo, 1 + eps_hi) * A_i)   clipped_surrogate
        kl_it = exp(ref_it - logp_it) - (ref_it - logp_it) - 1          k3_kl (>= 0)
        loss  = agg(pg * e * u, m * w) + beta * agg(kl, m)              aggregate

    where m is `mask`, w is `token_weights` (1 if None), e is `entropy_mask` (1 if None), u is
    `pg_weights` (1 if None) and agg
    is `losses.policy.aggregate` by `loss_type` ("grpo": per-sequence token mean, then the mean
    over sequences [GRPO]; "dapo"/"bnpo": one token mean over the batch [DAPO]; "dr_grpo": the
    token sum over the constant N * T [Dr. GRPO]). With w == 1 this is agg(pg + beta * kl, m).

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
      pg_weights: [N, T] optional non-negative per-token weights u multiplying the pg term
        (no gradient) outside the normaliser, so they scale each token's gradient for every
        `loss_type`: truncated importance sampling's weights (`losses.policy.tis_weight`, Yao
        et al. 2025, as verl applies them). The KL term and the metrics are unweighted.

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
    return compose_policy_loss(
        ppo_surrogate, "token", logp, old_logp, ref_logp, advantages, mask,
        clip_eps=clip_eps, clip_eps_high=clip_eps_high, beta=beta, loss_type=loss_type,
        token_weights=token_weights, entropy_mask=entropy_mask, pg_weights=pg_weights,
    )


@POLICY_LOSSES.register("gspo")
def gspo_loss(logp, old_logp, ref_logp, advantages, mask, **hyperparams):
    """GSPO: GRPO's clipped surrogate on the length-normalised sequence ratio.

        s_i   = exp( sum_t m_it (logp_it - old_logp_it) / sum_t m_it )   importance_ratio(sequence)
        pg_i  = -min(s_i * A_i, clip(s_i, 1 - eps_lo, 1 + eps_hi) * A_i)
        loss  = agg(pg, m) + beta * agg(kl, m)

    Zheng et al., Group Sequence Policy Optimization, arXiv 2507.18071. The paper's objective is
    mean_i pg_i, which is agg with loss_type "grpo" (each sequence's positions hold the same
    pg_i); the gradient flows through s_i into every token of the sequence (the paper's
    sequence-level form). Its clip range is much smaller than GRPO's, since s_i is a geometric
    mean of token ratios: the paper uses eps_lo = 3e-4, eps_hi = 4e-4, the defaults here (a
    config sets them through `grpo.clip_eps` / `grpo.clip_eps_high`). "clip_frac" is the
    fraction of tokens in clipped sequences. Arguments (`hyperparams`: those of `grpo_loss`)
    and metrics as `grpo_loss`.
    """
    hyperparams = {"clip_eps": 3e-4, "clip_eps_high": 4e-4} | hyperparams
    return compose_policy_loss(ppo_surrogate, "sequence", logp, old_logp, ref_logp, advantages,
                               mask, **hyperparams)


@POLICY_LOSSES.register("cispo")
def cispo_loss(logp, old_logp, ref_logp, advantages, mask, **hyperparams):
    """CISPO: REINFORCE weighted by the clipped, detached token importance ratio.

        r_it  = exp(logp_it - old_logp_it)
        pg_it = -sg(clip(r_it, 1 - eps_lo, 1 + eps_hi)) * A_i * logp_it
        loss  = agg(pg, m) + beta * agg(kl, m)

    MiniMax-M1, arXiv 2506.13585. Unlike the PPO clip, no token's gradient is dropped: a token
    whose ratio leaves the range keeps the gradient -w A grad logp with its weight w capped
    (grad pg_it = -w_it A_i grad logp_it). The paper clips the weight from above only ("we did
    not impose a lower bound", i.e. eps_lo large; the default eps_lo = 1 bounds it at 0, which
    no ratio reaches) and takes the token mean over the batch (loss_type "dapo", the default
    here). eps_hi = 0.28 is DAPO's upper clip (the paper tunes eps_hi per setup). "clip_frac" is
    the fraction of tokens whose weight is capped (r outside [1 - eps_lo, 1 + eps_hi], whatever
    the sign of A). Arguments (`hyperparams`: those of `grpo_loss`) and metrics as `grpo_loss`.
    """
    hyperparams = {"clip_eps": 1.0, "clip_eps_high": 0.28, "loss_type": "dapo"} | hyperparams
    return compose_policy_loss(cispo_surrogate, "token", logp, old_logp, ref_logp, advantages,
                               mask, **hyperparams)


__all__ = [
    "POLICY_LOSSES",
    "cispo_loss",
    "cispo_surrogate",
    "compose_policy_loss",
    "group_advantages",
    "grpo_loss",
    "gspo_loss",
    "ppo_surrogate",
]

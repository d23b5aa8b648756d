"""GRPO's whole objective as one pure function of per-token statistics, the batch and the
hyperparameters: `grpo_objective(token_stats, batch, hp) -> (loss, metrics)`.

The trainer (`algorithms.grpo.GRPOTrainer`) only computes the per-token statistics of its model
(`TokenStats`: from the full logits, chunk by chunk (`losses.chunked`) or from a diffusion LM's
log-prob estimator) and calls this; everything else is here. Per token t of sequence i, with m
the loss mask:

    r_it    = exp(logp_it - old_it)                                  importance ratio
    pg_it   = -min(r_it A_i, clip(r_it, 1 - eps_lo, 1 + eps_hi) A_i)   clipped surrogate
    kl_it   = exp(ref_it - logp_it) - (ref_it - logp_it) - 1          k3 KL
    e_it    = [H_it >= Quantile_m(H, q)]      (high_entropy_quantile q; else 1)
    u_it    = min(exp(old_it - sampler_it), C)  (TIS, when the sampler's log-probs are given)
    loss    = agg(pg e u, m w) + beta agg(kl, m) + R(stats, m)

with w the batch's `token_weights` (1 if None), agg the `loss_type` aggregation
(`losses.policy.aggregate`) and R the entropy regulariser `hp.entropy_reg`
(`losses.siren.REGULARIZERS`). The policy loss is `hp.policy_loss` of `losses.POLICY_LOSSES`
(the above is "grpo"'s surrogate).

Papers: GRPO, DeepSeekMath, arXiv 2402.03300 (group advantages, the clipped surrogate, k3 KL);
DAPO, arXiv 2503.14476 (token-mean "dapo" aggregation, clip-higher eps_hi > eps_lo); Dr. GRPO,
arXiv 2503.20783 (constant normaliser "dr_grpo"); Wang et al., "Beyond the 80/20 Rule", arXiv
2506.01939 (the high-entropy-token mask e); Yao et al. 2025, truncated importance sampling (TIS,
u); SIREN, arXiv 2509.25133 (selective entropy regularisation, R = "siren"); the k3 estimator is
J. Schulman's "Approximating KL Divergence" (2020).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxrl_suite.losses.common import masked_mean
from jaxrl_suite.losses.grpo import POLICY_LOSSES
from jaxrl_suite.losses.policy import tis_weight
from jaxrl_suite.losses.siren import (
    REGULARIZERS,
    as_regularizer,
    peak_entropy_mask,
    statistics_from_logits,
)

# Metrics of the objective that are means over the batch's valid tokens (rescaled by a
# micro-batch's token share, see `grpo_objective`).
TOKEN_MEAN_METRICS = ("kl", "ratio", "clip_frac", "entropy", "pg_token_frac", "top_p_entropy",
                      "masked_fraction", "tis_weight", "tis_capped_frac")
# The loss types whose loss is a token mean over the batch (micro-batches weigh by tokens).
TOKEN_MEAN_LOSS_TYPES = ("dapo", "bnpo")


class TokenStats(NamedTuple):
    """Per-token statistics of the policy on a batch's completion tokens.

    logp: [B, N] log-probs of the completion tokens (with their gradient).
    entropy: [B, N] full-vocabulary entropy (with its gradient when a regulariser takes it from
      here; the objective's metric and high-entropy mask use it detached), or None when the
      model has no softmax to take it from (a diffusion LM's log-prob estimates): the objective
      is then the policy loss alone.
    logits: [B, N, V] the full logits (temperature applied), or None when chunked; with them the
      regulariser computes its statistics from them.
    top_p_entropy: [B, N] the top-p entropy at `hp.siren_top_p` (with its gradient), when the
      logits are not given and the regulariser needs it.
    """

    logp: chex.Array
    entropy: chex.Array | None = None
    logits: chex.Array | None = None
    top_p_entropy: chex.Array | None = None


class ObjectiveBatch(NamedTuple):
    """The data of one (micro-)batch of the objective.

    mask: [B, N] the loss mask (1 on trained completion tokens).
    old_logp: [B, N] log-probs of the policy that sampled (or the trainer's recomputed ones under
      TIS); None: on-policy, the current log-probs detached (a scorer's, mu = 1).
    ref_logp: [B, N] reference log-probs, or None (beta == 0).
    advantages: [B] one per sequence.
    sampler_logp: [B, N] the sampler's log-probs: the pg term is weighted by TIS's
      min(exp(old_logp - sampler_logp), tis_cap); None: no weight.
    token_weights: [B, N] non-negative weights of the pg term's mask (`grpo_loss`), or None.
    anchor: [] SIREN's target entropy (no gradient), or None when the regulariser needs none.
    n_tokens: [] the valid tokens of the whole batch, with gradient micro-batches (k > 1).
    """

    mask: chex.Array
    old_logp: chex.Array | None
    ref_logp: chex.Array | None
    advantages: chex.Array
    sampler_logp: chex.Array | None = None
    token_weights: chex.Array | None = None
    anchor: chex.Array | float | None = None
    n_tokens: chex.Array | None = None


@dataclasses.dataclass(frozen=True)
class ObjectiveHParams:
    """The hyperparameters of `grpo_objective` (static), the `GRPOConfig` fields of the same
    names (`algorithms.grpo_config.objective_hparams` builds them) plus `micro_batches`, the
    number k of gradient micro-batches the batch is split into (1: none)."""

    policy_loss: str = "grpo"
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    beta: float = 0.0
    loss_type: str = "dapo"
    entropy_reg: str = "none"
    entropy_coef: float = 0.0
    siren_top_p: float = 0.9
    siren_quantile: float = 0.8
    high_entropy_quantile: float | None = None
    tis_cap: float = 2.0
    micro_batches: int = 1

    def __post_init__(self):
        POLICY_LOSSES.get(self.policy_loss)  # UnknownNameError listing the known ones
        REGULARIZERS.get(self.entropy_reg)
        if self.micro_batches < 1:
            raise ValueError(f"micro_batches must be >= 1, got {self.micro_batches}")


def grpo_objective(
    token_stats: TokenStats, batch: ObjectiveBatch, hp: ObjectiveHParams
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """GRPO's loss on one (micro-)batch: policy loss + entropy regulariser (module docstring).

    Steps: the high-entropy mask e from the detached entropy (`hp.high_entropy_quantile`,
    `losses.siren.peak_entropy_mask`); TIS weights u (`losses.policy.tis_weight`) when
    `batch.sampler_logp` is set; the policy loss `hp.policy_loss` with `batch.token_weights`;
    the regulariser `hp.entropy_reg` on the statistics it needs (from `token_stats.logits` when
    given, else from `token_stats`'s per-token fields).

    Gradient micro-batches (`hp.micro_batches` = k > 1) of a loss that is a mean over rows
    ("grpo", "dr_grpo"; the trainer weighs each micro-batch 1/k): the token means (a
    token-mean regulariser such as the naive entropy bonus, and `TOKEN_MEAN_METRICS`) are
    rescaled by this micro-batch's share of the batch's tokens, n_j / n (n = `batch.n_tokens`),
    over 1/k, so that they sum to the batch's token means.

    Returns:
      (loss, metrics): the policy loss's metrics (pg_loss, kl, ratio, clip_frac), "entropy" (mean
      detached entropy), "pg_token_frac" (with the high-entropy mask), TIS's tis_weight /
      tis_capped_frac, and the regulariser's ("entropy_reg", ...). With no entropy statistics
      (`token_stats.entropy` None) the policy loss and its metrics alone.

    Raises:
      ValueError: an option that needs a statistic `token_stats` lacks.
    """
    policy_loss = POLICY_LOSSES.get(hp.policy_loss)
    regularizer = as_regularizer(REGULARIZERS.get(hp.entropy_reg))
    mask = batch.mask
    logp = token_stats.logp
    old_logp = jax.lax.stop_gradient(logp) if batch.old_logp is None else batch.old_logp
    token_ent = None  # [B, N], detached: metrics / mask
    if token_stats.entropy is not None:
        token_ent = jax.lax.stop_gradient(token_stats.entropy)
    elif hp.high_entropy_quantile is not None or regularizer.needs:
        raise ValueError(f"entropy_reg={hp.entropy_reg!r} / high_entropy_quantile="
                         f"{hp.high_entropy_quantile} need the token entropies")
    entropy_mask = None
    if hp.high_entropy_quantile is not None:
        entropy_mask = peak_entropy_mask(token_ent, mask, quantile=hp.high_entropy_quantile)
    tis_weights, tis_metrics = None, {}
    if batch.sampler_logp is not None:
        tis_weights, tis_metrics = tis_weight(old_logp, batch.sampler_logp, mask, hp.tis_cap)
    loss, metrics = policy_loss(
        logp, old_logp, batch.ref_logp, batch.advantages, mask, clip_eps=hp.clip_eps,
        clip_eps_high=hp.clip_eps_high, beta=hp.beta, loss_type=hp.loss_type,
        token_weights=batch.token_weights, entropy_mask=entropy_mask,
        **({} if tis_weights is None else {"pg_weights": tis_weights}),
    )
    if token_ent is None:  # log-prob estimates only (a diffusion LM's): the policy loss alone
        return loss, dict(metrics, **tis_metrics)
    metrics = dict(metrics, entropy=masked_mean(token_ent, mask), **tis_metrics)
    if entropy_mask is not None:
        metrics["pg_token_frac"] = jnp.sum(entropy_mask) / jnp.maximum(jnp.sum(mask), 1)
    reg, reg_metrics = regularizer.fn(
        regularizer_statistics(token_stats, regularizer.needs, hp), mask,
        coef=hp.entropy_coef, top_p=hp.siren_top_p, quantile=hp.siren_quantile,
        anchor=batch.anchor)
    metrics = {**metrics, **reg_metrics}
    k = hp.micro_batches
    if k > 1 and hp.loss_type not in TOKEN_MEAN_LOSS_TYPES:
        # Micro-batches weigh 1/k each (a mean over rows); the token means are rescaled by this
        # micro-batch's share of the batch's tokens, n_j / n, over 1/k, so they sum to the
        # batch's.
        share = k * jnp.sum(mask > 0) / jnp.maximum(batch.n_tokens, 1.0)
        if regularizer.token_mean:
            reg = reg * share
        metrics = {n: v * share if n in TOKEN_MEAN_METRICS or (
            n == "entropy_reg" and regularizer.token_mean) else v
            for n, v in metrics.items()}
    return loss + reg, metrics


def regularizer_statistics(token_stats: TokenStats, needs, hp: ObjectiveHParams
                           ) -> dict[str, chex.Array]:
    """The per-token statistics `needs` of a regulariser: computed from `token_stats.logits`
    when given (`losses.siren.statistics_from_logits`, with their gradient), else taken from its
    per-token fields; a statistic it lacks (e.g. the logits, when chunked) is a ValueError."""
    if token_stats.logits is not None:
        return statistics_from_logits(token_stats.logits, needs, top_p=hp.siren_top_p)
    given = {"entropy": token_stats.entropy, "top_p_entropy": token_stats.top_p_entropy}
    missing = [n for n in needs if given.get(n) is None]
    if missing:
        raise ValueError(f"entropy_reg={hp.entropy_reg!r} needs {', '.join(missing)}, which the "
                         f"token statistics lack (chunked log-probs keep no logits)")
    return {n: given[n] for n in needs}


__all__ = [
    "TOKEN_MEAN_LOSS_TYPES",
    "TOKEN_MEAN_METRICS",
    "ObjectiveBatch",
    "ObjectiveHParams",
    "TokenStats",
    "grpo_objective",
    "regularizer_statistics",
]

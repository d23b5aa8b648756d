"""Preference losses on pairs of sequences: DPO and ORPO.

DPO (Rafailov et al. 2023, "Direct Preference Optimization: Your Language Model is Secretly a
Reward Model", arXiv:2305.18290) fits the policy to pairs (y_w preferred over y_l) through the
implicit reward beta * log(pi / pi_ref), with no reward model. ORPO (Hong, Lee and Thorne 2024,
"ORPO: Monolithic Preference Optimization without Reference Model", arXiv:2403.07691) adds to
the chosen sequence's NLL an odds-ratio term that needs no reference model.

Both take per-token log-probabilities of the completion tokens (`losses.common.token_logprobs`)
with their masks, so they compose with the trainers: chosen [B, T], rejected [B, T'] (the two
may be padded to different lengths), one row per pair. Positions with mask 0 may hold any value
(even -inf). Both are pure, jit-compatible functions of arrays and compute in at least float32.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxrl_suite.losses.common import check_rank, check_shape, masked_mean


def _check_positive(name: str, x) -> None:
    """ValueError for a concrete x <= 0 (a tracer passes)."""
    if not isinstance(x, jax.core.Tracer) and not float(x) > 0:
        raise ValueError(f"{name} must be positive, got {x}")


def _check_pair(chosen_logp, chosen_mask, rejected_logp, rejected_mask, weights) -> None:
    check_rank("chosen_logp", chosen_logp, 2)
    check_shape("chosen_mask", chosen_mask, chosen_logp.shape)
    check_rank("rejected_logp", rejected_logp, 2)
    check_shape("rejected_mask", rejected_mask, rejected_logp.shape)
    batch = chosen_logp.shape[:1]
    if rejected_logp.shape[:1] != batch:
        raise ValueError(f"rejected_logp must have {batch[0]} rows (one per pair), got shape "
                         f"{rejected_logp.shape}")
    if weights is not None:
        check_shape("weights", weights, batch)


def _sequence_logp(logp: chex.Array, mask: chex.Array, dtype) -> chex.Array:
    """[B, T] token log-probs -> [B] sum over the mask (padding may hold -inf)."""
    return jnp.sum(jnp.where(jnp.asarray(mask) > 0, logp.astype(dtype), 0.0), axis=-1)


def _pair_mean(x: chex.Array, weights: chex.Array | None) -> chex.Array:
    """Mean of [B] per-pair values, weighted by `weights` when given (0 for zero total)."""
    if weights is None:
        return jnp.mean(x)
    return masked_mean(x, jnp.asarray(weights, x.dtype))


def dpo_loss(
    chosen_logp: chex.Array,
    chosen_mask: chex.Array,
    rejected_logp: chex.Array,
    rejected_mask: chex.Array,
    ref_chosen_logp: chex.Array,
    ref_rejected_logp: chex.Array,
    *,
    beta: float | chex.Array = 0.1,
    weights: chex.Array | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """Direct Preference Optimization loss (Rafailov et al. 2023, arXiv:2305.18290, eq. 7).

        log pi(y)  = sum_t m_t log pi(y_t | y_<t)                    (sum over the mask)
        r_w        = beta * (log pi(y_w) - log pi_ref(y_w))          implicit reward, chosen
        r_l        = beta * (log pi(y_l) - log pi_ref(y_l))          implicit reward, rejected
        l_b        = -log sigmoid(r_w - r_l)                         (jax.nn.log_sigmoid)
        loss       = sum_b w_b l_b / sum_b w_b                       (plain mean when w is None)

    The gradient flows into the policy's log-probs only (the reference's are data):
    d l_b / d log pi(y_w) = -beta * sigmoid(-(r_w - r_l)), and the opposite for y_l.

    Args:
      chosen_logp: [B, T] policy token log-probs of the chosen (preferred) completions.
      chosen_mask: [B, T] completion-token mask of the chosen rows (only mask > 0 matters).
      rejected_logp: [B, T'] policy token log-probs of the rejected completions.
      rejected_mask: [B, T'] their mask.
      ref_chosen_logp: [B, T] reference-model token log-probs of the chosen completions.
      ref_rejected_logp: [B, T'] the same for the rejected completions.
      beta: the KL-regularisation strength beta > 0 (0.1, as the paper and TRL).
      weights: optional [B] non-negative per-pair weights (e.g. 0 for padding pairs).

    Returns:
      (loss [], metrics), every metric a (weighted) mean over pairs:
        dpo_loss:            the loss;
        dpo_margin:          r_w - r_l, the reward margin (beta times the log-ratio difference);
        dpo_accuracy:        fraction of pairs with r_w - r_l > 0;
        dpo_chosen_reward:   r_w;
        dpo_rejected_reward: r_l.
      Zero total weight gives loss 0, not NaN.
    """
    _check_pair(chosen_logp, chosen_mask, rejected_logp, rejected_mask, weights)
    check_shape("ref_chosen_logp", ref_chosen_logp, chosen_logp.shape)
    check_shape("ref_rejected_logp", ref_rejected_logp, rejected_logp.shape)
    _check_positive("beta", beta)
    dtype = jnp.promote_types(jnp.result_type(chosen_logp, rejected_logp), jnp.float32)
    ref_chosen = jax.lax.stop_gradient(ref_chosen_logp)
    ref_rejected = jax.lax.stop_gradient(ref_rejected_logp)
    beta = jnp.asarray(beta, dtype)
    chosen_reward = beta * (_sequence_logp(chosen_logp, chosen_mask, dtype)
                            - _sequence_logp(ref_chosen, chosen_mask, dtype))  # [B]
    rejected_reward = beta * (_sequence_logp(rejected_logp, rejected_mask, dtype)
                              - _sequence_logp(ref_rejected, rejected_mask, dtype))  # [B]
    margin = chosen_reward - rejected_reward  # [B]
    per_pair = -jax.nn.log_sigmoid(margin)  # [B]
    loss = _pair_mean(per_pair, weights)
    sg = jax.lax.stop_gradient
    metrics = {
        "dpo_loss": sg(loss),
        "dpo_margin": sg(_pair_mean(margin, weights)),
        "dpo_accuracy": sg(_pair_mean((margin > 0).astype(dtype), weights)),
        "dpo_chosen_reward": sg(_pair_mean(chosen_reward, weights)),
        "dpo_rejected_reward": sg(_pair_mean(rejected_reward, weights)),
    }
    return loss, metrics


def log_odds(logp: chex.Array, max_logp: float = -1e-6) -> chex.Array:
    """Log-odds of a probability given by its log, log(P / (1 - P)) with P = exp(logp).

        log_odds(lp) = lp - log(1 - exp(lp)),   lp = min(logp, max_logp)

    log(1 - exp(lp)) is computed as log(-expm1(lp)) for lp > -log 2 and log1p(-exp(lp))
    otherwise (Maechler 2012, "Accurately Computing log(1 - exp(-|a|))"), which keeps full
    precision at both ends where the naive log(1 - exp(lp)) cancels or underflows. P = 1
    (lp = 0, possible in float32 for a near-certain sequence) has infinite odds: lp is clipped
    to at most `max_logp` < 0 first, so the log-odds stay finite (about 13.8 for the default
    -1e-6) and the gradient through a clipped entry is 0.

    Args:
      logp: log-probabilities, any shape, <= 0.
      max_logp: the clip, a negative constant.

    Returns:
      The log-odds, the shape of `logp`, in at least float32.
    """
    if not max_logp < 0:
        raise ValueError(f"max_logp must be negative, got {max_logp}")
    dtype = jnp.promote_types(jnp.result_type(logp), jnp.float32)
    lp = jnp.minimum(jnp.asarray(logp, dtype), max_logp)
    near_zero = lp > -jnp.log(2.0).astype(dtype)
    # Each branch only sees inputs in its own range, so neither makes a NaN gradient.
    log1mexp = jnp.where(
        near_zero,
        jnp.log(-jnp.expm1(jnp.where(near_zero, lp, -1.0))),
        jnp.log1p(-jnp.exp(jnp.where(near_zero, -1.0, lp))),
    )
    return lp - log1mexp


def orpo_loss(
    chosen_logp: chex.Array,
    chosen_mask: chex.Array,
    rejected_logp: chex.Array,
    rejected_mask: chex.Array,
    *,
    lam: float | chex.Array = 0.1,
    weights: chex.Array | None = None,
    max_logp: float = -1e-6,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """Odds Ratio Preference Optimization loss (Hong et al. 2024, arXiv:2403.07691, eq. 6-7).

        lp(y)   = sum_t m_t log pi(y_t | y_<t) / sum_t m_t         (mean token log-prob)
        lo(y)   = log odds(y) = lp - log(1 - exp(lp))              (`log_odds`, lp clipped to
                                                                    <= max_logp)
        z_b     = lo(y_w) - lo(y_l)                                log odds ratio
        L_OR    = sum_b w_b (-log sigmoid(z_b)) / sum_b w_b
        L_SFT   = - sum_b w_b sum_t m_bt log pi(y_w,bt) / sum_b w_b sum_t m_bt
        loss    = L_SFT + lam * L_OR

    P(y) = exp(lp) is the length-normalised likelihood, as in the paper and TRL. L_SFT is the
    token mean of the chosen completions' NLL over all the batch's chosen tokens (TRL's
    cross-entropy over the chosen rows), not a mean of per-sequence means, so long chosen
    completions weigh more; with `weights` each row's tokens count w_b times. lam = 0.1 is
    TRL's default (its `beta`).

    Args:
      chosen_logp: [B, T] policy token log-probs of the chosen completions.
      chosen_mask: [B, T] their completion-token mask (only mask > 0 matters).
      rejected_logp: [B, T'] policy token log-probs of the rejected completions.
      rejected_mask: [B, T'] their mask.
      lam: weight lambda > 0 of the odds-ratio term.
      weights: optional [B] non-negative per-pair weights (e.g. 0 for padding pairs).
      max_logp: clip of the mean log-prob before the log-odds (negative; see `log_odds`).

    Returns:
      (loss [], metrics), means over pairs (weighted when `weights` is given):
        orpo_loss:            the loss;
        orpo_nll:             L_SFT;
        orpo_or_loss:         L_OR (the odds-ratio term before lam);
        orpo_log_odds_margin: z, the log odds ratio;
        orpo_accuracy:        fraction of pairs with z > 0.
      Zero total weight (or no chosen token) gives 0, not NaN.
    """
    _check_pair(chosen_logp, chosen_mask, rejected_logp, rejected_mask, weights)
    _check_positive("lam", lam)
    dtype = jnp.promote_types(jnp.result_type(chosen_logp, rejected_logp), jnp.float32)
    chosen_valid = jnp.asarray(chosen_mask) > 0  # [B, T]
    rejected_valid = jnp.asarray(rejected_mask) > 0  # [B, T']
    chosen_tok = jnp.where(chosen_valid, chosen_logp.astype(dtype), 0.0)  # [B, T]
    rejected_tok = jnp.where(rejected_valid, rejected_logp.astype(dtype), 0.0)  # [B, T']
    chosen_mean = masked_mean(chosen_tok, chosen_valid, axis=-1)  # [B]
    rejected_mean = masked_mean(rejected_tok, rejected_valid, axis=-1)  # [B]
    margin = log_odds(chosen_mean, max_logp) - log_odds(rejected_mean, max_logp)  # [B]
    or_loss = _pair_mean(-jax.nn.log_sigmoid(margin), weights)

    token_weights = chosen_valid.astype(dtype)  # [B, T]
    if weights is not None:
        token_weights = token_weights * jnp.asarray(weights, dtype)[:, None]
    nll = masked_mean(-chosen_tok, token_weights)

    loss = nll + jnp.asarray(lam, dtype) * or_loss
    sg = jax.lax.stop_gradient
    metrics = {
        "orpo_loss": sg(loss),
        "orpo_nll": sg(nll),
        "orpo_or_loss": sg(or_loss),
        "orpo_log_odds_margin": sg(_pair_mean(margin, weights)),
        "orpo_accuracy": sg(_pair_mean((margin > 0).astype(dtype), weights)),
    }
    return loss, metrics


__all__ = ["dpo_loss", "log_odds", "orpo_loss"]

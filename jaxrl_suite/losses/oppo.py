"""OPPO's losses (Kang et al., ICML 2023, arXiv 2305.16217) and the preference-reward baseline.

OPPO learns, from offline segments and preferences between them, a hindsight encoder
z = phi(tau), a contextual policy pi(a | s, z) and an optimal context z*, without a scalar reward:

    L_recon = E_tau [ || pi(s_t, phi(tau)) - a_t ||^2 ]                   (hindsight information
                                                                           matching)
    L_pref  = E [ max(0, ||z* - phi(tau+)||_2 - ||z* - phi(tau-)||_2 + margin) ]   (triplet,
              over the pairs with a strict preference tau+ > tau-; z* gets no gradient here)
    L_norm  = E [ (||phi(tau)||_2 - 1)^2 ]
    encoder and policy:  L_recon + lambda_pref * L_pref + lambda_norm * L_norm
    z*:                  L_pref with phi fixed

The authors' code uses margin 1, the Euclidean distance of torch's `TripletMarginLoss`, and
lambda_pref = lambda_norm = 0.1, with ties dropped from the triplet term.

The baseline learns a reward instead: the Bradley-Terry loss of a segment-summed reward model,

    L_BT = - E [ y log sigma(R_a - R_b) + (1 - y) log sigma(R_b - R_a) ],   R = sum_t r(s_t, a_t)

with y in [0, 1] the preference for segment a (0.5 on a tie).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxrl_suite.losses.common import check_rank, masked_mean

_EPS = 1e-6  # torch's pairwise_distance eps: ||x - y + eps||


def _distance(x: chex.Array, y: chex.Array) -> chex.Array:
    return jnp.linalg.norm(x - y + _EPS, axis=-1)


def triplet_margin_loss(
    anchor: chex.Array, positive: chex.Array, negative: chex.Array, weight: chex.Array, *,
    margin: float = 1.0,
) -> chex.Array:
    """Weighted mean of max(0, d(anchor, positive) - d(anchor, negative) + margin), d Euclidean.

    anchor, positive, negative: [P, Z] (anchor may broadcast, e.g. [Z]); weight: [P] (0 drops a
    row). Returns 0 when every weight is 0."""
    check_rank("positive", positive, 2)
    hinge = jnp.maximum(_distance(anchor, positive) - _distance(anchor, negative) + margin, 0.0)
    return masked_mean(hinge, weight)


def oppo_preference_loss(
    z_star: chex.Array, phi_a: chex.Array, phi_b: chex.Array, label: chex.Array, *,
    margin: float = 1.0,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """OPPO's triplet loss with anchor z* [Z] over pairs of segment embeddings [P, Z].

    label [P]: 1 if segment a is preferred, 0 if b is, 0.5 on a tie (ties are left out). The
    preferred segment is the positive. Returns (loss, {"pref_used_frac", "pref_acc"}), where
    pref_acc is the share of used pairs whose preferred segment is the nearer one to z*."""
    a_wins = label > 0.5
    used = (label != 0.5).astype(jnp.float32)
    positive = jnp.where(a_wins[:, None], phi_a, phi_b)
    negative = jnp.where(a_wins[:, None], phi_b, phi_a)
    loss = triplet_margin_loss(z_star, positive, negative, used, margin=margin)
    nearer = (_distance(z_star, positive) < _distance(z_star, negative)).astype(jnp.float32)
    return loss, {"pref_used_frac": jnp.mean(used), "pref_acc": masked_mean(nearer, used)}


def phi_norm_loss(phi: chex.Array) -> chex.Array:
    """mean((||phi||_2 - 1)^2) over the rows of phi [P, Z]: keeps the embeddings on the sphere."""
    check_rank("phi", phi, 2)
    return jnp.mean((jnp.linalg.norm(phi, axis=-1) - 1.0) ** 2)


def action_mse(pred: chex.Array, target: chex.Array, mask: chex.Array) -> chex.Array:
    """Hindsight reconstruction: mean over valid steps of the squared action error summed over
    action dimensions divided by their number (torch's MSELoss over the valid rows).

    pred, target: [..., T, A]; mask: [..., T]."""
    err = jnp.mean((pred - target) ** 2, axis=-1)
    return masked_mean(err, mask)


def oppo_loss(
    recon: chex.Array, pref: chex.Array, norm: chex.Array, *, lambda_pref: float = 0.1,
    lambda_norm: float = 0.1,
) -> chex.Array:
    """The encoder and policy objective: recon + lambda_pref * pref + lambda_norm * norm."""
    return recon + lambda_pref * pref + lambda_norm * norm


def bradley_terry_loss(
    return_a: chex.Array, return_b: chex.Array, label: chex.Array
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """Cross-entropy of the Bradley-Terry preference model on predicted segment returns [P].

    label [P] in [0, 1] (soft labels allowed). Returns (loss, {"bt_acc"}), the share of strict
    preferences the model orders correctly."""
    d = return_a - return_b
    loss = -jnp.mean(label * jax.nn.log_sigmoid(d) + (1.0 - label) * jax.nn.log_sigmoid(-d))
    strict = (label != 0.5).astype(jnp.float32)
    right = ((d > 0) == (label > 0.5)).astype(jnp.float32)
    return loss, {"bt_acc": masked_mean(right, strict)}


__all__ = [
    "action_mse",
    "bradley_terry_loss",
    "oppo_loss",
    "oppo_preference_loss",
    "phi_norm_loss",
    "triplet_margin_loss",
]

"""Implicit Q-learning (Kostrikov, Nair and Levine 2021, arXiv 2110.06169): pure losses.

IQL never queries Q at actions outside the dataset. With target network Q_hat:

    L_V(psi)   = E_(s,a)      [ L2^tau( Q_hat(s, a) - V_psi(s) ) ]
    L2^tau(u)  = |tau - 1(u < 0)| u^2
    L_Q(theta) = E_(s,a,r,s') [ ( r + gamma (1 - done) V_psi(s') - Q_theta(s, a) )^2 ]
    L_pi(phi)  = - E_(s,a)    [ min(exp(beta (Q_hat(s, a) - V_psi(s))), w_max) log pi_phi(a | s) ]

(advantage-weighted regression for policy extraction; the weight is clipped at w_max = 100 as in
the authors' code). tau -> 1 makes V approach the in-sample maximum of Q.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def expectile_loss(diff: chex.Array, tau: float) -> chex.Array:
    """Mean of |tau - 1(diff < 0)| * diff^2 (the asymmetric L2 of expectile regression)."""
    if not 0.0 < tau < 1.0:
        raise ValueError(f"expectile tau must be in (0, 1), got {tau}")
    weight = jnp.where(diff < 0, 1.0 - tau, tau)
    return jnp.mean(weight * diff**2)


def iql_value_loss(q: chex.Array, v: chex.Array, tau: float = 0.7) -> chex.Array:
    """L_V: expectile regression of V(s) [B] onto the (target, no-gradient) Q(s, a) [B]."""
    return expectile_loss(jax.lax.stop_gradient(q) - v, tau)


def iql_q_loss(
    q: chex.Array, reward: chex.Array, done: chex.Array, next_v: chex.Array, gamma: float = 0.99
) -> chex.Array:
    """L_Q: squared TD error against r + gamma (1 - done) V(s') (V gets no gradient). [B] each;
    `done` is the terminal flag (a time-limit cut is not terminal)."""
    target = reward + gamma * (1.0 - done.astype(jnp.float32)) * jax.lax.stop_gradient(next_v)
    return jnp.mean((target - q) ** 2)


def awr_policy_loss(
    logp: chex.Array, q: chex.Array, v: chex.Array, beta: float = 3.0, max_weight: float = 100.0
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """L_pi: -mean(min(exp(beta (Q - V)), max_weight) * log pi(a | s)); Q and V get no gradient.

    Returns (loss, {"awr_weight": mean weight})."""
    adv = jax.lax.stop_gradient(q - v)
    weight = jnp.minimum(jnp.exp(beta * adv), max_weight)
    return -jnp.mean(weight * logp), {"awr_weight": jnp.mean(weight)}


__all__ = ["awr_policy_loss", "expectile_loss", "iql_q_loss", "iql_value_loss"]

"""Behaviour cloning: maximum likelihood of the dataset's actions.

    L_BC(phi) = - E_(s,a)~D [ log pi_phi(a | s) ]

The first baseline of offline RL (e.g. Fu et al. 2020, D4RL, arXiv 2004.07219, and the "BC" rows of
OPPO, arXiv 2305.16217). It is IQL's advantage-weighted regression with every weight 1.
"""

from __future__ import annotations

import chex
import jax.numpy as jnp

from jaxrl_suite.losses.common import masked_mean


def bc_loss(logp: chex.Array, mask: chex.Array | None = None
            ) -> tuple[chex.Array, dict[str, chex.Array]]:
    """-mean(log pi(a | s)) over the rows of `logp` [B] where `mask` [B] is set (all if None).

    Returns (loss, {"bc_logp": mean log-likelihood})."""
    mask = jnp.ones_like(logp) if mask is None else mask
    mean_logp = masked_mean(logp, mask)
    return -mean_logp, {"bc_logp": mean_logp}


__all__ = ["bc_loss"]

"""OPPO's networks (arXiv 2305.16217): the hindsight encoder and the contextual policy.

`SegmentEncoder` maps a segment of K (state, action) pairs to z = phi(tau) [z_dim]: a per-step MLP,
a mean over the valid steps, and a linear head (the authors use a small transformer; an MLP over
pooled steps keeps this fast on a CPU). `ContextPolicy` maps (s, z) to an action: a tanh mean scaled
to the action bounds for continuous actions, logits for discrete ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxrl_suite.models.offline import mlp


class SegmentEncoder(nn.Module):
    """(obs [..., K, obs_dim], actions [..., K, act_features], mask [..., K]) -> z [..., z_dim]."""

    z_dim: int = 8
    hidden: Sequence[int] = (64, 64)
    activation: str = "relu"

    @nn.compact
    def __call__(self, obs: jax.Array, actions: jax.Array, mask: jax.Array) -> jax.Array:
        h = mlp(jnp.concatenate([obs, actions], axis=-1), self.hidden, self.activation)
        m = mask[..., None].astype(h.dtype)
        pooled = jnp.sum(h * m, axis=-2) / jnp.maximum(jnp.sum(m, axis=-2), 1.0)
        return nn.Dense(self.z_dim)(pooled)


class ContextPolicy(nn.Module):
    """(obs [..., obs_dim], z [..., z_dim]) -> action mean [..., A] (continuous) or logits."""

    action_dim: int
    discrete: bool
    action_scale: float = 1.0  # continuous: actions lie in [-scale, scale] around `action_shift`
    action_shift: float = 0.0
    hidden: Sequence[int] = (64, 64)
    activation: str = "relu"

    @nn.compact
    def __call__(self, obs: jax.Array, z: jax.Array) -> jax.Array:
        h = mlp(jnp.concatenate([obs, z], axis=-1), self.hidden, self.activation)
        out = nn.Dense(self.action_dim)(h)
        if self.discrete:
            return out
        return self.action_shift + self.action_scale * jnp.tanh(out)


__all__ = ["ContextPolicy", "SegmentEncoder"]

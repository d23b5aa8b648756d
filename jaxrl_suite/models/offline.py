"""Networks of the offline baselines: the BC / IQL policy, IQL's critics and the preference reward.

- `OfflinePolicy`: obs -> `DiagGaussian` (tanh mean scaled to the action bounds, state-independent
  log std clipped to [-5, 2], as in the IQL authors' MuJoCo setting) or `Categorical`.
- `TwinQ`: two Q networks; continuous actions are concatenated to the observation, discrete
  actions index a [num_actions] head. IQL takes the minimum of the two.
- `ValueNet`: V(s).
- `RewardNet`: r(s, a) for the Bradley-Terry preference reward model (summed over a segment).

All are plain MLPs (`mlp`, default flax initialisers), the same trunk OPPO's networks use.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxrl_suite.models.actor_critic import ACTIVATIONS, Categorical, DiagGaussian

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


def mlp(x: jax.Array, hidden: Sequence[int], activation: str = "relu") -> jax.Array:
    """Dense + activation for each width in `hidden` (to be called inside `nn.compact`)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation '{activation}' is not one of {sorted(ACTIVATIONS)}")
    act = ACTIVATIONS[activation]
    for width in hidden:
        x = act(nn.Dense(width)(x))
    return x


class OfflinePolicy(nn.Module):
    """obs [..., obs_dim] -> DiagGaussian over [..., A] (continuous) or Categorical (discrete)."""

    action_dim: int
    discrete: bool
    action_scale: float = 1.0  # continuous: the mean lies in shift +- scale
    action_shift: float = 0.0
    hidden: Sequence[int] = (64, 64)
    activation: str = "relu"

    @nn.compact
    def __call__(self, obs: jax.Array):
        h = mlp(obs, self.hidden, self.activation)
        out = nn.Dense(self.action_dim)(h)
        if self.discrete:
            return Categorical(out)
        mean = self.action_shift + self.action_scale * jnp.tanh(out)
        log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))
        log_std = jnp.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)
        return DiagGaussian(mean, jnp.broadcast_to(log_std, mean.shape))


class TwinQ(nn.Module):
    """(obs [B, obs_dim], action [B, A] float or [B] int) -> (q1 [B], q2 [B])."""

    num_actions: int
    discrete: bool
    hidden: Sequence[int] = (64, 64)
    activation: str = "relu"

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array):
        qs = []
        for _ in range(2):
            if self.discrete:
                q_all = nn.Dense(self.num_actions)(mlp(obs, self.hidden, self.activation))
                q = jnp.take_along_axis(q_all, action[..., None].astype(jnp.int32), -1)[..., 0]
            else:
                x = jnp.concatenate([obs, action], axis=-1)
                q = nn.Dense(1)(mlp(x, self.hidden, self.activation))[..., 0]
            qs.append(q)
        return qs[0], qs[1]


class ValueNet(nn.Module):
    """obs [..., obs_dim] -> V(s) [...]."""

    hidden: Sequence[int] = (64, 64)
    activation: str = "relu"

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        return nn.Dense(1)(mlp(obs, self.hidden, self.activation))[..., 0]


class RewardNet(nn.Module):
    """(obs [..., obs_dim], action features [..., F]) -> r(s, a) [...]."""

    hidden: Sequence[int] = (64, 64)
    activation: str = "relu"

    @nn.compact
    def __call__(self, obs: jax.Array, action_features: jax.Array) -> jax.Array:
        x = jnp.concatenate([obs, action_features], axis=-1)
        return nn.Dense(1)(mlp(x, self.hidden, self.activation))[..., 0]


__all__ = ["LOG_STD_MAX", "LOG_STD_MIN", "OfflinePolicy", "RewardNet", "TwinQ", "ValueNet", "mlp"]

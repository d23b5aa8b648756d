"""Actor-critic MLP and the two action distributions PPO needs.

The network is the one PureJaxRL uses for classic control: separate actor and critic MLPs
(default 2 x 64, tanh), orthogonal initialisation with gain sqrt(2) in the hidden layers, 0.01 on
the policy head and 1.0 on the value head. Discrete actions get a categorical over logits;
continuous actions a diagonal Gaussian whose log standard deviation is a state-independent
parameter (initialised to 0).

The distributions are small pytrees with `sample / log_prob / entropy / mode`, and
`noise / sample_from` to draw a whole rollout's randomness ahead of its time loop (one batched draw
instead of one small one per step, which XLA:CPU runs as a loop each). They are written here so that
the suite needs no distribution library; `tests/models/test_actor_critic.py` checks them against
direct formulas.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax.linen.initializers import constant


def orthogonal(scale: float = 1.0):
    """Orthogonal initializer (Saxe et al. 2014) without LAPACK: Gram-Schmidt, applied twice.

    Same distribution as `flax.linen.initializers.orthogonal` (the Q of a Gaussian matrix with a
    positive R diagonal, i.e. Haar-distributed). Flax's version calls LAPACK's QR, and under
    `jax.vmap` over seeds XLA:CPU runs that batched QR on its small intra-op thread pool, where two
    concurrent ones can deadlock a 2-core machine (observed with jax 0.10); classical Gram-Schmidt
    with one re-orthogonalisation pass is plain matmuls and orthogonal to float32 precision.
    """

    def init(key, shape, dtype=jnp.float32):
        rows, cols = shape[-2], shape[-1]
        n, k = max(rows, cols), min(rows, cols)
        a = jax.random.normal(key, (*shape[:-2], n, k), jnp.float32)

        def column(q, j):
            v = a[..., :, j]
            for _ in range(2):  # CGS2: the second pass removes what rounding left behind
                coef = jnp.einsum("...nk,...n->...k", q, v)
                v = v - jnp.einsum("...nk,...k->...n", q, coef)
            v = v / jnp.linalg.norm(v, axis=-1, keepdims=True)
            return q.at[..., :, j].set(v), None

        q, _ = jax.lax.scan(column, jnp.zeros_like(a), jnp.arange(k))
        if rows < cols:
            q = jnp.swapaxes(q, -1, -2)
        return (scale * q).astype(dtype)

    return init


ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu, "gelu": nn.gelu}


@flax.struct.dataclass
class Categorical:
    """pi(a) = softmax(logits)_a over the last axis."""

    logits: jax.Array

    def sample(self, key: jax.Array) -> jax.Array:
        return jax.random.categorical(key, self.logits)

    @staticmethod
    def noise(key: jax.Array, shape: Sequence[int]) -> jax.Array:
        """Gumbel(0, 1) noise of the logits' `shape`, drawn ahead (e.g. for a whole rollout)."""
        return jax.random.gumbel(key, shape)

    def sample_from(self, noise: jax.Array) -> jax.Array:
        """Gumbel-max: argmax(logits + noise) ~ pi; with `noise(key, logits.shape)` this is
        exactly `sample(key)`."""
        return jnp.argmax(self.logits + noise, axis=-1)

    def log_prob(self, action: jax.Array) -> jax.Array:
        logp = jax.nn.log_softmax(self.logits)
        return jnp.take_along_axis(logp, action[..., None].astype(jnp.int32), axis=-1)[..., 0]

    def entropy(self) -> jax.Array:
        logp = jax.nn.log_softmax(self.logits)
        return -jnp.sum(jnp.exp(logp) * logp, axis=-1)

    def mode(self) -> jax.Array:
        return jnp.argmax(self.logits, axis=-1)


@flax.struct.dataclass
class DiagGaussian:
    """pi(a) = prod_i N(a_i; mean_i, exp(log_std_i)^2) over the last axis."""

    mean: jax.Array
    log_std: jax.Array

    def sample(self, key: jax.Array) -> jax.Array:
        return self.sample_from(self.noise(key, self.mean.shape))

    @staticmethod
    def noise(key: jax.Array, shape: Sequence[int]) -> jax.Array:
        """Standard normal noise of the mean's `shape`, drawn ahead (e.g. for a whole rollout)."""
        return jax.random.normal(key, shape)

    def sample_from(self, noise: jax.Array) -> jax.Array:
        """mean + std * noise ~ pi for standard normal `noise`."""
        return self.mean + jnp.exp(self.log_std) * noise

    def log_prob(self, action: jax.Array) -> jax.Array:
        z = (action - self.mean) * jnp.exp(-self.log_std)
        per_dim = -0.5 * z**2 - self.log_std - 0.5 * math.log(2 * math.pi)
        return jnp.sum(per_dim, axis=-1)

    def entropy(self) -> jax.Array:
        per_dim = self.log_std + 0.5 * (1.0 + math.log(2 * math.pi))
        return jnp.sum(jnp.broadcast_to(per_dim, self.mean.shape), axis=-1)

    def mode(self) -> jax.Array:
        return self.mean


def _mlp(x, hidden: Sequence[int], activation: str):
    act = ACTIVATIONS[activation]
    for width in hidden:
        x = act(nn.Dense(width, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(x))
    return x


class ActorCritic(nn.Module):
    """obs [..., obs_dim] -> (Categorical | DiagGaussian, value [...])."""

    action_dim: int
    discrete: bool = True
    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"

    @nn.compact
    def __call__(self, obs: jax.Array):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation '{self.activation}' is not one of {sorted(ACTIVATIONS)}")
        h = _mlp(obs, self.hidden, self.activation)
        head = nn.Dense(self.action_dim, kernel_init=orthogonal(0.01), bias_init=constant(0.0))(h)
        if self.discrete:
            dist = Categorical(head)
        else:
            log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))
            dist = DiagGaussian(head, jnp.broadcast_to(log_std, head.shape))
        v = _mlp(obs, self.hidden, self.activation)
        value = nn.Dense(1, kernel_init=orthogonal(1.0), bias_init=constant(0.0))(v)[..., 0]
        return dist, value

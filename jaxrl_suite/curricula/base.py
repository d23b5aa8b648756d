"""The curriculum protocol and the two non-adaptive baselines (round robin, uniform random).

A *context* is a float32 vector `[F]` of physical environment parameters (pole length, gravity,
...). A curriculum decides which contexts the agent trains on. Every curriculum here is a frozen
dataclass that holds only static configuration and constant arrays, so it can be closed over inside
`jax.jit(jax.vmap(train))`; all mutable information lives in a *state* pytree with fixed shapes:

    cstate = curriculum.init(key)
    for each training iteration:
        contexts = curriculum.sample(cstate, key, num_envs)     # [num_envs, F] float32
        ... collect a rollout on `contexts`, PPO update ...
        cstate = curriculum.update(cstate, key, value_fn)      # value_fn: [m, F] -> [m]
        log(curriculum.metrics(cstate))                        # fixed keys, scalar arrays

`value_fn` is the critic's estimate of the initial-state value V(s0 | c), a jit-traceable closure.
No method branches in Python on traced values, so `init`, `sample` and `update` can all be jitted
and vmapped (over seeds or keys).

Curricula are registered by name in `CURRICULA` (each module registers its own) and built with
`make_curriculum(name, instances, **kwargs)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.core.registry import Registry

ValueFn = Callable[[jax.Array], jax.Array]
"""Critic estimate V(s0 | c): contexts [m, F] -> values [m]; must be jit-traceable."""


@runtime_checkable
class Curriculum(Protocol):
    """What the training loop relies on. `State` is any pytree of fixed-shape arrays."""

    def init(self, key: jax.Array) -> Any:
        """The initial curriculum state."""
        ...

    def sample(self, state: Any, key: jax.Array, n: int) -> jax.Array:
        """`n` contexts for the next rollout batch, float32 `[n, F]`; pure (state unchanged)."""
        ...

    def update(self, state: Any, key: jax.Array, value_fn: ValueFn) -> Any:
        """The state after one training iteration, given the current critic `value_fn`."""
        ...

    def metrics(self, state: Any) -> dict[str, jax.Array]:
        """Scalar diagnostics; the keys are fixed for a given curriculum object."""
        ...


CURRICULA: Registry[Callable[..., Curriculum]] = Registry("curriculum")


def make_curriculum(name: str, instances: Any, **kwargs: Any) -> Curriculum:
    """Builds the curriculum registered as `name` over `instances` ([N, F]) with constructor
    `kwargs`, e.g. make_curriculum("space", instances, eta=0.1, kappa=1).

    Raises:
      UnknownNameError: (a LookupError) for an unregistered name; the message lists the known ones.
    """
    return CURRICULA.get(name)(instances, **kwargs)


def as_instances(instances: Any, name: str = "instances") -> jax.Array:
    """Validates an instance set and returns it as a float32 `[N, F]` array (N >= 1, F >= 1)."""
    arr = jnp.asarray(instances, dtype=jnp.float32)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"{name} must have shape [N, F] with N, F >= 1, got {np.shape(instances)}")
    return arr


class RoundRobinState(NamedTuple):
    pointer: jax.Array  # int32 scalar in [0, N): index of the first instance of the next batch


@dataclasses.dataclass(frozen=True, eq=False)
class RoundRobin:
    """Cycles through a fixed instance set in order (the "round robin" baseline of SPaCE).

    With N instances, pointer p_t and stride s (a static int, default 1):

        sample(state, key, n) = instances[(p_t + [0, 1, ..., n-1]) mod N]
        p_{t+1} = (p_t + s) mod N

    `sample` cannot tell `update` how many contexts it handed out (it returns only contexts), so
    the advance per update is the static `stride`:

    * `stride=1` (default): over any N consecutive updates every instance appears exactly n times
      in total, whatever the batch size n (each of the N offsets is used once and every offset
      shifts the same window by one). When n >= N every batch already contains every instance
      floor(n/N) or ceil(n/N) times.
    * `stride=num_envs`: consecutive batches are disjoint consecutive blocks, the classic
      one-instance-after-the-other round robin; every instance appears equally often over
      lcm(n, N) / n updates.

    The key is unused (round robin is deterministic). Metrics: {"pointer"}.
    """

    instances: jax.Array
    stride: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "instances", as_instances(self.instances))
        if int(self.stride) < 0:
            raise ValueError(f"stride must be >= 0, got {self.stride}")
        object.__setattr__(self, "stride", int(self.stride))

    @property
    def num_instances(self) -> int:
        return self.instances.shape[0]

    def init(self, key: jax.Array) -> RoundRobinState:
        del key
        return RoundRobinState(pointer=jnp.zeros((), jnp.int32))

    def sample(self, state: RoundRobinState, key: jax.Array, n: int) -> jax.Array:
        del key
        idx = (state.pointer + jnp.arange(n, dtype=jnp.int32)) % self.num_instances
        return self.instances[idx]

    def update(
        self, state: RoundRobinState, key: jax.Array, value_fn: ValueFn | None = None
    ) -> RoundRobinState:
        del key, value_fn
        return RoundRobinState(pointer=(state.pointer + self.stride) % self.num_instances)

    def metrics(self, state: RoundRobinState) -> dict[str, jax.Array]:
        return {"pointer": state.pointer}


class RandomState(NamedTuple):
    num_updates: jax.Array  # int32 scalar, only counted for logging


@dataclasses.dataclass(frozen=True, eq=False)
class RandomCurriculum:
    """Samples every context independently and uniformly from the whole instance set.

        sample(state, key, n)[j] = instances[i_j],   i_j ~ Uniform{0, ..., N-1} i.i.d.

    `update` ignores the critic (it only counts updates). Metrics: {"num_updates"}.
    """

    instances: jax.Array

    def __post_init__(self) -> None:
        object.__setattr__(self, "instances", as_instances(self.instances))

    @property
    def num_instances(self) -> int:
        return self.instances.shape[0]

    def init(self, key: jax.Array) -> RandomState:
        del key
        return RandomState(num_updates=jnp.zeros((), jnp.int32))

    def sample(self, state: RandomState, key: jax.Array, n: int) -> jax.Array:
        del state
        idx = jax.random.randint(key, (n,), 0, self.num_instances)
        return self.instances[idx]

    def update(
        self, state: RandomState, key: jax.Array, value_fn: ValueFn | None = None
    ) -> RandomState:
        del key, value_fn
        return RandomState(num_updates=state.num_updates + 1)

    def metrics(self, state: RandomState) -> dict[str, jax.Array]:
        return {"num_updates": state.num_updates}


CURRICULA.register("round_robin", RoundRobin)
CURRICULA.register("random", RandomCurriculum)

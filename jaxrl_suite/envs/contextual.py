"""Contextual classic-control environments in pure JAX, in the spirit of CARL.

CARL (Benjamins et al., "Contextualize Me -- The Case for Context in Reinforcement Learning",
TMLR 2023, arXiv:2202.04500) turns the physical constants of standard RL environments (pole
length, gravity, link masses, ...) into a *context*: a contextual MDP draws one context per
episode, and an agent is trained and evaluated on distributions of contexts. The context is either
*hidden* (plain observation) or *visible* (appended to the observation). CARL itself wraps
gymnasium environments; this module is our own pure-JAX version over gymnax's classic-control
environments, so that whole training runs (rollouts, curricula, updates) jit and vmap.

A context lives in gymnax's `EnvParams`: its physical fields are the context features
(`CONTEXT_SPACES`, whose defaults are gymnax's and whose bounds follow CARL's context spaces).

    env, params = make_contextual("CartPole-v1", visible_features=("length",))
    params = with_context(params, length=1.0, masspole=0.2)     # checked, derived fields redone
    obs, state = env.reset(key, params)
    obs, state, reward, terminated, truncated, info = env.step(key, state, action, params)

    sample = uniform_sampler("CartPole-v1", ("length", "gravity"), rel_width=0.5)
    contexts = sample(key, num_envs)                                        # [num_envs, 2]
    batch_params = jax.vmap(lambda c: params_from_vector(params, ("length", "gravity"), c))(
        contexts)
    obs, state = jax.vmap(env.reset)(keys, batch_params)          # one context per environment

Public API:

* `ENV_NAMES`, `CONTEXT_SPACES` (env -> feature -> (default, lower, upper), in canonical order),
  `ContextError`.
* `make_contextual(env_name, visible_features=())` -> (`ContextualEnv`, default `EnvParams`).
* `with_context(params, **features)`, `context_vector(params, features)`,
  `params_from_vector(params, features, values)`, `clip_to_bounds(env_name, features, values)`.
* Context samplers (pure functions `sample(key, n) -> [n, F]`, usable under jit):
  `fixed_sampler`, `uniform_sampler`, `gaussian_sampler`.

**Which context does an episode use?** The context of an episode is fixed when it is reset: it is
stored in the environment state (`ContextualState.params`) and all dynamics of the episode use it.
The `params` passed to `ContextualEnv.step` are the context of the *next* episode: they are only
used when this step ends the episode (termination or truncation) and the environment auto-resets.
This is how a curriculum hands new contexts to running environments without cutting episodes
short. Passing the same params on every step gives exactly gymnax's `env.step`.

Bounds are closed intervals `[lower, upper]`; `with_context` checks concrete values against them
(and that they are finite) and skips the check for traced values (inside `jit` / `vmap`).
Visible features are normalised by their defaults (`value / default`); a feature whose default is
0 (Acrobot's `torque_noise_max`) is appended unnormalised.

Dynamics are gymnax's (`step_env` / `reset_env`), which match gymnasium's classic-control
environments for CartPole, Pendulum, MountainCar and Acrobot ("book" dynamics) under any context
(see the parity tests). Known gymnax difference we inherit: in MountainCarContinuous, gymnax zeroes
a negative velocity at the goal position, gymnasium at the left wall.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.struct
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
from gymnax.environments import spaces
from gymnax.environments.classic_control import (
    acrobot,
    cartpole,
    continuous_mountain_car,
    mountain_car,
    pendulum,
)

_INF = math.inf

ENV_NAMES: tuple[str, ...] = (
    "CartPole-v1",
    "Pendulum-v1",
    "MountainCar-v0",
    "MountainCarContinuous-v0",
    "Acrobot-v1",
)

# env_name -> feature -> (default, lower, upper). Defaults are gymnax's `EnvParams` defaults;
# bounds are CARL's (carl/envs/gymnasium/classic_control/carl_*.py) unless commented otherwise.
CONTEXT_SPACES: dict[str, dict[str, tuple[float, float, float]]] = {
    "CartPole-v1": {
        "gravity": (9.8, 0.1, _INF),
        "masscart": (1.0, 0.1, 10.0),
        "masspole": (0.1, 0.01, 1.0),
        "length": (0.5, 0.05, 5.0),  # half the pole length, as in gym
        "force_mag": (10.0, 1.0, 100.0),
        "tau": (0.02, 0.002, 0.2),
    },
    "Pendulum-v1": {
        # CARL: (-inf, inf) (registered there under the name "gravity"); a negative speed limit
        # makes the velocity clip meaningless, so ours requires a positive value.
        "max_speed": (8.0, 1e-6, _INF),
        # Not in CARL's gymnasium Pendulum (CARL's older gymnax Pendulum: (-inf, inf)); ours
        # requires a positive value for the same reason as max_speed.
        "max_torque": (2.0, 1e-6, _INF),
        "dt": (0.05, 0.0, _INF),
        "g": (10.0, 0.0, _INF),
        "m": (1.0, 1e-6, _INF),
        "l": (1.0, 1e-6, _INF),
    },
    "MountainCar-v0": {
        "force": (0.001, -_INF, _INF),
        "gravity": (0.0025, 0.0, _INF),
        "max_speed": (0.07, 0.0, _INF),
        # CARL's default is 0.45 (that of MountainCarContinuous); gym/gymnax use 0.5.
        "goal_position": (0.5, -_INF, _INF),
    },
    "MountainCarContinuous-v0": {
        "power": (0.0015, -_INF, _INF),
        # Not in CARL's MountainCarContinuous (gymnasium hard-codes it); CARL's MountainCar bounds.
        "gravity": (0.0025, 0.0, _INF),
        "max_speed": (0.07, 0.0, _INF),
        # CARL's default is 0.5 (that of MountainCar); gym/gymnax use 0.45.
        "goal_position": (0.45, -_INF, _INF),
    },
    "Acrobot-v1": {
        # link_length_2 only matters for rendering (as in gym); it does not enter the dynamics.
        "link_length_1": (1.0, 0.1, 10.0),
        "link_length_2": (1.0, 0.1, 10.0),
        "link_mass_1": (1.0, 0.1, 10.0),
        "link_mass_2": (1.0, 0.1, 10.0),
        "link_com_pos_1": (0.5, 0.0, 1.0),
        "link_com_pos_2": (0.5, 0.0, 1.0),
        "link_moi": (1.0, 0.1, 10.0),
        "max_vel_1": (4 * math.pi, 0.4 * math.pi, 40 * math.pi),
        "max_vel_2": (9 * math.pi, 0.9 * math.pi, 90 * math.pi),
        # CARL: (-1, 1). A negative amplitude is not a wider noise in JAX: gymnax draws
        # uniform(-max, max), and jax.random.uniform(minval > maxval) returns minval, i.e. a
        # constant torque offset. Ours: [0, 1].
        "torque_noise_max": (0.0, 0.0, 1.0),
    },
}

# Each gymnax module has its own EnvParams class, so the class identifies the environment.
_PARAMS_TYPES: dict[type, str] = {
    cartpole.EnvParams: "CartPole-v1",
    pendulum.EnvParams: "Pendulum-v1",
    mountain_car.EnvParams: "MountainCar-v0",
    continuous_mountain_car.EnvParams: "MountainCarContinuous-v0",
    acrobot.EnvParams: "Acrobot-v1",
}


class ContextError(ValueError):
    """An unknown environment or context feature, or a context value outside its bounds."""


def _derived_fields(env_name: str, params: Any) -> dict[str, Any]:
    """EnvParams fields computed from context features (recomputed on every context change)."""
    if env_name == "CartPole-v1":
        return {
            "total_mass": params.masscart + params.masspole,
            "polemass_length": params.masspole * params.length,
        }
    return {}


# -- validation helpers -------------------------------------------------------------------------


def _check_env(env_name: str) -> str:
    if env_name not in CONTEXT_SPACES:
        raise ContextError(
            f"unknown contextual environment {env_name!r}; valid environments: "
            f"{', '.join(ENV_NAMES)}"
        )
    return env_name


def _check_features(env_name: str, features: Sequence[str]) -> tuple[str, ...]:
    _check_env(env_name)
    if isinstance(features, str):  # a bare string is almost certainly a mistake for (name,)
        features = (features,)
    features = tuple(features)
    space = CONTEXT_SPACES[env_name]
    for name in features:
        if name not in space:
            raise ContextError(
                f"{env_name} has no context feature {name!r}; valid features: {', '.join(space)}"
            )
    if len(set(features)) != len(features):
        raise ContextError(f"{env_name} context features are repeated: {features}")
    return features


def _env_of(params: Any) -> str:
    try:
        return _PARAMS_TYPES[type(params)]
    except KeyError:
        raise ContextError(
            f"cannot tell the environment of params of type {type(params).__qualname__}; expected "
            f"the EnvParams of one of {', '.join(ENV_NAMES)}"
        ) from None


def _is_traced(value: Any) -> bool:
    return isinstance(value, jax.core.Tracer)


def _check_value(env_name: str, name: str, value: Any) -> None:
    """Raises ContextError if a concrete scalar or array `value` is non-finite or out of bounds."""
    if _is_traced(value):
        return
    _, lower, upper = CONTEXT_SPACES[env_name][name]
    arr = np.asarray(value, dtype=np.float64)
    bad = ~(np.isfinite(arr) & (arr >= lower) & (arr <= upper))
    if np.any(bad):
        first = float(arr[bad].flat[0]) if arr.ndim else float(arr)
        if not np.isfinite(first):
            raise ContextError(f"{env_name} context {name!r}={first!r} is not finite")
        raise ContextError(
            f"{env_name} context {name!r}={first!r} is outside its bounds ({lower:g}, {upper:g})"
        )


def _defaults(env_name: str, features: Sequence[str]) -> np.ndarray:
    return np.array([CONTEXT_SPACES[env_name][f][0] for f in features], np.float32)


def _bounds(env_name: str, features: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    space = CONTEXT_SPACES[env_name]
    lower = np.array([space[f][1] for f in features], np.float32)
    upper = np.array([space[f][2] for f in features], np.float32)
    return lower, upper


# -- contexts <-> EnvParams ---------------------------------------------------------------------


def with_context(params: Any, **features: Any) -> Any:
    """Returns a copy of `params` with the given context features set.

    Derived fields (CartPole's `total_mass` and `polemass_length`) are recomputed. Values may be
    Python / numpy scalars, concrete or traced JAX arrays, or batched arrays (for `vmap` over
    `EnvParams`); concrete values are checked against `CONTEXT_SPACES`, traced ones are not.

    Args:
      params: a gymnax classic-control `EnvParams` (its class identifies the environment).
      **features: context feature name -> value.

    Returns:
      The new `EnvParams`.

    Raises:
      ContextError: for an unknown feature, or a concrete value that is non-finite or outside its
        bounds (the message names the environment and the feature).
    """
    env_name = _env_of(params)
    _check_features(env_name, tuple(features))
    for name, value in features.items():
        _check_value(env_name, name, value)
    params = dataclasses.replace(params, **features)
    return dataclasses.replace(params, **_derived_fields(env_name, params))


def context_vector(params: Any, features: Sequence[str]) -> jax.Array:
    """The values of `features` in `params` as a float32 vector.

    Args:
      params: a gymnax classic-control `EnvParams`, possibly batched.
      features: context feature names.

    Returns:
      `[F]` float32, or `[..., F]` if the params (or some of the features) are batched.
    """
    features = _check_features(_env_of(params), features)
    values = [jnp.asarray(getattr(params, f), jnp.float32) for f in features]
    return jnp.stack(jnp.broadcast_arrays(*values), axis=-1)


def params_from_vector(params: Any, features: Sequence[str], values: Any) -> Any:
    """`params` with `features` set from a context vector (the inverse of `context_vector`).

    Jit- and vmap-friendly: `jax.vmap(lambda c: params_from_vector(params, features, c))(cs)`
    turns `[n, F]` contexts into batched `EnvParams`.

    Args:
      params: a gymnax classic-control `EnvParams` providing the non-context fields.
      features: the F context feature names, in the order of `values`' last axis.
      values: `[..., F]` context values (real units).

    Returns:
      The new `EnvParams` (via `with_context`; concrete values are bounds-checked).

    Raises:
      ContextError: unknown feature, wrong last dimension, or concrete value out of bounds.
    """
    env_name = _env_of(params)
    features = _check_features(env_name, features)
    values = jnp.asarray(values, jnp.float32)
    if values.ndim < 1 or values.shape[-1] != len(features):
        raise ContextError(
            f"{env_name} context values have shape {values.shape}; expected [..., {len(features)}]"
            f" for features {features}"
        )
    return with_context(params, **{f: values[..., i] for i, f in enumerate(features)})


def clip_to_bounds(env_name: str, features: Sequence[str], values: Any) -> jax.Array:
    """Clips `[..., F]` context values of `features` into their bounds (float32)."""
    features = _check_features(env_name, features)
    lower, upper = _bounds(env_name, features)
    return jnp.clip(jnp.asarray(values, jnp.float32), lower, upper)


# -- samplers -----------------------------------------------------------------------------------


Sampler = Callable[[jax.Array, int], jax.Array]
"""`sample(key, n) -> [n, F]` float32 contexts; pure and usable inside `jax.jit` (static n)."""


def fixed_sampler(contexts: Any) -> Sampler:
    """A sampler that draws uniformly (with replacement) from a fixed list of contexts.

    Args:
      contexts: `[N, F]` context values (real units), N >= 1.

    Returns:
      `sample(key, n) -> [n, F]`: rows of `contexts`.
    """
    table = jnp.asarray(contexts, jnp.float32)
    if table.ndim != 2 or table.shape[0] < 1 or table.shape[1] < 1:
        raise ValueError(f"contexts must have shape [N, F] with N, F >= 1, got {table.shape}")

    def sample(key: jax.Array, n: int) -> jax.Array:
        return table[jax.random.randint(key, (n,), 0, table.shape[0])]

    return sample


def _relative(name: str, value: Any, num_features: int) -> jax.Array:
    rel = jnp.broadcast_to(jnp.asarray(value, jnp.float32), (num_features,))
    if not _is_traced(value) and np.any(~(np.asarray(rel) >= 0)):
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return rel


def uniform_sampler(env_name: str, features: Sequence[str], rel_width: Any) -> Sampler:
    """Contexts `default * (1 + U(-rel_width, rel_width))`, independently per feature.

    Args:
      env_name: one of `ENV_NAMES`.
      features: the F context feature names.
      rel_width: relative half-width, a scalar or `[F]` (>= 0).

    Returns:
      `sample(key, n) -> [n, F]` float32, clipped to the bounds.
    """
    features = _check_features(env_name, features)
    default = _defaults(env_name, features)
    width = _relative("rel_width", rel_width, len(features))

    def sample(key: jax.Array, n: int) -> jax.Array:
        u = jax.random.uniform(key, (n, len(features)), jnp.float32, -1.0, 1.0)
        return clip_to_bounds(env_name, features, default * (1.0 + width * u))

    return sample


def gaussian_sampler(env_name: str, features: Sequence[str], rel_sigma: Any) -> Sampler:
    """Contexts `default * (1 + rel_sigma * N(0, 1))`, independently per feature.

    Args:
      env_name: one of `ENV_NAMES`.
      features: the F context feature names.
      rel_sigma: relative standard deviation, a scalar or `[F]` (>= 0).

    Returns:
      `sample(key, n) -> [n, F]` float32, clipped to the bounds.
    """
    features = _check_features(env_name, features)
    default = _defaults(env_name, features)
    sigma = _relative("rel_sigma", rel_sigma, len(features))

    def sample(key: jax.Array, n: int) -> jax.Array:
        z = jax.random.normal(key, (n, len(features)), jnp.float32)
        return clip_to_bounds(env_name, features, default * (1.0 + sigma * z))

    return sample


# -- the environment ----------------------------------------------------------------------------


@flax.struct.dataclass
class ContextualState:
    """State of a contextual environment: the gymnax state and the episode's context."""

    env_state: Any
    params: Any


class ContextualEnv:
    """A gymnax classic-control environment whose episodes each carry their own context.

    Plain Python object, hashable by (name, visible_features), so it can be closed over or passed
    as a static argument under `jax.jit`. `reset` and `step` are pure, jit- and vmap-compatible
    (over keys, states, actions and params).

    Attributes:
      name: the environment name (one of `ENV_NAMES`).
      visible_features: context features appended to the observation (normalised by defaults).
      base: the gymnax environment.
      default_params: gymnax's default `EnvParams`.
      discrete: whether actions are discrete.
      num_actions: number of actions (discrete) or action dimension (continuous).
      obs_dim: observation size, including the visible features.
      action_low, action_high: action bounds under the default context (continuous), else None.
    """

    def __init__(self, name: str, visible_features: Sequence[str] = ()):
        self.name = _check_env(name)
        self.visible_features = _check_features(name, visible_features)
        self.base, self.default_params = gymnax.make(name)
        action_space = self.base.action_space(self.default_params)
        self.discrete = isinstance(action_space, spaces.Discrete)
        if self.discrete:
            self.num_actions = int(action_space.n)
            self.action_low = self.action_high = None
        else:
            self.num_actions = int(np.prod(action_space.shape))
            self.action_low = float(np.min(np.asarray(action_space.low)))
            self.action_high = float(np.max(np.asarray(action_space.high)))
        obs_shape = self.base.observation_space(self.default_params).shape
        self.obs_dim = int(np.prod(obs_shape)) + len(self.visible_features)
        default = _defaults(name, self.visible_features)
        self._obs_scale = np.where(default == 0, 1.0, default).astype(np.float32)

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and other.name == self.name
            and other.visible_features == self.visible_features
        )

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.name, self.visible_features))

    def __repr__(self) -> str:
        return f"ContextualEnv({self.name!r}, visible_features={self.visible_features})"

    def observation(self, base_obs: jax.Array, params: Any) -> jax.Array:
        """The float32 observation: gymnax's observation, then the visible features / defaults."""
        obs = jnp.asarray(base_obs, jnp.float32).reshape(-1)
        if not self.visible_features:
            return obs
        ctx = context_vector(params, self.visible_features) / self._obs_scale
        return jnp.concatenate([obs, ctx])

    def reset(self, key: jax.Array, params: Any = None) -> tuple[jax.Array, ContextualState]:
        """Starts an episode in the context `params` (default: `default_params`).

        Returns:
          (obs [obs_dim] float32, ContextualState holding the episode's context).
        """
        if params is None:
            params = self.default_params
        base_obs, env_state = self.base.reset_env(key, params)
        return self.observation(base_obs, params), ContextualState(env_state, params)

    def step(
        self,
        key: jax.Array,
        state: ContextualState,
        action: Any,
        params: Any = None,
        reset: tuple[jax.Array, ContextualState] | None = None,
    ) -> tuple[jax.Array, ContextualState, jax.Array, jax.Array, jax.Array, dict[str, Any]]:
        """One transition in the episode's context, auto-resetting into `params` when it ends.

        Args:
          key: PRNG key (split as in gymnax's `step`: step key, reset key).
          state: the current `ContextualState`; its `params` drive the dynamics.
          action: the action.
          params: the context of the *next* episode, used only if this step ends the episode
            (default: `default_params`).
          reset: the next episode's `(obs, state)`, drawn ahead by `reset(key_reset, params)`
            (a rollout can draw all its resets in one batched call before its time loop). Then
            `key` is the step key alone and `params` is not used; `step(k, s, a, p)` equals
            `step(k_step, s, a, reset=reset(k_reset, p))` with `k_step, k_reset = split(k)`.

        Returns:
          (obs, state, reward, terminated, truncated, info), gymnax's six-value API. After a
          terminal or truncated step, `obs` and `state` are those of the new episode and
          `info["final_observation"]` is the observation of the step's true next state
          (with the finished episode's visible context). `info` also has "terminated",
          "truncated" and gymnax's "discount".
        """
        if reset is None:
            key, key_reset = jax.random.split(key)
            reset = self.reset(key_reset, params)
        obs_re, state_re = reset
        obs_st, env_st, reward, terminated, info = self.base.step_env(
            key, state.env_state, action, state.params
        )
        truncated = self.base.is_truncated(env_st, state.params)
        done = jnp.logical_or(terminated, truncated)

        final_obs = self.observation(obs_st, state.params)
        obs = jnp.where(done, obs_re, final_obs)
        select = lambda new, old: jnp.where(done, new, old)
        new_state = jax.tree.map(select, state_re, ContextualState(env_st, state.params))
        info = {
            **info,
            "terminated": terminated,
            "truncated": truncated,
            "final_observation": final_obs,
        }
        return obs, new_state, reward, terminated, truncated, info


def make_contextual(
    env_name: str, *, visible_features: Sequence[str] = ()
) -> tuple[ContextualEnv, Any]:
    """Builds a contextual environment and its default params.

    Args:
      env_name: one of `ENV_NAMES`.
      visible_features: context features appended to the observation, normalised by their
        defaults; () hides the context.

    Returns:
      (ContextualEnv, default EnvParams).

    Raises:
      ContextError: unknown environment or feature (the message lists the valid ones).
    """
    env = ContextualEnv(env_name, visible_features)
    return env, env.default_params


def context_space(env_name: str) -> Mapping[str, tuple[float, float, float]]:
    """The context space of `env_name`: feature -> (default, lower, upper)."""
    return CONTEXT_SPACES[_check_env(env_name)]


__all__ = [
    "CONTEXT_SPACES",
    "ENV_NAMES",
    "ContextError",
    "ContextualEnv",
    "ContextualState",
    "Sampler",
    "clip_to_bounds",
    "context_space",
    "context_vector",
    "fixed_sampler",
    "gaussian_sampler",
    "make_contextual",
    "params_from_vector",
    "uniform_sampler",
    "with_context",
]

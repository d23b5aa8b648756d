"""Offline RL data in the D4RL layout, and scripted preferences between trajectory segments.

A dataset is a dict of equal-length arrays, one row per transition, in collection order:

    observations [N, obs_dim]   actions [N, act_dim] (or [N] for discrete)   rewards [N]
    terminals [N] bool (the MDP ended)   timeouts [N] bool (the episode was cut by a time limit)

An episode ends at a row whose `terminals` or `timeouts` is set. Scores are D4RL-normalised:
100 * (R - R_random) / (R_expert - R_random).

Preferences (OPPO, arXiv 2305.16217, and the preference-based RL it builds on) compare two
segments of K consecutive transitions inside one episode each. The scripted teacher prefers the
segment with the higher true return; with a temperature T > 0 the label is drawn from the
Bradley-Terry model P(a > b) = sigmoid((R_a - R_b) / T) instead.

Everything here is a pure function of arrays and jit-compatible (static sizes only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

FIELDS = ("observations", "actions", "rewards", "terminals", "timeouts")


def collect(
    env,
    policy: Callable[[jax.Array, jax.Array], jax.Array],
    key: jax.Array,
    *,
    num_envs: int,
    num_steps: int,
    epsilon: float | jax.Array = 0.0,
    env_params: Any = None,
) -> dict[str, jax.Array]:
    """Roll `policy` in `num_envs` copies of `env` for `num_steps` steps; a D4RL dataset.

    Args:
      env: a `ContextualEnv` (gymnax six-value step, auto-reset).
      policy: `policy(obs [num_envs, obs_dim], key) -> actions` (a behaviour policy, e.g. a PPO
        agent's sampled or mode action).
      key: PRNG key.
      num_envs, num_steps: static sizes; the dataset has num_envs * num_steps rows.
      epsilon: with this probability each action is replaced by a uniformly random one (over
        the discrete actions, or uniform in [action_low, action_high]); 1.0 is the random policy.
      env_params: the context of every episode (default: the environment's default).

    Returns the dataset with each environment's transitions contiguous (env 0's steps, then env
    1's, ...), plus "next_observations" (the true next state, also at episode ends). The last row
    of each environment's stream is marked as a timeout unless it is terminal, so no episode or
    segment crosses streams.
    """
    if env_params is None:
        env_params = env.default_params
    k_reset, k_run = jax.random.split(key)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_reset, num_envs),
                                                         env_params)
    v_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def random_actions(k):
        if env.discrete:
            return jax.random.randint(k, (num_envs,), 0, env.num_actions)
        return jax.random.uniform(k, (num_envs, env.num_actions), minval=env.action_low,
                                  maxval=env.action_high)

    def step(carry, k):
        state, obs = carry
        k_pol, k_eps, k_rand, k_env = jax.random.split(k, 4)
        action = policy(obs, k_pol)
        if not env.discrete:
            action = jnp.clip(action, env.action_low, env.action_high)
        explore = jax.random.uniform(k_eps, (num_envs,)) < epsilon
        rand = random_actions(k_rand)
        action = jnp.where(explore.reshape((-1,) + (1,) * (action.ndim - 1)), rand, action)
        next_obs, state, reward, term, trunc, info = v_step(
            jax.random.split(k_env, num_envs), state, action, env_params)
        row = {"observations": obs, "actions": action, "rewards": reward.astype(jnp.float32),
               "terminals": term.astype(bool), "timeouts": trunc.astype(bool) & ~term,
               "next_observations": info["final_observation"]}
        return (state, next_obs), row

    _, rows = jax.lax.scan(step, (state, obs), jax.random.split(k_run, num_steps))
    # [num_steps, num_envs, ...] -> [num_envs * num_steps, ...], each env's stream contiguous
    data = {k: jnp.swapaxes(v, 0, 1).reshape((num_envs * num_steps,) + v.shape[2:])
            for k, v in rows.items()}
    stream_end = (jnp.arange(num_envs * num_steps) % num_steps) == num_steps - 1
    data["timeouts"] = data["timeouts"] | (stream_end & ~data["terminals"])
    return data


def evaluate_policy(
    env, policy: Callable[[jax.Array, jax.Array], jax.Array], key: jax.Array, *,
    num_episodes: int, env_params: Any = None, batched_params: bool = False,
) -> jax.Array:
    """Undiscounted return of `num_episodes` full episodes of `policy` (one per parallel env, run
    to the environment's episode limit): [num_episodes].

    `env_params` is one context for every episode (default: the environment's default), or with
    `batched_params` a pytree with a leading [num_episodes] axis, one context per episode."""
    if env_params is None:
        env_params = env.default_params
    p_axis = 0 if batched_params else None
    k_reset, k_run = jax.random.split(key)
    obs, state = jax.vmap(env.reset, in_axes=(0, p_axis))(
        jax.random.split(k_reset, num_episodes), env_params)
    v_step = jax.vmap(env.step, in_axes=(0, 0, 0, p_axis))
    horizon = int(env.default_params.max_steps_in_episode)

    def step(carry, k):
        state, obs, total, alive = carry
        k_pol, k_env = jax.random.split(k)
        action = policy(obs, k_pol)
        if not env.discrete:
            action = jnp.clip(action, env.action_low, env.action_high)
        obs, state, reward, term, trunc, _ = v_step(jax.random.split(k_env, num_episodes), state,
                                                    action, env_params)
        total = total + jnp.where(alive, reward, 0.0)
        return (state, obs, total, alive & ~(term | trunc)), None

    init = (state, obs, jnp.zeros((num_episodes,)), jnp.ones((num_episodes,), bool))
    (_, _, total, _), _ = jax.lax.scan(step, init, jax.random.split(k_run, horizon))
    return total


def concat(*datasets: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """Datasets one after another (each ends with a terminal or timeout, as `collect`'s do)."""
    for d in datasets:
        check_dataset(d)
    keys = set.intersection(*(set(d) for d in datasets))
    return {k: jnp.concatenate([jnp.asarray(d[k]) for d in datasets]) for k in sorted(keys)}


def check_dataset(data: Mapping[str, np.ndarray | jax.Array]) -> int:
    """Validates the D4RL layout; returns N. Raises ValueError naming the field at fault."""
    missing = [f for f in FIELDS if f not in data]
    if missing:
        raise ValueError(f"offline dataset is missing field(s) {missing}; it needs {list(FIELDS)}")
    n = int(np.shape(data["rewards"])[0])
    for f in FIELDS:
        if np.shape(data[f])[:1] != (n,):
            raise ValueError(f"offline dataset field '{f}' has {np.shape(data[f])[0]} rows, "
                             f"'rewards' has {n}")
    for f in ("rewards", "terminals", "timeouts"):
        if np.ndim(data[f]) != 1:
            raise ValueError(f"offline dataset field '{f}' must be 1-D, got shape "
                             f"{np.shape(data[f])}")
    return n


def dataset_actions(env, data: Mapping[str, Any]) -> tuple[jax.Array, jax.Array]:
    """(actions, action_features) of a dataset for `env`'s action space.

    Discrete: int32 [N] and their one-hot [N, num_actions]. Continuous: float32 [N, A], twice."""
    n = int(np.shape(data["actions"])[0])
    if env.discrete:
        actions = jnp.asarray(data["actions"], jnp.int32).reshape(n)
        return actions, jax.nn.one_hot(actions, env.num_actions)
    actions = jnp.asarray(data["actions"], jnp.float32).reshape(n, -1)
    if actions.shape[1] != env.num_actions:
        raise ValueError(f"offline dataset field 'actions' has {actions.shape[1]} dimensions, "
                         f"the environment has {env.num_actions}")
    return actions, actions


def action_scale_shift(env) -> tuple[float, float]:
    """(scale, shift) mapping [-1, 1] onto a continuous action box; (1, 0) for discrete."""
    if env.discrete:
        return 1.0, 0.0
    return (env.action_high - env.action_low) / 2, (env.action_high + env.action_low) / 2


def check_preferences(prefs: Mapping[str, Any], data: Mapping[str, Any],
                      length: int) -> tuple[jax.Array, jax.Array]:
    """Validates `make_preferences` output against a dataset; returns (starts int32 [P, 2],
    label float32 [P]). Raises ValueError naming the field at fault."""
    for f in ("starts", "label"):
        if f not in prefs:
            raise ValueError(f"prefs: missing field '{f}' (make_preferences writes it)")
    starts, label = jnp.asarray(prefs["starts"]), jnp.asarray(prefs["label"], jnp.float32)
    if starts.ndim != 2 or starts.shape[1] != 2 or label.shape != starts.shape[:1]:
        raise ValueError(f"prefs: 'starts' must be [P, 2] and 'label' [P], got "
                         f"{starts.shape} and {label.shape}")
    n = int(np.shape(data["rewards"])[0])
    if int(starts.min()) < 0:
        raise ValueError(f"prefs: 'starts' has a negative row {int(starts.min())}")
    if int(starts.max()) + length > n:
        raise ValueError(f"prefs: a segment of segment_length={length} starting at row "
                         f"{int(starts.max())} runs past the {n} rows")
    return starts.astype(jnp.int32), label


def episode_ids(terminals: jax.Array, timeouts: jax.Array) -> jax.Array:
    """Episode index of each row: the number of episode ends strictly before it. [N] int32."""
    done = jnp.logical_or(terminals, timeouts).astype(jnp.int32)
    return jnp.cumsum(done) - done


def episode_returns(rewards: jax.Array, terminals: jax.Array, timeouts: jax.Array,
                    num_episodes: int) -> jax.Array:
    """Undiscounted return of each episode, [num_episodes] (a trailing unfinished episode
    counts as one). `num_episodes` is static: at least the number of episodes in the data."""
    ids = episode_ids(terminals, timeouts)
    return jax.ops.segment_sum(rewards, ids, num_segments=num_episodes)


def normalized_score(returns, random_return: float, expert_return: float):
    """D4RL-normalised score: 100 * (R - R_random) / (R_expert - R_random)."""
    if expert_return == random_return:
        raise ValueError("normalised score: expert_return equals random_return "
                         f"({expert_return}); the scale is undefined")
    return 100.0 * (jnp.asarray(returns) - random_return) / (expert_return - random_return)


def segment_starts(terminals: jax.Array, timeouts: jax.Array, length: int) -> jax.Array:
    """Rows t whose segment t..t+length-1 lies inside one episode: [N] bool."""
    n = terminals.shape[0]
    if not 1 <= length <= n:
        raise ValueError(f"segment length must be in 1..{n} (the dataset size), got {length}")
    ids = episode_ids(terminals, timeouts)
    end = jnp.arange(n) + length - 1
    inside = end < n
    return inside & (ids == ids[jnp.minimum(end, n - 1)])


def sample_segment_pairs(key: jax.Array, terminals: jax.Array, timeouts: jax.Array, *,
                         num_pairs: int, length: int) -> jax.Array:
    """Start rows of `num_pairs` pairs of segments, drawn uniformly from the valid starts.

    Returns [num_pairs, 2] int32. Raises if no episode is `length` rows long (checked eagerly
    when the arrays are concrete)."""
    valid = segment_starts(terminals, timeouts, length)
    if not isinstance(valid, jax.core.Tracer) and not bool(valid.any()):
        raise ValueError(f"no episode in the dataset has {length} rows for a segment")
    p = valid.astype(jnp.float32) / jnp.maximum(valid.sum(), 1)
    return jax.random.choice(key, valid.shape[0], (num_pairs, 2), replace=True, p=p).astype(
        jnp.int32)


def segment_returns(rewards: jax.Array, starts: jax.Array, length: int) -> jax.Array:
    """Sum of `rewards[s : s + length]` for every start s (any shape of `starts`)."""
    c = jnp.concatenate([jnp.zeros((1,), rewards.dtype), jnp.cumsum(rewards)])
    return c[starts + length] - c[starts]


def gather_segments(x: jax.Array, starts: jax.Array, length: int) -> jax.Array:
    """Rows `x[s : s + length]` for every start s: [*starts.shape, length, *x.shape[1:]]."""
    idx = starts[..., None] + jnp.arange(length)
    return x[idx]


def preference_labels(key: jax.Array, return_a: jax.Array, return_b: jax.Array, *,
                      temperature: float = 0.0) -> jax.Array:
    """Label = how much segment a is preferred over b, in [0, 1].

    temperature == 0: the scripted teacher, 1 if R_a > R_b, 0 if R_a < R_b, 0.5 on a tie.
    temperature > 0: a Bradley-Terry draw, 1 with probability sigmoid((R_a - R_b) / T), else 0.
    """
    if temperature < 0:
        raise ValueError(f"preference temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return 0.5 * (1.0 + jnp.sign(return_a - return_b)).astype(jnp.float32)
    p = jax.nn.sigmoid((return_a - return_b) / temperature)
    return jax.random.bernoulli(key, p).astype(jnp.float32)


def make_preferences(key: jax.Array, data: Mapping[str, jax.Array], *, num_pairs: int,
                     length: int, temperature: float = 0.0) -> dict[str, jax.Array]:
    """Pairs of segments with scripted labels: {"starts" [P, 2], "returns" [P, 2], "label" [P]}
    (label 1 means the first segment is preferred)."""
    check_dataset(data)
    k_pairs, k_label = jax.random.split(key)
    rewards = jnp.asarray(data["rewards"], jnp.float32)
    terminals, timeouts = jnp.asarray(data["terminals"]), jnp.asarray(data["timeouts"])
    starts = sample_segment_pairs(k_pairs, terminals, timeouts, num_pairs=num_pairs,
                                  length=length)
    returns = segment_returns(rewards, starts, length)
    label = preference_labels(k_label, returns[:, 0], returns[:, 1], temperature=temperature)
    return {"starts": starts, "returns": returns, "label": label}


__all__ = [
    "FIELDS",
    "check_dataset",
    "check_preferences",
    "collect",
    "action_scale_shift",
    "concat",
    "dataset_actions",
    "evaluate_policy",
    "episode_ids",
    "episode_returns",
    "gather_segments",
    "make_preferences",
    "normalized_score",
    "preference_labels",
    "sample_segment_pairs",
    "segment_returns",
    "segment_starts",
]

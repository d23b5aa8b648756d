"""Passive T-Maze memory task in pure JAX, as used by RATE and ELMUR.

The T-Maze (Bakker, "Reinforcement Learning with Long Short-Term Memory", NeurIPS 2001) in the
"classic passive" form of Ni et al. ("When Do Transformers Shine in RL? Decoupling Memory from
Credit Assignment", NeurIPS 2023) is the memory benchmark of RATE (Cherepanov et al., "Recurrent
Action Transformer with Memory", arXiv:2306.09459) and ELMUR (Cherepanov et al.). This module is
our own gymnax implementation of RATE's environment (public code: GitHub
``CognitiveAISystems/RATE``, ``TMaze_new/TMaze_new_src/utils/tmaze.py`` for the dynamics,
``.../utils/tmaze_new_dataset.py`` and ``.../inference/val_tmaze.py`` for the observation the
agent sees, the episode time limit and the scripted optimal policy)::

                                   up    (x = L, y = +1)
    start (x = 0) - - - - - - - junction (x = L, y = 0)
                                   down  (x = L, y = -1)

At reset the goal side ("cue", ``+1`` = up, ``-1`` = down) is drawn uniformly. The cue is shown
*only in the first observation*. The agent walks the corridor to the junction at ``x = L``
(``L = params.corridor_length``) and must then turn towards the cued side.

**Actions** (``Discrete(4)``, RATE's ``action_mapping``): ``0`` right (``x + 1``), ``1`` up
(``y + 1``), ``2`` left (``x - 1``), ``3`` down (``y - 1``). A move that would leave the maze is
a no-op: up/down inside the corridor, left at the start, right at the junction. Up/down at the
junction is the choice and ends the episode.

**Observation** (``float32[4]``, RATE's model input ``{y, hint, flag, noise}``; RATE's env also
emits ``x``, but its agents are fed ``states[..., 1:]``, i.e. without it):

* ``obs[0]`` ``y``: 0 in the corridor, ``+1`` / ``-1`` after a turn (only in the final
  observation of an episode).
* ``obs[1]`` ``hint``: the cue (``+1`` / ``-1``) in the first observation of an episode, 0 after.
* ``obs[2]`` ``flag``: 1 while the agent stands at the junction, else 0.
* ``obs[3]`` ``noise``: uniform in ``{-1, 0, 1}``, fresh every step (a distractor channel; turn
  it off with ``params.obs_noise = False``).

**Reward**: 1 for the correct turn, 0 for the wrong one. With ``params.penalty < 0`` (RATE's
``penalty``, 0 by default as in all of RATE's runs) every non-final step on which the agent lags
behind the optimal schedule (``x < t`` after ``t`` steps) also costs ``penalty``.

**Episode end**: terminated after the turn; truncated at ``params.max_steps_in_episode``
(``L + 2`` as in RATE, where ``episode_timeout = corridor_length + 2``: the optimal episode takes
``L + 1`` steps, leaving one step of slack). ``info["success"]`` is True exactly on a step that
makes the correct turn. ``corridor_length`` is an ordinary (traceable) params field: no shape
depends on it, so different lengths can be vmapped together (use `tmaze_params` to keep
``max_steps_in_episode = L + 2``).

Scripted behaviour-cloning data: read the cue from the first observation (`tmaze_cue`), keep it,
and act with `tmaze_oracle(cue, obs)` (right until the junction flag, then turn to the cue; it is
RATE's ``generate_trajectory`` policy).

    env, params = TMaze(), tmaze_params(corridor_length=50)
    obs, state = env.reset(key, params)
    cue = tmaze_cue(obs)
    obs, state, reward, terminated, truncated, info = env.step(key, state,
                                                               tmaze_oracle(cue, obs), params)

Deviations from RATE, and why: the junction flag is 1 whenever the agent is at the junction
(RATE's evaluation sets it only on the first arrival; the two agree for any policy that does not
idle at the junction), so the flag is a function of the position; a wrong turn always gives 0
(RATE gives -1 instead when ``goal_reward != 1``); RATE's ``hint_steps`` (showing the cue for
several steps), ``oracle_length`` and ``distract_reward`` are not implemented (RATE uses
``hint_steps = 1`` and zeros); the noise channel is drawn from the step key instead of numpy's
global generator.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import environment, spaces

# Actions (RATE's `action_mapping = [[1, 0], [0, 1], [-1, 0], [0, -1]]`).
RIGHT, UP, LEFT, DOWN = 0, 1, 2, 3
NUM_ACTIONS = 4

# Observation channels.
OBS_Y, OBS_HINT, OBS_FLAG, OBS_NOISE = 0, 1, 2, 3
OBS_DIM = 4

# RATE: episode_timeout = corridor_length + 2.
EPISODE_SLACK = 2


@struct.dataclass
class EnvState(environment.EnvState):
    """T-Maze state.

    Attributes:
        x: Position along the corridor, ``0 .. corridor_length`` (int32).
        y: 0 in the corridor, ``+1`` / ``-1`` after the turn (int32).
        cue: The goal side, ``+1`` (up) or ``-1`` (down) (int32).
        time: Steps taken in this episode (int32).
    """

    x: jax.Array
    y: jax.Array
    cue: jax.Array
    time: jax.Array


@struct.dataclass
class EnvParams(environment.EnvParams):
    """T-Maze parameters (all traceable: none changes a shape).

    Attributes:
        corridor_length: ``L``, the junction's position (>= 1).
        penalty: Per-step penalty (<= 0) for lagging behind the optimal schedule (RATE's
            ``penalty``); 0 gives the pure 1/0 reward.
        obs_noise: Whether ``obs[3]`` carries RATE's uniform ``{-1, 0, 1}`` noise (else 0).
        max_steps_in_episode: Time limit (truncation); RATE uses ``corridor_length + 2``.
    """

    corridor_length: int = 10
    penalty: float = 0.0
    obs_noise: bool = True
    max_steps_in_episode: int = 10 + EPISODE_SLACK


def tmaze_params(corridor_length: int = 10, **overrides: Any) -> EnvParams:
    """Params for a corridor length with RATE's time limit ``corridor_length + 2``.

    Args:
        corridor_length: ``L``, the junction's position.
        **overrides: Other `EnvParams` fields (``penalty``, ``obs_noise``,
            ``max_steps_in_episode``).

    Returns:
        The `EnvParams`.

    Raises:
        ValueError: For a concrete ``corridor_length < 1`` or ``penalty > 0``.
    """
    if isinstance(corridor_length, int) and corridor_length < 1:
        raise ValueError(f"corridor_length must be >= 1, got {corridor_length}")
    penalty = overrides.get("penalty", 0.0)
    if isinstance(penalty, int | float) and penalty > 0:
        raise ValueError(f"penalty must be <= 0, got {penalty}")
    overrides.setdefault("max_steps_in_episode", corridor_length + EPISODE_SLACK)
    return EnvParams(corridor_length=corridor_length, **overrides)


def tmaze_cue(first_obs: jax.Array) -> jax.Array:
    """The cue (``+1`` up, ``-1`` down) from an episode's first observation.

    Args:
        first_obs: The observation returned by reset (``[..., 4]``).

    Returns:
        ``first_obs[..., 1]`` (0 for any later observation).
    """
    return first_obs[..., OBS_HINT]


def tmaze_oracle(cue: jax.Array, obs: jax.Array) -> jax.Array:
    """Optimal action given the remembered cue (RATE's scripted data policy).

    Moves right until the junction flag is set, then turns up for cue ``+1`` and down for
    ``-1``. Pure and elementwise: works under jit / vmap with batched ``cue`` / ``obs``.

    Args:
        cue: The cue from the episode's first observation (see `tmaze_cue`), ``[...]``.
        obs: The current observation, ``[..., 4]``.

    Returns:
        int32 actions, ``[...]``.
    """
    turn = jnp.where(jnp.asarray(cue) > 0, UP, DOWN)
    return jnp.where(obs[..., OBS_FLAG] > 0.5, turn, RIGHT).astype(jnp.int32)


class TMaze(environment.Environment[EnvState, EnvParams]):
    """RATE's passive T-Maze (see the module docstring for the full specification)."""

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self).__name__)

    def __repr__(self) -> str:
        return "TMaze()"

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def step_env(
        self,
        key: jax.Array,
        state: EnvState,
        action: int | jax.Array,
        params: EnvParams,
    ) -> tuple[jax.Array, EnvState, jax.Array, jax.Array, dict[str, Any]]:
        """One transition (no auto-reset; gymnax's `step` adds it)."""
        action = jnp.asarray(action, jnp.int32)
        length = jnp.asarray(params.corridor_length, jnp.int32)
        at_junction = state.x == length
        # Right/left move along the corridor (clipped to [0, L]); up/down only at the junction.
        dx = jnp.where(action == RIGHT, 1, jnp.where(action == LEFT, -1, 0))
        x = jnp.clip(state.x + dx, 0, length).astype(jnp.int32)
        turned = at_junction & ((action == UP) | (action == DOWN))
        y = jnp.where(turned, jnp.where(action == UP, 1, -1), 0).astype(jnp.int32)
        time = state.time + 1
        new_state = EnvState(x=x, y=y, cue=state.cue, time=time)

        success = turned & (y == state.cue)
        timeout = time >= params.max_steps_in_episode
        lagging = x < time  # RATE: penalty when x < t - oracle_length, oracle_length = 0
        step_reward = jnp.where(lagging & ~timeout, params.penalty, 0.0)
        reward = jnp.where(turned, success.astype(jnp.float32), step_reward)
        obs = self._obs(key, new_state, params, show_hint=False)
        return obs, new_state, reward.astype(jnp.float32), turned, {"success": success}

    def reset_env(self, key: jax.Array, params: EnvParams) -> tuple[jax.Array, EnvState]:
        """Draws the cue; the agent starts at ``x = 0``."""
        key_cue, key_noise = jax.random.split(key)
        cue = jnp.where(jax.random.bernoulli(key_cue), 1, -1).astype(jnp.int32)
        zero = jnp.zeros((), jnp.int32)
        state = EnvState(x=zero, y=zero, cue=cue, time=zero)
        return self._obs(key_noise, state, params, show_hint=True), state

    def _obs(self, key: jax.Array, state: EnvState, params: EnvParams, show_hint: bool):
        noise = jax.random.randint(key, (), -1, 2).astype(jnp.float32)
        noise = jnp.where(params.obs_noise, noise, 0.0)
        hint = state.cue.astype(jnp.float32) if show_hint else jnp.zeros((), jnp.float32)
        flag = ((state.x == params.corridor_length) & (state.y == 0)).astype(jnp.float32)
        return jnp.stack([state.y.astype(jnp.float32), hint, flag, noise])

    def get_obs(self, state: EnvState, params: EnvParams | None = None, key=None) -> jax.Array:
        """Observation of a state (hint shown iff ``state.time == 0``; noise from ``key``)."""
        params = self.default_params if params is None else params
        key = jax.random.key(0) if key is None else key
        obs = self._obs(key, state, params, show_hint=True)
        return obs.at[OBS_HINT].multiply((state.time == 0).astype(jnp.float32))

    def is_terminated(self, state: EnvState, params: EnvParams) -> jax.Array:
        """True once the agent has turned at the junction."""
        return state.y != 0

    @property
    def name(self) -> str:
        return "TMaze"

    @property
    def num_actions(self) -> int:
        return NUM_ACTIONS

    def action_space(self, params: EnvParams | None = None) -> spaces.Discrete:
        return spaces.Discrete(NUM_ACTIONS)

    def observation_space(self, params: EnvParams | None = None) -> spaces.Box:
        return spaces.Box(-1.0, 1.0, (OBS_DIM,), jnp.float32)

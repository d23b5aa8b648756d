"""POPGym memory tasks in pure JAX (gymnax API): RepeatPrevious, CountRecall, StatelessCartPole.

POPGym (Morad et al., "POPGym: Benchmarking Partially Observable Reinforcement Learning", ICLR
2023, arXiv:2303.01859) is a suite of partially observable tasks, each in Easy / Medium / Hard
sizes, whose rewards are scaled so that an episode's return lies in ``[-1, 1]``. This module is
our own gymnax implementation of three of them, following POPGym's code (GitHub
``proroklab/popgym``: ``popgym/envs/repeat_previous.py``, ``popgym/envs/count_recall.py``,
``popgym/envs/stateless_cartpole.py`` and the card deck ``popgym/core/deck.py``)::

    env, params = make_popgym("RepeatPrevious", "hard")
    obs, state = env.reset(key, params)
    action = env.oracle_action(state, params)          # scripted expert, for behaviour cloning
    obs, state, reward, terminated, truncated, info = env.step(key, state, action, params)

Sizes (exactly POPGym's ``*Easy`` / ``*Medium`` / ``*Hard`` classes; `POPGYM_SIZES`):

=================  ======================  ======================  ======================
task               easy                    medium                  hard
=================  ======================  ======================  ======================
RepeatPrevious     1 deck, k = 4           2 decks, k = 32         3 decks, k = 64
CountRecall        1 deck, colours (2)     2 decks, suits (4)      4 decks, ranks (13)
StatelessCartPole  200 steps               400 steps               600 steps
=================  ======================  ======================  ======================

**RepeatPrevious(num_decks, k)**. ``N = 52 * num_decks`` cards (13 of each of 4 suits per deck)
are shuffled and shown one per step; the episode has ``N - 1`` steps (terminated at the last). The
observation is the one-hot suit of the current card (``float32[4]``; POPGym's ``Discrete(4)``
observation, one-hot encoded as RLlib's preprocessor does). Action ``Discrete(4)``: a suit. The
target is POPGym's ``hand[-k]``: the k-th most recent card *counting the current one*, i.e. the
card observed ``k - 1`` steps before the current observation (so ``k = 1`` would mean "repeat the
card you see"). Steps before ``k`` cards have been seen are unrewarded (reward 0); afterwards the
reward is ``+1 / (N - k)`` for the right suit and ``-1 / (N - k)`` otherwise; there are exactly
``N - k`` rewarded steps, so the return lies in ``[-1, 1]``.

**CountRecall(num_decks, deck_type)**. Two independently shuffled decks of ``N = 52 * num_decks``
cards, a value deck and a query deck, are dealt one card each per step; a card's type is its
colour (2), suit (4) or rank (13). The observation is ``[one_hot(value type), one_hot(query
type)]`` (``float32[2 * num_types]``; POPGym's ``MultiDiscrete([num_types] * 2)`` one-hot
encoded). The agent must answer how many value cards *of the queried type* it has seen so far,
the current one included. Reward ``+1 / (N - 1)`` for the exact count, ``-1 / (N - 1)`` otherwise,
on each of the ``N - 1`` steps (return in ``[-1, 1]``; POPGym's ``error_clamp`` argument is unused
by its reward and is not implemented). Action: ``Discrete(max_card_count + 1)`` with
``max_card_count = N / num_types`` (see deviations).

**StatelessCartPole**. CartPole-v1 dynamics (gymnax's, which match gymnasium's) with the two
velocities removed: observation ``[x, theta]`` (``float32[2]``), action ``Discrete(2)`` (0 push
left, 1 push right). Every step, including the one that terminates (pole beyond 12 degrees or
cart beyond 2.4), gives ``1 / max_steps_in_episode`` (POPGym's ``reward_transform``; a step taken
after termination, which cannot happen with auto-reset, would give -1), so balancing for the whole
episode returns exactly 1. Truncated at ``max_steps_in_episode`` (200 / 400 / 600).

**Episode ends**. Terminated and truncated are exclusive: ``truncated`` is only set when the time
limit ends an episode that did not terminate (RepeatPrevious and CountRecall always terminate at
their fixed length, ``params.max_steps_in_episode = N - 1``).

**Oracles**. `RepeatPrevious.oracle_action` and `CountRecall.oracle_action` read the hidden state
and return an action that earns the maximal return (1) when used on every step.

Deviations from POPGym, and why:

* CountRecall's action space has ``max_card_count + 1`` actions (POPGym: ``max_card_count``), so
  that every count ``0 .. max_card_count`` can be answered. With POPGym's space, a count equal to
  ``max_card_count`` (e.g. all 26 red cards seen on the last step of an Easy episode, about half
  of all episodes; nearly every Hard episode) cannot be answered correctly.
* Observations are one-hot float vectors rather than discrete indices (the networks' input
  encoding in POPGym's baselines); no previous-action or is-first-step channels are added.
* ``truncated`` excludes ``terminated`` (see above); POPGym's StatelessCartPole can report both.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import environment, spaces
from gymnax.environments.classic_control import cartpole

DECK_SIZE = 52
NUM_SUITS = 4
NUM_RANKS = 13
NUM_COLORS = 2

POPGYM_NAMES: tuple[str, ...] = ("RepeatPrevious", "CountRecall", "StatelessCartPole")
DIFFICULTIES: tuple[str, ...] = ("easy", "medium", "hard")

# Constructor arguments of POPGym's Easy / Medium / Hard classes.
POPGYM_SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "RepeatPrevious": {
        "easy": {"num_decks": 1, "k": 4},
        "medium": {"num_decks": 2, "k": 32},
        "hard": {"num_decks": 3, "k": 64},
    },
    "CountRecall": {
        "easy": {"num_decks": 1, "deck_type": "colors"},
        "medium": {"num_decks": 2, "deck_type": "suits"},
        "hard": {"num_decks": 4, "deck_type": "ranks"},
    },
    "StatelessCartPole": {
        "easy": {"max_episode_length": 200},
        "medium": {"max_episode_length": 400},
        "hard": {"max_episode_length": 600},
    },
}


def _deck_types(num_decks: int, deck_type: str) -> np.ndarray:
    """Type index of every card of ``num_decks`` decks, as POPGym's ``Deck`` orders them."""
    card = np.arange(DECK_SIZE * num_decks)
    if deck_type == "colors":  # Deck.colors_idx = tile([0, 1], num_cards // 2)
        return card % NUM_COLORS
    if deck_type == "suits":  # Deck.suits_idx = tile(tile(arange(4), 13), num_decks)
        return card % NUM_SUITS
    if deck_type == "ranks":  # Deck.ranks_idx = tile(arange(13).repeat(4), num_decks)
        return (card % DECK_SIZE) // NUM_SUITS
    raise ValueError(f"Unknown deck_type {deck_type!r}; valid: 'colors', 'suits', 'ranks'")


@struct.dataclass
class EnvParams(environment.EnvParams):
    """Params of the card games: only the time limit (their sizes are static, shape-defining).

    Attributes:
        max_steps_in_episode: Time limit; the card games end by termination after ``N - 1``
            steps, which is the default their factories set.
    """

    max_steps_in_episode: int = DECK_SIZE - 1


class _CardGame(environment.Environment):
    """Shared parts of the card games: value equality (shares jit caches) and truncation."""

    def _config(self) -> tuple:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._config() == self._config()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._config()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}{self._config()}"

    @property
    def num_cards(self) -> int:
        """``N = 52 * num_decks``."""
        return DECK_SIZE * self.num_decks

    @property
    def default_params(self) -> EnvParams:
        return EnvParams(max_steps_in_episode=self.num_cards - 1)

    def is_terminated(self, state: Any, params: Any) -> jax.Array:
        """True once ``N - 1`` steps have been taken (the deck is exhausted)."""
        return state.time >= self.num_cards - 1

    def is_truncated(self, state: Any, params: Any) -> jax.Array:
        """Time limit reached without termination."""
        return (state.time >= params.max_steps_in_episode) & ~self.is_terminated(state, params)


# -- RepeatPrevious ------------------------------------------------------------------------------


@struct.dataclass
class RepeatPreviousState(environment.EnvState):
    """RepeatPrevious state.

    Attributes:
        cards: Suit of every card in dealing order, int32[N]; ``cards[t]`` is observed at time t.
        time: Steps taken (int32).
    """

    cards: jax.Array
    time: jax.Array


class RepeatPrevious(_CardGame):
    """Output the suit of the k-th most recent card, the current one included (POPGym).

    Args:
        num_decks: Number of 52-card decks (sets the episode length ``52 * num_decks - 1``).
        k: Which card to repeat; POPGym's ``hand[-k]`` (``k = 1`` is the current card).
    """

    def __init__(self, num_decks: int = 1, k: int = 4):
        super().__init__()
        if num_decks < 1:
            raise ValueError(f"num_decks must be >= 1, got {num_decks}")
        if not 1 <= k < DECK_SIZE * num_decks:
            raise ValueError(f"k must be in [1, {DECK_SIZE * num_decks}), got {k}")
        self.num_decks = num_decks
        self.k = k

    def _config(self) -> tuple:
        return (self.num_decks, self.k)

    @property
    def reward_scale(self) -> float:
        """``1 / (N - k)``: the magnitude of each of the ``N - k`` rewards."""
        return 1.0 / (self.num_cards - self.k)

    def reset_env(self, key: jax.Array, params: EnvParams) -> tuple[jax.Array, RepeatPreviousState]:
        """Shuffles the deck(s) and shows the first card."""
        suits = jnp.asarray(_deck_types(self.num_decks, "suits"), jnp.int32)
        cards = jax.random.permutation(key, suits)
        state = RepeatPreviousState(cards=cards, time=jnp.zeros((), jnp.int32))
        return self.get_obs(state), state

    def step_env(
        self,
        key: jax.Array,
        state: RepeatPreviousState,
        action: int | jax.Array,
        params: EnvParams,
    ) -> tuple[jax.Array, RepeatPreviousState, jax.Array, jax.Array, dict[str, Any]]:
        """Scores the answer and shows the next card."""
        target_time = state.time + 1 - self.k
        scored = target_time >= 0
        correct = jnp.asarray(action) == state.cards[jnp.maximum(target_time, 0)]
        reward = jnp.where(correct, self.reward_scale, -self.reward_scale)
        reward = jnp.where(scored, reward, 0.0).astype(jnp.float32)
        new_state = RepeatPreviousState(cards=state.cards, time=state.time + 1)
        terminated = self.is_terminated(new_state, params)
        return self.get_obs(new_state), new_state, reward, terminated, {}

    def get_obs(self, state: RepeatPreviousState, params: Any = None, key: Any = None):
        """One-hot suit of the current card, float32[4]."""
        card = state.cards[jnp.minimum(state.time, self.num_cards - 1)]
        return jax.nn.one_hot(card, NUM_SUITS, dtype=jnp.float32)

    def oracle_action(self, state: RepeatPreviousState, params: EnvParams | None = None):
        """The rewarded suit (any suit, here the first card's, before ``k`` cards were seen)."""
        return state.cards[jnp.maximum(state.time + 1 - self.k, 0)].astype(jnp.int32)

    @property
    def name(self) -> str:
        return "RepeatPrevious"

    @property
    def num_actions(self) -> int:
        return NUM_SUITS

    def action_space(self, params: EnvParams | None = None) -> spaces.Discrete:
        return spaces.Discrete(NUM_SUITS)

    def observation_space(self, params: EnvParams | None = None) -> spaces.Box:
        return spaces.Box(0.0, 1.0, (NUM_SUITS,), jnp.float32)


# -- CountRecall ---------------------------------------------------------------------------------


@struct.dataclass
class CountRecallState(environment.EnvState):
    """CountRecall state.

    Attributes:
        value_cards: Type of every value card in dealing order, int32[N].
        query_cards: Type of every query card in dealing order, int32[N].
        counts: Value cards of each type seen so far (current one included), int32[num_types].
        time: Steps taken (int32); ``value_cards[time]`` / ``query_cards[time]`` are shown.
    """

    value_cards: jax.Array
    query_cards: jax.Array
    counts: jax.Array
    time: jax.Array


class CountRecall(_CardGame):
    """Count how many value cards of the queried type have been seen (POPGym).

    Args:
        num_decks: Number of 52-card decks in each of the value and query decks.
        deck_type: What a card's type is: ``"colors"`` (2), ``"suits"`` (4) or ``"ranks"`` (13).
    """

    def __init__(self, num_decks: int = 1, deck_type: str = "colors"):
        super().__init__()
        if num_decks < 1:
            raise ValueError(f"num_decks must be >= 1, got {num_decks}")
        self._types = _deck_types(num_decks, deck_type)  # validates deck_type
        self.num_decks = num_decks
        self.deck_type = deck_type
        self.num_types = int(self._types.max()) + 1
        self.max_card_count = self.num_cards // self.num_types

    def _config(self) -> tuple:
        return (self.num_decks, self.deck_type)

    @property
    def reward_scale(self) -> float:
        """``1 / (N - 1)``: the magnitude of each of the ``N - 1`` rewards."""
        return 1.0 / (self.num_cards - 1)

    def reset_env(self, key: jax.Array, params: EnvParams) -> tuple[jax.Array, CountRecallState]:
        """Shuffles both decks and deals the first value and query cards."""
        key_value, key_query = jax.random.split(key)
        types = jnp.asarray(self._types, jnp.int32)
        value_cards = jax.random.permutation(key_value, types)
        query_cards = jax.random.permutation(key_query, types)
        counts = jax.nn.one_hot(value_cards[0], self.num_types, dtype=jnp.int32)
        state = CountRecallState(
            value_cards=value_cards,
            query_cards=query_cards,
            counts=counts,
            time=jnp.zeros((), jnp.int32),
        )
        return self.get_obs(state), state

    def step_env(
        self,
        key: jax.Array,
        state: CountRecallState,
        action: int | jax.Array,
        params: EnvParams,
    ) -> tuple[jax.Array, CountRecallState, jax.Array, jax.Array, dict[str, Any]]:
        """Scores the count for the current query, then deals the next pair of cards."""
        target = self.oracle_action(state, params)
        correct = jnp.asarray(action) == target
        reward = jnp.where(correct, self.reward_scale, -self.reward_scale).astype(jnp.float32)
        time = state.time + 1
        next_value = state.value_cards[jnp.minimum(time, self.num_cards - 1)]
        counts = state.counts + jax.nn.one_hot(next_value, self.num_types, dtype=jnp.int32)
        new_state = CountRecallState(
            value_cards=state.value_cards,
            query_cards=state.query_cards,
            counts=counts,
            time=time,
        )
        terminated = self.is_terminated(new_state, params)
        return self.get_obs(new_state), new_state, reward, terminated, {}

    def get_obs(self, state: CountRecallState, params: Any = None, key: Any = None):
        """``[one_hot(value type), one_hot(query type)]``, float32[2 * num_types]."""
        t = jnp.minimum(state.time, self.num_cards - 1)
        value = jax.nn.one_hot(state.value_cards[t], self.num_types, dtype=jnp.float32)
        query = jax.nn.one_hot(state.query_cards[t], self.num_types, dtype=jnp.float32)
        return jnp.concatenate([value, query])

    def oracle_action(self, state: CountRecallState, params: EnvParams | None = None):
        """The correct count: value cards of the current query's type seen so far."""
        t = jnp.minimum(state.time, self.num_cards - 1)
        return state.counts[state.query_cards[t]].astype(jnp.int32)

    @property
    def name(self) -> str:
        return "CountRecall"

    @property
    def num_actions(self) -> int:
        return self.max_card_count + 1

    def action_space(self, params: EnvParams | None = None) -> spaces.Discrete:
        return spaces.Discrete(self.num_actions)

    def observation_space(self, params: EnvParams | None = None) -> spaces.Box:
        return spaces.Box(0.0, 1.0, (2 * self.num_types,), jnp.float32)


# -- StatelessCartPole ---------------------------------------------------------------------------


@struct.dataclass
class StatelessCartPoleParams(cartpole.EnvParams):
    """gymnax's CartPole params; ``max_steps_in_episode`` is POPGym's ``max_episode_length``."""

    max_steps_in_episode: int = 200


StatelessCartPoleState = cartpole.EnvState


class StatelessCartPole(cartpole.CartPole):
    """CartPole without velocities, reward ``1 / max_steps_in_episode`` per step (POPGym)."""

    def __init__(self):
        super().__init__()
        self.obs_shape = (2,)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self).__name__)

    def __repr__(self) -> str:
        return "StatelessCartPole()"

    @property
    def default_params(self) -> StatelessCartPoleParams:
        return StatelessCartPoleParams()

    def step_env(
        self,
        key: jax.Array,
        state: cartpole.EnvState,
        action: int | jax.Array,
        params: StatelessCartPoleParams,
    ) -> tuple[jax.Array, cartpole.EnvState, jax.Array, jax.Array, dict[str, Any]]:
        """gymnax's CartPole step with POPGym's observation and reward."""
        prev_terminal = self.is_terminated(state, params)
        obs, new_state, _, terminated, info = super().step_env(key, state, action, params)
        reward = jnp.where(prev_terminal, -1.0, 1.0 / params.max_steps_in_episode)
        return obs, new_state, reward.astype(jnp.float32), terminated, info

    def get_obs(self, state: cartpole.EnvState, params: Any = None, key: Any = None):
        """``[x, theta]``, float32[2]."""
        return jnp.stack([state.x, state.theta]).astype(jnp.float32)

    def is_truncated(self, state: cartpole.EnvState, params: Any) -> jax.Array:
        """Time limit reached without termination."""
        return (state.time >= params.max_steps_in_episode) & ~self.is_terminated(state, params)

    @property
    def name(self) -> str:
        return "StatelessCartPole"

    def observation_space(self, params: StatelessCartPoleParams) -> spaces.Box:
        high = jnp.array([params.x_threshold * 2, params.theta_threshold_radians * 2], jnp.float32)
        return spaces.Box(-high, high, (2,), jnp.float32)


# -- factory -------------------------------------------------------------------------------------


def make_popgym(name: str, difficulty: str) -> tuple[environment.Environment, Any]:
    """Builds a POPGym task at one of POPGym's sizes.

    Args:
        name: ``"RepeatPrevious"``, ``"CountRecall"`` or ``"StatelessCartPole"``.
        difficulty: ``"easy"``, ``"medium"`` or ``"hard"``.

    Returns:
        ``(env, params)``; envs compare equal by configuration, so equal envs share jit caches.

    Raises:
        ValueError: For an unknown name or difficulty (the message lists the valid ones).
    """
    if name not in POPGYM_SIZES:
        raise ValueError(f"Unknown POPGym task {name!r}; valid names: {', '.join(POPGYM_NAMES)}")
    sizes = POPGYM_SIZES[name]
    if difficulty not in sizes:
        raise ValueError(
            f"Unknown difficulty {difficulty!r} for {name}; valid: {', '.join(DIFFICULTIES)}"
        )
    size = sizes[difficulty]
    if name == "RepeatPrevious":
        env = RepeatPrevious(**size)
        return env, env.default_params
    if name == "CountRecall":
        env = CountRecall(**size)
        return env, env.default_params
    env = StatelessCartPole()
    return env, StatelessCartPoleParams(max_steps_in_episode=size["max_episode_length"])

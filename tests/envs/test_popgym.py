"""Tests for the POPGym tasks in `envs.popgym` (rules checked against POPGym's code by hand)."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments.classic_control import cartpole

from jaxrl_suite.envs.popgym import (
    DIFFICULTIES,
    POPGYM_NAMES,
    CountRecall,
    RepeatPrevious,
    StatelessCartPole,
    make_popgym,
)

KEY = jax.random.key(0)
NUM_ENVS = 8


def rollout(env, params, key, policy, num_steps):
    """Numpy trajectories of `_rollout`."""
    return jax.tree.map(np.asarray, _rollout(env, params, key, policy, num_steps))


@partial(jax.jit, static_argnames=("env", "policy", "num_steps"))
def _rollout(env, params, key, policy, num_steps):
    """Vmapped rollouts with auto-reset; ``policy(env, state, obs, memory, t) -> (a, memory)``."""

    def single(key):
        key, key_reset = jax.random.split(key)
        obs, state = env.reset(key_reset, params)
        memory = jax.tree.map(jnp.zeros_like, policy(env, state, obs, None, 0)[1])

        def body(carry, inp):
            obs, state, memory = carry
            key, t = inp
            action, memory = policy(env, state, obs, memory, t)
            obs2, state2, reward, terminated, truncated, info = env.step(key, state, action, params)
            out = {
                "obs": obs,
                "action": action,
                "reward": reward,
                "terminated": terminated,
                "truncated": truncated,
                "oracle": oracle(env, state, params),
                "state": state,
            }
            return (obs2, state2, memory), out

        inputs = (jax.random.split(key, num_steps), jnp.arange(num_steps))
        return jax.lax.scan(body, (obs, state, memory), inputs)[1]

    keys = jax.random.split(key, NUM_ENVS)
    return jax.vmap(single)(keys)


def oracle(env, state, params):
    if isinstance(env, StatelessCartPole):
        return jnp.zeros((), jnp.int32)
    return env.oracle_action(state, params)


def oracle_policy(env, state, obs, memory, t):
    """The env's oracle; a hand-made full-state controller for StatelessCartPole."""
    if isinstance(env, StatelessCartPole):
        u = 0.05 * state.x + 0.2 * state.x_dot + 3.0 * state.theta + 0.5 * state.theta_dot
        return (u > 0).astype(jnp.int32), memory
    return env.oracle_action(state), memory


def repeat_previous_script(env, state, obs, memory, t):
    """Answers from the observed history only; right except on every third step."""
    seen = jnp.zeros(env.num_cards, jnp.int32) if memory is None else memory
    seen = seen.at[t].set(jnp.argmax(obs).astype(jnp.int32))
    target = seen[jnp.maximum(t + 1 - env.k, 0)]  # POPGym's hand[-k]: k-th most recent card
    action = jnp.where(t % 3 == 0, (target + 1) % 4, target)
    return action, seen


def count_recall_script(env, state, obs, memory, t):
    """Counts from the observed history only; right on even steps, off by one on odd ones."""
    counts = jnp.zeros(env.num_types, jnp.int32) if memory is None else memory
    value, query = obs[: env.num_types], obs[env.num_types :]
    counts = counts + value.astype(jnp.int32)
    target = jnp.sum(counts * query.astype(jnp.int32))
    action = jnp.where(t % 2 == 0, target, (target + 1) % env.num_actions)
    return action, counts


# -- factory and sizes ---------------------------------------------------------------------------


def test_sizes_are_popgyms():
    expected = {
        ("RepeatPrevious", "easy"): (1, 4),
        ("RepeatPrevious", "medium"): (2, 32),
        ("RepeatPrevious", "hard"): (3, 64),
    }
    for (name, difficulty), (decks, k) in expected.items():
        env, params = make_popgym(name, difficulty)
        assert isinstance(env, RepeatPrevious) and (env.num_decks, env.k) == (decks, k)
        assert params.max_steps_in_episode == 52 * decks - 1
        assert env.num_actions == 4 and env.observation_space(params).shape == (4,)
    expected = {"easy": (1, "colors", 2, 26), "medium": (2, "suits", 4, 26)}
    expected["hard"] = (4, "ranks", 13, 16)
    for difficulty, (decks, deck_type, types, max_count) in expected.items():
        env, params = make_popgym("CountRecall", difficulty)
        assert isinstance(env, CountRecall)
        assert (env.num_decks, env.deck_type, env.num_types) == (decks, deck_type, types)
        assert env.max_card_count == max_count and env.num_actions == max_count + 1
        assert env.observation_space(params).shape == (2 * types,)
        assert params.max_steps_in_episode == 52 * decks - 1
    for difficulty, length in zip(DIFFICULTIES, (200, 400, 600), strict=True):
        env, params = make_popgym("StatelessCartPole", difficulty)
        assert isinstance(env, StatelessCartPole) and params.max_steps_in_episode == length
        assert env.num_actions == 2 and env.observation_space(params).shape == (2,)
    assert make_popgym("CountRecall", "hard")[0] == CountRecall(4, "ranks")


def test_unknown_name_or_difficulty():
    with pytest.raises(ValueError, match="'Foo'.*RepeatPrevious, CountRecall, StatelessCartPole"):
        make_popgym("Foo", "easy")
    with pytest.raises(ValueError, match="'extreme'.*easy, medium, hard"):
        make_popgym("CountRecall", "extreme")
    with pytest.raises(ValueError, match="deck_type"):
        CountRecall(1, "jokers")
    with pytest.raises(ValueError, match="k must be"):
        RepeatPrevious(1, 52)


@pytest.mark.parametrize("name", POPGYM_NAMES)
@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_every_size_runs_under_jit_and_oracle_is_maximal(name, difficulty):
    env, params = make_popgym(name, difficulty)
    steps = params.max_steps_in_episode
    traj = rollout(env, params, KEY, oracle_policy, steps)
    assert traj["obs"].dtype == np.float32
    assert traj["obs"].shape == (NUM_ENVS, steps, *env.observation_space(params).shape)
    # One full episode per env, ending on the last step with the maximal return of 1.
    ends = traj["terminated"] | traj["truncated"]
    assert not ends[:, :-1].any() and ends[:, -1].all()
    np.testing.assert_allclose(traj["reward"].sum(axis=1), 1.0, rtol=1e-5)
    if name == "StatelessCartPole":
        assert traj["truncated"][:, -1].all() and not traj["terminated"].any()
    else:
        assert traj["terminated"][:, -1].all() and not traj["truncated"].any()


# -- RepeatPrevious ------------------------------------------------------------------------------


def test_repeat_previous_deck_and_observations():
    env, params = make_popgym("RepeatPrevious", "medium")
    obs, state = env.reset(KEY, params)
    np.testing.assert_array_equal(np.bincount(np.asarray(state.cards), minlength=4), [26] * 4)
    traj = rollout(env, params, KEY, oracle_policy, params.max_steps_in_episode)
    cards = traj["state"].cards[:, 0]
    np.testing.assert_array_equal(traj["obs"].argmax(-1), cards[:, :-1])
    np.testing.assert_array_equal(traj["obs"].sum(-1), 1.0)


def test_repeat_previous_rewards_by_hand():
    env, params = make_popgym("RepeatPrevious", "easy")
    n, k = 52, 4
    traj = rollout(env, params, KEY, repeat_previous_script, n - 1)
    # The history-based answer is the oracle's whenever the step is scored.
    t = np.arange(n - 1)
    scored = t >= k - 1
    right = t % 3 != 0
    assert np.all((traj["action"] == traj["oracle"])[:, scored] == right[scored])
    expected = np.where(scored, np.where(right, 1.0, -1.0), 0.0) / (n - k)
    np.testing.assert_allclose(traj["reward"], np.broadcast_to(expected, (NUM_ENVS, n - 1)))
    assert scored.sum() == n - k  # so that a perfect return is exactly 1
    ret = traj["reward"].sum(axis=1)
    np.testing.assert_allclose(ret, (right[scored].sum() - (~right[scored]).sum()) / (n - k))
    assert np.all(np.abs(ret) <= 1)
    assert traj["terminated"][:, -1].all() and not traj["terminated"][:, :-1].any()


def test_repeat_previous_k_counts_the_current_card():
    # k = 1 would mean "repeat the card you see" (POPGym's hand[-1]).
    env = RepeatPrevious(num_decks=1, k=1)
    params = env.default_params
    obs, state = env.reset(KEY, params)
    for _ in range(5):
        action = jnp.argmax(obs)
        obs, state, reward, *_ = env.step(KEY, state, action, params)
        assert np.isclose(reward, 1 / 51)


# -- CountRecall ---------------------------------------------------------------------------------


def test_count_recall_rewards_by_hand():
    env, params = make_popgym("CountRecall", "easy")
    n = 52
    traj = rollout(env, params, KEY, count_recall_script, n - 1)
    t = np.arange(n - 1)
    even = t % 2 == 0
    # The count reconstructed from observations is the oracle's answer.
    np.testing.assert_array_equal(traj["action"][:, even], traj["oracle"][:, even])
    assert np.all(traj["action"][:, ~even] != traj["oracle"][:, ~even])
    expected = np.where(even, 1.0, -1.0) / (n - 1)
    np.testing.assert_allclose(traj["reward"], np.broadcast_to(expected, (NUM_ENVS, n - 1)))
    np.testing.assert_allclose(traj["reward"].sum(axis=1), (even.sum() - (~even).sum()) / (n - 1))
    assert traj["terminated"][:, -1].all() and not traj["terminated"][:, :-1].any()
    # Both decks hold 26 cards of each colour; counts include the current value card.
    state = traj["state"]
    np.testing.assert_array_equal(np.bincount(state.value_cards[0, 0], minlength=2), [26, 26])
    np.testing.assert_array_equal(state.counts.sum(-1), np.broadcast_to(t + 1, (NUM_ENVS, n - 1)))


def test_count_recall_needs_the_extra_action():
    # A count of max_card_count (all cards of the queried colour seen) does occur; POPGym's
    # Discrete(max_card_count) could not answer it, our Discrete(max_card_count + 1) can.
    env, params = make_popgym("CountRecall", "easy")
    traj = rollout(env, params, KEY, oracle_policy, params.max_steps_in_episode)
    assert traj["oracle"].max() == env.max_card_count == env.num_actions - 1


# -- StatelessCartPole ---------------------------------------------------------------------------


def test_stateless_cartpole_matches_cartpole_without_velocities():
    env, params = make_popgym("StatelessCartPole", "easy")
    full = cartpole.CartPole()
    full_params = cartpole.EnvParams(max_steps_in_episode=200)
    obs, state = env.reset(KEY, params)
    full_obs, full_state = full.reset(KEY, full_params)
    np.testing.assert_allclose(obs, full_obs[jnp.array([0, 2])])
    for _ in range(5):
        obs, state, reward, terminated, truncated, _ = env.step(KEY, state, 1, params)
        full_obs, full_state, *_ = full.step(KEY, full_state, 1, full_params)
        assert obs.shape == (2,) and obs.dtype == jnp.float32
        np.testing.assert_allclose(obs, full_obs[jnp.array([0, 2])], rtol=1e-6)
        assert np.isclose(reward, 1 / 200)


def test_stateless_cartpole_terminates_like_cartpole():
    env, params = make_popgym("StatelessCartPole", "easy")
    push_right = lambda env, state, obs, memory, t: (jnp.int32(1), memory)
    traj = rollout(env, params, KEY, push_right, 60)
    for i in range(NUM_ENVS):
        end = int(np.argmax(traj["terminated"][i]))
        assert 0 < end < 60 and not traj["truncated"][i].any()
        # Every step of the episode, the terminating one included, earns 1 / 200.
        np.testing.assert_allclose(traj["reward"][i, : end + 1], 1 / 200)
        state = jax.tree.map(lambda x, i=i, end=end: x[i, end], traj["state"])
        assert not env.is_terminated(state, params)  # alive before the last step
        # Observation = (x, theta) of the state it was observed in.
        np.testing.assert_allclose(traj["obs"][i, end], [state.x, state.theta])
    np.testing.assert_array_less(traj["reward"].sum(1), 1.0)

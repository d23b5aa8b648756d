"""Tests for the RATE-style passive T-Maze in `envs.tmaze`."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.envs.tmaze import (
    DOWN,
    LEFT,
    OBS_FLAG,
    OBS_HINT,
    OBS_NOISE,
    OBS_Y,
    RIGHT,
    UP,
    EnvParams,
    TMaze,
    tmaze_cue,
    tmaze_oracle,
    tmaze_params,
)

ENV = TMaze()
KEY = jax.random.key(0)

# Rollout policies (a traced mode, so one compiled rollout serves them all).
ORACLE, ALWAYS_UP, WRONG_TURN, ALWAYS_LEFT = 0, 1, 2, 3

# One batch of mixed corridor lengths, vmapped through one compiled rollout.
LENGTHS = np.array([3, 5, 7, 50] * 64)
NUM_STEPS = 52  # L + 2 for the longest corridor


def reset_with_cue(cue: int, params: EnvParams, seed: int = 0):
    """Resets until the drawn cue is `cue` (a fair coin: a few tries at most)."""
    for i in range(64):
        obs, state = ENV.reset(jax.random.fold_in(KEY, 1000 * seed + i), params)
        if int(state.cue) == cue:
            return obs, state
    raise AssertionError("cue never drawn")


@partial(jax.jit, static_argnames=("num_steps",))
def rollout(keys, params, mode, num_steps):
    """Vmapped rollouts (auto-reset) under a scripted policy; returns per-step arrays."""

    def single(key, params):
        key, key_reset = jax.random.split(key)
        obs, state = ENV.reset(key_reset, params)

        def body(carry, key):
            obs, state, cue = carry
            cue = jnp.where(obs[OBS_HINT] != 0, obs[OBS_HINT], cue)  # a new episode's cue
            action = jnp.select(
                [mode == ORACLE, mode == ALWAYS_UP, mode == WRONG_TURN],
                [tmaze_oracle(cue, obs), tmaze_oracle(1.0, obs), tmaze_oracle(-cue, obs)],
                LEFT,
            )
            obs2, state2, reward, terminated, truncated, info = ENV.step(key, state, action, params)
            out = {
                "obs": obs,
                "action": action,
                "reward": reward,
                "terminated": terminated,
                "truncated": truncated,
                "success": info["success"],
                "cue": state.cue,
            }
            return (obs2, state2, cue), out

        keys = jax.random.split(key, num_steps)
        return jax.lax.scan(body, (obs, state, jnp.zeros(())), keys)[1]

    return jax.vmap(single)(keys, params)


def batch_params():
    return jax.vmap(lambda length: tmaze_params(length))(jnp.asarray(LENGTHS, jnp.int32))


@pytest.fixture(scope="module")
def rollouts():
    """Trajectories of every scripted policy over the mixed-length batch (one compile)."""
    params = batch_params()
    keys = jax.random.split(jax.random.key(1), len(LENGTHS))
    return {
        mode: jax.tree.map(np.asarray, rollout(keys, params, jnp.int32(mode), NUM_STEPS))
        for mode in (ORACLE, ALWAYS_UP, WRONG_TURN, ALWAYS_LEFT)
    }


# -- spec ----------------------------------------------------------------------------------------


def test_spaces_and_defaults():
    params = ENV.default_params
    assert params.corridor_length == 10 and params.max_steps_in_episode == 12
    assert params.penalty == 0.0
    assert ENV.num_actions == 4 and ENV.action_space(params).n == 4
    assert ENV.observation_space(params).shape == (4,)
    obs, state = ENV.reset(KEY, params)
    assert obs.shape == (4,) and obs.dtype == jnp.float32
    assert ENV.name == "TMaze" and TMaze() == ENV and hash(TMaze()) == hash(ENV)
    assert tmaze_params(50).max_steps_in_episode == 52
    with pytest.raises(ValueError, match="corridor_length"):
        tmaze_params(0)
    with pytest.raises(ValueError, match="penalty"):
        tmaze_params(5, penalty=0.5)


# -- scripted sequences --------------------------------------------------------------------------


@pytest.mark.parametrize("cue", [1, -1])
def test_right_then_correct_turn_rewards_one(cue):
    params = tmaze_params(5)
    obs, state = reset_with_cue(cue, params)
    assert tmaze_cue(obs) == cue
    for t in range(5):
        assert obs[OBS_FLAG] == 0
        obs, state, reward, terminated, truncated, info = ENV.step(KEY, state, RIGHT, params)
        assert reward == 0 and not terminated and not truncated and not info["success"]
        assert int(state.x) == t + 1
    assert obs[OBS_FLAG] == 1  # at the junction
    turn = UP if cue == 1 else DOWN
    obs, state, reward, terminated, truncated, info = ENV.step(KEY, state, turn, params)
    assert reward == 1.0 and bool(terminated) and not truncated and bool(info["success"])
    final = info["final_observation"]
    assert final[OBS_Y] == cue and final[OBS_FLAG] == 0 and final[OBS_HINT] == 0
    assert obs[OBS_HINT] != 0  # auto-reset: the next episode's first observation


@pytest.mark.parametrize("cue", [1, -1])
def test_wrong_turn_rewards_zero(cue):
    params = tmaze_params(3)
    obs, state = reset_with_cue(cue, params, seed=1)
    for _ in range(3):
        obs, state, *_ = ENV.step(KEY, state, RIGHT, params)
    wrong = DOWN if cue == 1 else UP
    obs, state, reward, terminated, truncated, info = ENV.step(KEY, state, wrong, params)
    assert reward == 0.0 and bool(terminated) and not truncated and not info["success"]
    assert info["final_observation"][OBS_Y] == -cue


def test_invalid_moves_are_no_ops():
    params = tmaze_params(2)
    obs, state = ENV.reset(KEY, params)
    for action in (UP, DOWN, LEFT):  # walls in the corridor / at the start
        obs, state, reward, terminated, *_ = ENV.step(KEY, state, action, params)
        assert int(state.x) == 0 and int(state.y) == 0 and not terminated
    params = tmaze_params(2, max_steps_in_episode=20)
    obs, state = ENV.reset(KEY, params)
    obs, state, *_ = ENV.step(KEY, state, RIGHT, params)
    obs, state, *_ = ENV.step(KEY, state, RIGHT, params)
    obs, state, reward, terminated, *_ = ENV.step(KEY, state, RIGHT, params)  # dead end
    assert int(state.x) == 2 and obs[OBS_FLAG] == 1 and not terminated
    obs, state, *_ = ENV.step(KEY, state, LEFT, params)  # back into the corridor
    assert int(state.x) == 1 and obs[OBS_FLAG] == 0


def test_cue_only_in_first_observation(rollouts):
    for mode in (ORACLE, ALWAYS_LEFT):
        traj = rollouts[mode]
        hint = traj["obs"][..., OBS_HINT]
        first = np.zeros_like(hint, dtype=bool)
        first[:, 0] = True
        first[:, 1:] = traj["terminated"][:, :-1] | traj["truncated"][:, :-1]
        np.testing.assert_array_equal(hint[first], traj["cue"][first])  # the cue, +-1
        assert set(np.unique(hint[first])) == {-1.0, 1.0}
        assert np.all(hint[~first] == 0)


def test_noise_channel():
    params = tmaze_params(5)
    keys = jax.random.split(KEY, 200)
    obs, _ = jax.vmap(ENV.reset, in_axes=(0, None))(keys, params)
    assert set(np.unique(np.asarray(obs[:, OBS_NOISE]))) == {-1.0, 0.0, 1.0}
    quiet = tmaze_params(5, obs_noise=False)
    obs, state = jax.vmap(ENV.reset, in_axes=(0, None))(keys, quiet)
    assert np.all(np.asarray(obs[:, OBS_NOISE]) == 0)


def test_penalty_for_lagging():
    params = tmaze_params(4, penalty=-0.1)
    obs, state = ENV.reset(KEY, params)
    rewards, truncs = [], []
    for _ in range(6):  # always left: lags from the first step on, truncated at L + 2 = 6
        obs, state, reward, terminated, truncated, _ = ENV.step(KEY, state, LEFT, params)
        rewards.append(float(reward))
        truncs.append(bool(truncated))
    np.testing.assert_allclose(rewards, [-0.1] * 5 + [0.0], atol=1e-6)
    assert truncs == [False] * 5 + [True]
    # The optimal schedule is never penalised.
    obs, state = ENV.reset(KEY, params)
    cue = tmaze_cue(obs)
    total = 0.0
    for _ in range(5):
        obs, state, reward, *_ = ENV.step(KEY, state, tmaze_oracle(cue, obs), params)
        total += float(reward)
    assert total == 1.0


# -- vmapped rollouts ----------------------------------------------------------------------------


def test_oracle_always_succeeds_for_every_length(rollouts):
    traj = rollouts[ORACLE]
    assert not traj["truncated"].any()
    ends = traj["terminated"]
    np.testing.assert_array_equal(traj["success"], ends)
    np.testing.assert_array_equal(traj["reward"], ends.astype(np.float32))
    for length in (3, 5, 7, 50):
        rows = LENGTHS == length
        # Optimal episodes take L + 1 steps: terminations at t = L, 2L + 1, ...
        expected = np.zeros(NUM_STEPS, bool)
        expected[length :: length + 1] = True
        assert np.all(ends[rows] == expected)
    assert ends[LENGTHS == 50].sum() == 64  # L = 50: each env solved its one episode
    assert ends[LENGTHS == 5].sum() == 64 * (NUM_STEPS // 6)


def test_corridor_length_varies_under_vmap():
    params = jax.vmap(lambda length: tmaze_params(length))(jnp.array([2, 6], jnp.int32))
    keys = jax.random.split(KEY, 2)
    obs, state = jax.vmap(ENV.reset)(keys, params)
    cue = tmaze_cue(obs)
    flags = []
    for _ in range(3):
        action = tmaze_oracle(cue, obs)
        obs, state, reward, terminated, truncated, info = jax.vmap(ENV.step)(
            keys, state, action, params
        )
        flags.append(np.asarray(obs[:, OBS_FLAG]))
    # After two steps right, only the L = 2 env stands at its junction; then it turns.
    np.testing.assert_array_equal(np.stack(flags)[:2], [[0, 0], [1, 0]])
    np.testing.assert_array_equal(terminated, [True, False])
    np.testing.assert_array_equal(info["success"], [True, False])
    np.testing.assert_array_equal(state.x, [0, 3])  # the first env was auto-reset


def test_memoryless_up_policy_is_a_coin_flip(rollouts):
    traj = rollouts[ALWAYS_UP]  # right until the junction, then always up
    ends = traj["terminated"]
    assert not traj["truncated"].any()
    rate = traj["success"][ends].mean()
    assert ends.sum() > 1500
    assert 0.45 < rate < 0.55, rate
    np.testing.assert_array_equal(traj["success"][ends], traj["cue"][ends] == 1)


def test_wrong_turn_policy_never_succeeds(rollouts):
    traj = rollouts[WRONG_TURN]
    assert traj["terminated"].sum() > 0 and not traj["success"].any()
    assert np.all(traj["reward"] == 0)


def test_truncation_at_time_limit(rollouts):
    traj = rollouts[ALWAYS_LEFT]  # never reaches the junction
    assert not traj["terminated"].any() and np.all(traj["reward"] == 0)
    for length in (3, 5, 7, 50):
        expected = np.zeros(NUM_STEPS, bool)
        expected[length + 1 :: length + 2] = True  # time limit L + 2
        assert np.all(traj["truncated"][LENGTHS == length] == expected)

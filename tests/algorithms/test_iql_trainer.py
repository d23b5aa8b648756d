"""IQL and BC trainers (issue 6 baselines): jitted, vmapped over seeds with the data as an
argument (one compilation for every dataset of a shape), and right on a one-step bandit."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.algorithms.iql import (
    BCConfig,
    IQLConfig,
    make_train,
    make_train_bc,
    normalize_rewards,
)
from jaxrl_suite.envs.contextual import ContextualEnv
from jaxrl_suite.envs.offline import collect

SMALL = dict(hidden=(32,), batch_size=64, eval_episodes=2)


@pytest.fixture(scope="module")
def bandit():
    """CartPole states, one-step episodes: action 1 pays 1, action 0 pays 0, and the behaviour
    policy takes action 0 four times in five. BC should copy action 0; IQL should pick 1."""
    env = ContextualEnv("CartPole-v1")
    data = collect(env, lambda obs, k: jnp.zeros(obs.shape[0], jnp.int32), jax.random.PRNGKey(0),
                   num_envs=4, num_steps=100)
    data = {k: np.asarray(v) for k, v in data.items()}
    rng = np.random.default_rng(0)
    data["actions"] = (rng.random(len(data["rewards"])) < 0.2).astype(np.int32)
    data["rewards"] = data["actions"].astype(np.float32)
    data["terminals"] = np.ones_like(data["terminals"])
    data["timeouts"] = np.zeros_like(data["timeouts"])
    return env, data


def test_normalize_rewards_matches_numpy():
    r = np.array([-3.0, 1.0, 0.0, 5.0], np.float32)
    np.testing.assert_allclose(normalize_rewards(jnp.asarray(r)), (r + 3) / 8, rtol=1e-6)
    np.testing.assert_array_equal(normalize_rewards(jnp.full(3, 2.0)), np.zeros(3))
    np.testing.assert_array_equal(normalize_rewards(jnp.asarray(r), "none"), r)
    with pytest.raises(ValueError, match="reward_normalization 'zscore'"):
        normalize_rewards(jnp.asarray(r), "zscore")
    with pytest.raises(ValueError, match="reward_normalization"):
        IQLConfig(reward_normalization="zscore")


def test_iql_learns_the_paying_action_and_bc_the_common_one(bandit):
    env, data = bandit
    obs = jnp.asarray(data["observations"][:50])
    train, iql = make_train(IQLConfig(steps=1500, lr=1e-3, **SMALL), env)
    state, m = jax.jit(train)(jax.random.PRNGKey(0), iql.prepare(data))
    assert m["q_loss"].shape == (1500,) and np.isfinite(np.asarray(m["q_loss"])).all()
    assert int(np.asarray(m["nonfinite"]).sum()) == 0 and int(state.step) == 1500
    q1, q2 = iql.q_net.apply(state.params["q"], obs, jnp.ones(50, jnp.int32))
    q0, _ = iql.q_net.apply(state.params["q"], obs, jnp.zeros(50, jnp.int32))
    # terminal one-step episodes: Q(s, a) -> r(a) (minmax-normalised rewards are already 0/1)
    np.testing.assert_allclose(np.asarray(q1), 1.0, atol=0.1)
    np.testing.assert_allclose(np.asarray(q0), 0.0, atol=0.1)
    # V is the 0.7-expectile of Q over the behaviour's actions, 0.2 of which pay: between
    # the mean (0.2) and the max (1)
    v = np.asarray(iql.v_net.apply(state.params["v"], obs))
    assert 0.25 < v.mean() < 0.9
    assert (np.asarray(iql.act(state.params["pi"], obs)) == 1).mean() > 0.9

    bc_train, bc = make_train_bc(BCConfig(steps=300, lr=1e-3, **SMALL), env)
    bc_state, bm = jax.jit(bc_train)(jax.random.PRNGKey(0), bc.prepare(data))
    assert float(bm["bc_loss"][-50:].mean()) < float(bm["bc_loss"][:10].mean())
    assert (np.asarray(bc.act(bc_state.params["pi"], obs)) == 0).mean() > 0.9


def test_given_rewards_replace_the_dataset_rewards(bandit):
    env, data = bandit
    obs = jnp.asarray(data["observations"][:50])
    train, iql = make_train(IQLConfig(steps=1500, lr=1e-3, **SMALL), env)
    flipped = 1.0 - jnp.asarray(data["rewards"])  # now action 0 pays
    state, _ = jax.jit(train)(jax.random.PRNGKey(0), iql.prepare(data), flipped)
    assert (np.asarray(iql.act(state.params["pi"], obs)) == 0).mean() > 0.9
    with pytest.raises(ValueError, match=r"rewards must have shape \(400,\)"):
        train(jax.random.PRNGKey(0), iql.prepare(data), jnp.zeros(7))


def test_continuous_iql_and_bc_vmap_over_seeds():
    env = ContextualEnv("Pendulum-v1")
    data = collect(env, lambda obs, k: jax.random.uniform(k, (obs.shape[0], 1), minval=-2,
                                                          maxval=2),
                   jax.random.PRNGKey(1), num_envs=2, num_steps=100)
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    for train, agent in (make_train(IQLConfig(steps=30, **SMALL), env),
                         make_train_bc(BCConfig(steps=30, **SMALL), env)):
        state, m = jax.jit(jax.vmap(train, in_axes=(0, None)))(keys, agent.prepare(data))
        assert m["eval_return"].shape == (2,)
        assert np.isfinite(np.asarray(m["eval_return"])).all()
        actions = jax.vmap(agent.act)(state.params["pi"],
                                      jnp.broadcast_to(data["observations"][:5], (2, 5, 3)))
        assert actions.shape == (2, 5, 1) and float(jnp.abs(actions).max()) <= 2.0
        leaves = jax.tree.leaves(state.params["pi"])
        assert not np.allclose(leaves[0][0], leaves[0][1])  # the seeds differ


def test_iql_needs_next_observations_and_matching_action_dims(bandit):
    env, data = bandit
    _, iql = make_train(IQLConfig(**SMALL), env)
    with pytest.raises(ValueError, match="missing field 'next_observations'"):
        iql.prepare({k: v for k, v in data.items() if k != "next_observations"})
    _, bc = make_train_bc(BCConfig(**SMALL), env)
    bc.prepare({k: v for k, v in data.items() if k != "next_observations"})  # BC needs no s'
    pend = ContextualEnv("Pendulum-v1")
    two_d = dict(data, actions=np.zeros((len(data["rewards"]), 2), np.float32))
    with pytest.raises(ValueError, match="'actions' has 2 dimensions, the environment has 1"):
        make_train_bc(BCConfig(**SMALL), pend).agent.prepare(two_d)
    with pytest.raises(ValueError,
                       match=r"config field 'iql.expectile' must be in \(0, 1\), got 1.0"):
        dataclasses.replace(IQLConfig(), expectile=1.0)


def test_one_compiled_train_serves_two_datasets_of_one_shape(bandit):
    """The dataset is an argument of train, not a constant of the program: the second dataset
    (same shape, other rewards) reuses the first compilation and gives other results."""
    env, data = bandit
    traces = {"iql": 0, "bc": 0}
    for name, (train, agent) in (("iql", make_train(IQLConfig(steps=20, **SMALL), env)),
                                 ("bc", make_train_bc(BCConfig(steps=20, **SMALL), env))):
        def counted(rng, batch, train=train, name=name):
            traces[name] += 1
            return train(rng, batch)

        run = jax.jit(jax.vmap(counted, in_axes=(0, None)))
        keys = jax.random.split(jax.random.PRNGKey(0), 2)
        other = dict(data, rewards=1.0 - data["rewards"],
                     actions=1 - data["actions"], observations=data["observations"][::-1])
        state_a, m_a = run(keys, agent.prepare(data))
        state_b, m_b = run(keys, agent.prepare(other))
        assert traces[name] == 1, name
        assert not np.allclose(np.asarray(jax.tree.leaves(state_a.params)[0]),
                               np.asarray(jax.tree.leaves(state_b.params)[0])), name

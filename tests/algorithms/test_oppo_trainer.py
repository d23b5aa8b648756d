"""OPPO's trainer (issue 6): jitted, vmapped over seeds with the data as an argument, each update
on its own parameters."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.algorithms.oppo import OPPO, OPPOConfig, make_train
from jaxrl_suite.envs.contextual import ContextualEnv
from jaxrl_suite.envs.offline import collect, concat, evaluate_policy, make_preferences
from jaxrl_suite.losses.oppo import oppo_preference_loss

CFG = OPPOConfig(segment_length=5, steps=60, batch_pairs=16, eval_episodes=2, hidden=(16,),
                 z_dim=4)


@pytest.fixture(scope="module")
def pendulum():
    env = ContextualEnv("Pendulum-v1")
    still = lambda obs, k: jnp.zeros((obs.shape[0], 1))
    data = concat(collect(env, still, jax.random.PRNGKey(0), num_envs=2, num_steps=40),
                  collect(env, still, jax.random.PRNGKey(1), num_envs=2, num_steps=40,
                          epsilon=1.0))
    prefs = make_preferences(jax.random.PRNGKey(2), data, num_pairs=64, length=5)
    return env, data, prefs


def test_train_is_jitted_and_vmapped_over_seeds_and_learns(pendulum):
    env, data, prefs = pendulum
    train, oppo = make_train(CFG, env)
    traces = []

    def counted(rng, batch):
        traces.append(1)
        return train(rng, batch)

    run = jax.jit(jax.vmap(counted, in_axes=(0, None)))
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    state, m = run(keys, oppo.prepare(data, prefs))
    assert m["loss"].shape == (2, CFG.steps) and m["eval_return"].shape == (2,)
    np.testing.assert_array_equal(np.asarray(m["nonfinite"]), 0)
    # another dataset of the same shape (the rows reversed) reuses the compiled program
    flipped = {k: np.asarray(v)[::-1] for k, v in data.items()}
    state_b, _ = run(keys, oppo.prepare(flipped, prefs))
    assert len(traces) == 1
    assert not np.allclose(state.z_star, state_b.z_star)
    for k in ("loss", "recon", "pref", "phi_norm", "z_loss"):
        assert np.isfinite(np.asarray(m[k])).all(), k
    assert (m["loss"][:, -10:].mean(1) < m["loss"][:, :10].mean(1)).all()
    assert not np.allclose(state.z_star[0], state.z_star[1])  # the seeds differ
    assert np.asarray(m["pref_used_frac"]).min() > 0.9  # Pendulum's segment returns differ


def test_z_star_moves_only_on_its_own_loss(pendulum):
    env, data, prefs = pendulum
    frozen_z = OPPOConfig(**{**CFG.__dict__, "z_lr": 0.0})
    train, frozen = make_train(frozen_z, env)
    batch = frozen.prepare(data, prefs)
    state, _ = jax.jit(train)(jax.random.PRNGKey(1), batch)
    init = frozen.init(jax.random.split(jax.random.PRNGKey(1))[0], batch)
    np.testing.assert_array_equal(state.z_star, init.z_star)

    frozen_nets = OPPOConfig(**{**CFG.__dict__, "lr": 0.0, "z_lr": 0.05})
    oppo = OPPO(frozen_nets, env)
    s0 = oppo.init(jax.random.PRNGKey(3), batch)
    update = jax.jit(oppo.update)
    s = s0
    for _ in range(41):
        s, _ = update(s, batch)
    jax.tree.map(np.testing.assert_array_equal, s.params, s0.params)  # lr 0: nets unchanged
    obs, feats, _, label = oppo._batch(jax.random.PRNGKey(4), batch)
    phi = oppo.embed(s0.params, obs, feats)
    before = oppo_preference_loss(s0.z_star, phi[:, 0], phi[:, 1], label)[0]
    after = oppo_preference_loss(s.z_star, phi[:, 0], phi[:, 1], label)[0]
    assert float(after) < float(before)


def test_discrete_actions_and_tied_preferences():
    """CartPole pays 1 per step: every pair of segments ties, so only reconstruction trains."""
    env = ContextualEnv("CartPole-v1")
    data = collect(env, lambda obs, k: (obs[:, 2] > 0).astype(jnp.int32), jax.random.PRNGKey(0),
                   num_envs=2, num_steps=50, epsilon=0.3)
    prefs = make_preferences(jax.random.PRNGKey(1), data, num_pairs=32, length=5)
    assert (np.asarray(prefs["label"]) == 0.5).all()
    train, oppo = make_train(CFG, env)
    state, m = jax.jit(train)(jax.random.PRNGKey(0), oppo.prepare(data, prefs))
    assert float(np.max(m["pref"])) == 0.0 and float(np.max(m["pref_used_frac"])) == 0.0
    assert float(m["recon"][-10:].mean()) < float(m["recon"][:10].mean())
    assert 0 < float(m["eval_return"]) <= 500


def test_evaluate_policy_matches_a_single_env_loop():
    env = ContextualEnv("CartPole-v1")
    policy = lambda obs, k: (obs[:, 3] > 0).astype(jnp.int32)
    key = jax.random.PRNGKey(5)
    got = evaluate_policy(env, policy, key, num_episodes=3)
    k_reset, k_run = jax.random.split(key)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_reset, 3),
                                                         env.default_params)
    want = []
    for i in range(3):
        o, s = obs[i], jax.tree.map(lambda x, i=i: x[i], state)
        total = 0.0
        for k in jax.random.split(k_run, 500):
            k_pol, k_env = jax.random.split(k)
            a = policy(o[None], k_pol)[0]
            o, s, r, term, trunc, _ = env.step(jax.random.split(k_env, 3)[i], s, a)
            total += float(r)
            if term or trunc:
                break
        want.append(total)
    np.testing.assert_allclose(got, want)


def test_bad_preferences_name_the_field(pendulum):
    env, data, prefs = pendulum
    oppo = OPPO(CFG, env)
    with pytest.raises(ValueError, match=r"prefs: 'starts' must be \[P, 2\]"):
        oppo.prepare(data, {"starts": prefs["starts"][:, :1], "label": prefs["label"]})
    with pytest.raises(ValueError, match="runs past the 160 rows"):
        oppo.prepare(data, {"starts": jnp.array([[0, 158]]), "label": jnp.ones(1)})
    with pytest.raises(ValueError, match="config field 'oppo.steps' must be >= 1, got 0"):
        OPPOConfig(steps=0)

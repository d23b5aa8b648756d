"""Preference reward model + IQL (issue 6 baseline): ranking learned, relabelling, composition."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.algorithms.iql import IQLConfig
from jaxrl_suite.algorithms.pref_reward import RewardModelConfig, make_train, make_train_reward
from jaxrl_suite.envs.contextual import ContextualEnv
from jaxrl_suite.envs.offline import collect, make_preferences

K = 5
REWARD = RewardModelConfig(segment_length=K, hidden=(32,), batch_pairs=32, steps=400, lr=3e-3)


@pytest.fixture(scope="module")
def pendulum():
    env = ContextualEnv("Pendulum-v1")
    uniform = lambda obs, k: jax.random.uniform(k, (obs.shape[0], 1), minval=-2.0, maxval=2.0)
    data = collect(env, uniform, jax.random.PRNGKey(0), num_envs=4, num_steps=100)
    prefs = make_preferences(jax.random.PRNGKey(1), data, num_pairs=256, length=K)
    held_out = make_preferences(jax.random.PRNGKey(2), data, num_pairs=256, length=K)
    return env, data, prefs, held_out


def _ranking_accuracy(model, params, batch, prefs):
    r = np.asarray(model.segment_returns(params, batch, jnp.asarray(prefs["starts"])))
    label = np.asarray(prefs["label"])
    strict = label != 0.5
    return np.mean((r[:, 0] > r[:, 1])[strict] == (label[strict] > 0.5))


def test_reward_model_learns_to_rank_held_out_segments(pendulum):
    env, data, prefs, held_out = pendulum
    train, model = make_train_reward(REWARD, env)
    batch = model.prepare(data, prefs)
    state, m = jax.jit(train)(jax.random.PRNGKey(0), batch)
    init = model.init(jax.random.PRNGKey(0), batch)
    assert float(m["bt_loss"][-50:].mean()) < float(m["bt_loss"][:10].mean())
    assert int(np.asarray(m["nonfinite"]).sum()) == 0
    acc_before = _ranking_accuracy(model, init.params, batch, held_out)
    acc_after = _ranking_accuracy(model, state.params, batch, held_out)
    assert acc_after > 0.85 and acc_after > acc_before + 0.1, (acc_before, acc_after)
    learned = np.asarray(model.relabel(state.params, batch))
    assert np.corrcoef(learned, np.asarray(data["rewards"]))[0, 1] > 0.5


def test_segment_returns_sum_the_relabelled_rewards(pendulum):
    env, data, prefs, _ = pendulum
    model = make_train_reward(REWARD, env).agent
    batch = model.prepare(data, prefs)
    params = model.init(jax.random.PRNGKey(3), batch).params
    per_row = np.asarray(model.relabel(params, batch))  # [N]
    starts = np.asarray(prefs["starts"][:7])  # [7, 2]
    want = np.array([[per_row[s:s + K].sum() for s in pair] for pair in starts])
    got = model.segment_returns(params, batch, jnp.asarray(starts))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_reward_then_iql_is_one_vmapped_program(pendulum):
    env, data, prefs, _ = pendulum
    small = RewardModelConfig(segment_length=K, hidden=(16,), batch_pairs=8, steps=20)
    train, agent = make_train(small, IQLConfig(hidden=(16,), batch_size=32, steps=20,
                                               eval_episodes=2), env)
    batch = agent.prepare(data, prefs)
    (r_state, agent_state), m = jax.jit(jax.vmap(train, in_axes=(0, None)))(
        jax.random.split(jax.random.PRNGKey(0), 2), batch)
    assert m["bt_loss"].shape == (2, 20) and m["q_loss"].shape == (2, 20)
    assert m["eval_return"].shape == (2,) and m["reward_corr"].shape == (2,)
    assert np.all(np.abs(np.asarray(m["reward_corr"])) <= 1.0)
    assert int(agent_state.step[0]) == 20 and int(r_state.step[1]) == 20
    # the two nonfinite counts keep apart: the reward model's and IQL's
    assert m["reward_nonfinite"].shape == (2, 20) and m["nonfinite"].shape == (2, 20)
    # reward_corr is the Pearson correlation of the relabelled and the true rewards
    r_params = jax.tree.map(lambda x: x[1], r_state.params)
    learned = np.asarray(agent.reward_model.relabel(r_params, batch[0]))
    want = np.corrcoef(learned, np.asarray(data["rewards"]))[0, 1]
    np.testing.assert_allclose(float(m["reward_corr"][1]), want, rtol=1e-4)


@pytest.mark.parametrize("prefs_of, message", [
    (lambda p: {"starts": p["starts"]}, "prefs: missing field 'label'"),
    (lambda p: {"starts": p["starts"][:, 0], "label": p["label"]}, "'starts' must be"),
    (lambda p: {"starts": p["starts"] + 1000, "label": p["label"]}, "runs past the 400 rows"),
    (lambda p: {"starts": p["starts"] - 1000, "label": p["label"]}, "negative row"),
])
def test_bad_preferences_are_one_line_errors(pendulum, prefs_of, message):
    env, data, prefs, _ = pendulum
    with pytest.raises(ValueError, match=message):
        make_train_reward(REWARD, env).agent.prepare(data, prefs_of(prefs))

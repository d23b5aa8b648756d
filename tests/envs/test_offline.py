"""Offline datasets and scripted preferences (issue 6, data part) against numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.envs.offline import (
    check_dataset,
    collect,
    concat,
    episode_ids,
    episode_returns,
    gather_segments,
    make_preferences,
    normalized_score,
    preference_labels,
    sample_segment_pairs,
    segment_returns,
    segment_starts,
)


def _dataset(seed=0, n=60):
    rng = np.random.default_rng(seed)
    terminals = rng.random(n) < 0.05
    timeouts = np.zeros(n, bool)
    timeouts[19::20] = True  # a time limit of 20 steps
    return {
        "observations": rng.normal(size=(n, 3)).astype(np.float32),
        "actions": rng.normal(size=(n, 1)).astype(np.float32),
        "rewards": rng.normal(size=n).astype(np.float32),
        "terminals": terminals,
        "timeouts": timeouts,
    }


def _np_episodes(data):
    """Episode index of each row by a Python loop."""
    ids, e = [], 0
    for term, tout in zip(data["terminals"], data["timeouts"], strict=True):
        ids.append(e)
        e += bool(term or tout)
    return np.array(ids)


def test_episode_ids_and_returns_match_a_loop():
    data = _dataset()
    ids = _np_episodes(data)
    np.testing.assert_array_equal(episode_ids(data["terminals"], data["timeouts"]), ids)
    want = np.array([data["rewards"][ids == e].sum() for e in range(ids.max() + 1)])
    got = episode_returns(data["rewards"], data["terminals"], data["timeouts"], ids.max() + 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_episode_ids_hand_case():
    terminals = np.array([0, 0, 1, 0, 0, 0, 0], bool)
    timeouts = np.array([0, 0, 0, 0, 1, 0, 0], bool)
    np.testing.assert_array_equal(episode_ids(terminals, timeouts), [0, 0, 0, 1, 1, 2, 2])


@pytest.mark.parametrize("length", [1, 3, 7])
def test_segment_starts_brute_force(length):
    data = _dataset(1)
    ids = _np_episodes(data)
    n = len(ids)
    want = np.array([t + length <= n and len(set(ids[t : t + length])) == 1 for t in range(n)])
    np.testing.assert_array_equal(segment_starts(data["terminals"], data["timeouts"], length),
                                  want)


def test_sampled_pairs_are_valid_and_cover_every_start_uniformly():
    data = _dataset(2)
    valid = np.asarray(segment_starts(data["terminals"], data["timeouts"], 5))
    sample = jax.jit(sample_segment_pairs, static_argnames=("num_pairs", "length"))
    starts = np.asarray(sample(jax.random.PRNGKey(0), data["terminals"], data["timeouts"],
                               num_pairs=20000, length=5))
    assert starts.shape == (20000, 2) and valid[starts].all()
    counts = np.bincount(starts.ravel(), minlength=len(valid))[valid]
    expected = starts.size / valid.sum()
    assert (counts > 0).all()
    assert np.abs(counts / expected - 1).max() < 0.15  # uniform over the valid starts


def test_segment_returns_and_gather_match_slices():
    data = _dataset(3)
    starts = np.array([[0, 4], [10, 33]])
    got = segment_returns(jnp.asarray(data["rewards"]), jnp.asarray(starts), 4)
    want = np.array([[data["rewards"][s : s + 4].sum() for s in row] for row in starts])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    seg = gather_segments(jnp.asarray(data["observations"]), jnp.asarray(starts), 4)
    assert seg.shape == (2, 2, 4, 3)
    np.testing.assert_array_equal(seg[1, 1], data["observations"][33:37])


def test_scripted_labels_and_bradley_terry_noise():
    ra, rb = jnp.array([3.0, 1.0, 2.0]), jnp.array([1.0, 3.0, 2.0])
    np.testing.assert_array_equal(preference_labels(None, ra, rb), [1.0, 0.0, 0.5])
    n, t = 40000, 2.0
    diffs = jnp.array([-2.0, 0.0, 1.0, 4.0])
    ra = jnp.tile(diffs, n // 4)
    labels = preference_labels(jax.random.PRNGKey(1), ra, jnp.zeros_like(ra), temperature=t)
    freq = np.asarray(labels).reshape(-1, 4).mean(axis=0)
    np.testing.assert_allclose(freq, 1 / (1 + np.exp(-np.asarray(diffs) / t)), atol=0.02)


def test_make_preferences_labels_follow_the_true_returns():
    data = _dataset(4, n=200)
    out = make_preferences(jax.random.PRNGKey(2), data, num_pairs=64, length=6)
    starts, returns = np.asarray(out["starts"]), np.asarray(out["returns"])
    want = np.array([[data["rewards"][s : s + 6].sum() for s in row] for row in starts])
    np.testing.assert_allclose(returns, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out["label"], (want[:, 0] > want[:, 1]).astype(np.float32))


def test_normalized_score_hand_case():
    np.testing.assert_allclose(normalized_score(np.array([-10.0, 45.0, 100.0]), -10.0, 100.0),
                               [0.0, 50.0, 100.0])
    with pytest.raises(ValueError, match="expert_return equals random_return"):
        normalized_score(1.0, 5.0, 5.0)


def test_bad_input_names_the_field():
    data = _dataset()
    with pytest.raises(ValueError, match=r"missing field\(s\) \['timeouts'\]"):
        check_dataset({k: v for k, v in data.items() if k != "timeouts"})
    with pytest.raises(ValueError, match="field 'actions' has 59 rows"):
        check_dataset({**data, "actions": data["actions"][:-1]})
    with pytest.raises(ValueError, match="segment length must be in 1..60"):
        segment_starts(data["terminals"], data["timeouts"], 61)
    with pytest.raises(ValueError, match="no episode in the dataset has 25 rows"):
        sample_segment_pairs(jax.random.PRNGKey(0), data["terminals"], data["timeouts"],
                             num_pairs=2, length=25)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        preference_labels(None, jnp.zeros(2), jnp.zeros(2), temperature=-1.0)


def _loop_collect(env, policy, key, num_envs, num_steps):
    """The same rollout as `collect` (epsilon 0), one Python step at a time, per env stream."""
    k_reset, k_run = jax.random.split(key)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_reset, num_envs),
                                                         env.default_params)
    streams = [[] for _ in range(num_envs)]
    for k in jax.random.split(k_run, num_steps):
        k_pol, _, _, k_env = jax.random.split(k, 4)
        action = policy(obs, k_pol)
        keys = jax.random.split(k_env, num_envs)
        for i in range(num_envs):
            s_i = jax.tree.map(lambda x, i=i: x[i], state)
            o, s_new, r, term, trunc, info = env.step(keys[i], s_i, action[i])
            streams[i].append((np.asarray(obs[i]), int(action[i]), float(r), bool(term),
                               bool(trunc), np.asarray(info["final_observation"])))
            state = jax.tree.map(lambda x, y, i=i: x.at[i].set(y), state, s_new)
            obs = obs.at[i].set(o)
    return [row for stream in streams for row in stream]


def test_collect_matches_a_step_loop_and_marks_stream_ends():
    from jaxrl_suite.envs.contextual import ContextualEnv

    env = ContextualEnv("CartPole-v1")
    policy = lambda obs, key: (obs[:, 2] > 0).astype(jnp.int32)  # push towards the lean
    data = collect(env, policy, jax.random.PRNGKey(0), num_envs=2, num_steps=30)
    assert check_dataset(data) == 60
    rows = _loop_collect(env, policy, jax.random.PRNGKey(0), 2, 30)
    np.testing.assert_allclose(data["observations"], np.stack([r[0] for r in rows]), atol=1e-6)
    np.testing.assert_array_equal(data["actions"], [r[1] for r in rows])
    np.testing.assert_allclose(data["rewards"], [r[2] for r in rows])
    np.testing.assert_array_equal(data["terminals"], [r[3] for r in rows])
    np.testing.assert_allclose(data["next_observations"], np.stack([r[5] for r in rows]),
                               atol=1e-6)
    # within a stream, the next observation is the next row's unless the episode ended
    done = np.asarray(data["terminals"] | data["timeouts"])
    same = ~done[:-1]
    np.testing.assert_allclose(np.asarray(data["next_observations"])[:-1][same],
                               np.asarray(data["observations"])[1:][same], atol=1e-6)
    assert done[29] and done[59]  # each stream ends an episode


def test_collect_epsilon_one_is_uniform_random_and_concat_keeps_episodes():
    from jaxrl_suite.envs.contextual import ContextualEnv

    env = ContextualEnv("Pendulum-v1")
    policy = lambda obs, key: jnp.full((obs.shape[0], 1), 2.0)  # always the top of the range
    greedy = collect(env, policy, jax.random.PRNGKey(1), num_envs=4, num_steps=50)
    rand = collect(env, policy, jax.random.PRNGKey(1), num_envs=4, num_steps=50, epsilon=1.0)
    np.testing.assert_allclose(greedy["actions"], 2.0)
    a = np.asarray(rand["actions"])
    assert a.min() >= -2.0 and a.max() <= 2.0 and abs(a.mean()) < 0.3 and a.std() > 1.0
    both = concat(greedy, rand)
    assert check_dataset(both) == 400
    ids = np.asarray(episode_ids(both["terminals"], both["timeouts"]))
    assert ids[199] != ids[200]  # the first dataset's last episode ends before the second's


def test_dataset_actions_and_action_scale_shift():
    from jaxrl_suite.envs.contextual import ContextualEnv
    from jaxrl_suite.envs.offline import action_scale_shift, dataset_actions

    cart, pend = ContextualEnv("CartPole-v1"), ContextualEnv("Pendulum-v1")
    acts, feats = dataset_actions(cart, {"actions": np.array([1, 0, 1])})
    np.testing.assert_array_equal(acts, [1, 0, 1])
    np.testing.assert_array_equal(feats, [[0, 1], [1, 0], [0, 1]])
    acts, feats = dataset_actions(pend, {"actions": np.array([0.5, -1.0])})
    assert acts.shape == feats.shape == (2, 1)
    assert action_scale_shift(cart) == (1.0, 0.0)
    assert action_scale_shift(pend) == (2.0, 0.0)  # Pendulum's torque lies in [-2, 2]

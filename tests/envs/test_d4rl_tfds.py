"""TFDS D4RL (RLDS) -> D4RL layout: the per-episode rule on hand-built episodes, TFDS's own
converter round trip, mocked `tfds.load`, errors, and reference scores."""

from __future__ import annotations

import sys

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from jaxrl_suite.envs.d4rl_tfds import (  # noqa: E402
    D4RL_REF_SCORES,
    load_tfds_d4rl,
    ref_scores,
    rlds_episode_to_transitions,
)
from jaxrl_suite.envs.offline import check_dataset, normalized_score  # noqa: E402

HOPPER = "d4rl_mujoco_hopper/v2-medium"


def _episode(obs, act, reward, discount, is_last, is_terminal):
    obs = np.asarray(obs, np.float32)
    t = obs.shape[0]
    is_first = np.zeros(t, bool)
    is_first[0] = True
    return {"observation": obs, "action": np.asarray(act, np.float32),
            "reward": np.asarray(reward, np.float32), "discount": np.asarray(discount, np.float32),
            "is_first": is_first, "is_last": np.asarray(is_last, bool),
            "is_terminal": np.asarray(is_terminal, bool)}


def _assert_rows(out, obs, act, rew, next_obs, terminals, timeouts):
    np.testing.assert_array_equal(out["observations"], np.asarray(obs, np.float32))
    np.testing.assert_array_equal(out["actions"], np.asarray(act, np.float32))
    np.testing.assert_array_equal(out["rewards"], np.asarray(rew, np.float32))
    np.testing.assert_array_equal(out["next_observations"], np.asarray(next_obs, np.float32))
    np.testing.assert_array_equal(out["terminals"], np.asarray(terminals, bool))
    np.testing.assert_array_equal(out["timeouts"], np.asarray(timeouts, bool))
    assert out["rewards"].dtype == np.float32
    assert out["terminals"].dtype == bool and out["timeouts"].dtype == bool
    assert check_dataset(out) == len(rew)


# 3 real transitions o0 -a0-> o1 -a1-> o2 -a2-> o3; obs_dim 2, act_dim 1.
OBS = [[0.0, 0.5], [1.0, 1.5], [2.0, 2.5], [3.0, 3.5]]
ACT = [[10.0], [11.0], [12.0], [0.0]]
REW = [1.0, 2.0, 3.0, 0.0]


def test_terminal_with_observation_only_step():
    # TFDS: ends in a terminal state -> last real step discount 0, extra step (is_terminal).
    ep = _episode(OBS, ACT, REW, discount=[1, 1, 0, 0], is_last=[0, 0, 0, 1],
                  is_terminal=[0, 0, 0, 1])
    out = rlds_episode_to_transitions(ep)
    _assert_rows(out, OBS[:3], ACT[:3], REW[:3], next_obs=OBS[1:],
                 terminals=[0, 0, 1], timeouts=[0, 0, 0])


def test_timeout_with_observation_only_step_from_next_obs():
    # TFDS: source had next_observations, no terminal -> extra step, is_terminal False.
    ep = _episode(OBS, ACT, REW, discount=[1, 1, 1, 0], is_last=[0, 0, 0, 1],
                  is_terminal=[0, 0, 0, 0])
    out = rlds_episode_to_transitions(ep)
    _assert_rows(out, OBS[:3], ACT[:3], REW[:3], next_obs=OBS[1:],
                 terminals=[0, 0, 0], timeouts=[0, 0, 1])


def test_no_observation_only_step_keeps_all_rows():
    # TFDS: timeout without next_observations -> the last step is a real transition, discount 1.
    ep = _episode(OBS[:3], ACT[:3], REW[:3], discount=[1, 1, 1], is_last=[0, 0, 1],
                  is_terminal=[0, 0, 0])
    out = rlds_episode_to_transitions(ep)
    # The last next observation is unknown: the row's own observation is copied.
    _assert_rows(out, OBS[:3], ACT[:3], REW[:3], next_obs=[OBS[1], OBS[2], OBS[2]],
                 terminals=[0, 0, 0], timeouts=[0, 0, 1])
    # The same with is_terminal on the kept last row -> terminal, not timeout.
    ep["is_terminal"] = np.array([0, 0, 1], bool)
    out = rlds_episode_to_transitions(ep)
    _assert_rows(out, OBS[:3], ACT[:3], REW[:3], next_obs=[OBS[1], OBS[2], OBS[2]],
                 terminals=[0, 0, 1], timeouts=[0, 0, 0])


def test_flags_before_the_last_step_are_ignored():
    ep = _episode(OBS, ACT, REW, discount=[0, 1, 0, 0], is_last=[1, 1, 0, 1],
                  is_terminal=[1, 1, 0, 0])
    out = rlds_episode_to_transitions(ep)
    _assert_rows(out, OBS[:3], ACT[:3], REW[:3], next_obs=OBS[1:],
                 terminals=[0, 0, 0], timeouts=[0, 0, 1])


def test_single_observation_only_step_and_empty_episode_give_zero_rows():
    ep = _episode(OBS[:1], ACT[:1], [0.0], discount=[0], is_last=[1], is_terminal=[1])
    out = rlds_episode_to_transitions(ep)
    assert {k: v.shape for k, v in out.items()} == {
        "observations": (0, 2), "actions": (0, 1), "rewards": (0,), "terminals": (0,),
        "timeouts": (0,), "next_observations": (0, 2)}
    assert check_dataset(out) == 0
    assert check_dataset(rlds_episode_to_transitions([])) == 0


def test_iterable_of_step_dicts_equals_stacked():
    ep = _episode(OBS, ACT, REW, discount=[1, 1, 0, 0], is_last=[0, 0, 0, 1],
                  is_terminal=[0, 0, 0, 1])
    per_step = [{**{k: v[i] for k, v in ep.items()}, "infos": {"qpos": np.zeros(3)}}
                for i in range(4)]
    a, b = rlds_episode_to_transitions(ep), rlds_episode_to_transitions(iter(per_step))
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    with pytest.raises(ValueError, match="missing key"):
        rlds_episode_to_transitions([{"observation": np.zeros(2)}])


@pytest.mark.parametrize("with_next_obs", [False, True])
def test_round_trip_through_tfds_converter(tmp_path, with_next_obs):
    """A D4RL hdf5 file through TFDS's own converter and back gives the source rows."""
    h5py = pytest.importorskip("h5py")
    dataset_utils = pytest.importorskip("tensorflow_datasets.d4rl.dataset_utils")
    # Episodes of 3 (terminal), 4 (timeout) and 2 rows (the file ends mid-episode).
    n = 9
    rng = np.random.default_rng(0)
    obs_all = rng.normal(size=(n + 1, 2)).astype(np.float32)
    src = {"observations": obs_all[:n], "actions": rng.normal(size=(n, 1)).astype(np.float32),
           "rewards": rng.normal(size=(n,)).astype(np.float32),
           "terminals": np.zeros(n, bool), "timeouts": np.zeros(n, bool)}
    src["terminals"][2] = True
    src["timeouts"][6] = True
    nxt = obs_all[1:].copy()
    nxt[2] = 99.0  # the terminal state, never an observation
    nxt[6] = 77.0  # the state the time limit cut off
    if with_next_obs:
        src["next_observations"] = nxt
    path = tmp_path / "d4rl.hdf5"
    with h5py.File(path, "w") as f:
        for k, v in src.items():
            f.create_dataset(k, data=v)
    episodes = [ex["steps"] for _, ex in dataset_utils.generate_examples(str(path))]
    assert len(episodes) == 3
    parts = [rlds_episode_to_transitions(ep) for ep in episodes]
    out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    assert check_dataset(out) == n
    for k in ("observations", "actions", "rewards", "terminals"):
        np.testing.assert_array_equal(out[k], src[k], err_msg=k)
    timeouts = src["timeouts"].copy()
    timeouts[-1] = True  # the unfinished last episode ends as a timeout
    np.testing.assert_array_equal(out["timeouts"], timeouts)
    inner = np.ones(n, bool)
    inner[[2, 6, 8]] = False
    np.testing.assert_array_equal(out["next_observations"][inner], nxt[inner])
    if with_next_obs:
        # The last episode's next observation is right. For the others TFDS (4.9.x) appends the
        # file's *last* next_observation, not the episode's; accept either (a fix upstream).
        np.testing.assert_array_equal(out["next_observations"][8], nxt[8])
        for i in (2, 6):
            assert (np.array_equal(out["next_observations"][i], nxt[i])
                    or np.array_equal(out["next_observations"][i], nxt[-1]))
    else:
        # Terminal without next_observations: TFDS's dummy zero observation; the timeouts
        # have no observation-only step, so the row's own observation is copied.
        np.testing.assert_array_equal(out["next_observations"][2], np.zeros(2))
        np.testing.assert_array_equal(out["next_observations"][6], src["observations"][6])
        np.testing.assert_array_equal(out["next_observations"][8], src["observations"][8])


def _mock_episodes(**load_kwargs):
    """The mocked dataset's episodes as lists of per-step dicts, read independently."""
    ds = tfds.load(HOPPER, split="train", download=False, **load_kwargs)
    return [list(ep["steps"]) for ep in tfds.as_numpy(ds)]


@pytest.mark.parametrize("num_sub_examples", [1, 4])
def test_load_mocked_hopper(num_sub_examples):
    with tfds.testing.mock_data(num_examples=3, num_sub_examples=num_sub_examples):
        data = load_tfds_d4rl(HOPPER)
        episodes = _mock_episodes()
    n = check_dataset(data)
    assert len(episodes) == 3
    lengths = [len(ep) - int(bool(ep[-1]["is_last"]) and float(ep[-1]["discount"]) == 0.0)
               for ep in episodes]
    assert n == sum(lengths)
    assert data["observations"].shape == (n, 11) and data["next_observations"].shape == (n, 11)
    assert data["actions"].shape == (n, 3)
    assert data["observations"].dtype == np.float32 and data["actions"].dtype == np.float32
    assert data["rewards"].dtype == np.float32 and data["rewards"].shape == (n,)
    assert data["terminals"].dtype == bool and data["timeouts"].dtype == bool
    done = data["terminals"] | data["timeouts"]
    assert not (data["terminals"] & data["timeouts"]).any()
    ends = np.cumsum(lengths) - 1
    expected_done = np.zeros(n, bool)
    expected_done[ends] = True
    np.testing.assert_array_equal(done, expected_done)
    np.testing.assert_array_equal(data["terminals"][ends],
                                  [bool(ep[-1]["is_terminal"]) for ep in episodes])
    rows = [s for ep, m in zip(episodes, lengths, strict=True) for s in ep[:m]]
    np.testing.assert_array_equal(data["observations"], np.stack([s["observation"] for s in rows]))
    np.testing.assert_array_equal(data["rewards"], np.stack([s["reward"] for s in rows]))


def test_load_max_episodes():
    with tfds.testing.mock_data(num_examples=3, num_sub_examples=2):
        full = load_tfds_d4rl(HOPPER)
        two = load_tfds_d4rl(HOPPER, max_episodes=2)
        one = load_tfds_d4rl(HOPPER, max_episodes=1)
    n_full, n_two, n_one = check_dataset(full), check_dataset(two), check_dataset(one)
    assert n_one < n_two < n_full
    assert int((two["terminals"] | two["timeouts"]).sum()) == 2
    assert int((one["terminals"] | one["timeouts"]).sum()) == 1
    for k in full:
        np.testing.assert_array_equal(two[k], full[k][:n_two])
    with pytest.raises(ValueError, match="max_episodes"):
        load_tfds_d4rl(HOPPER, max_episodes=0)


def test_unknown_dataset_is_one_line_error(no_network):
    name = "d4rl_no_such_dataset/v2-medium"
    with pytest.raises(ValueError) as info:
        load_tfds_d4rl(name)
    msg = str(info.value)
    assert "\n" not in msg and name in msg


def test_dataset_not_prepared_is_one_line_error(tmp_path, no_network):
    with pytest.raises(FileNotFoundError) as info:
        load_tfds_d4rl(HOPPER, data_dir=str(tmp_path))
    msg = str(info.value)
    assert "\n" not in msg and HOPPER in msg and str(tmp_path) in msg
    assert "download" in msg and "tfds.load" in msg


def test_unknown_config_is_one_line_error(tmp_path, no_network):
    name = "d4rl_mujoco_hopper/v9-nonsense"
    with pytest.raises(ValueError) as info:
        load_tfds_d4rl(name, data_dir=str(tmp_path))
    msg = str(info.value)
    assert "\n" not in msg and name in msg


def test_missing_tensorflow_datasets_is_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[tfds\]"'):
        load_tfds_d4rl(HOPPER)


def test_ref_scores():
    assert ref_scores(HOPPER) == (-20.272305, 3234.3)
    assert ref_scores("d4rl_mujoco_halfcheetah/v2-expert") == D4RL_REF_SCORES["halfcheetah"]
    assert ref_scores("d4rl_mujoco_walker2d/v2-medium-replay") == (1.629008, 4592.3)
    assert ref_scores("d4rl_mujoco_ant/v2-full-replay") == (-325.6, 3879.7)
    assert ref_scores("hopper-medium-v2") == D4RL_REF_SCORES["hopper"]
    random, expert = ref_scores(HOPPER)
    np.testing.assert_allclose(normalized_score(np.array([random, expert]), random, expert),
                               [0.0, 100.0], atol=1e-4)
    with pytest.raises(ValueError) as info:
        ref_scores("d4rl_antmaze/umaze-v2")
    assert "\n" not in str(info.value) and "d4rl_antmaze/umaze-v2" in str(info.value)

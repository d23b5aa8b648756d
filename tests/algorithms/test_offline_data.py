"""D4RL-like datasets from PPO snapshots (issue 6, data part)."""

import jax
import numpy as np
import pytest

from jaxrl_suite.algorithms.offline_data import (
    DATASETS,
    OfflineDataConfig,
    build_datasets,
    complete_episode_returns,
    dataset_scores,
    pick_expert_and_medium,
)
from jaxrl_suite.algorithms.ppo import PPOConfig
from jaxrl_suite.envs.offline import check_dataset


def test_pick_expert_and_medium_hand_cases():
    assert pick_expert_and_medium([0.0, 30.0, 60.0, 100.0], 50.0) == (3, 2)
    assert pick_expert_and_medium([0.0, 100.0, 40.0, 100.0], 50.0) == (3, 2)  # latest best
    assert pick_expert_and_medium([0.0, 40.0, 60.0, 90.0], 50.0) == (3, 1)  # earliest on a tie


def test_complete_episode_returns_drops_episodes_cut_by_the_stream():
    # two streams of 5 rows: [a: 3 rows, terminal | b: 2 rows, cut by the stream end]
    #                        [c: 5 rows, terminal at the stream end]
    data = {
        "rewards": np.array([1, 1, 1, 2, 2, 3, 3, 3, 3, 3], np.float32),
        "terminals": np.array([0, 0, 1, 0, 0, 0, 0, 0, 0, 1], bool),
        "timeouts": np.array([0, 0, 0, 0, 1, 0, 0, 0, 0, 0], bool),
    }
    np.testing.assert_allclose(complete_episode_returns(data, 5), [3.0, 15.0])
    data["terminals"][9] = False
    data["timeouts"][9] = True  # now the second stream's episode is cut too
    np.testing.assert_allclose(complete_episode_returns(data, 5), [3.0])
    data["timeouts"][4] = False
    data["timeouts"][3] = True  # a time limit inside the stream is a natural end
    np.testing.assert_allclose(complete_episode_returns(data, 5), [3.0, 2.0])


@pytest.fixture(scope="module")
def cartpole_data():
    cfg = OfflineDataConfig(
        # 8 evaluation episodes per snapshot, as the OPPO experiment uses 20: one deterministic
        # episode ranks the snapshots too noisily to pick the expert and medium ones.
        ppo=PPOConfig(env="CartPole-v1", total_timesteps=16384, num_envs=4, num_steps=128,
                      eval_episodes=8),
        snapshots=4, num_envs=4, steps_per_env=500, epsilon=0.1)
    return cfg, *build_datasets(cfg, jax.random.PRNGKey(0))


def test_build_datasets_layout_and_normalisers(cartpole_data):
    cfg, datasets, info = cartpole_data
    assert list(datasets) == list(DATASETS)
    rows = cfg.num_envs * cfg.steps_per_env
    sizes = {k: check_dataset(d) for k, d in datasets.items()}
    assert sizes["random"] == sizes["medium"] == sizes["expert"] == rows
    assert sizes["medium-expert"] == 2 * rows
    assert sizes["medium-replay"] == (info["medium_index"] + 1) * rows
    assert info["expert_return"] > info["random_return"]
    scores = np.array(info["snapshot_scores"])
    assert scores[info["expert_index"]] == pytest.approx(100.0) and scores.max() <= 100.0 + 1e-9
    assert info["medium_index"] != info["expert_index"]
    # the random dataset's actions are uniform over CartPole's two actions
    assert abs(datasets["random"]["actions"].mean() - 0.5) < 0.05
    # D4RL normalisation: the random dataset scores 0 on average by construction
    assert dataset_scores(datasets["random"], info, cfg.steps_per_env).mean() == pytest.approx(
        0.0, abs=1e-6)


def test_expert_data_beats_random_data(cartpole_data):
    cfg, datasets, info = cartpole_data
    returns = {k: np.asarray(d["rewards"]).sum() / max(1, int(np.sum(d["terminals"])))
               for k, d in datasets.items()}  # return per failure: CartPole pays 1 per step
    assert returns["expert"] > returns["medium"] >= returns["random"]


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="snapshots=3 must divide the 8 PPO"):
        OfflineDataConfig(ppo=PPOConfig(total_timesteps=4096), snapshots=3)
    with pytest.raises(ValueError,
                       match=r"config field 'data.epsilon' must be in \[0, 1\], got 1.5"):
        OfflineDataConfig(ppo=PPOConfig(total_timesteps=4096), snapshots=4, epsilon=1.5)

"""D4RL-like offline datasets from our own PPO agents (issue 6).

One PPO run is trained in `snapshots` equal chunks and its policy is kept after each (plus the
initial one). Each snapshot is scored by `PPO.evaluate`; scores are D4RL-normalised between the
uniformly random policy (0, its mean return over complete episodes) and the best snapshot, the
expert (100). The datasets, each rolled out
with `envs.offline.collect` (sampled actions, replaced by random ones with probability epsilon):

    random         the uniformly random policy
    medium         the snapshot whose normalised score is closest to `medium_score`
    expert         the best snapshot (the latest on a tie)
    medium-replay  every snapshot from the initial policy up to medium, one after another
                   (a stand-in for the replay buffer of training up to the medium policy)
    medium-expert  medium then expert

The offline trainers (`algorithms.iql`, `algorithms.oppo`, `algorithms.pref_reward`) read a
dataset as the device pytrees `Transitions` (`transitions(env, data)`) and `PreferenceData`
(`preference_data(env, data, prefs, segment_length)`), which they take as an argument
(`train(rng, data)`), so that one compiled program serves every dataset of the same shape.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.algorithms.ppo import PPO, PPOConfig
from jaxrl_suite.core.config import Count, Probability, Range, check_fields, to_dict
from jaxrl_suite.core.metrics import write_json
from jaxrl_suite.envs.offline import (
    check_dataset,
    check_preferences,
    collect,
    concat,
    dataset_actions,
    episode_ids,
    normalized_score,
)

DATASETS = ("random", "medium", "medium-replay", "medium-expert", "expert")


@dataclasses.dataclass(frozen=True)
class OfflineDataConfig:
    ppo: PPOConfig = PPOConfig()  # the agent that generates the data
    # policy snapshots after equal chunks of PPO training (plus the initial)
    snapshots: Count = 5
    epsilon: Probability = 0.1  # probability of a uniformly random action in the behaviour policy
    num_envs: Count = 8  # parallel environments per rollout
    steps_per_env: Count = 500  # transitions per environment per policy
    # normalised score the medium snapshot is chosen closest to (any finite value)
    medium_score: Annotated[float, Range()] = 50.0

    def __post_init__(self):
        check_fields(self, "data.")  # the Ranges declared above
        if self.ppo.num_updates % self.snapshots:
            raise ValueError(f"snapshots={self.snapshots} must divide the "
                             f"{self.ppo.num_updates} PPO iterations")


class Transitions(flax.struct.PyTreeNode):
    """One row per transition of a D4RL-layout dataset, as the offline trainers read it."""

    obs: jax.Array  # [N, obs_dim] float32
    actions: jax.Array  # [N] int32 (discrete) or [N, A] float32
    rewards: jax.Array  # [N] float32, the dataset's (true) rewards
    done: jax.Array  # [N] float32, the dataset's `terminals`
    next_obs: jax.Array | None  # [N, obs_dim] float32; None if the dataset has none


class PreferenceData(flax.struct.PyTreeNode):
    """A dataset's rows and the labelled segment pairs of `envs.offline.make_preferences`."""

    obs: jax.Array  # [N, obs_dim] float32
    actions: jax.Array  # [N] int32 or [N, A] float32
    action_features: jax.Array  # [N, num_actions] one-hot (discrete) or the actions
    starts: jax.Array  # [P, 2] int32 first rows of the two segments of each pair
    label: jax.Array  # [P] float32: 1 if the first segment is preferred, 0.5 a tie


def transitions(env, data: Mapping[str, Any]) -> Transitions:
    """`data` (D4RL layout, validated by `check_dataset`) as `Transitions` for `env`'s actions.

    Only shapes are checked, so it also runs on traced arrays."""
    check_dataset(data)
    actions, _ = dataset_actions(env, data)
    next_obs = data.get("next_observations")
    return Transitions(
        obs=jnp.asarray(data["observations"], jnp.float32), actions=actions,
        rewards=jnp.asarray(data["rewards"], jnp.float32),
        done=jnp.asarray(data["terminals"], jnp.float32),
        next_obs=None if next_obs is None else jnp.asarray(next_obs, jnp.float32),
    )


def preference_data(env, data: Mapping[str, Any], prefs: Mapping[str, Any],
                    segment_length: int) -> PreferenceData:
    """`data` and `prefs` as `PreferenceData`; checks (eagerly, on concrete arrays) that every
    segment of `segment_length` rows lies inside the dataset (ValueError naming the field)."""
    check_dataset(data)
    starts, label = check_preferences(prefs, data, segment_length)
    actions, features = dataset_actions(env, data)
    return PreferenceData(obs=jnp.asarray(data["observations"], jnp.float32), actions=actions,
                          action_features=features, starts=starts, label=label)


def pick_expert_and_medium(scores, target: float) -> tuple[int, int]:
    """(expert, medium) snapshot indices: the expert has the highest score (the latest on a tie);
    medium is the other snapshot whose score is closest to `target` (the earliest on a tie)."""
    scores = np.asarray(scores, np.float64)
    expert = int(len(scores) - 1 - np.argmax(scores[::-1]))
    gap = np.abs(scores - target)
    gap[expert] = np.inf
    return expert, int(np.argmin(gap))


def complete_episode_returns(data, stream_length: int) -> np.ndarray:
    """Returns of the episodes in `data` that ran to their natural end.

    `data` is made of environment streams of `stream_length` rows (as `collect` writes them, and
    `concat` of such datasets); an episode whose last row is a stream's last row was cut by the
    collection, not by the environment, unless that row is terminal, and is left out."""
    terminals = np.asarray(data["terminals"])
    done = terminals | np.asarray(data["timeouts"])
    ids = np.asarray(episode_ids(data["terminals"], data["timeouts"]))
    returns = np.bincount(ids, weights=np.asarray(data["rewards"], np.float64))
    last = np.flatnonzero(done)  # the last row of each episode, in episode order
    stream_end = (last % stream_length) == stream_length - 1
    keep = terminals[last] | ~stream_end
    return returns[: len(last)][keep]


def train_snapshots(config: OfflineDataConfig, key: jax.Array):
    """PPO trained in `config.snapshots` chunks. Returns (ppo, [params] * (snapshots + 1),
    returns [snapshots + 1]) with each snapshot's mean evaluation return."""
    ppo = PPO(config.ppo)
    hp = config.ppo.hparams()
    k_init, k_eval = jax.random.split(key)
    runner = ppo.init(k_init, hp)
    chunk = config.ppo.num_updates // config.snapshots
    run_chunk = jax.jit(lambda r: ppo.run(r, hp, chunk)[0])
    evaluate = jax.jit(lambda p, k: ppo.evaluate(p, k).mean())
    params = [runner.params]
    for _ in range(config.snapshots):
        runner = run_chunk(runner)
        params.append(runner.params)
    keys = jax.random.split(k_eval, len(params))
    returns = np.array([float(evaluate(p, k)) for p, k in zip(params, keys, strict=True)])
    return ppo, params, returns


def build_datasets(config: OfflineDataConfig, key: jax.Array) -> tuple[dict, dict]:
    """The five D4RL-style datasets and their info.

    Returns (datasets {name: dict of arrays}, info) with info holding "random_return",
    "expert_return" (the D4RL normalisers), "snapshot_returns", "snapshot_scores",
    "medium_index" and "expert_index".
    """
    k_train, k_data = jax.random.split(key)
    ppo, params, returns = train_snapshots(config, k_train)
    env = ppo.env

    def rollout(p, k, epsilon):
        policy = lambda obs, kk: ppo.network.apply(p, obs)[0].sample(kk)
        return collect(env, policy, k, num_envs=config.num_envs,
                       num_steps=config.steps_per_env, epsilon=epsilon)

    rollout = jax.jit(rollout)
    keys = iter(jax.random.split(k_data, len(params) + 2))
    random_data = rollout(params[0], next(keys), 1.0)
    random_return = float(complete_episode_returns(random_data, config.steps_per_env).mean())
    expert_return = float(returns.max())
    if expert_return <= random_return:
        raise ValueError(f"the PPO agent's best return ({expert_return:.3g}) does not beat the "
                         f"random policy's ({random_return:.3g}); train it longer "
                         "(ppo.total_timesteps)")
    scores = np.asarray(normalized_score(returns, random_return, expert_return))
    expert, medium = pick_expert_and_medium(scores, config.medium_score)
    by_snapshot = [rollout(p, next(keys), config.epsilon) for p in params]
    datasets = {
        "random": random_data,
        "medium": by_snapshot[medium],
        "medium-replay": concat(*by_snapshot[: medium + 1]),
        "medium-expert": concat(by_snapshot[medium], by_snapshot[expert]),
        "expert": by_snapshot[expert],
    }
    datasets = {k: {f: np.asarray(v) for f, v in d.items()} for k, d in datasets.items()}
    info = {"random_return": random_return, "expert_return": expert_return,
            "snapshot_returns": returns.tolist(), "snapshot_scores": scores.tolist(),
            "medium_index": medium, "expert_index": expert, "env": config.ppo.env}
    return datasets, info


def load_or_build_datasets(config: OfflineDataConfig, data_dir: str | Path, *, seed: int,
                           resume: bool) -> tuple[dict, dict, bool]:
    """`build_datasets` with key PRNGKey(seed), saved under `data_dir` (each dataset as
    NAME.npz with D4RL's field names, the normalisers and the config in info.json); with
    `resume`, the datasets saved there are read back instead, after checking they were built
    from the same config and seed (a one-line ValueError if not). Returns (datasets, info,
    whether they were read back)."""
    data_dir = Path(data_dir)
    info_path = data_dir / "info.json"
    if resume and info_path.is_file():
        info = json.loads(info_path.read_text())
        if info.get("data_config") != to_dict(config) or info.get("data_seed") != seed:
            raise ValueError(f"--resume: {info_path} was built with another data config or "
                             "run.data_seed; resume with the same config or start afresh")
        datasets = {}
        for name in DATASETS:
            with np.load(data_dir / f"{name}.npz") as f:
                datasets[name] = {k: f[k] for k in f.files}
        return datasets, info, True
    datasets, info = build_datasets(config, jax.random.PRNGKey(seed))
    info = {**info, "data_config": to_dict(config), "data_seed": seed}
    if jax.process_index() == 0:
        data_dir.mkdir(parents=True, exist_ok=True)
        for name, d in datasets.items():
            np.savez_compressed(data_dir / f"{name}.npz", **d)
        write_json(info_path, info)
    return datasets, info, False


def dataset_scores(data, info, stream_length: int) -> np.ndarray:
    """D4RL-normalised score of every episode of `data` that ran to its natural end."""
    r = complete_episode_returns(data, stream_length)
    return np.asarray(normalized_score(r, info["random_return"], info["expert_return"]))


__all__ = [
    "DATASETS",
    "OfflineDataConfig",
    "PreferenceData",
    "Transitions",
    "build_datasets",
    "complete_episode_returns",
    "dataset_scores",
    "load_or_build_datasets",
    "pick_expert_and_medium",
    "preference_data",
    "train_snapshots",
    "transitions",
]

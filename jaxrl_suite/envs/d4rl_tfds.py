"""D4RL datasets from TensorFlow Datasets (RLDS format) in our D4RL layout (`envs.offline`).

TFDS ships D4RL (`d4rl_mujoco_hopper/v2-medium`, `d4rl_mujoco_walker2d/v2-expert`, ...) as RLDS
episodes: one example per episode whose "steps" is a sequence of

    observation [obs_dim]   action [act_dim]   reward []   discount []
    is_first []   is_last []   is_terminal []          (plus "infos", ignored here)

`load_tfds_d4rl` turns a split into the dict of numpy arrays that `envs.offline` uses (one row per
transition, episodes one after another in dataset order):

    observations [N, obs_dim]   actions [N, act_dim]   rewards [N] float32
    terminals [N] bool   timeouts [N] bool   next_observations [N, obs_dim]

The mapping follows TFDS's converter (`tensorflow_datasets/d4rl/dataset_utils.py`,
`_get_episode`): when the source episode ends in a terminal state, or the source file had
`next_observations`, it appends an extra observation-only step (is_last=True, zero action and
reward, discount 0, is_terminal = whether the episode ended in a terminal state); otherwise the
last step is a real transition with is_last=True and discount 1. So, per episode of T steps:

  * final step is_last with discount == 0: observation-only. It is dropped (T - 1 rows), its
    observation is the next observation of the row before it, and that row (now the last) is
    marked terminal if the dropped step is_terminal, else a timeout;
  * otherwise: all T rows are kept and the last is marked a timeout (terminal if its own
    is_terminal is set). Its true next observation is not in the data; the row's own
    observation is copied into next_observations there.

Caveat (TFDS 4.9.x): when the source file had next_observations, the converter fills every
episode's observation-only step with the file's *last* next_observation, not the episode's own,
so the last row of every episode but the file's final one gets a wrong next observation (a
terminal row masks it in a TD target; a timeout row does not). Without next_observations, the
observation-only step of a terminal episode holds zeros.

Only the final step's flags are read; is_first / is_last / is_terminal on earlier steps are
ignored (RLDS defines them only at episode boundaries). Every episode therefore ends in exactly
one terminal-or-timeout row, at its last row, as `envs.offline` expects. Observations and actions
keep their stored dtype (float32 for most configs).

The real data is not fetched here: `load_tfds_d4rl` never downloads. Download and prepare it
yourself once, with network access, e.g.

    python -c "import tensorflow_datasets as tfds; tfds.load('d4rl_mujoco_hopper/v2-medium')"

(or `tfds build d4rl_mujoco_hopper/v2-medium`), then pass the same `data_dir` (default
~/tensorflow_datasets). TFDS needs the optional extra: `pip install -e ".[tfds]"`.

Scores: `ref_scores(name)` gives the public D4RL (random, expert) returns for the environment;
normalise with `jaxrl_suite.envs.offline.normalized_score(returns, *ref_scores(name))`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from jaxrl_suite.envs.offline import check_dataset

STEP_KEYS = ("observation", "action", "reward", "discount", "is_first", "is_last", "is_terminal")

# Public D4RL normalising returns (random, expert), from d4rl/infos.py (REF_MIN/MAX_SCORE).
D4RL_REF_SCORES: dict[str, tuple[float, float]] = {
    "hopper": (-20.272305, 3234.3),
    "halfcheetah": (-280.178953, 12135.0),
    "walker2d": (1.629008, 4592.3),
    "ant": (-325.6, 3879.7),
}


def ref_scores(name: str) -> tuple[float, float]:
    """(random, expert) D4RL returns of a TFDS D4RL name, e.g. "d4rl_mujoco_hopper/v2-medium"
    (also "hopper-medium-v2" or plain "hopper"). Raises ValueError if the environment is not in
    `D4RL_REF_SCORES`."""
    base = name.split("/")[0].lower()
    for prefix in ("d4rl_mujoco_", "d4rl_"):
        base = base.removeprefix(prefix)
    base = base.split("-")[0]
    if base not in D4RL_REF_SCORES:
        raise ValueError(f"no D4RL reference scores for dataset '{name}'; known environments: "
                         f"{sorted(D4RL_REF_SCORES)}")
    return D4RL_REF_SCORES[base]


def _stack_steps(steps: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """One episode's steps as stacked arrays {key: [T, ...]} for the keys in `STEP_KEYS`.

    `steps` is either already stacked (a mapping of arrays) or an iterable of per-step dicts,
    e.g. the nested "steps" dataset of an episode from `tfds.as_numpy`. Extra keys ("infos")
    are dropped. An empty iterable gives [0]-shaped arrays."""
    if isinstance(steps, Mapping):
        missing = [k for k in STEP_KEYS if k not in steps]
        if missing:
            raise ValueError(f"RLDS steps are missing key(s) {missing}; need {list(STEP_KEYS)}")
        return {k: np.asarray(steps[k]) for k in STEP_KEYS}
    cols: dict[str, list] = {k: [] for k in STEP_KEYS}
    for i, step in enumerate(steps):
        missing = [k for k in STEP_KEYS if k not in step]
        if missing:
            raise ValueError(f"RLDS step {i} is missing key(s) {missing}; need {list(STEP_KEYS)}")
        for k in STEP_KEYS:
            cols[k].append(np.asarray(step[k]))
    return {k: np.stack(v) if v else np.zeros((0,)) for k, v in cols.items()}


def rlds_episode_to_transitions(
    steps: Mapping[str, np.ndarray] | Iterable[Mapping[str, np.ndarray]],
) -> dict[str, np.ndarray]:
    """One RLDS episode as D4RL-layout rows (see the module docstring for the rule).

    Args:
      steps: the episode's stacked steps, observation [T, obs_dim], action [T, act_dim],
        reward [T], discount [T], is_first [T], is_last [T], is_terminal [T] (other keys are
        ignored); or an iterable of per-step dicts (a nested dataset through `tfds.as_numpy`).

    Returns observations [N, obs_dim], actions [N, act_dim], rewards [N] float32, terminals [N]
    bool, timeouts [N] bool, next_observations [N, obs_dim], where N = T - 1 if the final step is
    observation-only (is_last and discount == 0), else T. next_observations[t] is
    observation[t + 1], except on the last row of an episode without an observation-only step,
    whose next observation is unknown: there it is a copy of the row's own observation (only a
    timeout can have it, so a TD target should not bootstrap from it blindly). The last row is
    the only one with a terminal or timeout set. A single observation-only step (or T = 0)
    gives zero rows.
    """
    s = _stack_steps(steps)
    obs, act = s["observation"], s["action"]
    t = obs.shape[0]
    if t == 0:
        return {"observations": obs, "actions": act,
                "rewards": np.zeros((0,), np.float32), "terminals": np.zeros((0,), bool),
                "timeouts": np.zeros((0,), bool), "next_observations": obs}
    last_is_last = bool(s["is_last"][-1])
    last_terminal = bool(s["is_terminal"][-1])
    obs_only = last_is_last and float(s["discount"][-1]) == 0.0
    if obs_only:
        n = t - 1
        next_obs = obs[1:]
    else:
        n = t
        next_obs = np.concatenate([obs[1:], obs[-1:]], axis=0)
    terminals = np.zeros((n,), bool)
    timeouts = np.zeros((n,), bool)
    if n > 0:
        terminals[-1] = last_terminal
        timeouts[-1] = not last_terminal
    return {
        "observations": obs[:n],
        "actions": act[:n],
        "rewards": np.asarray(s["reward"][:n], np.float32),
        "terminals": terminals,
        "timeouts": timeouts,
        "next_observations": next_obs,
    }


def _load_error(name: str, data_dir: str | None, err: Exception) -> Exception:
    """A one-line error for a TFDS dataset that cannot be loaded."""
    where = data_dir if data_dir is not None else "the default ~/tensorflow_datasets"
    how = (f"download it yourself once, with network access: python -c \"import "
           f"tensorflow_datasets as tfds; tfds.load('{name}', data_dir=...)\" "
           f"(or `tfds build {name.split('/')[0]}`), then pass that data_dir")
    detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if type(err).__name__ == "DatasetNotFoundError":
        return ValueError(f"TFDS dataset '{name}' is not a registered TFDS dataset ({detail})")
    if isinstance(err, AssertionError | OSError) or type(err).__name__ == "NotFoundError":
        return FileNotFoundError(f"TFDS dataset '{name}' is not prepared in {where}; {how}")
    return ValueError(f"TFDS dataset '{name}' could not be loaded from {where} "
                      f"({type(err).__name__}: {detail}); {how}")


def load_tfds_d4rl(
    name: str,
    split: str = "train",
    *,
    data_dir: str | None = None,
    max_episodes: int | None = None,
) -> dict[str, np.ndarray]:
    """A TFDS D4RL split in the D4RL layout of `envs.offline` (never downloads).

    Args:
      name: TFDS name with config, e.g. "d4rl_mujoco_hopper/v2-medium".
      split: TFDS split (D4RL has only "train"; slices such as "train[:10%]" work).
      data_dir: where the prepared data lies (default: TFDS's, ~/tensorflow_datasets).
      max_episodes: read at most this many episodes (in dataset order); None reads all.

    Returns observations [N, obs_dim], actions [N, act_dim], rewards [N] float32, terminals [N]
    bool, timeouts [N] bool, next_observations [N, obs_dim]: each episode converted by
    `rlds_episode_to_transitions`, concatenated in order. Raises ImportError without
    tensorflow_datasets, FileNotFoundError if the data is not prepared in `data_dir`, and
    ValueError for an unknown dataset or config, or a split with no transitions.
    """
    if max_episodes is not None and max_episodes < 1:
        raise ValueError(f"max_episodes must be >= 1 or None, got {max_episodes}")
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise ImportError("tensorflow_datasets is not installed; run "
                          "`pip install -e \".[tfds]\"` to load TFDS D4RL datasets") from None
    try:
        ds = tfds.load(name, split=split, data_dir=data_dir, download=False)
    except Exception as err:  # DatasetNotFoundError, AssertionError (not prepared), ...
        raise _load_error(name, data_dir, err) from None
    if max_episodes is not None:
        ds = ds.take(max_episodes)
    parts = [rlds_episode_to_transitions(ep["steps"]) for ep in tfds.as_numpy(ds)]
    parts = [p for p in parts if p["rewards"].shape[0] > 0]
    if not parts:
        raise ValueError(f"TFDS dataset '{name}' split '{split}' has no transitions")
    data = {k: np.concatenate([p[k] for p in parts], axis=0) for k in parts[0]}
    check_dataset(data)
    return data


__all__ = [
    "D4RL_REF_SCORES",
    "STEP_KEYS",
    "load_tfds_d4rl",
    "ref_scores",
    "rlds_episode_to_transitions",
]

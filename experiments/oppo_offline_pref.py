"""OPPO vs preference-reward + IQL, BC and oracle IQL on D4RL-style datasets of our PPO agents.

Claim checked (Kang et al., "Beyond Reward: Offline Preference-guided Policy Optimization", ICML
2023, arXiv 2305.16217): modelling offline trajectories and preferences in one step (OPPO: a
hindsight encoder, a contextual policy and an optimal context z* found by a triplet loss) does at
least as well as learning a scalar reward from the preferences and running offline RL on it.

    jaxrl-suite run oppo_offline_pref              # full size (Pendulum, 4 datasets, 3 seeds)
    jaxrl-suite run oppo_offline_pref --resume     # a killed run continues after its last unit
    jaxrl-suite run oppo_offline_pref --smoke      # seconds; what the tests run

Steps:
  1. data: PPO trained in snapshots on `data.ppo.env`; the random / medium / medium-replay /
     medium-expert / expert datasets rolled out with epsilon-noise (`algorithms/offline_data.py`),
     each saved as `data/<name>.npz` (D4RL field names) with the normalisers in `data/info.json`;
  2. preferences: `prefs.num_pairs` pairs of K-step segments per dataset, labelled by the scripted
     teacher (higher true return wins; Bradley-Terry draws with `prefs.temperature` > 0);
  3. methods, each one jitted program vmapped over `run.seeds`:
       bc          behaviour cloning of the whole dataset
       pref_iql    Bradley-Terry reward model on the preferences, then IQL on its rewards
       oppo        OPPO on the same preferences (evaluated with z*)
       oracle_iql  IQL on the true rewards (the upper reference; it sees what the others don't)
Each (dataset, method) unit of the `Study` writes runs/<dataset>/<method>/result.json and an orbax
checkpoint of its final per-seed states (checkpoints/<dataset>/<method>); `--resume` skips the
units with a result.json (a kill loses the unit in progress only). Writes
results/oppo_offline_pref/{config.json, summary.json, table.md, returns.png, zspace.png}.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import jax
import numpy as np

from jaxrl_suite.algorithms import iql, oppo, pref_reward
from jaxrl_suite.algorithms.iql import BCConfig, IQLConfig
from jaxrl_suite.algorithms.offline_data import (
    DATASETS,
    OfflineDataConfig,
    dataset_scores,
    load_or_build_datasets,
)
from jaxrl_suite.algorithms.oppo import OPPOConfig
from jaxrl_suite.algorithms.ppo import PPOConfig
from jaxrl_suite.algorithms.pref_reward import RewardModelConfig
from jaxrl_suite.core.checkpoint import save_tree
from jaxrl_suite.core.config import Count, NonNegative, Seed, check_fields, to_dict
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.core.metrics import WandbConfig, pyplot, save_figure
from jaxrl_suite.core.parallel import print0
from jaxrl_suite.core.study import Study, check_seeds, check_variants, seed_stats
from jaxrl_suite.envs.contextual import ContextualEnv
from jaxrl_suite.envs.offline import make_preferences, normalized_score
from jaxrl_suite_experiments import CONFIGS

NAME = "oppo_offline_pref"
METHODS = ("bc", "pref_iql", "oppo", "oracle_iql")


@dataclasses.dataclass(frozen=True)
class PrefConfig:
    num_pairs: Count = 500  # labelled segment pairs per dataset
    segment_length: Count = 20  # K; oppo.segment_length and reward.segment_length must equal it
    # 0: scripted teacher; > 0: Bradley-Terry labels at this temperature
    temperature: NonNegative = 0.0

    def __post_init__(self):
        check_fields(self, "prefs.")  # the Ranges declared above


@dataclasses.dataclass(frozen=True)
class RunConfig:
    seeds: tuple[Seed, ...] = (0, 1, 2)  # vmapped seeds per (dataset, method)
    datasets: tuple[str, ...] = ("random", "medium", "medium-replay", "medium-expert")
    methods: tuple[str, ...] = METHODS
    zspace_dataset: str = "medium-replay"  # the dataset whose OPPO z-space is plotted (seed 0)
    data_seed: Seed = 0  # PPO snapshots, rollouts and preference pairs
    wandb: WandbConfig = WandbConfig()  # log to W&B as --wandb does (`enabled: true`)

    def __post_init__(self):
        check_fields(self, "run.")  # the Ranges declared above


def _default_data() -> OfflineDataConfig:
    ppo = PPOConfig(env="Pendulum-v1", num_envs=16, total_timesteps=1_024_000, lr=1e-3,
                    ent_coef=0.0, update_epochs=10, num_minibatches=8, eval_episodes=20)
    return OfflineDataConfig(ppo=ppo, snapshots=10, num_envs=10, steps_per_env=1000)


@dataclasses.dataclass(frozen=True)
class Config:
    data: OfflineDataConfig = dataclasses.field(default_factory=_default_data)
    prefs: PrefConfig = dataclasses.field(default_factory=PrefConfig)
    oppo: OPPOConfig = dataclasses.field(default_factory=OPPOConfig)
    reward: RewardModelConfig = dataclasses.field(default_factory=RewardModelConfig)
    iql: IQLConfig = dataclasses.field(default_factory=IQLConfig)
    bc: BCConfig = dataclasses.field(default_factory=BCConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)

    def __post_init__(self):
        check_variants(self.run.datasets, DATASETS, "run.datasets")
        check_variants(self.run.methods, METHODS, "run.methods")
        if self.run.zspace_dataset not in DATASETS:
            raise ValueError(f"run.zspace_dataset: unknown '{self.run.zspace_dataset}'; "
                             f"valid: {list(DATASETS)}")
        k = self.prefs.segment_length
        for field, value in (("oppo.segment_length", self.oppo.segment_length),
                             ("reward.segment_length", self.reward.segment_length)):
            if value != k:
                raise ValueError(f"{field}={value} must equal prefs.segment_length={k}")
        check_seeds(self.run.seeds)


# -- data ------------------------------------------------------------------------------------------
def _preferences(cfg: Config, datasets: dict) -> dict:
    """Labelled segment pairs of each dataset (keyed by its position in DATASETS)."""
    prefs = {}
    key = jax.random.fold_in(jax.random.PRNGKey(cfg.run.data_seed), 1)
    for name in cfg.run.datasets:
        p = make_preferences(jax.random.fold_in(key, DATASETS.index(name)), datasets[name],
                             num_pairs=cfg.prefs.num_pairs, length=cfg.prefs.segment_length,
                             temperature=cfg.prefs.temperature)
        prefs[name] = {k: np.asarray(v) for k, v in p.items()}
    return prefs


# -- methods ---------------------------------------------------------------------------------------
def _with_data(made, *data):
    """(train, agent, train's data argument) of a `make_train` result and its raw data."""
    return made.train, made.agent, made.agent.prepare(*data)


# method -> (config, env, data, prefs) -> (train(rng, batch), agent, batch) for one dataset
TRAINERS = {
    "bc": lambda cfg, env, data, prefs: _with_data(iql.make_train_bc(cfg.bc, env), data),
    "pref_iql": lambda cfg, env, data, prefs: _with_data(
        pref_reward.make_train(cfg.reward, cfg.iql, env), data, prefs),
    "oppo": lambda cfg, env, data, prefs: _with_data(oppo.make_train(cfg.oppo, env), data, prefs),
    "oracle_iql": lambda cfg, env, data, prefs: _with_data(iql.make_train(cfg.iql, env), data),
}


def _diagnostics(method: str, metrics: dict) -> dict:
    """Per-seed training diagnostics: the mean of the last 10% of steps of a few metrics."""
    out = {}
    for k in ("bc_loss", "q_loss", "v_loss", "bt_acc", "bt_loss", "recon", "pref", "pref_acc",
              "phi_norm", "z_loss"):
        if k in metrics:
            m = np.asarray(metrics[k])
            out[k] = m[:, -max(m.shape[1] // 10, 1):].mean(axis=1).tolist()
    if "reward_corr" in metrics:
        out["reward_corr"] = np.asarray(metrics["reward_corr"]).tolist()
    return out


def run(cfg: Config, opts: RunOptions) -> dict:
    t0 = time.perf_counter()
    units = [f"{d}/{m}" for d in cfg.run.datasets for m in cfg.run.methods]
    study = Study(NAME, opts, variants=units, seeds=cfg.run.seeds)
    study.write_config(cfg)
    env = ContextualEnv(cfg.data.ppo.env)
    datasets, info, reused = load_or_build_datasets(cfg.data, opts.out_dir / "data",
                                                    seed=cfg.run.data_seed, resume=opts.resume)
    print0(f"[{NAME}] {cfg.data.ppo.env} data {'reloaded' if reused else 'built'}: random "
           f"{info['random_return']:.1f}, expert {info['expert_return']:.1f}; snapshot scores "
           f"{np.round(info['snapshot_scores'], 1).tolist()}")
    prefs = _preferences(cfg, datasets)
    score = lambda r: np.asarray(normalized_score(np.asarray(r, np.float64), info["random_return"],
                                                  info["expert_return"]))

    def train_unit(unit: str) -> dict:  # one (dataset, method), its seeds vmapped
        t_unit = time.perf_counter()
        d, method = unit.split("/")
        train, agent, batch = TRAINERS[method](cfg, env, datasets[d], prefs[d])
        base = jax.random.fold_in(jax.random.PRNGKey(1), METHODS.index(method))
        keys = jax.random.split(base, max(cfg.run.seeds) + 1)[np.asarray(cfg.run.seeds)]  # seed
        # s: the s-th key, whatever the other seeds (split(k, n)[s] does not depend on n)
        state, metrics = jax.jit(jax.vmap(train, in_axes=(0, None)))(keys, batch)
        returns = np.asarray(metrics["eval_return"], np.float64)
        scores = score(returns)
        result = {"method": method, "returns": returns.tolist(), "scores": scores.tolist(),
                  "score_mean": float(scores.mean()), "score_std": float(scores.std()),
                  "diagnostics": _diagnostics(method, metrics),
                  "wall_time_s": time.perf_counter() - t_unit}
        if method == "oppo":
            ctx = oppo.context_diagnostics(agent, batch, state, prefs[d],
                                       jax.random.fold_in(keys[0], 7))
            for name in ("near_phi", "best_phi"):
                ctx[f"{name}_score"] = score(ctx[f"{name}_return"]).tolist()
            result["contexts"] = ctx
            if d == cfg.run.zspace_dataset:
                result["zspace"] = oppo.zspace_pca(agent, batch, state, prefs[d])
        save_tree(study.checkpoint_dir(unit), state, {"method": method})
        return result

    done = study.run_units(units, train_unit, fmt=_fmt)
    results = {d: {m: done[f"{d}/{m}"] for m in cfg.run.methods} for d in cfg.run.datasets}

    data_stats, stats = {}, {}
    for d in cfg.run.datasets:
        s = dataset_scores(datasets[d], info, cfg.data.steps_per_env)
        data_stats[d] = {"rows": int(len(datasets[d]["rewards"])),
                         "episode_score_mean": float(s.mean()) if len(s) else None,
                         "episodes": int(len(s)),
                         "pref_tie_frac": float(np.mean(prefs[d]["label"] == 0.5))}
        stats[d] = {"data": data_stats[d]["episode_score_mean"],  # a plain value; None shows "-"
                    **{m: seed_stats(r["scores"]) for m, r in results[d].items()}}
    claim = {}
    for d in cfg.run.datasets:
        if {"oppo", "pref_iql"} <= set(results[d]):
            o, p = results[d]["oppo"], results[d]["pref_iql"]
            claim[d] = {"oppo_minus_pref_iql": o["score_mean"] - p["score_mean"],
                        "oppo_ge_pref_iql": bool(o["score_mean"] >= p["score_mean"])}
    if claim:
        claim["holds_on"] = f"{sum(c['oppo_ge_pref_iql'] for c in claim.values())}/{len(claim)}"
    summary = {"experiment": NAME, "config": to_dict(cfg), "env": cfg.data.ppo.env,
               "normalisers": {"random_return": info["random_return"],
                               "expert_return": info["expert_return"]},
               "snapshot_scores": info["snapshot_scores"], "datasets": data_stats,
               "results": {d: {m: {k: v for k, v in r.items() if k != "zspace"}
                               for m, r in rs.items()} for d, rs in results.items()},
               "claim": claim, "resumed": opts.resume, "wall_time_s": time.perf_counter() - t0}
    keys = {"data": "data (behaviour)", **{m: m for m in cfg.run.methods}}
    table = (f"D4RL-normalised return on {cfg.data.ppo.env}, mean ± std over "
             f"{len(cfg.run.seeds)} seeds (data: the behaviour episodes' mean)\n\n"
             + study.table(stats, keys, formats=dict.fromkeys(keys, ".1f"), label="dataset")
             + _contexts_table(results))
    study.plot_bars({d: {m: r["scores"] for m, r in rs.items()} for d, rs in results.items()},
                    opts.out_dir / "returns.png", ylabel="D4RL-normalised return", hline=100.0)
    z = results.get(cfg.run.zspace_dataset, {}).get("oppo", {}).get("zspace")
    if z is not None and jax.process_index() == 0:
        _plot_zspace(z, cfg, opts.out_dir / "zspace.png")
    return study.finish(summary, table)


def _fmt(r: dict) -> str:
    return (f"normalised score {r['score_mean']:.1f} +- {r['score_std']:.1f} "
            f"({len(r['scores'])} seeds, {r['wall_time_s']:.0f} s)")


def _contexts_table(results: dict) -> str:
    """OPPO under other contexts per dataset (a diagnostic, next to its z* score)."""
    ctx = {d: rs["oppo"]["contexts"] for d, rs in results.items() if "oppo" in rs}
    if not ctx:
        return ""
    ms = lambda x: f"{np.mean(x):.1f} ± {np.std(x):.1f}"
    lines = ["", "OPPO's policy under other contexts (diagnostics; best phi reads the true "
             "returns), and the gap ||z* - nearest phi|| / median phi nearest-neighbour distance",
             "", "| dataset | z* | nearest phi to z* | best-return phi | gap |",
             "|---|---|---|---|---|"]
    for d, c in ctx.items():
        gap = np.asarray(c["z_star_to_nearest_phi"]) / np.asarray(c["phi_nn_median"])
        lines.append(f"| {d} | {ms(results[d]['oppo']['scores'])} | {ms(c['near_phi_score'])} "
                     f"| {ms(c['best_phi_score'])} | {np.mean(gap):.1f}x |")
    return "\n".join(lines) + "\n"


def _plot_zspace(z: dict, cfg: Config, path: Path) -> None:
    plt = pyplot()
    pc = np.asarray(z["pc"])
    fig, ax = plt.subplots(figsize=(5.2, 4.2))
    sc = ax.scatter(pc[:, 0], pc[:, 1], c=z["returns"], s=8, cmap="viridis")
    ax.scatter(*z["z_star"], marker="*", s=250, c="r", edgecolors="k", label="z*")
    fig.colorbar(sc, ax=ax, label=f"true return of the {cfg.prefs.segment_length}-step segment")
    ev = z["explained"]
    ax.set_xlabel(f"PC 1 ({100 * ev[0]:.0f}% var)")
    ax.set_ylabel(f"PC 2 ({100 * ev[1]:.0f}% var)" if len(ev) > 1 else "PC 2")
    ax.legend(loc="best")
    ax.set_title(f"OPPO phi(segment), {cfg.run.zspace_dataset}, seed 0\n"
                 f"corr(||phi - z*||, return) = {z['corr_dist_return']:.2f}", fontsize=9)
    save_figure(fig, path)


EXPERIMENT = Experiment(
    name=NAME,
    config=CONFIGS / f"{NAME}.yaml",
    config_cls=Config,
    run=run,
    description="OPPO vs preference reward + IQL, BC and oracle IQL on PPO-generated datasets",
)

__all__ = ["EXPERIMENT", "METHODS", "Config"]

"""ELMUR against a memoryless transformer and a GRU on POPGym memory tasks.

Claim checked (Cherepanov, Kovalev, Panov, "ELMUR: External Layer Memory with Update/Rewrite for
Long-Horizon RL", arXiv 2510.07151): on POPGym's memory puzzles, ELMUR's layer memory helps over
a transformer limited to its context, and it is competitive with recurrent baselines.

    jaxrl-suite run elmur_popgym            # full size (3 tasks x 3 models x 3 seeds, easy; 18 min)
    jaxrl-suite run elmur_popgym --smoke    # seconds; what the tests run

Every model is trained offline with return-conditioned behaviour cloning (`algorithms.rcbc`) on
the same dataset per task and seed: trajectories of the task's oracle made noisy per episode
(random action with probability eps ~ U[0, rcbc.eps_max]), so the data hold returns of several
qualities. The models: ELMUR, the same transformer with memory read and write switched off
(context = the current segment), and a GRU over the same tokens. Each is evaluated online,
conditioned on the best return (1.0; POPGym scales every task's return to [-1, 1]). Reported: the
mean episode return per task, mean and std over seeds. Each (task, model) is a `Study` unit
"TASK-DIFFICULTY/MODEL": writes results/elmur_popgym/{config.json, summary.json, table.md,
returns.png} and per unit runs/UNIT/{metrics.jsonl (training blocks), result.json};
`--resume` skips the units already finished.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from jaxrl_suite.algorithms.rcbc import (
    ARCHS,
    PolicyConfig,
    RCBCConfig,
    SeqPolicy,
    evaluate_seeds,
    fit_seeds,
    popgym_task,
    token_dim,
)
from jaxrl_suite.core.config import Count, Seed, check_fields, to_dict
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.core.metrics import WandbConfig
from jaxrl_suite.core.parallel import make_mesh, print0
from jaxrl_suite.core.study import Study, check_seeds, check_variants, seed_stats
from jaxrl_suite.envs.popgym import DIFFICULTIES, POPGYM_NAMES, make_popgym
from jaxrl_suite.models.elmur import ELMURConfig
from jaxrl_suite_experiments import CONFIGS

NAME = "elmur_popgym"


@dataclasses.dataclass(frozen=True)
class RunConfig:
    seeds: tuple[Seed, ...] = (0, 1, 2)  # vmapped in one program per model and task
    tasks: tuple[str, ...] = POPGYM_NAMES
    difficulties: tuple[str, ...] = ("easy",)
    models: tuple[str, ...] = ARCHS
    eval_episodes: Count = 32  # per seed
    wandb: WandbConfig = WandbConfig()  # log to W&B as --wandb does (`enabled: true`)

    def __post_init__(self):
        check_fields(self, "run.")  # the Ranges declared above


@dataclasses.dataclass(frozen=True)
class Config:
    elmur: ELMURConfig = dataclasses.field(
        default_factory=lambda: ELMURConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64,
                                            mem_slots=8, segment_len=16, pre_norm=False,
                                            detach_memory=False)
    )
    gru_hidden: Count = 64  # the GRU baseline's hidden size
    rcbc: RCBCConfig = dataclasses.field(
        default_factory=lambda: RCBCConfig(num_episodes=512, batch_size=32, num_updates=1000,
                                           lr=1e-3, eps_max=0.5)
    )
    run: RunConfig = dataclasses.field(default_factory=RunConfig)

    def __post_init__(self):
        check_fields(self)  # the Ranges declared above (top-level fields)
        for field, given, valid in (("run.tasks", self.run.tasks, POPGYM_NAMES),
                                    ("run.difficulties", self.run.difficulties, DIFFICULTIES),
                                    ("run.models", self.run.models, ARCHS)):
            check_variants(given, valid, field)
        check_seeds(self.run.seeds)


def run(cfg: Config, opts: RunOptions) -> dict:
    t0 = time.perf_counter()
    labels = [f"{t}-{d}" for t in cfg.run.tasks for d in cfg.run.difficulties]
    models = cfg.run.models
    units = [f"{label}/{m}" for label in labels for m in models]
    study = Study(NAME, opts, variants=units, seeds=cfg.run.seeds)
    study.write_config(cfg)

    def train_unit(unit: str) -> dict:
        label, model = unit.split("/")
        name, difficulty = label.rsplit("-", 1)
        task = popgym_task(name, difficulty, cfg.elmur.segment_len)
        env, env_params = make_popgym(name, difficulty)
        pcfg = PolicyConfig(arch=model, elmur=cfg.elmur, gru_hidden=cfg.gru_hidden)
        policy = SeqPolicy(pcfg, token_dim(task), task.num_actions)
        with study.unit_log(unit) as logger:
            params, metrics, t_train = fit_seeds(cfg.rcbc, pcfg, task, cfg.run.seeds, logger,
                                                 make_mesh())
        loss = np.asarray(metrics["loss"])  # [S, blocks]
        ev = evaluate_seeds(policy, env, cfg.run.eval_episodes, 1.0, cfg.rcbc.return_scale)
        out = ev(params, jax.random.key(7), env_params, task.horizon)
        per_seed = np.asarray(out["return"], np.float64).mean(axis=1)  # [S]
        data = np.asarray(metrics["data_return"])  # [S]
        return {"return_mean": float(per_seed.mean()), "return_std": float(per_seed.std()),
                "return_per_seed": per_seed, "data_return": float(data.mean()),
                "data_return_per_seed": data, "final_loss": float(loss[:, -1].mean()),
                "train_wall_s": t_train}

    results = study.run_units(units, train_unit, fmt=lambda r: f"return {r['return_mean']:.3f} "
                              f"± {r['return_std']:.3f} ({r['train_wall_s']:.0f} s training)")
    per_task = {label: {m: results[f"{label}/{m}"] for m in models} for label in labels}
    study.plot_bars({t: {m: r["return_per_seed"] for m, r in rs.items()}
                     for t, rs in per_task.items()}, opts.out_dir / "returns.png",
                    ylabel="mean episode return", hline=0.0, ylim=(-1.05, 1.05))
    stats = {t: {**{m: seed_stats(r["return_per_seed"]) for m, r in rs.items()},
                 "data": seed_stats(rs[models[0]]["data_return_per_seed"])}
             for t, rs in per_task.items()}
    print0(f"[{NAME}] mean episode return (mean ± std over {len(cfg.run.seeds)} seeds; "
           f"{cfg.run.eval_episodes} episodes each; best possible 1.0)")
    return study.finish({"config": to_dict(cfg), "results": per_task,
                         "wall_time_s": time.perf_counter() - t0},
                        study.table(stats, [*models, "data"], label="task"))


EXPERIMENT = Experiment(
    name=NAME,
    config=CONFIGS / f"{NAME}.yaml",
    config_cls=Config,
    run=run,
    description="ELMUR vs a memoryless transformer and a GRU on POPGym (offline RC-BC)",
)

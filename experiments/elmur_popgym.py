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
mean episode return per task, mean and std over seeds. Writes
results/elmur_popgym/{summary.json, metrics.jsonl, returns.png}.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from experiments import CONFIGS
from jaxrl_suite.algorithms.rcbc import (
    ARCHS,
    PolicyConfig,
    RCBCConfig,
    SeqPolicy,
    evaluate_seeds,
    popgym_task,
    token_dim,
    train_seeds,
)
from jaxrl_suite.core.config import to_dict
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.core.metrics import MetricsLogger, pyplot, save_figure, write_json
from jaxrl_suite.core.parallel import make_mesh, print0
from jaxrl_suite.core.study import check_seeds, check_variants
from jaxrl_suite.envs.popgym import DIFFICULTIES, POPGYM_NAMES, make_popgym
from jaxrl_suite.models.elmur import ELMURConfig

NAME = "elmur_popgym"


@dataclasses.dataclass(frozen=True)
class RunConfig:
    seeds: tuple[int, ...] = (0, 1, 2)  # vmapped in one program per model and task
    tasks: tuple[str, ...] = POPGYM_NAMES
    difficulties: tuple[str, ...] = ("easy",)
    models: tuple[str, ...] = ARCHS
    eval_episodes: int = 32  # per seed


@dataclasses.dataclass(frozen=True)
class Config:
    elmur: ELMURConfig = dataclasses.field(
        default_factory=lambda: ELMURConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64,
                                            mem_slots=8, segment_len=16, pre_norm=False,
                                            detach_memory=False)
    )
    gru_hidden: int = 64
    rcbc: RCBCConfig = dataclasses.field(
        default_factory=lambda: RCBCConfig(num_episodes=512, batch_size=32, num_updates=1000,
                                           lr=1e-3, eps_max=0.5)
    )
    run: RunConfig = dataclasses.field(default_factory=RunConfig)

    def __post_init__(self):
        for field, given, valid in (("run.tasks", self.run.tasks, POPGYM_NAMES),
                                    ("run.difficulties", self.run.difficulties, DIFFICULTIES),
                                    ("run.models", self.run.models, ARCHS)):
            check_variants(given, valid, field)
        check_seeds(self.run.seeds)


def run(cfg: Config, opts: RunOptions) -> dict:
    t0 = time.perf_counter()
    logger = MetricsLogger(opts.out_dir, tensorboard=opts.tensorboard)
    results, step = {}, 0
    for name in cfg.run.tasks:
        for difficulty in cfg.run.difficulties:
            label = f"{name}-{difficulty}"
            task = popgym_task(name, difficulty, cfg.elmur.segment_len)
            env, env_params = make_popgym(name, difficulty)
            results[label] = {}
            for model in cfg.run.models:
                pcfg = PolicyConfig(arch=model, elmur=cfg.elmur, gru_hidden=cfg.gru_hidden)
                policy = SeqPolicy(pcfg, token_dim(task), task.num_actions)
                t_train = time.perf_counter()
                params, metrics = jax.block_until_ready(
                    train_seeds(cfg.rcbc, pcfg, task, cfg.run.seeds, make_mesh()))
                t_train = time.perf_counter() - t_train
                ev = evaluate_seeds(policy, env, cfg.run.eval_episodes, 1.0,
                                    cfg.rcbc.return_scale)
                out = ev(params, jax.random.key(7), env_params, task.horizon)
                per_seed = np.asarray(out["return"], np.float64).mean(axis=1)  # [S]
                results[label][model] = {
                    "return_mean": float(per_seed.mean()), "return_std": float(per_seed.std()),
                    "return_per_seed": per_seed,
                    "data_return": float(np.asarray(metrics["data_return"]).mean()),
                    "final_loss": float(np.asarray(metrics["loss"])[:, -1].mean()),
                    "train_wall_s": t_train,
                }
                step += 1
                logger.log({"step": step, "task": label, "model": model,
                            "return": float(per_seed.mean()),
                            "final_loss": results[label][model]["final_loss"]})
                if opts.progress:
                    print0(f"[{NAME}] {label} {model}: return {per_seed.mean():.3f} +- "
                           f"{per_seed.std():.3f} ({t_train:.0f} s training)")
    logger.close()
    summary = {"config": to_dict(cfg), "results": results,
               "wall_time_s": time.perf_counter() - t0}
    write_json(opts.out_dir / "summary.json", summary)
    _plot(cfg, results, opts.out_dir / "returns.png")
    models = cfg.run.models
    lines = [f"[{NAME}] mean episode return (mean +- std over {len(cfg.run.seeds)} seeds; "
             f"{cfg.run.eval_episodes} episodes each; best possible 1.0)",
             f"{'task':<26}" + "".join(f"{m:>18}" for m in models) + f"{'data':>8}"]
    for label, r in results.items():
        cells = "".join(f"{r[m]['return_mean']:>11.3f} +- {r[m]['return_std']:.3f}"
                        for m in models)
        lines.append(f"{label:<26}{cells}{r[models[0]]['data_return']:>8.3f}")
    print0("\n".join(lines))
    return summary


def _plot(cfg: Config, results: dict, path) -> None:
    plt = pyplot()
    labels, models = list(results), cfg.run.models
    fig, ax = plt.subplots(figsize=(max(6.4, 2.2 * len(labels)), 4.0))
    width = 0.8 / len(models)
    x = np.arange(len(labels))
    for i, model in enumerate(models):
        m = [results[t][model]["return_mean"] for t in labels]
        s = [results[t][model]["return_std"] for t in labels]
        ax.bar(x + (i - (len(models) - 1) / 2) * width, m, width, yerr=s, capsize=3, label=model)
    ax.set_xticks(x, labels, rotation=10)
    ax.set_ylabel("mean episode return")
    ax.set_ylim(-1.05, 1.05)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_title(f"POPGym, offline RC-BC (mean +- std, {len(cfg.run.seeds)} seeds)")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    save_figure(fig, path)


EXPERIMENT = Experiment(
    name=NAME,
    config=CONFIGS / f"{NAME}.yaml",
    config_cls=Config,
    run=run,
    description="ELMUR vs a memoryless transformer and a GRU on POPGym (offline RC-BC)",
)

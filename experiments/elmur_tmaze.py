"""ELMUR on the passive T-Maze: train on short corridors, act in corridors up to 10^6 steps.

Claim checked (Cherepanov, Kovalev, Panov, "ELMUR: External Layer Memory with Update/Rewrite for
Long-Horizon RL", arXiv 2510.07151): with layer memory and the LRU update, a transformer whose
context is a short segment retains the T-Maze cue over horizons far beyond its context and beyond
its training lengths; the paper reports 100 % success up to 1,000,000 steps.

    jaxrl-suite run elmur_tmaze            # full size (3 seeds x 2 models; 27 min on 2 CPU cores)
    jaxrl-suite run elmur_tmaze --smoke    # seconds; what the tests run

Both models are trained offline with return-conditioned behaviour cloning (`algorithms.rcbc`) on
RATE's oracle trajectories in corridors of `train.min_length..train.max_length` steps, the same
data and settings for each: ELMUR, and the same transformer with memory read and write switched
off (its context is the current segment only). Each is then evaluated online, step by step with
`SeqPolicy.step` (O(1) per step, constant memory), on corridors of every length in
`eval.lengths`. Reported: success rate (correct turn at the junction) per length, mean and std
over seeds, and the evaluation's wall time per environment step. Writes
results/elmur_tmaze/{summary.json, metrics.jsonl, success.png}.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments import CONFIGS
from jaxrl_suite.algorithms.rcbc import (
    PolicyConfig,
    RCBCConfig,
    SeqPolicy,
    evaluate_seeds,
    tmaze_task,
    token_dim,
    train_seeds,
)
from jaxrl_suite.core.config import to_dict
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.core.metrics import MetricsLogger, pyplot, save_figure, write_json
from jaxrl_suite.core.parallel import make_mesh, print0
from jaxrl_suite.core.study import check_seeds, check_variants
from jaxrl_suite.envs.tmaze import TMaze, tmaze_params
from jaxrl_suite.models.elmur import ELMURConfig

NAME = "elmur_tmaze"
MODELS = ("elmur", "transformer")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    min_length: int = 1  # corridor lengths of the training data ~ U{min..max}
    max_length: int = 300


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    lengths: tuple[int, ...] = (100, 1_000, 10_000, 100_000, 1_000_000)
    episodes: tuple[int, ...] = (16, 16, 16, 16, 4)  # per seed, one entry per length


@dataclasses.dataclass(frozen=True)
class RunConfig:
    seeds: tuple[int, ...] = (0, 1, 2)  # vmapped in one program per model
    models: tuple[str, ...] = MODELS


def _default_elmur() -> ELMURConfig:
    # The authors' T-Maze run: memory of 2 slots, lru_blend_alpha 0.79, post-LN, context 10;
    # d_model 32 and 2 heads here (theirs: 128, 2) to fit a CPU.
    return ELMURConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, mem_slots=2, segment_len=10,
                       alpha=0.79, pre_norm=False, detach_memory=False)


@dataclasses.dataclass(frozen=True)
class Config:
    elmur: ELMURConfig = dataclasses.field(default_factory=_default_elmur)
    rcbc: RCBCConfig = dataclasses.field(
        default_factory=lambda: RCBCConfig(num_episodes=512, batch_size=32, num_updates=1000,
                                           lr=1e-3)
    )
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)

    def __post_init__(self):
        check_variants(self.run.models, MODELS, "run.models")
        check_seeds(self.run.seeds)
        if len(self.eval.episodes) != len(self.eval.lengths):
            raise ValueError(
                f"eval.episodes has {len(self.eval.episodes)} entries, eval.lengths "
                f"{len(self.eval.lengths)}: give one episode count per length"
            )
        if min(self.eval.lengths, default=1) < 1:
            raise ValueError("eval.lengths must all be >= 1")


def run(cfg: Config, opts: RunOptions) -> dict:
    t0 = time.perf_counter()
    task = tmaze_task(cfg.train.min_length, cfg.train.max_length, cfg.elmur.segment_len)
    logger = MetricsLogger(opts.out_dir, tensorboard=opts.tensorboard)
    results, step = {}, 0
    for model in cfg.run.models:
        pcfg = PolicyConfig(arch=model, elmur=cfg.elmur)
        policy = SeqPolicy(pcfg, token_dim(task), task.num_actions)
        t_train = time.perf_counter()
        params, metrics = jax.block_until_ready(
            train_seeds(cfg.rcbc, pcfg, task, cfg.run.seeds, make_mesh()))
        t_train = time.perf_counter() - t_train
        loss = np.asarray(metrics["loss"])  # [S, blocks]
        for b in range(loss.shape[1]):
            step += 1
            logger.log({"step": step, "model": model, "update": (b + 1) * cfg.rcbc.log_every,
                        "loss": float(loss[:, b].mean()),
                        "accuracy": float(np.asarray(metrics["accuracy"])[:, b].mean())})
        per_length = {}
        evaluators = {}
        for length, episodes in zip(cfg.eval.lengths, cfg.eval.episodes, strict=True):
            if episodes not in evaluators:  # compile outside the timing: one short corridor
                evaluators[episodes] = evaluate_seeds(policy, TMaze(), episodes, 1.0)
                jax.block_until_ready(evaluators[episodes](
                    params, jax.random.key(0), tmaze_params(jnp.int32(1)), jnp.int32(3)))
            ev = evaluators[episodes]
            key = jax.random.key(10_000 + length)
            env_params = tmaze_params(jnp.int32(length))
            t_eval = time.perf_counter()
            out = jax.block_until_ready(ev(params, key, env_params, jnp.int32(length + 2)))
            t_eval = time.perf_counter() - t_eval
            succ = np.asarray(out["success"], np.float64)  # [S, E]
            steps = int(np.asarray(out["length"]).max())
            per_seed = succ.mean(axis=1)
            per_length[length] = {
                "success_mean": float(per_seed.mean()), "success_std": float(per_seed.std()),
                "success_per_seed": per_seed, "episodes_per_seed": episodes,
                "episode_steps": steps, "eval_wall_s": t_eval,
                "us_per_step": 1e6 * t_eval / max(steps, 1),
            }
            step += 1
            logger.log({"step": step, "model": model, "corridor_length": length,
                        "success": float(per_seed.mean()), "eval_wall_s": t_eval})
            if opts.progress:
                print0(f"[{NAME}] {model}: L={length:,} success {per_seed.mean():.2f} "
                       f"+- {per_seed.std():.2f} ({t_eval:.1f} s)")
        results[model] = {"train_wall_s": t_train, "final_loss": float(loss[:, -1].mean()),
                          "data_return": float(np.asarray(metrics["data_return"]).mean()),
                          "lengths": per_length}
    logger.close()
    summary = {"config": to_dict(cfg), "results": results,
               "wall_time_s": time.perf_counter() - t0}
    if "elmur" in results:
        summary["claim"] = {
            "paper": "100% success up to 1,000,000 steps",
            "elmur_success_at_longest": results["elmur"]["lengths"][max(cfg.eval.lengths)][
                "success_mean"],
        }
    write_json(opts.out_dir / "summary.json", summary)
    _plot(cfg, results, opts.out_dir / "success.png")
    header = f"{'model':<13}" + "".join(f"{'L=' + f'{n:,}':>18}" for n in cfg.eval.lengths)
    lines = [f"[{NAME}] T-Maze success (mean +- std over {len(cfg.run.seeds)} seeds; trained on "
             f"L <= {cfg.train.max_length}, segment {cfg.elmur.segment_len})", header]
    for model, r in results.items():
        cells = "".join(
            f"{r['lengths'][n]['success_mean']:>11.2f} +- {r['lengths'][n]['success_std']:.2f}"
            for n in cfg.eval.lengths)
        lines.append(f"{model:<13}{cells}")
    lines.append("eval time per env step (us): " + ", ".join(
        f"{m} " + "/".join(f"{r['lengths'][n]['us_per_step']:.0f}" for n in cfg.eval.lengths)
        for m, r in results.items()))
    print0("\n".join(lines))
    return summary


def _plot(cfg: Config, results: dict, path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    x = np.asarray(cfg.eval.lengths)
    for model, r in results.items():
        m = np.array([r["lengths"][n]["success_mean"] for n in cfg.eval.lengths])
        s = np.array([r["lengths"][n]["success_std"] for n in cfg.eval.lengths])
        (line,) = ax.plot(x, m, "o-", lw=2, label=model)
        ax.fill_between(x, m - s, m + s, color=line.get_color(), alpha=0.2)
    ax.axhline(0.5, color="k", ls="--", lw=1, label="memoryless (50 %)")
    ax.set_xscale("log")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("corridor length")
    ax.set_ylabel("success rate")
    ax.set_title(f"T-Maze, trained on L <= {cfg.train.max_length} (mean +- std, "
                 f"{len(cfg.run.seeds)} seeds)")
    ax.legend()
    ax.grid(alpha=0.3)
    save_figure(fig, path)


EXPERIMENT = Experiment(
    name=NAME,
    config=CONFIGS / f"{NAME}.yaml",
    config_cls=Config,
    run=run,
    description="ELMUR vs a memoryless transformer on T-Maze corridors up to 10^6 steps",
)

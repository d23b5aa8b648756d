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
over seeds, and the evaluation's wall time per environment step. Each model is a `Study` unit:
writes results/elmur_tmaze/{config.json, summary.json, table.md, success.png} and per model
runs/MODEL/{metrics.jsonl (training blocks, then one record per length), result.json};
`--resume` skips the models already finished.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.algorithms.rcbc import (
    PolicyConfig,
    RCBCConfig,
    SeqPolicy,
    evaluate_seeds,
    fit_seeds,
    tmaze_task,
    token_dim,
)
from jaxrl_suite.core.config import Count, Seed, check_fields, to_dict
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.core.metrics import WandbConfig
from jaxrl_suite.core.parallel import make_mesh, print0
from jaxrl_suite.core.study import Study, check_seeds, check_variants, seed_stats
from jaxrl_suite.envs.tmaze import TMaze, tmaze_params
from jaxrl_suite.models.elmur import ELMURConfig
from jaxrl_suite_experiments import CONFIGS

NAME = "elmur_tmaze"
MODELS = ("elmur", "transformer")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    min_length: Count = 1  # corridor lengths of the training data ~ U{min..max}
    max_length: Count = 300

    def __post_init__(self):
        check_fields(self, "train.")  # the Ranges declared above


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    lengths: tuple[Count, ...] = (100, 1_000, 10_000, 100_000, 1_000_000)  # corridor lengths
    episodes: tuple[Count, ...] = (16, 16, 16, 16, 4)  # per seed, one entry per length

    def __post_init__(self):
        check_fields(self, "eval.")  # the Ranges declared above


@dataclasses.dataclass(frozen=True)
class RunConfig:
    seeds: tuple[Seed, ...] = (0, 1, 2)  # vmapped in one program per model
    models: tuple[str, ...] = MODELS
    wandb: WandbConfig = WandbConfig()  # log to W&B as --wandb does (`enabled: true`)

    def __post_init__(self):
        check_fields(self, "run.")  # the Ranges declared above


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


def run(cfg: Config, opts: RunOptions) -> dict:
    t0 = time.perf_counter()
    task = tmaze_task(cfg.train.min_length, cfg.train.max_length, cfg.elmur.segment_len)
    lengths = cfg.eval.lengths
    study = Study(NAME, opts, variants=cfg.run.models, seeds=cfg.run.seeds)
    study.write_config(cfg)

    def train_unit(model: str) -> dict:
        pcfg = PolicyConfig(arch=model, elmur=cfg.elmur)
        policy = SeqPolicy(pcfg, token_dim(task), task.num_actions)
        logger = study.unit_log(model)
        params, metrics, t_train = fit_seeds(cfg.rcbc, pcfg, task, cfg.run.seeds, logger,
                                             make_mesh())
        loss = np.asarray(metrics["loss"])  # [S, blocks]
        per_length, evaluators = {}, {}
        for i, (length, episodes) in enumerate(zip(lengths, cfg.eval.episodes, strict=True)):
            if episodes not in evaluators:  # compile outside the timing: one short corridor
                evaluators[episodes] = evaluate_seeds(policy, TMaze(), episodes, 1.0)
                jax.block_until_ready(evaluators[episodes](
                    params, jax.random.key(0), tmaze_params(jnp.int32(1)), jnp.int32(3)))
            t_eval = time.perf_counter()
            out = jax.block_until_ready(evaluators[episodes](
                params, jax.random.key(10_000 + length), tmaze_params(jnp.int32(length)),
                jnp.int32(length + 2)))
            t_eval = time.perf_counter() - t_eval
            per_seed = np.asarray(out["success"], np.float64).mean(axis=1)  # [S]
            steps = int(np.asarray(out["length"]).max())
            per_length[str(length)] = {
                "success_mean": float(per_seed.mean()), "success_std": float(per_seed.std()),
                "success_per_seed": per_seed, "episodes_per_seed": episodes,
                "episode_steps": steps, "eval_wall_s": t_eval,
                "us_per_step": 1e6 * t_eval / max(steps, 1),
            }
            logger.log({"step": loss.shape[1] + i + 1, "corridor_length": length,
                        "success": float(per_seed.mean()), "eval_wall_s": t_eval})
        logger.close()
        return {"train_wall_s": t_train, "final_loss": float(loss[:, -1].mean()),
                "data_return": float(np.asarray(metrics["data_return"]).mean()),
                "lengths": per_length}

    results = study.run_units(cfg.run.models, train_unit, fmt=lambda r: "success " + ", ".join(
        f"L={n} {c['success_mean']:.2f}" for n, c in r["lengths"].items()))
    success = {m: np.array([r["lengths"][str(n)]["success_per_seed"] for n in lengths]).T
               for m, r in results.items()}  # [S, L]
    stats = {m: {"success": seed_stats(s), **{f"L={n}": seed_stats(s[:, i])
                                             for i, n in enumerate(lengths)}}
             for m, s in success.items()}
    study.plot_means(lengths, stats, "success", opts.out_dir / "success.png",
                     reference=("memoryless (50 %)", [0.5] * len(lengths)), xscale="log",
                     xlabel="corridor length", ylabel="success rate")
    summary = {"config": to_dict(cfg), "results": results,
               "wall_time_s": time.perf_counter() - t0}
    if "elmur" in results:
        summary["claim"] = {
            "paper": "100% success up to 1,000,000 steps",
            "elmur_success_at_longest": results["elmur"]["lengths"][str(max(lengths))][
                "success_mean"],
        }
    print0(f"[{NAME}] T-Maze success (mean ± std over {len(cfg.run.seeds)} seeds; trained on "
           f"L <= {cfg.train.max_length}, segment {cfg.elmur.segment_len})")
    cols = {f"L={n}": f"L={n:,}" for n in lengths}
    table = study.table(stats, cols, formats=dict.fromkeys(cols, ".2f"))
    timing = "eval time per env step (us): " + ", ".join(
        f"{m} " + "/".join(f"{r['lengths'][str(n)]['us_per_step']:.0f}" for n in lengths)
        for m, r in results.items())
    return study.finish(summary, f"{table}\n{timing}\n")


EXPERIMENT = Experiment(
    name=NAME,
    config=CONFIGS / f"{NAME}.yaml",
    config_cls=Config,
    run=run,
    description="ELMUR vs a memoryless transformer on T-Maze corridors up to 10^6 steps",
)

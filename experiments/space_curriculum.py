"""SPaCE vs round-robin, random and SPDRL curricula on a family of CartPole instances.

Claim checked (Eimer, Biedenkapp, Hutter, Lindauer, "Self-Paced Context Evaluation for Contextual
Reinforcement Learning", ICML 2021): ordering the training instances by the critic's value
improvement (SPaCE) learns the whole instance set faster than cycling through it (round robin).

    jaxrl-suite run space_curriculum            # full size (8 seeds x 4 curricula x 5e5 steps)
    jaxrl-suite run space_curriculum --smoke    # seconds; what the tests run

The instance set is a grid of pole lengths x force magnitudes (24 instances by default); the
context is visible to the agent (SPaCE ranks instances by V(s0 | c), which needs it). Every
curriculum trains PPO with the same settings and seeds; after every `eval_every` iterations the
deterministic policy is evaluated on all instances. Reported: environment steps until the mean
return over the full instance set first reaches `threshold` (median over seeds; seeds that never
reach it count as not reached), and learning curves with IQR bands. Writes
results/space_curriculum/{summary.json, table.md, learning_curves.png} and per curriculum
runs/NAME/{metrics.jsonl, result.json}; checkpoints after every chunk (checkpoints/NAME), so
`--resume` loses nothing.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Annotated

import numpy as np

from jaxrl_suite.algorithms.ppo import PPOConfig, fit_unit
from jaxrl_suite.core.config import (
    Count,
    NonNegative,
    NonNegativeInt,
    Positive,
    Range,
    Seed,
    check_fields,
    to_dict,
)
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.core.metrics import WandbConfig
from jaxrl_suite.core.study import Study, check_seeds, check_variants
from jaxrl_suite.curricula import make_curriculum
from jaxrl_suite.envs.contextual import CONTEXT_SPACES
from jaxrl_suite_experiments import CONFIGS

NAME = "space_curriculum"
CURRICULA = ("space", "round_robin", "random", "spdrl")


@dataclasses.dataclass(frozen=True)
class InstanceConfig:
    features: tuple[str, ...] = ("length", "force_mag")
    # the values of features[0] and features[1] (any finite values: the environment's context
    # space bounds them)
    values_x: tuple[Annotated[float, Range()], ...] = (0.15, 0.3, 0.5, 0.8, 1.2, 1.8)
    values_y: tuple[Annotated[float, Range()], ...] = (3.0, 6.0, 10.0, 15.0)

    def __post_init__(self):
        check_fields(self, "instances.")  # the Ranges declared above


@dataclasses.dataclass(frozen=True)
class SpaceConfig:
    eta: NonNegative = 0.1  # stagnation threshold on the relative change of the mean value
    kappa: Count = 1  # instances added when the set stagnates (and the initial set size)
    ordering: str = "improvement"  # "improvement" | "relative_improvement" | "absolute"
    initial: str = "random"  # initial set: "random" kappa instances or the "first" kappa

    def __post_init__(self):
        check_fields(self, "space.")  # the Ranges declared above


@dataclasses.dataclass(frozen=True)
class SpdrlConfig:
    epsilon: Positive = 0.25  # KL trust region per update
    # updates before the pull toward the target starts (0: at once)
    alpha_offset: NonNegativeInt = 10
    zeta: NonNegative = 1.6  # alpha = zeta * mean V / KL(p || mu)
    num_samples: Count = 64  # contexts drawn per update for the value estimate

    def __post_init__(self):
        check_fields(self, "spdrl.")  # the Ranges declared above


@dataclasses.dataclass(frozen=True)
class RunConfig:
    seeds: tuple[Seed, ...] = tuple(range(8))  # seeds per curriculum, vmapped in one program
    curricula: tuple[str, ...] = CURRICULA
    # mean return over all instances (80 % of CartPole's max of 500); a return: any finite value
    threshold: Annotated[float, Range()] = 400.0
    wandb: WandbConfig = WandbConfig()  # log to W&B as --wandb does (`enabled: true`)

    def __post_init__(self):
        check_fields(self, "run.")  # the Ranges declared above


@dataclasses.dataclass(frozen=True)
class Config:
    ppo: PPOConfig = dataclasses.field(
        default_factory=lambda: PPOConfig(env="CartPole-v1", eval_every=61)
    )
    instances: InstanceConfig = dataclasses.field(default_factory=InstanceConfig)
    space: SpaceConfig = dataclasses.field(default_factory=SpaceConfig)
    spdrl: SpdrlConfig = dataclasses.field(default_factory=SpdrlConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)

    def __post_init__(self):
        check_variants(self.run.curricula, CURRICULA, "run.curricula")
        check_seeds(self.run.seeds)
        if len(self.instances.features) != 2:
            raise ValueError("instances.features must name exactly two features")
        if not self.ppo.eval_every:
            raise ValueError("ppo.eval_every must be > 0 (the learning curves need evaluations)")


def instance_set(cfg: Config) -> np.ndarray:
    ic = cfg.instances
    return np.array(list(itertools.product(ic.values_x, ic.values_y)), np.float32)


def build_curriculum(cfg: Config, name: str, instances: np.ndarray):
    if name == "space":
        s = cfg.space
        return make_curriculum("space", instances, eta=s.eta, kappa=s.kappa, ordering=s.ordering,
                               initial=s.initial)
    if name == "spdrl":
        space = CONTEXT_SPACES[cfg.ppo.env]
        lower = np.array([space[f][1] for f in cfg.instances.features], np.float32)
        upper = np.array([space[f][2] for f in cfg.instances.features], np.float32)
        d = cfg.spdrl
        return make_curriculum(
            "spdrl", instances, epsilon=d.epsilon, alpha_offset=d.alpha_offset, zeta=d.zeta,
            num_samples=d.num_samples, lower=lower, upper=np.minimum(upper, 1e6),
        )
    return make_curriculum(name, instances)


def steps_to_threshold(curve: np.ndarray, steps: np.ndarray, threshold: float) -> float:
    """First entry of `steps` where `curve` >= threshold; inf if never."""
    hit = np.nonzero(curve >= threshold)[0]
    return float(steps[hit[0]]) if hit.size else float("inf")


def run(cfg: Config, opts: RunOptions) -> dict:
    t0 = time.perf_counter()
    study = Study(NAME, opts, variants=cfg.run.curricula, seeds=cfg.run.seeds)
    study.write_config(cfg)
    instances = instance_set(cfg)
    pcfg = dataclasses.replace(
        cfg.ppo, context_features=cfg.instances.features, visible_features=cfg.instances.features
    )
    num_chunks = pcfg.num_updates // pcfg.eval_every
    steps = pcfg.eval_every * pcfg.num_envs * pcfg.num_steps * np.arange(1, num_chunks + 1)

    def record(metrics, evals) -> dict:  # per chunk: medians over seeds
        return {"mean_return_all_instances": float(np.median(evals.mean(axis=1))),
                **{k: float(np.median(v[:, -1])) for k, v in metrics.items()
                   if k.startswith("curriculum/")}}

    def train(name: str) -> dict:  # every seed of one curriculum, resumable after each chunk
        metrics, evals = fit_unit(study, name, pcfg, cfg.run.seeds, record=record,
                                  curriculum=build_curriculum(cfg, name, instances),
                                  eval_contexts=instances)
        curve = evals.mean(axis=2)  # [S, chunks] mean return over all instances
        return {"curve": curve, "final_mean_return": curve[:, -1],
                "auc_mean_return": curve.mean(axis=1),
                "steps_to_threshold_per_seed": [steps_to_threshold(x, steps, cfg.run.threshold)
                                                for x in curve],
                "final_curriculum_metrics": {k: float(np.median(v[:, -1])) for k, v in
                                             metrics.items() if k.startswith("curriculum/")}}

    runs = study.run_units(cfg.run.curricula, train, fmt=lambda r: "final return over the "
                           f"instances, median {np.median(r['final_mean_return']):.1f}")
    stats = Study.unit_stats(runs, ("final_mean_return", "auc_mean_return"))
    results = {}
    for c, r in runs.items():
        reach = np.asarray(r["steps_to_threshold_per_seed"])  # inf where never reached
        results[c] = {"steps_to_threshold_per_seed": reach,
                      "steps_to_threshold_median": float(np.median(reach)),
                      "seeds_reached": int(np.isfinite(reach).sum()), **stats[c],
                      "final_curriculum_metrics": r["final_curriculum_metrics"]}
    summary = {
        "config": to_dict(cfg), "instances": instances, "env_steps": steps,
        "threshold": cfg.run.threshold, "results": results,
        "wall_time_s": time.perf_counter() - t0,
    }
    if {"space", "round_robin"} <= set(results):
        summary["claim"] = {
            "space_steps_median": results["space"]["steps_to_threshold_median"],
            "round_robin_steps_median": results["round_robin"]["steps_to_threshold_median"],
            "space_auc_median": results["space"]["auc_mean_return"]["median"],
            "round_robin_auc_median": results["round_robin"]["auc_mean_return"]["median"],
        }
    study.plot_curves(
        runs, "curve", opts.out_dir / "learning_curves.png", x=steps,
        xlabel="env steps per seed", ylabel=f"mean return over {len(instances)} instances",
        hline=cfg.run.threshold,
        title=f"Curricula on {cfg.ppo.env}: median and IQR over {len(cfg.run.seeds)} seeds",
    )
    rows = {c: {**r, "reached": f"{r['seeds_reached']}/{len(cfg.run.seeds)}"}
            for c, r in results.items()}
    table = study.table(rows, {"steps_to_threshold_median": "steps (median)", "reached":
                               "reached", "final_mean_return": "final return",
                               "auc_mean_return": "mean over training"},
                        cell="median", label="curriculum",
                        formats={"steps_to_threshold_median": ",.0f", "final_mean_return": ".1f",
                                 "auc_mean_return": ".1f"})
    return study.finish(summary, f"Steps to mean return >= {cfg.run.threshold:g} on all "
                        f"{len(instances)} instances, median [IQR] over {len(cfg.run.seeds)} "
                        f"seeds\n\n{table}")


EXPERIMENT = Experiment(
    name=NAME,
    config=CONFIGS / f"{NAME}.yaml",
    config_cls=Config,
    run=run,
    description="SPaCE vs round-robin, random and SPDRL curricula on 24 CartPole instances",
)

"""CARL: does a visible context help PPO generalise to held-out CartPole physics?

Claim checked (Benjamins et al., "Contextualize Me -- The Case for Context in Reinforcement
Learning", TMLR 2023; CARL): training on a context distribution and making the context visible to
the agent closes part of the generalisation gap to unseen contexts.

    jaxrl-suite run carl_generalization            # full size (8 seeds x 3 variants x 5e5 steps)
    jaxrl-suite run carl_generalization --smoke    # seconds; what the tests run

Variants (all PPO, PureJaxRL's CartPole settings, seeds vmapped in one program each):
  default_hidden  - trained on the default context only
  dist_hidden     - trained on contexts drawn uniformly within +-train_width of the defaults,
                    context not observed
  dist_visible    - the same distribution, the context features appended to the observation
Each is evaluated (deterministic policy) on a grid of pole length x gravity that reaches well
outside the training box. Writes results/carl_generalization/{summary.json, table.md,
heatmap.png, learning_curves.png} and per variant runs/VARIANT/{metrics.jsonl, result.json};
checkpoints after every chunk (checkpoints/VARIANT), so `--resume` loses nothing.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Annotated

import numpy as np

from jaxrl_suite.algorithms.ppo import PPOConfig, fit_unit
from jaxrl_suite.core.config import Count, NonNegative, Range, Seed, check_fields, to_dict
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.core.metrics import WandbConfig, pyplot, save_figure
from jaxrl_suite.core.study import Study, check_seeds, check_variants
from jaxrl_suite.envs.contextual import CONTEXT_SPACES
from jaxrl_suite_experiments import CONFIGS

NAME = "carl_generalization"
VARIANTS = ("default_hidden", "dist_hidden", "dist_visible")
COLUMNS = {"default_context": "default ctx", "in_distribution": "in-dist grid",
           "held_out": "held-out grid"}  # of the result table


@dataclasses.dataclass(frozen=True)
class ContextConfig:
    features: tuple[str, ...] = ("length", "gravity")  # the two varied features (grid axes)
    train_width: NonNegative = 0.5  # training contexts: default * (1 + U(-w, w)) per feature
    # eval values of features[0] and features[1] (any finite values: the environment's context
    # space bounds them)
    grid_x: tuple[Annotated[float, Range()], ...] = (0.1, 0.25, 0.5, 1.0, 2.0)
    grid_y: tuple[Annotated[float, Range()], ...] = (2.0, 5.0, 9.8, 20.0, 40.0)

    def __post_init__(self):
        check_fields(self, "context.")  # the Ranges declared above


@dataclasses.dataclass(frozen=True)
class RunConfig:
    seeds: tuple[Seed, ...] = tuple(range(8))  # seeds per variant, vmapped in one program
    variants: tuple[str, ...] = VARIANTS
    chunks: Count = 4  # evaluate on the grid (and checkpoint) this many times during training
    wandb: WandbConfig = WandbConfig()  # log to W&B as --wandb does (`enabled: true`)

    def __post_init__(self):
        check_fields(self, "run.")  # the Ranges declared above


@dataclasses.dataclass(frozen=True)
class Config:
    ppo: PPOConfig = dataclasses.field(
        default_factory=lambda: PPOConfig(env="CartPole-v1", eval_episodes=2)
    )
    context: ContextConfig = dataclasses.field(default_factory=ContextConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)

    def __post_init__(self):
        check_variants(self.run.variants, VARIANTS, "run.variants")
        check_seeds(self.run.seeds)
        if len(self.context.features) != 2:
            raise ValueError("context.features must name exactly two features (the grid axes)")
        if self.ppo.num_updates % self.run.chunks:
            raise ValueError(
                f"run.chunks={self.run.chunks} must divide the {self.ppo.num_updates} iterations"
            )


def variant_config(cfg: Config, variant: str) -> PPOConfig:
    hidden = variant != "dist_visible"
    return dataclasses.replace(
        cfg.ppo,
        context_features=cfg.context.features,
        visible_features=() if hidden else cfg.context.features,
        context_sampler="default" if variant == "default_hidden" else "uniform",
        context_width=0.0 if variant == "default_hidden" else cfg.context.train_width,
        eval_every=cfg.ppo.num_updates // cfg.run.chunks,
    )


def eval_grid(cfg: Config) -> tuple[np.ndarray, np.ndarray]:
    """[M, 2] grid contexts (x-major) and a boolean [M] mask of those inside the training box."""
    grid = np.array(list(itertools.product(cfg.context.grid_x, cfg.context.grid_y)), np.float32)
    space = CONTEXT_SPACES[cfg.ppo.env]
    defaults = np.array([space[f][0] for f in cfg.context.features], np.float32)
    w = cfg.context.train_width
    inside = np.all(np.abs(grid / defaults - 1.0) <= w + 1e-6, axis=1)
    return grid, inside


def run(cfg: Config, opts: RunOptions) -> dict:
    t0 = time.perf_counter()
    study = Study(NAME, opts, variants=cfg.run.variants, seeds=cfg.run.seeds)
    study.write_config(cfg)
    grid, inside = eval_grid(cfg)
    space = CONTEXT_SPACES[cfg.ppo.env]
    defaults = np.array([space[f][0] for f in cfg.context.features], np.float32)
    is_default = np.all(np.isclose(grid, defaults), axis=1)
    chunk_steps = (cfg.ppo.num_updates // cfg.run.chunks) * cfg.ppo.num_envs * cfg.ppo.num_steps

    def train(variant: str) -> dict:  # every seed of one variant, resumable after each chunk
        _, evals = fit_unit(study, variant, variant_config(cfg, variant), cfg.run.seeds,
                            eval_contexts=grid,
                            record=lambda m, e: {"grid_return": float(e.mean())})
        final = evals[:, -1]  # [S, M] returns after training
        result = {"in_distribution": final[:, inside].mean(1),
                  "held_out": final[:, ~inside].mean(1), "grid": final.mean(1),
                  "curve": evals.mean(axis=2),  # [S, chunks] mean grid return over training
                  "grid_median": np.median(final, axis=0).reshape(len(cfg.context.grid_x), -1)}
        result["gap"] = result["in_distribution"] - result["held_out"]
        if is_default.any():
            result["default_context"] = final[:, is_default].mean(axis=1)
        return result

    runs = study.run_units(cfg.run.variants, train, fmt=lambda r: "median held-out return "
                           f"{np.median(r['held_out']):.1f}")
    stats = Study.unit_stats(runs, ("default_context", "in_distribution", "held_out", "grid",
                                    "gap"))
    results = {v: {**stats[v], "grid_median": runs[v]["grid_median"]} for v in runs}
    summary = {
        "config": to_dict(cfg),
        "grid_x": list(cfg.context.grid_x), "grid_y": list(cfg.context.grid_y),
        "features": list(cfg.context.features), "inside_training_box": inside.tolist(),
        "results": results, "wall_time_s": time.perf_counter() - t0,
    }
    if {"dist_hidden", "dist_visible"} <= set(results):
        hid = results["dist_hidden"]["held_out"]["median"]
        vis = results["dist_visible"]["held_out"]["median"]
        summary["claim"] = {
            "held_out_median_hidden": hid, "held_out_median_visible": vis,
            "visible_minus_hidden": vis - hid,
            "gap_median_hidden": results["dist_hidden"]["gap"]["median"],
            "gap_median_visible": results["dist_visible"]["gap"]["median"],
        }
    _heatmap(cfg, results, inside, opts.out_dir / "heatmap.png")
    study.plot_curves(runs, "curve", opts.out_dir / "learning_curves.png",
                      x=chunk_steps * np.arange(1, cfg.run.chunks + 1),
                      xlabel="env steps per seed", ylabel="mean return over the eval grid",
                      title=f"CARL {cfg.ppo.env}: median and IQR over {len(cfg.run.seeds)} seeds")
    table = study.table(stats, COLUMNS, cell="median", label="variant",
                        formats=dict.fromkeys(COLUMNS, ".1f"))
    return study.finish(summary, f"Final deterministic return, median [IQR] over "
                        f"{len(cfg.run.seeds)} seeds\n\n{table}")


def _heatmap(cfg: Config, results: dict, inside: np.ndarray, path) -> None:
    plt = pyplot()
    n = len(results)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.8), squeeze=False)
    fx, fy = cfg.context.features
    for ax, (variant, r) in zip(axes[0], results.items(), strict=True):
        z = np.asarray(r["grid_median"]).T  # rows: y (gravity), cols: x (length)
        im = ax.imshow(z, origin="lower", vmin=0, vmax=500, cmap="viridis")
        for (i, j), val in np.ndenumerate(z):
            ax.text(j, i, f"{val:.0f}", ha="center", va="center", fontsize=7,
                    color="w" if val < 300 else "k")
        box = inside.reshape(len(cfg.context.grid_x), -1).T
        for (i, j), b in np.ndenumerate(box):
            if b:
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="r", lw=1.5))
        ax.set_xticks(range(len(cfg.context.grid_x)), [f"{v:g}" for v in cfg.context.grid_x])
        ax.set_yticks(range(len(cfg.context.grid_y)), [f"{v:g}" for v in cfg.context.grid_y])
        ax.set_xlabel(fx)
        ax.set_ylabel(fy)
        ax.set_title(variant)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="median return (red: training box)")
    fig.suptitle(f"CARL {cfg.ppo.env}: held-out contexts, {len(cfg.run.seeds)} seeds")
    save_figure(fig, path, tight=False, bbox_inches="tight")


EXPERIMENT = Experiment(
    name=NAME,
    config=CONFIGS / f"{NAME}.yaml",
    config_cls=Config,
    run=run,
    description="CARL: PPO with hidden vs visible context on held-out CartPole physics",
)

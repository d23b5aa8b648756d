"""ExIt: does training on single self-iteration steps teach improvement over many steps?

Claim checked (Jiang, Lupu and Bachrach, "Bootstrapping Task Spaces for Self-Improvement", arXiv
2509.04575): ExIt, which trains only on single-step iterations started from the most learnable
partial histories seen so far, gives a policy that keeps improving when run for more
self-iteration steps at inference than any training episode had.

    jaxrl-suite run exit_self_improve              # full size
    jaxrl-suite run exit_self_improve --smoke      # seconds; what the tests run
    jaxrl-suite run exit_self_improve --resume     # a killed run continues where it stopped

One SFT warm-up on the task's solutions, with a share `sft_iter_frac` of the prompts shown in the
self-iteration format (`envs.text.IterationMix`), then for every variant and seed a run from that
same SFT checkpoint:

    grpo     GRPO on turn-0 tasks only
    naive    GRPO on whole K-turn revision episodes (K = `variants.naive_turns`), the reward the
             final answer's score (`algorithms.exit.MultiTurnTrainer`)
    exit     ExIt (`algorithms.exit.ExItTrainer`: task buffer, self-divergence, diversity bonus)

Each is evaluated greedily for 1..`eval.steps` self-iteration steps on held-out tasks
(`algorithms.exit.evaluate_iterations`); training compute is the number of generated tokens.
Each run checkpoints under checkpoints/VARIANT_sSEED (ExIt: the buffer too) and writes
runs/VARIANT_sSEED/result.json, which a resumed study keeps. Writes results/exit_self_improve/
{summary.json, table.md, iterations.png}.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import jax
import numpy as np

from experiments.grpo_arithmetic import _print, _setup
from jaxrl_suite.algorithms.exit import (
    ExItConfig,
    ExItTrainer,
    MultiTurnTrainer,
    evaluate_iterations,
)
from jaxrl_suite.algorithms.grpo import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer
from jaxrl_suite.algorithms.loop import fit_resumable
from jaxrl_suite.core.config import to_dict
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.core.metrics import pyplot, read_metrics, save_figure, write_json
from jaxrl_suite.envs.text import IterationMix, Task, make_task
from jaxrl_suite.models.hf import ModelConfig

NAME = "exit_self_improve"
VARIANTS = ("grpo", "naive", "exit")
TASK_NAMES = ("sort", "countdown", "arithmetic")


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    name: str = "sort"  # "sort" (fraction in place), "countdown" (graded) or "arithmetic"
    num_items: int = 5  # sort: numbers per list
    max_value: int = 99  # sort: numbers lie in 0..max_value
    num_numbers: int = 3  # countdown
    max_number: int = 10  # countdown
    max_target: int = 50  # countdown
    digits: int = 3  # arithmetic
    seed: int = 0  # the task generator's seed (train and test splits are disjoint)
    prompt_len: int = 112  # prompts (self-iteration ones included) are left-padded to this

    def __post_init__(self):
        if self.name not in TASK_NAMES:
            raise ValueError(f"task.name must be one of {list(TASK_NAMES)}, got {self.name!r}")

    def build(self) -> Task:
        if self.name == "sort":
            return make_task("sort", num_items=self.num_items, max_value=self.max_value,
                             seed=self.seed)
        if self.name == "countdown":
            return make_task("countdown", num_numbers=self.num_numbers,
                             max_number=self.max_number, max_target=self.max_target,
                             graded=True, seed=self.seed)
        return make_task("arithmetic", digits=self.digits, seed=self.seed)


@dataclasses.dataclass(frozen=True)
class VariantsConfig:
    names: tuple[str, ...] = VARIANTS  # which variants to train
    naive_turns: int = 3  # K of the naive fixed-depth baseline

    def __post_init__(self):
        unknown = [n for n in self.names if n not in VARIANTS]
        if unknown or not self.names or len(set(self.names)) != len(self.names):
            raise ValueError(f"variants.names must be distinct entries of {list(VARIANTS)}, got "
                             f"{list(self.names)}")
        if self.naive_turns < 2:
            raise ValueError(f"variants.naive_turns must be >= 2, got {self.naive_turns}")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    num_examples: int = 128  # held-out tasks
    steps: int = 8  # self-iteration steps at evaluation (1 = the task prompt alone)
    batch_size: int = 64

    def __post_init__(self):
        if self.steps < 1 or self.num_examples < 1:
            raise ValueError("eval.steps and eval.num_examples must be >= 1")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    seed: int = 0  # model init and SFT seed (one SFT checkpoint for every run)
    seeds: tuple[int, ...] = (0, 1, 2)  # seeds of each variant
    tokenizer: str = "byt5"
    num_devices: int | None = None  # devices on the "data" mesh axis (None = all)
    checkpoint_every: int = 25
    keep_checkpoints: int = 1

    def __post_init__(self):
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"run.seeds must be distinct and non-empty, got {list(self.seeds)}")


@dataclasses.dataclass(frozen=True)
class Config:
    task: TaskConfig = TaskConfig()
    model: ModelConfig = ModelConfig()  # model.hf_path starts from a local HF checkpoint
    sft: SFTConfig = SFTConfig()
    sft_iter_frac: float = 0.5  # share of SFT prompts in the self-iteration format
    grpo: GRPOConfig = GRPOConfig()  # shared by every variant
    exit: ExItConfig = ExItConfig()
    variants: VariantsConfig = VariantsConfig()
    eval: EvalConfig = EvalConfig()
    run: RunConfig = RunConfig()

    def __post_init__(self):
        if not 0.0 <= self.sft_iter_frac <= 1.0:
            raise ValueError(f"sft_iter_frac must be in [0, 1], got {self.sft_iter_frac}")


def _run_name(variant: str, seed: int) -> str:
    return f"{variant}_s{seed}"


# variant -> its trainer over the shared GRPOTrainer (all follow the `fit` protocol)
TRAINERS = {
    "grpo": lambda cfg, grpo: grpo,
    "naive": lambda cfg, grpo: MultiTurnTrainer(grpo, cfg.variants.naive_turns,
                                                cfg.exit.max_previous_chars),
    "exit": lambda cfg, grpo: ExItTrainer(grpo, cfg.exit),
}


def run(cfg: Config, opts: RunOptions) -> dict:
    t_start = time.perf_counter()
    task = cfg.task.build()
    tokenizer, task, mesh, model, params, sft_key, grpo_key = _setup(cfg, task)
    if jax.process_index() == 0:
        write_json(opts.out_dir / "config.json", {"experiment": NAME, "config": to_dict(cfg)})
    common = dict(mesh=mesh, prompt_len=cfg.task.prompt_len)
    held_out = task.examples("test", 0, cfg.eval.num_examples)

    # ---- SFT on solutions, some prompts in the self-iteration format ----
    mix = IterationMix(task, p_iter=cfg.sft_iter_frac, p_div=cfg.exit.p_div, seed=cfg.run.seed,
                       max_previous_chars=cfg.exit.max_previous_chars)
    sft = SFTTrainer(model, tokenizer, mix, cfg.sft, max_new_tokens=cfg.grpo.max_new_tokens,
                     **common)
    sft_state = fit_resumable(
        sft, sft.init_state(params, sft_key), stage="sft", num_steps=cfg.sft.steps,
        checkpoint_dir=opts.out_dir / "checkpoints" / "sft", log_dir=opts.out_dir,
        save_every=cfg.run.checkpoint_every, keep=cfg.run.keep_checkpoints, resume=opts.resume,
        tensorboard=opts.tensorboard, progress=opts.progress)
    grpo_plain = GRPOTrainer(model, tokenizer, task, cfg.grpo, ref_params=sft_state.params,
                             **common)
    sft_scores = evaluate_iterations(grpo_plain, sft_state.params, held_out,
                                     steps=cfg.eval.steps, batch_size=cfg.eval.batch_size)
    _print(f"[{NAME}] SFT: score by step {np.round(sft_scores, 3).tolist()}")

    results: dict[str, dict] = {}
    for variant in cfg.variants.names:
        trainer = TRAINERS[variant](cfg, grpo_plain)
        for seed in cfg.run.seeds:
            name = _run_name(variant, seed)
            result_path = opts.out_dir / "runs" / name / "result.json"
            if opts.resume and result_path.is_file():
                results[name] = json.loads(result_path.read_text())
                _print(f"[{NAME}] {name}: done before ({_fmt(results[name])})")
                continue
            results[name] = _train_one(trainer, grpo_plain, sft_state.params, grpo_key,
                                       variant, seed, held_out, cfg, opts)
            if jax.process_index() == 0:
                write_json(result_path, results[name])
            _print(f"[{NAME}] {name}: {_fmt(results[name])}")

    variants = _aggregate(results, cfg)
    summary = {"experiment": NAME, "task": cfg.task.name, "sft_scores": sft_scores.tolist(),
               "variants": variants, "claim": _claim(variants, cfg),
               "heldout_examples": len(held_out), "wall_time_s": time.perf_counter() - t_start,
               "resumed": opts.resume, "config": to_dict(cfg)}
    if jax.process_index() == 0:
        _plot(opts.out_dir / "iterations.png", sft_scores, variants, cfg)
        (opts.out_dir / "table.md").write_text(_table(sft_scores, variants, cfg))
        write_json(opts.out_dir / "summary.json", summary)
        _print((opts.out_dir / "table.md").read_text())
    return summary


def _train_one(trainer, grpo: GRPOTrainer, sft_params, grpo_key, variant: str, seed: int,
               held_out, cfg: Config, opts: RunOptions) -> dict:
    """One resumable run; returns its per-step held-out scores and its training compute."""
    t0 = time.perf_counter()
    run_dir = opts.out_dir / "runs" / _run_name(variant, seed)
    state = fit_resumable(
        trainer, trainer.init_state(sft_params, jax.random.fold_in(grpo_key, seed)),
        stage=variant, num_steps=cfg.grpo.steps,
        checkpoint_dir=opts.out_dir / "checkpoints" / _run_name(variant, seed), log_dir=run_dir,
        save_every=cfg.run.checkpoint_every, keep=cfg.run.keep_checkpoints, resume=opts.resume,
        tensorboard=opts.tensorboard, progress=opts.progress, postfix=("reward", "tokens"))
    params = state.train.params if variant == "exit" else state.params
    scores = evaluate_iterations(grpo, params, held_out, steps=cfg.eval.steps,
                                 batch_size=cfg.eval.batch_size)
    records = read_metrics(run_dir / "metrics.jsonl")
    return {"variant": variant, "seed": seed, "scores": scores.tolist(),
            "train_tokens": float(sum(r["tokens"] for r in records)),
            "final_reward": float(np.mean([r["reward"] for r in records[-10:]])),
            "wall_time_s": time.perf_counter() - t0}


def _fmt(r: dict) -> str:
    s = r["scores"]
    return (f"score step 1 {s[0]:.3f}, step {len(s)} {s[-1]:.3f}; "
            f"{r['train_tokens'] / 1e3:.0f}k training tokens")


def _aggregate(results: dict[str, dict], cfg: Config) -> dict:
    out = {}
    for variant in cfg.variants.names:
        runs = [results[_run_name(variant, s)] for s in cfg.run.seeds]
        scores = np.array([r["scores"] for r in runs])  # [S, T]
        tokens = np.array([r["train_tokens"] for r in runs])
        out[variant] = {"scores_mean": scores.mean(0).tolist(),
                        "scores_std": scores.std(0).tolist(), "scores_per_seed": scores.tolist(),
                        "train_tokens_mean": float(tokens.mean())}
    return out


def _claim(variants: dict, cfg: Config) -> dict:
    """Gain from iterating past the naive baseline's training depth K: score(T) - score(K), and
    score(T) - score(1), per variant (mean over seeds)."""
    k = min(cfg.variants.naive_turns, cfg.eval.steps)
    return {v: {"gain_after_K": s["scores_mean"][-1] - s["scores_mean"][k - 1],
                "gain_total": s["scores_mean"][-1] - s["scores_mean"][0], "K": k}
            for v, s in variants.items()}


def _plot(path, sft_scores, variants: dict, cfg: Config) -> None:
    plt = pyplot()
    steps = np.arange(1, cfg.eval.steps + 1)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(steps, sft_scores, "k--", label="SFT (start)")
    for v, s in variants.items():
        mean, std = np.array(s["scores_mean"]), np.array(s["scores_std"])
        ax.plot(steps, mean, marker="o", label=v)
        ax.fill_between(steps, mean - std, mean + std, alpha=0.2)
    ax.axvline(cfg.variants.naive_turns, color="gray", lw=0.8, ls=":")
    ax.set_xlabel("self-iteration steps at evaluation (dotted: naive K)")
    ax.set_ylabel(f"held-out {cfg.task.name} score")
    ax.set_title(f"{cfg.task.name}: mean ± std over {len(cfg.run.seeds)} seeds")
    ax.legend()
    save_figure(fig, path)


def _table(sft_scores, variants: dict, cfg: Config) -> str:
    t = cfg.eval.steps
    cols = sorted({1, min(cfg.variants.naive_turns, t), t})
    head = "| model | " + " | ".join(f"score @ {c}" for c in cols) + " | training tokens |"
    lines = [head, "|---" * (len(cols) + 2) + "|",
             "| SFT (start) | " + " | ".join(f"{sft_scores[c - 1]:.3f}" for c in cols) + " | - |"]
    for v, s in variants.items():
        cells = [f"{s['scores_mean'][c - 1]:.3f} ± {s['scores_std'][c - 1]:.3f}" for c in cols]
        lines.append(f"| {v} | " + " | ".join(cells) + f" | {s['train_tokens_mean']:.3g} |")
    return "\n".join(lines) + "\n"


EXPERIMENT = Experiment(
    name=NAME, config_cls=Config, run=run,
    description="ExIt vs turn-0 GRPO and a naive K-turn baseline: score vs self-iteration steps",
)

if __name__ == "__main__":
    from jaxrl_suite.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))

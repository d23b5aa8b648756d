"""Entropy collapse and selective entropy regularisation: four GRPO variants on countdown.

Claims checked (SIREN, arXiv 2509.25133): in RL with verifiable rewards, (1) plain GRPO's policy
entropy collapses; (2) a naive entropy bonus (full vocabulary, every token) makes entropy explode;
(3) SIREN (top-p entropy of the peak-entropy tokens, anchored to the initial entropy) keeps entropy
in a band and gives the best held-out maj@k / pass@k.

    jaxrl-suite run siren_entropy              # full size (about 30 minutes on a 2-core CPU)
    jaxrl-suite run siren_entropy --smoke      # seconds; what the tests run
    jaxrl-suite run siren_entropy --resume     # a killed run continues where it stopped

One SFT warm-up (teacher forcing on the generator's expressions), then for every variant in
`variants.names` and every seed in `run.seeds` a GRPO run from that same SFT checkpoint:

    plain         GRPO (losses/grpo.py)
    naive         GRPO + naive_entropy_bonus, coef `variants.naive_coef`
    high_entropy  GRPO whose policy gradient keeps only the tokens at or above the
                  `variants.high_entropy_quantile` entropy quantile ("80/20")
    siren         GRPO + siren_regularizer, coef `variants.siren_coef`, anchor = the SFT policy's
                  H_bar measured on the first batch

Each run checkpoints under checkpoints/VARIANT_sSEED and logs runs/VARIANT_sSEED/metrics.jsonl;
a finished run writes runs/VARIANT_sSEED/result.json (held-out greedy accuracy, pass@k, maj@k),
which a resumed study keeps. Writes results/siren_entropy/{summary.json, table.md, entropy.png,
length.png, accuracy.png}.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import jax
import numpy as np

from experiments.grpo_arithmetic import _print, _setup
from jaxrl_suite.algorithms.grpo import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer
from jaxrl_suite.algorithms.loop import fit_resumable
from jaxrl_suite.core.config import to_dict
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.core.metrics import plot_iqr_bands, read_metrics, write_json
from jaxrl_suite.envs.text import Task, make_task
from jaxrl_suite.models.hf import ModelConfig

NAME = "siren_entropy"
VARIANTS = ("plain", "naive", "high_entropy", "siren")


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    name: str = "countdown"  # "countdown" or "arithmetic"
    num_numbers: int = 3  # countdown: numbers in the prompt
    max_number: int = 10  # countdown: numbers are drawn from 1..max_number
    max_target: int = 50  # countdown: targets lie in 1..max_target
    graded: bool = False  # countdown: partial credit for a valid expression that misses
    digits: int = 4  # arithmetic: operand digits
    seed: int = 0  # seed of the task's example generator (train and test splits are disjoint)
    prompt_len: int = 14  # prompts are left-padded to this many tokens

    def __post_init__(self):
        if self.name not in ("countdown", "arithmetic"):
            raise ValueError(f"name must be 'countdown' or 'arithmetic', got {self.name!r}")

    def build(self) -> Task:
        if self.name == "countdown":
            return make_task("countdown", num_numbers=self.num_numbers,
                             max_number=self.max_number, max_target=self.max_target,
                             graded=self.graded, seed=self.seed)
        return make_task("arithmetic", digits=self.digits, seed=self.seed)


@dataclasses.dataclass(frozen=True)
class VariantsConfig:
    names: tuple[str, ...] = VARIANTS  # which of the four variants to train
    naive_coef: float = 0.1  # coef of -H (full-vocabulary entropy of every token)
    high_entropy_quantile: float = 0.8  # pg only on tokens at or above this entropy quantile
    siren_coef: float = 2.0  # coef of (H_bar - anchor)^2

    def __post_init__(self):
        unknown = [n for n in self.names if n not in VARIANTS]
        if unknown or not self.names or len(set(self.names)) != len(self.names):
            raise ValueError(f"names must be distinct entries of {list(VARIANTS)}, got "
                             f"{list(self.names)}")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    num_examples: int = 256  # held-out prompts
    batch_size: int = 128  # rows per evaluation batch
    samples: int = 16  # n sampled completions per prompt for pass@k / maj@k
    ks: tuple[int, ...] = (1, 4, 16)  # k of pass@k and maj@k (each <= samples)
    temperature: float = 1.0  # sampling temperature of the sampled evaluation

    def __post_init__(self):
        if not self.ks or not all(1 <= k <= self.samples for k in self.ks):
            raise ValueError(f"ks={list(self.ks)} must lie in 1..samples={self.samples}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    seed: int = 0  # model init and SFT seed (one SFT checkpoint for every GRPO run)
    seeds: tuple[int, ...] = (0, 1, 2)  # GRPO seeds of each variant (sampling, anchor batch)
    tokenizer: str = "byt5"  # "byt5" (bytes, no files) or a local Hugging Face tokenizer dir
    num_devices: int | None = None  # devices on the "data" mesh axis (None = all)
    checkpoint_every: int = 50  # save every this many steps of each stage
    keep_checkpoints: int = 1  # keep the last this many checkpoints per run

    def __post_init__(self):
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct and non-empty, got {list(self.seeds)}")


@dataclasses.dataclass(frozen=True)
class Config:
    task: TaskConfig = TaskConfig()
    model: ModelConfig = ModelConfig()  # model.hf_path starts from a local HF checkpoint
    sft: SFTConfig = SFTConfig()
    grpo: GRPOConfig = GRPOConfig()  # shared by every variant (entropy fields set per variant)
    variants: VariantsConfig = VariantsConfig()
    eval: EvalConfig = EvalConfig()
    run: RunConfig = RunConfig()

    def __post_init__(self):
        g = self.grpo
        if g.entropy_reg != "none" or g.high_entropy_quantile is not None:
            raise ValueError("grpo.entropy_reg and grpo.high_entropy_quantile are set per "
                             "variant here; use the variants.* fields instead")


def variant_config(cfg: Config, name: str) -> GRPOConfig:
    """The GRPO config of variant `name`: the shared `cfg.grpo` plus its entropy control."""
    v = cfg.variants
    changes = {
        "plain": {},
        "naive": {"entropy_reg": "naive", "entropy_coef": v.naive_coef},
        "high_entropy": {"high_entropy_quantile": v.high_entropy_quantile},
        "siren": {"entropy_reg": "siren", "entropy_coef": v.siren_coef},
    }[name]
    return dataclasses.replace(cfg.grpo, **changes)


def _run_name(variant: str, seed: int) -> str:
    return f"{variant}_s{seed}"


def run(cfg: Config, opts: RunOptions) -> dict:
    t_start = time.perf_counter()
    tokenizer, task, mesh, model, params, sft_key, grpo_key = _setup(cfg, cfg.task.build())
    if jax.process_index() == 0:
        write_json(opts.out_dir / "config.json", {"experiment": NAME, "config": to_dict(cfg)})
    common = dict(mesh=mesh, prompt_len=cfg.task.prompt_len)
    held_out = task.examples("test", 0, cfg.eval.num_examples)
    e = cfg.eval

    def evaluate(trainer, params) -> dict:
        out = {"greedy_accuracy": trainer.evaluate(params, held_out,
                                                   batch_size=e.batch_size)["accuracy"]}
        out.update(trainer.evaluate_sampled(
            params, held_out, n=e.samples, ks=e.ks, temperature=e.temperature,
            batch_size=e.batch_size, rng=jax.random.PRNGKey(cfg.run.seed + 1)))
        return out

    # ---- SFT: one checkpoint that every GRPO run starts from ----
    sft = SFTTrainer(model, tokenizer, task, cfg.sft, max_new_tokens=cfg.grpo.max_new_tokens,
                     **common)
    sft_state = fit_resumable(
        sft, sft.init_state(params, sft_key), stage="sft", num_steps=cfg.sft.steps,
        checkpoint_dir=opts.out_dir / "checkpoints" / "sft", log_dir=opts.out_dir,
        save_every=cfg.run.checkpoint_every, keep=cfg.run.keep_checkpoints, resume=opts.resume,
        tensorboard=opts.tensorboard, progress=opts.progress)
    sft_eval_path = opts.out_dir / "sft_eval.json"
    if opts.resume and sft_eval_path.is_file():
        sft_eval = json.loads(sft_eval_path.read_text())
    else:
        sft_eval = evaluate(sft, sft_state.params)
        if jax.process_index() == 0:
            write_json(sft_eval_path, sft_eval)
    _print(f"[{NAME}] SFT: " + _fmt(sft_eval))

    # ---- GRPO: every variant x seed from the same SFT params ----
    results: dict[str, dict] = {}
    for variant in cfg.variants.names:
        trainer = GRPOTrainer(model, tokenizer, task, variant_config(cfg, variant),
                              ref_params=sft_state.params, **common)
        for seed in cfg.run.seeds:
            name = _run_name(variant, seed)
            run_dir = opts.out_dir / "runs" / name
            result_path = run_dir / "result.json"
            if opts.resume and result_path.is_file():
                results[name] = json.loads(result_path.read_text())
                _print(f"[{NAME}] {name}: done before ({_fmt(results[name])})")
                continue
            results[name] = _train_one(trainer, sft_state.params, grpo_key, variant, seed,
                                       run_dir, cfg, opts, evaluate)
            if jax.process_index() == 0:
                write_json(result_path, results[name])
            _print(f"[{NAME}] {name}: {_fmt(results[name])}")

    summary = {
        "experiment": NAME,
        "sft": sft_eval,
        "variants": _aggregate(results, cfg),
        "claims": None,
        "heldout_examples": len(held_out),
        "wall_time_s": time.perf_counter() - t_start,
        "devices": int(mesh.devices.size),
        "resumed": opts.resume,
        "config": to_dict(cfg),
    }
    if jax.process_index() == 0:
        curves = _curves(opts.out_dir, cfg)
        summary["claims"] = _claims(summary["variants"], curves, cfg)
        _plots(opts.out_dir, curves, cfg, summary["claims"]["sft_entropy"])
        (opts.out_dir / "table.md").write_text(_table(sft_eval, summary["variants"], cfg))
        write_json(opts.out_dir / "summary.json", summary)
        _print((opts.out_dir / "table.md").read_text())
    return summary


def _train_one(trainer: GRPOTrainer, sft_params, grpo_key, variant: str, seed: int, run_dir,
               cfg: Config, opts: RunOptions, evaluate) -> dict:
    """One GRPO run (resumable from its checkpoints); returns its held-out evaluation."""
    t0 = time.perf_counter()
    init = trainer.init_state(sft_params, jax.random.fold_in(grpo_key, seed))
    if variant == "siren":  # the anchor: the SFT policy's H_bar on this seed's first batch
        trainer.anchor = cfg.grpo.siren_anchor
        if trainer.anchor is None:
            trainer.measure_anchor(init, trainer.batch(0))
    state = fit_resumable(
        trainer, init, stage="grpo", num_steps=cfg.grpo.steps,
        checkpoint_dir=opts.out_dir / "checkpoints" / _run_name(variant, seed), log_dir=run_dir,
        save_every=cfg.run.checkpoint_every, keep=cfg.run.keep_checkpoints, resume=opts.resume,
        tensorboard=opts.tensorboard, progress=opts.progress, postfix=("reward", "entropy"))
    result = {"variant": variant, "seed": seed, **evaluate(trainer, state.params)}
    if variant == "siren":
        result["anchor"] = trainer.anchor
    result["wall_time_s"] = time.perf_counter() - t0
    return result


def _fmt(r: dict) -> str:
    keys = ["greedy_accuracy"] + [k for k in r if k.startswith(("pass@", "maj@"))]
    return ", ".join(f"{k} {r[k]:.3f}" for k in keys)


def _metric_keys(cfg: Config) -> list[str]:
    return (["greedy_accuracy"] + [f"pass@{k}" for k in cfg.eval.ks]
            + [f"maj@{k}" for k in cfg.eval.ks] + ["length"])


def _aggregate(results: dict[str, dict], cfg: Config) -> dict:
    """Per variant: mean, std and per-seed values of each held-out metric."""
    out = {}
    for variant in cfg.variants.names:
        runs = [results[_run_name(variant, s)] for s in cfg.run.seeds]
        out[variant] = {k: {"mean": float(np.mean([r[k] for r in runs])),
                            "std": float(np.std([r[k] for r in runs])),
                            "per_seed": [r[k] for r in runs]} for k in _metric_keys(cfg)}
    return out


def _curves(out_dir, cfg: Config) -> dict[str, dict[str, np.ndarray]]:
    """Per variant and metric, the [seeds, steps] training curves read back from metrics.jsonl."""
    curves: dict[str, dict[str, np.ndarray]] = {}
    for variant in cfg.variants.names:
        per_seed = []
        for seed in cfg.run.seeds:
            recs = [r for r in read_metrics(out_dir / "runs" / _run_name(variant, seed)
                                            / "metrics.jsonl") if r["stage"] == "grpo"]
            per_seed.append({k: [r[k] for r in recs] for k in ("entropy", "length", "accuracy")})
        curves[variant] = {k: np.array([s[k] for s in per_seed], np.float64)
                           for k in ("entropy", "length", "accuracy")}
    return curves


def _claims(variants: dict, curves: dict, cfg: Config) -> dict:
    """The numbers each of the paper's claims is judged by (no verdicts: see the README).

    Entropy is the mean token entropy of the training rollouts. "start" is step 1's, sampled from
    the SFT policy (the same for every variant of a seed); "end" is the mean over the last `w`
    steps (w = a tenth of the run, at least 1). `best_variant` lists every variant that ties for
    the highest mean.
    """
    steps = next(iter(curves.values()))["entropy"].shape[1]
    w = max(1, steps // 10)
    entropy = {}
    for variant, c in curves.items():
        start, end = c["entropy"][:, 0], c["entropy"][:, -w:].mean(axis=1)
        entropy[variant] = {"start": float(start.mean()), "end": float(end.mean()),
                            "end_over_start": float((end / start).mean()),
                            "end_over_start_per_seed": (end / start).tolist(),
                            "min": float(c["entropy"].min()), "max": float(c["entropy"].max())}
    k = max(cfg.eval.ks)
    best = {}
    for m in (f"pass@{k}", f"maj@{k}", "pass@1", "greedy_accuracy"):
        top = max(variants[v][m]["mean"] for v in variants)
        best[m] = [v for v in variants if variants[v][m]["mean"] == top]
    sft_entropy = float(np.mean([c["entropy"][:, 0].mean() for c in curves.values()]))
    return {"entropy": entropy, "best_variant": best, "sft_entropy": sft_entropy,
            "window_steps": w}


def _smooth(x: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average along the last axis (shorter windows at the start)."""
    c = np.cumsum(np.pad(x, [(0, 0), (1, 0)]), axis=1)
    idx = np.arange(1, x.shape[1] + 1)
    lo = np.maximum(idx - window, 0)
    return (c[:, idx] - c[:, lo]) / (idx - lo)


def _plots(out_dir, curves: dict, cfg: Config, sft_entropy: float) -> None:
    steps = np.arange(1, cfg.grpo.steps + 1)
    window = max(1, cfg.grpo.steps // 20)
    task = cfg.task.name
    for metric, ylabel, hline, yscale in (
        ("entropy", "token entropy of rollouts (nats; dashed: SFT)", sft_entropy, "log"),
        ("length", "response length (tokens)", None, "linear"),
        ("accuracy", "training accuracy", None, "linear"),
    ):
        plot_iqr_bands(
            steps, {v: _smooth(c[metric], window) for v, c in curves.items()},
            out_dir / f"{metric}.png", xlabel="GRPO step", ylabel=ylabel, hline=hline,
            yscale=yscale,
            title=f"{task}: median and IQR over {len(cfg.run.seeds)} seeds "
                  f"(moving average {window})",
        )


def _table(sft_eval: dict, variants: dict, cfg: Config) -> str:
    """Markdown table of the held-out metrics: mean ± std over seeds (SFT: one model)."""
    keys = _metric_keys(cfg)
    lines = ["| model | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|",
             "| SFT (start) | " + " | ".join(f"{sft_eval[k]:.3f}" for k in keys) + " |"]
    for v, stats in variants.items():
        cells = [f"{stats[k]['mean']:.3f} ± {stats[k]['std']:.3f}" for k in keys]
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


EXPERIMENT = Experiment(
    name=NAME, config_cls=Config, run=run,
    description="entropy collapse: plain / naive bonus / high-entropy / SIREN GRPO (SIREN)",
)

if __name__ == "__main__":
    from jaxrl_suite.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))

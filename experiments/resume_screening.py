"""Resume screening with a composite reward: reward hacking under aggressive penalties, and its
guard (arXiv 2511.16073).

Claims checked (Jain et al., "A Mathematical Framework for Custom Reward Functions in Job
Application Evaluation using Reinforcement Learning"): (a) GRPO with aggressive penalties hacks
the reward, collapsing to an "excessively negative" policy, while a gentle weighting does not;
(b) the SFT -> GRPO screener beats a keyword-matching ATS; (c) the GRPO phase improves on SFT
alone. The paper's own numbers (91 % accuracy, SELECTED recall 0.85, precision 1.0, on its data)
are quoted for comparison, not expected on this generated task.

    jaxrl-suite run resume_screening              # full size (37 min on a busy 2-core CPU)
    jaxrl-suite run resume_screening --smoke      # seconds; what the tests run
    jaxrl-suite run resume_screening --resume     # a killed run continues where it stopped

One SFT checkpoint on the task's solutions (envs/text/screening.py), then GRPO from it with
each reward weighting (`variants`, rewards/composite.py), 3 seeds each, with the KL to the SFT
model (grpo.beta) and the reward-hacking guard (grpo.collapse_entropy) on. Held-out greedy
decisions give accuracy and the precision / recall / F1 of SELECTED for the keyword ATS (its
threshold fitted on training pairs), SFT and each GRPO variant; beside them, `sampled_accuracy`
and `sampled_f1` are those of one decision per pair sampled at the training temperature
(grpo.temperature; the first eval.sampled_examples pairs). Writes summary.json (table,
each run's collapse report and warnings, claims with verdicts from the numbers), table.md,
entropy.png (predicted-class entropy per step, the guard's threshold dashed),
components.png (each reward component per step) and metrics.png (held-out metric bars).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from typing import Annotated

import jax

from jaxrl_suite.algorithms import lm_study as kit
from jaxrl_suite.core.config import Count, Range, check_fields, to_dict
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.core.metrics import read_metrics
from jaxrl_suite.core.parallel import print0
from jaxrl_suite.core.study import check_variants, format_numbers, verdict
from jaxrl_suite.envs.text.screening import KeywordATS, ScreeningTask, selection_metrics
from jaxrl_suite.rewards.composite import (
    COMPONENTS,
    CompositeConfig,
    collapse_report,
)
from jaxrl_suite_experiments import CONFIGS

NAME = "resume_screening"
VARIANTS = ("aggressive", "gentle")
METRICS = ("accuracy", "precision", "recall", "f1", "selected_rate", "invalid_rate")
SAMPLED = ("sampled_accuracy", "sampled_f1")  # the headline metrics of sampled decisions
COLUMNS = ("accuracy", "sampled_accuracy", "precision", "recall", "f1", "sampled_f1",
           "selected_rate", "invalid_rate")  # table.md
# The paper's held-out numbers on its own data (abstract of arXiv 2511.16073).
PAPER = {"accuracy": 0.91, "recall": 0.85, "precision": 1.0}


@dataclasses.dataclass(frozen=True)
class WeightingsConfig:
    """The composite-reward weightings, one per GRPO variant (rewards.composite)."""

    names: tuple[str, ...] = VARIANTS  # which variants to train
    # The paper's "aggressive penalties": a false SELECTED (an unqualified hire) costs 4x what
    # a right decision earns; turning a qualified candidate away costs nothing.
    aggressive: CompositeConfig = CompositeConfig(false_selected=4.0)
    # Its "gentle polishing": both errors mildly and equally penalised.
    gentle: CompositeConfig = CompositeConfig(false_selected=0.25, false_rejected=0.25)

    def __post_init__(self):
        check_variants(self.names, VARIANTS, "names")


@dataclasses.dataclass(frozen=True)
class Config:
    task: kit.TaskConfig = kit.TaskConfig(name="screening", prompt_len=112)
    model: kit.ModelConfig = kit.ModelConfig()
    sft: kit.SFTConfig = kit.SFTConfig()
    # shared by both variants; beta is the KL to the SFT model, collapse_entropy the guard
    grpo: kit.GRPOConfig = kit.GRPOConfig(max_new_tokens=56, beta=0.04, collapse_entropy=0.5)
    weights: WeightingsConfig = WeightingsConfig()
    eval: kit.EvalConfig = kit.EvalConfig(num_examples=512)
    run: kit.RunConfig = kit.RunConfig(seeds=(0, 1, 2), keep_checkpoints=2)
    ats_train_examples: Count = 2000  # training pairs the ATS threshold is fitted on
    # a held-out SELECTED recall at or below this is collapsed
    near_zero_recall: Annotated[float, Range(ge=0, lt=1)] = 0.05

    def __post_init__(self):
        check_fields(self)  # the Ranges declared above (top-level fields)
        if self.task.name != "screening":
            raise ValueError(f"task.name must be 'screening', got {self.task.name!r}")
        if not self.grpo.collapse_entropy > 0:
            raise ValueError("grpo.collapse_entropy must be > 0 (the reward-hacking guard is on "
                             "in this study)")
        if not self.grpo.beta > 0:
            raise ValueError("grpo.beta must be > 0 (the composite reward's KL to the SFT model)")


def variant_task(cfg: Config, name: str) -> ScreeningTask:
    """The task of variant `name`: the same pairs, that variant's reward weighting."""
    return ScreeningTask(seed=cfg.task.seed, reward=getattr(cfg.weights, name))


def evaluate_decisions(trainer, params, examples, batch_size: int, *,
                       temperature: float | None = None, rng: jax.Array | None = None) -> dict:
    """Held-out greedy decisions: `selection_metrics`, plus the shares of completions in the
    exact format and with a score that agrees with their decision (the components of the
    default composite reward, `ScreeningTask.verify_batch`). With `temperature` (and `rng`),
    one decision per example sampled at that temperature instead (`LMRunner.complete`, in the
    same batches)."""
    texts, _ = trainer.complete(params, examples, batch_size=batch_size, rng=rng,
                                temperature=temperature)
    v = ScreeningTask().verify_batch(texts, examples)
    out = selection_metrics(v.outcomes, [e.answer for e in examples])
    for k in ("format", "calibration"):
        out[f"{k}_rate"] = sum(v.components[k]) / len(texts)
    return out


def run(cfg: Config, opts: RunOptions) -> dict:
    t_start = time.perf_counter()
    task = ScreeningTask(seed=cfg.task.seed)
    study = kit.LMStudy(NAME, cfg, opts, variants=cfg.weights.names, task=task)
    held_out, bs = study.held_out, cfg.eval.batch_size

    ats = KeywordATS.fit(task.examples("train", 0, cfg.ats_train_examples))
    ats_eval = {**selection_metrics(ats.predict(held_out), [e.answer for e in held_out]),
                "threshold": ats.threshold}
    print0(f"[{NAME}] keyword ATS: {format_numbers(ats_eval)}")

    def evaluate(trainer, params) -> dict:
        """Greedy decisions on the held-out pairs, and `SAMPLED` from one decision per pair
        sampled at the training temperature (the first eval.sampled_examples pairs)."""
        greedy = evaluate_decisions(trainer, params, held_out, bs)
        sampled = evaluate_decisions(trainer, params, held_out[: cfg.eval.sampled_examples], bs,
                                     temperature=cfg.grpo.temperature, rng=study.sampled_key)
        return {**greedy, **{f"sampled_{k}": sampled[k] for k in ("accuracy", "f1")}}

    sft_params = study.shared_sft().params
    base = study.grpo_trainer(cfg.grpo, sft_params)  # one compiled program for every variant
    sft_eval = study.cached(opts.out_dir / "sft_eval.json", lambda: evaluate(base, sft_params))
    print0(f"[{NAME}] SFT: {format_numbers(sft_eval)}")
    trainers = {v: base.with_task(variant_task(cfg, v)) for v in study.variants}

    def train(variant: str, seed: int, _) -> dict:
        trainer, t0 = trainers[variant], time.perf_counter()
        state = study.fit_run(trainer, trainer.init_state(sft_params, study.grpo_key(seed)),
                              variant, seed, num_steps=cfg.grpo.steps,
                              postfix=("reward", "outcome_entropy"))
        result = evaluate(trainer, state.params)
        records = read_metrics(study.run_dir(variant, seed) / "metrics.jsonl") \
            if jax.process_index() == 0 else []
        report = collapse_report([r for r in records if r.get("stage") == "grpo"],
                                 cfg.grpo.collapse_entropy)
        return {**result, "collapse_report": report,
                "collapsed": bool(report["collapsed"] or
                                  result["recall"] <= cfg.near_zero_recall),
                "wall_time_s": time.perf_counter() - t0}

    results = study.run(train)
    stats = study.aggregate(results, [*METRICS, *SAMPLED, "format_rate", "calibration_rate"])
    per_variant = study.per_variant(results)
    reports = {study.run_name(v, r["seed"]): r["collapse_report"]
               for v, runs in per_variant.items() for r in runs}
    warnings = [_warning(name, rep) for name, rep in reports.items() if rep["warned"]]
    for w in warnings:
        print0(f"[{NAME}] WARNING: {w}")
    claims = _claims(stats, per_variant, ats_eval, sft_eval, cfg)
    if jax.process_index() == 0:
        _plots(study, stats, ats_eval, sft_eval, cfg, opts)
    no_samples = {k: float("nan") for k in SAMPLED}  # the keyword ATS samples nothing
    table = study.table(stats, COLUMNS, first={"keyword ATS": {**ats_eval, **no_samples},
                                               "SFT": sft_eval})
    return study.finish({
        "experiment": NAME, "ats": ats_eval, "sft": sft_eval, "variants": stats,
        "table": {"keyword ATS": ats_eval, "SFT": sft_eval,
                  **{v: {k: {"mean": s[k]["mean"], "std": s[k]["std"]}
                         for k in (*METRICS, *SAMPLED)} for v, s in stats.items()}},
        "collapse_reports": reports, "warnings": warnings, "claims": claims, "paper": PAPER,
        "weights": {v: to_dict(getattr(cfg.weights, v)) for v in study.variants},
        "heldout_examples": len(held_out), "wall_time_s": time.perf_counter() - t_start,
        "devices": int(study.lm.mesh.devices.size), "resumed": opts.resume,
        "config": to_dict(cfg)}, table)


def _warning(name: str, rep: dict) -> str:
    """The guard's warning for one run, as summary.json keeps it."""
    shares = ", ".join(f"{c} {v:.2f}" for c, v in rep["final_fractions"].items())
    state = "collapsed" if rep["collapsed"] else "recovered by the end"
    return (f"{name}: predicted-class entropy below {rep['threshold']} bits from step "
            f"{rep['first_step']} ({rep['steps_below']} of {rep['steps']} steps), {state}; "
            f"final shares: {shares}")


def _claims(stats: dict, per_variant: dict, ats: dict, sft: dict, cfg: Config) -> dict:
    """Each claim's numbers and a verdict computed from them."""
    mean = {v: {k: s[k]["mean"] for k in METRICS} for v, s in stats.items()}
    claims = {}
    if set(VARIANTS) <= set(stats):
        n = {v: sum(r["collapsed"] for r in per_variant[v]) for v in VARIANTS}
        seeds = len(cfg.run.seeds)
        majority = n["aggressive"] >= math.ceil(seeds / 2) and n["aggressive"] > 0
        claims["reward_hacking"] = {
            "claim": "aggressive penalties collapse the policy to a degenerate output "
                     "(predicted-class entropy below the guard's threshold, or held-out "
                     "SELECTED recall near 0); the gentle weighting does not",
            "collapsed_runs": n, "seeds": seeds, "threshold_bits": cfg.grpo.collapse_entropy,
            "near_zero_recall": cfg.near_zero_recall,
            "final_entropy": {v: [r["collapse_report"]["final_entropy"]
                                  for r in per_variant[v]] for v in VARIANTS},
            "final_fractions": {v: [r["collapse_report"]["final_fractions"]
                                    for r in per_variant[v]] for v in VARIANTS},
            "recall": {v: [r["recall"] for r in per_variant[v]] for v in VARIANTS},
            "selected_rate": {v: mean[v]["selected_rate"] for v in VARIANTS},
            "verdict": verdict(majority and n["gentle"] == 0)}
    for v in stats:
        claims[f"{v}_beats_ats"] = {
            "claim": f"GRPO ({v}) beats the keyword ATS on held-out accuracy and SELECTED F1",
            "grpo": {k: mean[v][k] for k in ("accuracy", "f1")},
            "ats": {k: ats[k] for k in ("accuracy", "f1")},
            "verdict": verdict(mean[v]["accuracy"] > ats["accuracy"]
                                and mean[v]["f1"] > ats["f1"])}
        claims[f"{v}_beats_sft"] = {
            "claim": f"the GRPO phase ({v}) raises held-out accuracy above SFT alone",
            "grpo_accuracy": mean[v]["accuracy"], "sft_accuracy": sft["accuracy"],
            "verdict": verdict(mean[v]["accuracy"] > sft["accuracy"])}
    best = max(stats, key=lambda v: mean[v]["accuracy"])
    claims["paper_numbers"] = {
        "claim": "the paper's own held-out numbers (its data, a <600M model), for comparison",
        "paper": PAPER, "best_variant": best,
        "measured": {k: mean[best][k] for k in PAPER}}
    return claims


def _plots(study, stats, ats, sft, cfg: Config, opts: RunOptions) -> None:
    window = max(1, cfg.grpo.steps // 20)
    curves = study.curves(["outcome_entropy"], stage="grpo")
    study.plot_curves(curves, "outcome_entropy", opts.out_dir / "entropy.png", smooth=window,
                      xlabel="GRPO step", ylabel="predicted-class entropy (bits)",
                      hline=cfg.grpo.collapse_entropy,
                      title=f"{NAME}: median and IQR over {len(study.seeds)} seeds (dashed: "
                            f"the guard's threshold; moving average {window})")
    study.plot_runs(["reward", *(f"reward_{c}" for c in COMPONENTS), "kl"],
                    opts.out_dir / "components.png", stage="grpo", smooth=window)
    groups = {k: {"keyword ATS": [ats[k]], "SFT": [sft[k]],
                  **{v: s[k]["per_seed"] for v, s in stats.items()}}
              for k in ("accuracy", "precision", "recall", "f1")}
    study.plot_bars(groups, opts.out_dir / "metrics.png", ylabel="held-out", ylim=(0, 1.05),
                    title=f"{NAME}: held-out metrics of SELECTED (mean ± std over "
                          f"{len(study.seeds)} seeds)")


EXPERIMENT = Experiment(
    name=NAME, config_cls=Config, run=run, config=CONFIGS / f"{NAME}.yaml",
    description="resume screening: composite reward, aggressive vs gentle GRPO, collapse guard",
)

if __name__ == "__main__":
    from jaxrl_suite.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))

"""VisualThinker-R1-Zero on rendered spatial QA: GRPO from a pretrained "base" VLM (issue 46).

Claims (arXiv 2503.05132; the anchor's code and our setup: docs/r1zero.md): GRPO from the base,
the prompt ending inside `<think>`, reward accuracy + format, lifts CVBench accuracy ~30 % over
the base and ~2 % over answer-only SFT; the response length dips, then grows, with
self-correction; RL from an instruct model reasons trivially; a length reward does not help.

    jaxrl-suite run r1zero_spatial              # full size (about 90 min on a 2-core CPU)
    jaxrl-suite run r1zero_spatial --smoke      # seconds (the tests); --resume: a run goes on
"""

from __future__ import annotations

import dataclasses
import sys
import time

import jax
import numpy as np

from jaxrl_suite.algorithms import lm_study as kit
from jaxrl_suite.algorithms.sft import VALIDATION_START, SFTTrainer
from jaxrl_suite.core.config import (
    Count,
    NonNegative,
    NonNegativeInt,
    Probability,
    Seed,
    UnitInterval,
    check_fields,
    to_dict,
)
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.core.parallel import print0
from jaxrl_suite.core.study import START_FAILS, Study, check_variants, format_numbers
from jaxrl_suite.envs import vision
from jaxrl_suite.models.hf import VisionModelConfig
from jaxrl_suite_experiments import CONFIGS

NAME = "r1zero_spatial"
# variant -> (what it is, its prompt style); "sft" trains answer-only, the others run GRPO
VARIANTS = {"r1zero": ("GRPO from the base", "think"), "sft": ("answer-only SFT", "direct"),
            "instruct": ("GRPO from the answer-only SFT start", "think"),
            "length": ("GRPO with the naive length reward", "think")}
TRACE = ("think_rate", "trivial_rate", "grounded_fact_rate", "self_correction_rate",
         "correction_fix_share")
KEYS = ("greedy_accuracy", "sampled_accuracy", "length", *TRACE,
        *(f"acc_{c}" for c in vision.CATEGORIES), *(f"sampled_{c}" for c in vision.CATEGORIES))


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    steps: Count = 2000  # at most; the start rule (below) stops it earlier
    batch_size: Count = 32  # documents per step
    lr: NonNegative = 1e-3  # peak AdamW rate (warm-up, cosine to 10 % over `steps`)
    warmup_steps: NonNegativeInt = 50
    caption_share: UnitInterval = 0.5  # image documents; the rest tagged think/answer ones
    question_share: Probability = 0.0  # image documents that ask a question (options listed)
    presence_share: Probability = 0.0  # of those: "which of these objects is in the image?"
    kind_share: Probability = 0.0  # of the rest: "which of these is a number?" (else attribute)
    tagged_options_share: Probability = 0.0  # tagged documents with an option list
    correction_share: UnitInterval = 0.05  # captions with a "wait, no:" self-correction
    max_chars: Count = 255  # longest document continuation (longer ones are redrawn)
    prompt_len: Count = 176  # a document's prompt: "<image>" or a question (the longest: 169)
    # The start rule (docs/r1zero.md; `passes`): every check_every steps, on check_examples TRAINING
    # questions x G samples, accuracy >= stop_accuracy and >= min_nondegenerate groups unequal.
    check_every: Count = 250
    check_examples: Count = 32
    stop_accuracy: UnitInterval | None = 0.3
    min_nondegenerate: UnitInterval = 0.5

    def __post_init__(self):
        check_fields(self, "pretrain.")

    def passes(self, c: dict) -> bool:  # a group_check passes the start rule (null: accuracy any)
        return kit.LMStudy.passes_start_rule(c, {
            "accuracy_band": (self.stop_accuracy or 0.0, 1.0),
            "min_nondegenerate": self.min_nondegenerate})


@dataclasses.dataclass(frozen=True)
class VariantsConfig:
    names: tuple[str, ...] = tuple(VARIANTS)  # which variants to train
    # seeds of the variants other than r1zero (null: run.seeds); fewer to fit a time budget
    control_seeds: tuple[Seed, ...] | None = None
    length_per_token: NonNegative = 0.001  # the "length" variant's reward per completion byte

    def __post_init__(self):
        check_fields(self, "variants.")
        check_variants(self.names, VARIANTS, "variants.names")


@dataclasses.dataclass(frozen=True)
class Config:
    task: kit.TaskConfig = kit.TaskConfig(name="spatial_qa", prompt_len=184)
    model: VisionModelConfig = VisionModelConfig()
    pretrain: PretrainConfig = PretrainConfig()
    sft: kit.SFTConfig = kit.SFTConfig(steps=100, batch_size=16)  # answer-only SFT
    grpo: kit.GRPOConfig = kit.GRPOConfig(group_size=8, beta=0.04, loss_type="grpo",
                                          max_new_tokens=192)
    variants: VariantsConfig = VariantsConfig()
    eval: kit.EvalConfig = kit.EvalConfig(num_examples=256, sampled_examples=256)
    run: kit.RunConfig = kit.RunConfig(seeds=(0, 1, 2))

    def __post_init__(self):
        if self.task.name != "spatial_qa":
            raise ValueError(f"task.name must be 'spatial_qa', got {self.task.name!r}")


def spatial(cfg: Config, style: str, length_per_token: float = 0.0, seed: int = 0):
    return vision.SpatialQATask(cfg.task.seed + seed, style, length_per_token=length_per_token)


def run(cfg: Config, opts: RunOptions) -> dict:
    t_start, tasks = time.perf_counter(), {s: spatial(cfg, s) for s in ("think", "direct")}
    study = kit.LMStudy(NAME, cfg, opts, variants=cfg.variants.names, task=tasks["think"])
    g, p = cfg.grpo, cfg.pretrain
    held_out = {s: t.examples("test", 0, cfg.eval.num_examples) for s, t in tasks.items()}
    runners = {s: study.lm_trainer(t) for s, t in tasks.items()}

    def evaluate(params, style: str) -> dict:
        """Held-out accuracy (total, per category; greedy and sampled), length, trace stats."""
        examples = held_out[style]
        acc, (texts, lengths, _) = study.labelled_accuracy(runners[style], params, examples,
                                                           lambda e: e.meta.category)
        return {**acc, "length": float(lengths.mean()),
                **vision.trace_stats(texts, examples, prompt_opens=style == "think"),
                "examples": [{"prompt": e.prompt, "completion": t}
                             for e, t in zip(examples[:4], texts, strict=False)]}

    checks = tasks["think"].examples("train", VALIDATION_START, p.check_examples)  # TRAINING
    # (1) pretraining: the base model, stopped by the start rule
    pre_task = vision.PretrainTask(seed=cfg.task.seed, max_chars=p.max_chars,  # the *_share
                                   **{k: v for k, v in to_dict(p).items() if k.endswith("_share")})
    pre = SFTTrainer(study.lm.model, study.lm.tokenizer, pre_task, kit.SFTConfig(
        steps=p.steps, batch_size=p.batch_size, lr=p.lr, warmup_steps=p.warmup_steps),
        mesh=study.lm.mesh, prompt_len=p.prompt_len, max_new_tokens=p.max_chars + 1)

    def rule(n, state) -> dict:
        if n % p.check_every:
            return {}
        c = study.group_check(runners["think"], state.params, checks)
        print0(f"[{NAME}] pretraining step {n}: {format_numbers(c)}")
        return {**c, "stop": p.stop_accuracy is not None and p.passes(c)}

    ckpt = study.checkpoint_dir("pretrain")
    with study.log(study.run_dir("pretrain"), [(ckpt, 0)]) as log:
        base_state = study.fit(pre, pre.init_state(study.lm.init_params(study.start_seed),
                                                   kit.lm_keys(study.start_seed).sft),
                               stage="pretrain", num_steps=p.steps, checkpoint_dir=ckpt,
                               logger=log, callback=rule)
    base = base_state.params  # (2) the start check (start_passes: the rule), before any RL run
    start = study.cached(opts.out_dir / "start_check.json", lambda: {
        "pretrain_steps": int(base_state.step), **study.group_check(runners["think"], base, checks),
        "base_think": evaluate(base, "think"), "base_direct": evaluate(base, "direct")})
    start["start_passes"] = p.passes(start)
    for k in ("think", "direct"):
        print0(f"[{NAME}] start check, base ({k} prompt): {format_numbers(start[f'base_{k}'])}")
    instruct = None
    if "instruct" in cfg.variants.names:  # the "instruct" start: answer-only SFT of the base
        instruct = study.shared_sft(tasks["direct"], params=base, name="instruct_start").params
        start["instruct_think"] = study.cached(opts.out_dir / "instruct_eval.json",
                                               lambda: evaluate(instruct, "think"))
    trainers = {v: study.grpo_trainer(g, ref_params=base if v != "instruct" else instruct, task=
                spatial(cfg, "think", cfg.variants.length_per_token * (v == "length")))
                for v in cfg.variants.names if v != "sft"}

    def train(variant: str, seed: int, _) -> dict:
        t0, ckpt, trainer = time.perf_counter(), study.checkpoint_dir(variant, seed), \
            trainers.get(variant)
        if trainer is None:  # "sft": answer-only SFT of the base on its seed's questions
            with study.log(study.run_dir(variant, seed), [(ckpt, 0)]) as log:
                state = study.sft(seed, checkpoint_dir=ckpt, logger=log, params=base,
                                  task=spatial(cfg, "direct", seed=seed))
        else:
            init = instruct if variant == "instruct" else base
            state = study.fit_run(trainer, trainer.init_state(init, study.grpo_key(seed)),
                                  variant, seed, num_steps=g.steps,
                                  postfix=("reward", "accuracy", "length"))
        return {**evaluate(state.params, VARIANTS[variant][1]),
                "wall_time_s": time.perf_counter() - t0}

    studies = [Study(NAME, opts, [v for v in cfg.variants.names if v == "r1zero"], cfg.run.seeds),
               Study(NAME, opts, [v for v in cfg.variants.names if v != "r1zero"],
                     cfg.variants.control_seeds or cfg.run.seeds)]
    results, stats = {}, {}
    for s in studies:
        if s.variants:
            r = s.run(train, fmt=lambda r: format_numbers({k: r[k] for k in KEYS[:3]}))
            results.update(r)
            stats.update(s.aggregate(r, KEYS))
    claims = _claims(stats, start, studies[0]) if jax.process_index() == 0 else None
    if jax.process_index() == 0:
        _plots(study, studies, stats, start, opts)
    for name, row in (claims or {}).items():
        print0(f"[{NAME}] claim {name}: {row['verdict']}")
    first = {f"base ({s})": {k: np.nan if start[f"base_{s}"][k] is None else start[f"base_{s}"][k]
                             for k in KEYS} for s in ("think", "direct")}
    return study.finish({
        "experiment": NAME, "start_check": start, "variants": stats, "claims": claims,
        "per_seed": {k: {kk: r[kk] for kk in KEYS} for k, r in results.items()},
        "heldout_examples": cfg.eval.num_examples, "wall_time_s": time.perf_counter() - t_start,
        "devices": int(study.lm.mesh.devices.size), "resumed": opts.resume,
        "config": to_dict(cfg)}, study.table(stats, KEYS, first=first))


def _claims(stats: dict, start: dict, main: Study) -> dict:
    """One verdict per claim from the numbers (docs/r1zero.md says what each test means)."""
    have, base, out = set(stats), start["base_think"], {}

    def vs(a: str, b: str, key: str = "greedy_accuracy") -> dict:
        if b.startswith("base"):  # the base is one model: compare each seed with it
            return kit.LMStudy.compare({a: stats[a], "base": {key: {"per_seed": [
                start[b][key]]}}}, a, "base", key)
        return kit.LMStudy.compare(stats, a, b, key)

    if "r1zero" in have:
        r = stats["r1zero"]["greedy_accuracy"]["per_seed"]
        up = vs("r1zero", "base_think")
        both = {"over_base": up, "greedy": {"r1zero": r, "base": base["greedy_accuracy"]}}
        if "sft" in have:
            both["over_sft"] = vs("r1zero", "sft")
        beats_sft = "sft" not in have or both["over_sft"]["difference"] > 0
        gain = all(x > base["greedy_accuracy"] for x in r)
        out["cvbench_gain"] = {"paper": "59.47 % on CVBench, about +30 % over the base and +2 % "
                               "over SFT", **both,
                               "verdict": kit.LMStudy.verdict(gain and beats_sft, gain)}
        curves = main.curves(("length",), stage="grpo")["r1zero"]["length"]
        shape = [len(c) >= 3 and vision.dip_then_grow(c) for c in curves]  # smoke: 2
        out["length_dip_then_grow"] = {
            "paper": "response length first dips, then grows", "per_seed": shape,
            "verdict": kit.LMStudy.verdict(all(shape), any(shape))}
        sc = stats["r1zero"]["self_correction_rate"]["per_seed"]
        fix = stats["r1zero"]["correction_fix_share"]["mean"]
        out["aha"] = {"paper": "self-reflection emerges", "self_correction_rate": sc,
                      "base": base["self_correction_rate"], "fix_share": fix,
                      "verdict": kit.LMStudy.verdict(
                          all(x > base["self_correction_rate"] for x in sc) and fix == fix
                          and fix > 0.5, any(x > base["self_correction_rate"] for x in sc))}
    if {"instruct", "r1zero"} <= have:
        t = vs("instruct", "r1zero", "trivial_rate")
        out["instruct_trivial"] = {
            "paper": "RL on an instruct model gives trivial reasoning", "trivial_rate": t,
            "verdict": kit.LMStudy.verdict(t["difference"] > 0 and stats["instruct"][
                "trivial_rate"]["mean"] >= 0.5, t["difference"] > 0)}
    if {"length", "r1zero"} <= have:
        a = vs("length", "r1zero")
        longer = vs("length", "r1zero", "length")["difference"] > 0
        helps = a["difference"] > 0 and (a["p_welch"] is None or a["p_welch"] < 0.05)
        out["length_reward_ineffective"] = {
            "paper": "the naive length reward lengthens responses without helping accuracy",
            "accuracy": a, "longer": longer, "verdict": kit.LMStudy.verdict(not helps and longer,
                                                                           not helps)}
    fails = {"verdict": START_FAILS} if not start["start_passes"] else {}
    return {k: {**c, **fails} for k, c in out.items()}


def _plots(study, studies, stats: dict, start: dict, opts: RunOptions) -> None:
    base = {f"base ({s})": start[f"base_{s}"] for s in ("think", "direct")}
    groups = {k: {**{b: [r[k]] for b, r in base.items()},
                  **{v: s[k]["per_seed"] for v, s in stats.items()}}
              for k in ("greedy_accuracy", "sampled_accuracy")}
    study.plot_bars(groups, opts.out_dir / "accuracy.png", ylabel="held-out accuracy",
                    title=f"{NAME}: CVBench-like held-out accuracy (dots: seeds)")
    cats = {c: {**{b: [r[f"acc_{c}"]] for b, r in base.items()}, **{
        v: s[f"acc_{c}"]["per_seed"] for v, s in stats.items()}} for c in vision.CATEGORIES}
    study.plot_bars(cats, opts.out_dir / "categories.png", ylabel="greedy held-out accuracy",
                    title=f"{NAME}: per category (dots: seeds)")
    curves = {}
    for s in studies:
        grpo = [v for v in s.variants if v != "sft"]
        if grpo:
            curves.update(s.curves(("length", "accuracy"), stage="grpo", variants=grpo))
    if curves:
        n = min(len(c["length"][0]) for c in curves.values())
        curves = {v: {k: np.asarray(x)[:, :n] for k, x in c.items()} for v, c in curves.items()}
        study.plot_curves(curves, "length", opts.out_dir / "length_curve.png",
                          smooth=max(1, n // 20), xlabel="GRPO step",
                          ylabel="completion length (tokens)",
                          title=f"{NAME}: response length, median and IQR over seeds")


EXPERIMENT = Experiment(
    name=NAME, config_cls=Config, run=run, config=CONFIGS / f"{NAME}.yaml",
    description="VisualThinker-R1-Zero: GRPO from a pretrained base VLM on spatial QA, with "
                "answer-only SFT, instruct-start and length-reward controls",
)

if __name__ == "__main__":
    from jaxrl_suite.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))

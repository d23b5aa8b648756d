"""SpatialTree on eleven rendered spatial abilities (issue 46): SFT transfer between the levels
(E1, "transfer") and thinking-mode RL from one SFT start (E2, "rl").

Claims (SpatialTree, arXiv 2512.20617; no training code public): SFT on one L1 perception
ability hurts the other L1 abilities and helps L3 simulation / L4 agentic, more so blended; L1
abilities are nearly uncorrelated, the higher levels correlated; RL that rewards thinking
everywhere helps L3/L4 and hurts L1; auto-think (no thinking on L1, thinking on L3/L4) improves
every level (average: SFT 27.3, think-everywhere 30.1, auto-think 30.8). docs/spatialtree.md.

    jaxrl-suite run spatialtree_autothink  # full size (95 min on 2 cores); --smoke: seconds
    jaxrl-suite run spatialtree_autothink --set 'parts=[rl]'  # E2 alone ([transfer]: E1); --resume
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from jaxrl_suite import core
from jaxrl_suite.algorithms import lm_study as kit
from jaxrl_suite.algorithms.sft import VALIDATION_START
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.envs import vision
from jaxrl_suite.models.hf import VisionModelConfig
from jaxrl_suite_experiments import CONFIGS

NAME, PARTS, LEVELS = "spatialtree_autothink", ("transfer", "rl"), (1, 2, 3, 4)
MAX_SOLUTION = 370  # characters (byte tokens) of a think solution; grpo.max_new_tokens: + EOS
COLS = vision.ABILITIES  # the eleven columns, L1 first
L1 = tuple(c for c in COLS if vision.LEVEL_OF[c] == 1)
L34 = tuple(c for c in COLS if vision.LEVEL_OF[c] >= 3)
# E1 mix -> its target abilities (general: none, the eleven uniformly)
MIXES = {"general": (), "localisation": ("localisation",), "relation": ("relation",),
         "blend": ("localisation", "relation")}
# E2 variants, each the task's designed reward of that name (envs/vision/spatial_tree.py)
VARIANTS = ("think_everywhere", "auto_level", "auto_probe", "no_think")
MAIN = ("think_everywhere", "auto_level")  # on run.seeds; the others on variants.control_seeds
ACC = ("greedy_accuracy", *(f"acc_{c}" for c in COLS), *(f"acc_L{lv}" for lv in LEVELS))
KEYS = (*ACC, "sampled_accuracy", *(f"sampled_{c}" for c in COLS),
        *(f"{m}_L{lv}" for m in ("sampled", "think", "length") for lv in LEVELS),
        "think_rate", "length")
CURVES = ("reward", "accuracy", "length")  # GRPO's logged curves
# The start rule (docs/spatialtree.md, fixed before any RL run): on variants.check_examples TRAINING
# questions x G samples, >= 25 % of groups unequal in accuracy, sampled accuracy in [0.05, 0.95]
START_RULE = {"min_nondegenerate": 0.25, "accuracy_band": (0.05, 0.95)}
NOT_TESTED = core.START_FAILS
UNDEFINED = "not tested: a correlation is undefined (a constant column)"


@dataclasses.dataclass(frozen=True)
class TransferConfig:
    mixes: tuple[str, ...] = tuple(MIXES)  # E1's SFT mixes ("general" is the reference)
    target_share: core.UnitInterval = 0.75  # the targets' share of a targeted mix (1:3)

    def __post_init__(self):
        core.check_fields(self, "transfer.")
        core.check_variants(self.mixes, MIXES, "transfer.mixes")
        for m in self.mixes:
            vision.mix_abilities(MIXES[m], self.target_share)  # a share it cannot make raises


@dataclasses.dataclass(frozen=True)
class VariantsConfig:
    names: tuple[str, ...] = VARIANTS  # E2's RL variants
    # seeds of the variants other than MAIN (null: run.seeds); fewer to fit a time budget
    control_seeds: tuple[core.Seed, ...] | None = None
    penalty: core.NonNegative = 0.5  # the auto-think rules' cost of the wrong mode (none given)
    check_examples: core.Count = 32  # TRAINING questions of the start rule (START_RULE)

    def __post_init__(self):
        core.check_fields(self, "variants.")
        core.check_variants(self.names, VARIANTS, "variants.names")


@dataclasses.dataclass(frozen=True)
class Config:
    parts: tuple[str, ...] = PARTS  # which of E1 ("transfer") and E2 ("rl") to run
    task: kit.TaskConfig = kit.TaskConfig(name="spatial_tree", prompt_len=117)
    model: VisionModelConfig = VisionModelConfig()
    base: kit.SFTConfig = kit.SFTConfig(steps=300, batch_size=32)  # the shared general SFT
    sft: kit.SFTConfig = kit.SFTConfig(steps=25, batch_size=32)  # E1: each mix from the base
    grpo: kit.GRPOConfig = kit.GRPOConfig(group_size=8, beta=0.04, loss_type="grpo",
                                          max_new_tokens=371)
    transfer: TransferConfig = TransferConfig()
    variants: VariantsConfig = VariantsConfig()
    eval: kit.EvalConfig = kit.EvalConfig(num_examples=264, sampled_examples=132)
    run: kit.RunConfig = kit.RunConfig(seeds=(0, 1, 2))

    def __post_init__(self):
        core.check_variants(self.parts, PARTS, "parts")
        if self.task.name != "spatial_tree":
            raise ValueError(f"task.name must be 'spatial_tree', got {self.task.name!r}")
        if self.eval.num_examples % 11 or (self.eval.sampled_examples or 0) % 11:
            raise ValueError("eval.num_examples and eval.sampled_examples must be multiples of 11")


def tree(cfg: Config, mix: str = "general", reward: str = "accuracy", seed: int = 0):
    return vision.SpatialTreeTask(  # MAX_SOLUTION: longer items (1.8 % of exploration) redrawn
        seed=cfg.task.seed + seed, solution_style="mixed", reward=reward, penalty=cfg.variants.
        penalty, abilities=vision.mix_abilities(MIXES[mix], cfg.transfer.target_share),
        max_solution_len=MAX_SOLUTION)


def run(cfg: Config, opts: RunOptions) -> dict:
    t_start, general, e, g = time.perf_counter(), tree(cfg), cfg.eval, cfg.grpo
    mixes = cfg.transfer.mixes if "transfer" in cfg.parts else ()
    names = cfg.variants.names if "rl" in cfg.parts else ()
    study = kit.LMStudy(NAME, cfg, opts, variants=[*mixes, *names], task=general)
    runner, sft = study.lm_trainer(general), study.sft_trainer(general)  # shared programs
    # (1) the base: general-mix SFT from the first seed's init; E1 continues it, E2 starts there
    pre, ckpt = study.sft_trainer(general, cfg.base), study.checkpoint_dir("base")
    with study.log(study.run_dir("base"), [(ckpt, 0)]) as log:
        params = study.fit(pre, pre.init_state(study.lm.init_params(study.start_seed), kit.lm_keys(
            study.start_seed).sft), stage="base", num_steps=cfg.base.steps, checkpoint_dir=ckpt,
                           logger=log).params

    def evaluate(params) -> dict:
        """Held-out accuracy per column, per level and on average (greedy, sampled; every column
        alike, so a level's is the mean of its columns), greedy think rate and length per level."""
        ex, level = study.held_out, lambda x: f"L{x.meta.level}"
        acc, (texts, lengths, v) = study.labelled_accuracy(runner, params, ex,
                                                           lambda x: x.meta.ability, level)
        levels, think = [level(x) for x in ex], v.components["thinking"]
        return {**acc, **{f"{k}_{x}": y for k, values in (("think", think), ("length", lengths))
                          for x, y in vision.accuracy_by(levels, values).items()},
                "think_rate": float(np.mean(think)), "length": float(np.mean(lengths)),
            "examples": [{"prompt": x.prompt, "completion": t}
                         for x, t in zip(ex[:11], texts, strict=False)]}

    def sft_mix(mix: str, seed: int):  # E1: the base, SFT on a mix at the common budget
        ckpt = study.checkpoint_dir(mix, seed)
        with study.log(study.run_dir(mix, seed), [(ckpt, 0)]) as log:
            return study.sft(seed, checkpoint_dir=ckpt, logger=log, params=params,
                             trainer=sft.with_task(tree(cfg, mix, seed=seed))).params

    fmt = lambda r: core.format_numbers({k: r[k] for k in ("greedy_accuracy", "think_rate")})
    timed = lambda t0, params: {**evaluate(params), "wall_time_s": time.perf_counter() - t0}
    e1, start, e2, stats2 = core.Study(NAME, opts, mixes, cfg.run.seeds), None, [], {}
    results = e1.run(lambda mix, seed, _: timed(time.perf_counter(), sft_mix(mix, seed)), fmt=fmt)
    if names:  # (2) E2 from the base, after the start rule
        def check() -> dict:  # the start rule, before any RL
            r = study.group_check(runner, params, general.examples(
                "train", VALIDATION_START, cfg.variants.check_examples))
            return {"training": r, "rule": START_RULE,
                    "start_passes": study.passes_start_rule(r, START_RULE), **evaluate(params)}

        start = study.cached(opts.out_dir / "start_check.json", check)
        seen = core.format_numbers({**start["training"], **{k: start[k] for k in ACC[-4:]}})
        core.print0(f"[{NAME}] start check: {seen}; passes its rule: {start['start_passes']}")
        base = study.grpo_trainer(g, ref_params=params)  # one compiled program for every run

        def rl(variant: str, seed: int, _) -> dict:
            t0, trainer = time.perf_counter(), base.with_task(tree(cfg, reward=variant, seed=seed))
            return timed(t0, study.fit_run(trainer, trainer.init_state(
                params, study.grpo_key(seed)), variant, seed, num_steps=g.steps,
                postfix=CURVES).params)

        ctl = cfg.variants.control_seeds or cfg.run.seeds
        e2 = [s for s in (core.Study(NAME, opts, [v for v in names if v in MAIN], cfg.run.seeds),
                          core.Study(NAME, opts, [v for v in names if v not in MAIN], ctl))
              if s.variants]
        for s in e2:
            results.update(r := s.run(rl, fmt=fmt))
            stats2.update(s.aggregate(r, KEYS))
    summary: dict = {"experiment": NAME, "parts": list(cfg.parts), "start_check": start}
    if mixes:
        stats1 = e1.aggregate(results, KEYS)
        x = np.concatenate([np.array([s[f"acc_{c}"]["per_seed"] for c in COLS]).T
                            for s in stats1.values()])  # [runs, 11]: every E1 run's columns
        r = core.group_correlations(x, {"l1": range(len(L1)), "l34": [COLS.index(c) for c in L34]})
        summary["transfer"] = {"variants": stats1, "correlation": {"runs": len(x), **{
            f"{m}_{k}": r[k][m] for k in r for m in ("mean", "pairs")}}, **(
            {"delta": deltas(stats1, stats1["general"])} if "general" in stats1 else {})}
    curves = {v: c for s in e2 for v, c in s.curves(CURVES, stage="grpo").items()}
    if names:
        summary["rl"] = {"variants": stats2, "delta": deltas(stats2, start), "curves": {
            k: core.Study.curve_stats(curves, k, max(1, g.steps // 10)) for k in CURVES}}
    claims = verdicts(summary) if jax.process_index() == 0 else None
    if claims is not None:
        _plots(study, summary, curves, opts)
    for name, row in (claims or {}).items():
        core.print0(f"[{NAME}] claim {name}: {row['verdict']}")
    heads = ("greedy_accuracy", "sampled_accuracy", *(f"{m}_L{lv}" for m in ("acc", "think")
                                                      for lv in LEVELS), "length")
    return study.finish({
        **summary, "claims": claims, "per_seed": {k: {kk: r[kk] for kk in KEYS}
                                                  for k, r in results.items()},
        "heldout_examples": e.num_examples, "wall_time_s": time.perf_counter() - t_start,
        "devices": int(study.lm.mesh.devices.size), "resumed": opts.resume,
        "config": core.to_dict(cfg)}, study.table({**summary.get("transfer", {}).get(
            "variants", {}), **stats2}, heads, first={
            "start (general SFT)": {k: start[k] for k in heads}} if start else None))


def deltas(stats: dict, ref: dict) -> dict:
    """`seed_deltas` of ACC against `ref`; `drops`: per seed, how many columns have Δ < 0."""
    return {v: {**x, "drops": np.sum([np.array(x[f"acc_{c}"]["per_seed"]) < 0 for c in COLS],
                                     axis=0).tolist()} for v, x in core.seed_deltas(
        stats, ref, ACC).items()}


def verdicts(summary: dict) -> dict:
    """One verdict per claim (docs/spatialtree.md says how each is computed): `verdict(holds,
    partly)` of kit.LMStudy's ladder, each E2 one NOT_TESTED unless the start passes its rule."""
    out, t, rl, start = {}, summary.get("transfer"), summary.get("rl"), summary["start_check"]
    s = {**(t["variants"] if t else {}), **(rl["variants"] if rl else {})}
    cols = lambda v, cs: np.mean([s[v][f"acc_{c}"]["per_seed"] for c in cs], axis=0)  # [seeds]
    vs = lambda a, b, cs: core.compare_seeds(cols(a, cs), cols(b, cs))
    claim = lambda paper, holds, partly, gate=False, **numbers: {
        "paper": paper, **numbers, "verdict": NOT_TESTED if gate and not start["start_passes"]
        else kit.LMStudy.verdict(bool(holds), bool(partly))}
    singles = [m for m in ("localisation", "relation") if m in s and t and "general" in s]
    if singles:
        other = {m: vs(m, "general", [c for c in L1 if c != m]) for m in singles}
        up = {m: vs(m, "general", L34) for m in (*singles, "blend") if m in s}
        out["negative_transfer_within_l1"] = claim(
            "SFT on one L1 ability lowers the other L1 abilities",
            all(max(x["per_seed_difference"]) < 0 for x in other.values()),
            any(x["difference"] < 0 for x in other.values()), other_l1=other)
        out["cross_level_transfer"] = claim(
            "targeted L1 SFT raises L3/L4", all(min(up[m]["per_seed_difference"]) > 0
                                                for m in singles),
            any(up[m]["difference"] > 0 for m in singles), l34=up)
        if "blend" in s:
            over = {m: vs("blend", m, L34) for m in singles}
            out["blend_synergy"] = claim(
                "the blend's L3/L4 gain exceeds each single target's", up["blend"]["difference"]
                > 0 and all(min(o["per_seed_difference"]) > 0 for o in over.values()),
                all(o["difference"] > 0 for o in over.values()), l34=up, blend_over=over)
    if t:
        r1, r34 = t["correlation"]["mean_l1"], t["correlation"]["mean_l34"]
        out["l1_orthogonal_higher_correlated"] = {**claim(
            "L1 abilities nearly uncorrelated, L3/L4 correlated", r1 < r34 and r34 > 0, r1 < r34,
            **t["correlation"]), **({} if np.isfinite([r1, r34]).all() else {"verdict": UNDEFINED})}
    gain = {v: np.array(d["greedy_accuracy"]["per_seed"]) for v, d in (rl or {}).get(
        "delta", {}).items()}
    if "think_everywhere" in gain:
        te = {k: cols("think_everywhere", cs) - np.mean([start[f"acc_{c}"] for c in cs])
              for k, cs in (("l1", L1), ("l34", L34))}
        out["think_everywhere_tradeoff"] = claim(
            "thinking everywhere raises L3/L4 and lowers L1", min(te["l34"]) > 0
            and max(te["l1"]) < 0, te["l34"].mean() > 0 or te["l1"].mean() < 0, True, **te)
    if "auto_level" in gain:
        a, down = gain["auto_level"], [lv for lv in LEVELS if rl["delta"]["auto_level"][
            f"acc_L{lv}"]["mean"] < 0]
        te = kit.LMStudy.compare(s, "auto_level", "think_everywhere", "greedy_accuracy") \
            if "think_everywhere" in gain else None
        out["auto_think_improves_all"] = claim(
            "auto-think raises the average over SFT and think-everywhere (27.3 -> 30.1 -> 30.8),"
            " no level drops", min(a) > 0 and not down and (te is None or te["difference"] > 0),
            a.mean() > 0, True, gain=a, levels_down=down, over_think_everywhere=te)
    if {"auto_level", "no_think"} <= set(gain):
        a, n = gain["auto_level"], gain["no_think"]
        out["no_think_control"] = claim(
            "(control) auto-think's gain needs thinking, not RL alone", min(a) > max(n),
            a.mean() > n.mean(), True, auto_level_gain=a, no_think_gain=n,
            no_think_as_large=n.mean() >= a.mean(),
            **kit.LMStudy.compare(s, "auto_level", "no_think", "greedy_accuracy"))
    return out


def _plots(study, summary: dict, curves: dict, opts: RunOptions) -> None:
    t, rl, out = summary.get("transfer", {}), summary.get("rl"), opts.out_dir
    if "delta" in t:
        study.plot_bars({c: {m: d[f"acc_{c}"]["per_seed"] for m, d in t["delta"].items()
                             if m != "general"} for c in COLS}, out / "transfer_delta.png",
                        ylabel="Δ held-out accuracy vs general", hline=0.0,
                        title=f"{NAME} E1: Δ per column vs the general mix (dots: seeds)")
    if not rl:
        return
    study.plot_bars({k: {v: d[k]["per_seed"] for v, d in rl["delta"].items()}
                     for k in (*(f"acc_L{lv}" for lv in LEVELS), "greedy_accuracy")},
                    out / "rl_delta_levels.png", ylabel="Δ held-out accuracy vs the start",
                    hline=0.0, title=f"{NAME} E2: Δ per level vs the SFT start (dots: seeds)")
    study.plot_bars({f"L{lv}": {"start": [summary["start_check"][f"think_L{lv}"]], **{
        v: s[f"think_L{lv}"]["per_seed"] for v, s in rl["variants"].items()}} for lv in LEVELS},
        out / "think_rate.png", ylabel="think rate (greedy, held-out)",
        title=f"{NAME} E2: think rate per level (dots: seeds)")
    n = min(c["length"].shape[1] for c in curves.values())
    for k in ("length", "reward"):
        study.plot_curves({v: {k: c[k][:, :n]} for v, c in curves.items()}, k,
                          out / f"{k}_curve.png", smooth=max(1, n // 20), xlabel="GRPO step",
                          ylabel=k, title=f"{NAME} E2: GRPO {k}, median and IQR over seeds")


EXPERIMENT = Experiment(
    name=NAME, config_cls=Config, run=run, config=CONFIGS / f"{NAME}.yaml",
    description="SpatialTree: SFT transfer across ability levels and auto-think RL "
                "(think-everywhere, auto by level, auto by a no-think probe, no-think control)",
)

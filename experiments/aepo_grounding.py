"""AEPO on text GUI grounding: multi-answer exploration against naive RLVR (InfiGUI-G1).

Claim checked (AEPO, Liu et al. 2025, arXiv 2508.05731; InfiXAI/InfiGUI-G1): RL in which the
policy answers with a list of N candidate points, rewarded by the Adaptive Exploration Reward
(`rewards/aepo.py`: 1 + 1/sqrt(N k) for a first hit at rank k, 1 - 1/N for no hit, -1 for a
malformed, empty or collinear list) and trained with RLOO advantages, improves greedy
first-point accuracy over naive RLVR (one point, a binary hit reward) by up to 9 % relative,
most on the semantic / generalisation benchmarks.

    jaxrl-suite run aepo_grounding              # full size (about 45 min: see docs/aepo.md)
    jaxrl-suite run aepo_grounding --smoke      # seconds; what the tests run
    jaxrl-suite run aepo_grounding --resume     # a killed run continues where it stopped

The task (`envs/text/gui.py`): a screen of 3 typed, labelled boxes (the gui section; the task's
default is 5-6) in a 100 x 100 grid and an instruction that names one by its function ("store
edits" -> the save / apply / commit button), among look-alike labels and same-family
distractors. Stages:
  1. one SFT checkpoint on a 50/50 mix of the two answer modes ("point:" -> one point,
     "points:" -> 1-3 points, correct first), so both variants start from the same weights;
  2. its greedy first-point accuracy on two held-out splits (new screens with seen phrasings;
     new screens with phrasings training never draws) in each mode, and its exploration
     statistics (sampled: mean N, hit rate at any rank); the same for the control, the SFT
     continued for grpo.steps more optimizer steps ("sft_more");
  3. GRPO variants from it, `run.seeds` each (RLOO advantages for both, so the answer format and
     the reward are the only differences): "aepo" (multi mode, AEPO reward) and "naive" (single
     mode, binary reward); each is evaluated greedily in its own mode, first point only.
Writes summary.json (claims with a verdict computed from the numbers), table.md, accuracy.png
(bars per split and variant), reward.png and n_points.png (training curves).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Annotated

import jax
import numpy as np

from jaxrl_suite.algorithms import lm_study as kit
from jaxrl_suite.core.config import Count, Range, check_fields, to_dict
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.core.parallel import print0
from jaxrl_suite.core.study import check_variants, format_numbers
from jaxrl_suite.envs.text.gui import EVAL_SPLITS, GuiTask
from jaxrl_suite_experiments import CONFIGS

NAME = "aepo_grounding"
# variant -> (answer mode, GRPO reward)
VARIANTS = {"aepo": ("multi", "aepo"), "naive": ("single", "binary")}
PAPER_CLAIM = ("up to 9% relative improvement over naive RLVR, largest on the "
               "semantic/generalisation splits")
EXPLORE = ("mean_n", "hit_any", "first_hit", "format")  # sampled-rollout statistics


@dataclasses.dataclass(frozen=True)
class GuiConfig:
    # elements per screen: min_elements..max_elements (3..8)
    min_elements: Annotated[int, Range(ge=3, le=8)] = 3
    max_elements: Annotated[int, Range(ge=3, le=8)] = 3
    max_screen_chars: Count = 128  # longer screens are redrawn (bounds the prompt length)

    def __post_init__(self):
        check_fields(self, "gui.")  # the Ranges declared above
        GuiTask(min_elements=self.min_elements, max_elements=self.max_elements,
                max_screen_chars=self.max_screen_chars)  # validates


@dataclasses.dataclass(frozen=True)
class VariantsConfig:
    names: tuple[str, ...] = tuple(VARIANTS)  # which GRPO variants to train

    def __post_init__(self):
        check_variants(self.names, VARIANTS, "names")


@dataclasses.dataclass(frozen=True)
class Config:
    # the task is built from the `gui` section (task.name must stay gui_grounding)
    task: kit.TaskConfig = kit.TaskConfig(name="gui_grounding", prompt_len=153)
    gui: GuiConfig = GuiConfig()
    model: kit.ModelConfig = kit.ModelConfig()  # model.hf_path starts from a local HF checkpoint
    sft: kit.SFTConfig = kit.SFTConfig()
    # shared by both variants; the authors train with RLOO advantages
    grpo: kit.GRPOConfig = kit.GRPOConfig(advantage="rloo", max_new_tokens=48)
    variants: VariantsConfig = VariantsConfig()
    # num_examples: held-out prompts per split (greedy); samples x sampled_examples at
    # temperature: the exploration statistics of sampled rollouts
    eval: kit.EvalConfig = kit.EvalConfig(samples=4, sampled_examples=64)
    run: kit.RunConfig = kit.RunConfig(seeds=(0, 1, 2), keep_checkpoints=2)

    def __post_init__(self):
        if self.task.name != GuiTask.name:
            raise ValueError(f"task.name must be {GuiTask.name!r} (the task is built from the "
                             f"gui section), got {self.task.name!r}")
        if not self.eval.samples:
            raise ValueError("eval.samples must be > 0 (the exploration statistics sample)")
        need = gui_task(self, mode="mix").max_prompt_len
        if self.task.prompt_len < need:
            raise ValueError(f"task.prompt_len is {self.task.prompt_len} but the gui section's "
                             f"prompts take up to {need} tokens")


def gui_task(cfg: Config, **fields) -> GuiTask:
    """The task of `cfg` with `fields` (mode, eval_split, reward) set."""
    return GuiTask(seed=cfg.task.seed, min_elements=cfg.gui.min_elements,
                   max_elements=cfg.gui.max_elements, max_screen_chars=cfg.gui.max_screen_chars,
                   **fields)


def run(cfg: Config, opts: RunOptions) -> dict:
    t_start = time.perf_counter()
    sft_task = gui_task(cfg, mode="mix")
    study = kit.LMStudy(NAME, cfg, opts, variants=cfg.variants.names, task=sft_task)
    held_out = {(m, s): gui_task(cfg, mode=m, eval_split=s).examples("test", 0,
                                                                       cfg.eval.num_examples)
                for m in ("multi", "single") for s in EVAL_SPLITS}
    probe = study.lm_trainer(sft_task)  # greedy and sampled decoding, shared samplers

    def evaluate(trainer, params, mode: str) -> dict:
        """Greedy first-point accuracy per split, and sampled exploration statistics."""
        out = {}
        for split in EVAL_SPLITS:
            examples = held_out[mode, split]
            out[f"acc_{split}"] = trainer.evaluate(params, examples,
                                                   batch_size=cfg.eval.batch_size)["accuracy"]
            out.update({f"{k}_{split}": v for k, v in explore(
                trainer, params, examples[: cfg.eval.sampled_examples]).items()})
        return out

    def explore(trainer, params, examples) -> dict:
        """Statistics of eval.samples sampled answers per prompt: mean N (of the well-formed
        answers), hit rate at any rank, first-point hit rate and the well-formed rate."""
        flat = [e for e in examples for _ in range(cfg.eval.samples)]
        texts, _ = trainer.complete(
            params, flat, batch_size=cfg.eval.batch_size, temperature=cfg.eval.temperature,
            rng=jax.random.PRNGKey(study.start_seed + 1))
        c = sft_task.verify_batch(texts, flat).components
        ok = np.asarray(c["format"], bool)
        return {"mean_n": float(np.mean(np.asarray(c["n_points"])[ok])) if ok.any() else 0.0,
                "hit_any": float(np.mean(c["hit_any"])),
                "first_hit": float(np.mean(c["first_hit"])), "format": float(ok.mean())}

    sft_state = study.shared_sft()
    sft_params = sft_state.params
    sft_eval = study.cached(opts.out_dir / "sft_eval.json", lambda: {
        m: evaluate(probe, sft_params, m) for m in ("multi", "single")})
    # The control: the same SFT continued for as many optimizer steps as a GRPO run takes.
    more_eval = study.sft_control(sft_state, lambda params: {
        m: evaluate(probe, params, m) for m in ("multi", "single")})
    for m in ("multi", "single"):
        print0(f"[{NAME}] SFT ({m}): {format_numbers(sft_eval[m])}")
        print0(f"[{NAME}] SFT continued ({m}): {format_numbers(more_eval[m])}")
    trainers = {}
    for v in study.variants:
        mode, reward = VARIANTS[v]
        trainers[v] = study.grpo_trainer(cfg.grpo, sft_params,
                                         task=gui_task(cfg, mode=mode, reward=reward))

    def train(variant: str, seed: int, _) -> dict:
        trainer, t0 = trainers[variant], time.perf_counter()
        state = study.fit_run(trainer, trainer.init_state(sft_params, study.grpo_key(seed)),
                              variant, seed, num_steps=cfg.grpo.steps,
                              postfix=("reward", "accuracy"))
        return {**evaluate(trainer, state.params, VARIANTS[variant][0]),
                "wall_time_s": time.perf_counter() - t0}

    results = study.run(train)
    keys = [f"{k}_{s}" for k in ("acc", *EXPLORE) for s in EVAL_SPLITS]
    stats = study.aggregate(results, keys)
    claims = None
    if jax.process_index() == 0:  # the runs' logs are written by process 0
        claims = _claims(stats)
        _plots(study, stats, sft_eval, cfg, opts)
    for name, row in (claims or {}).items():
        print0(f"[{NAME}] claim {name}: {row.get('verdict')}")
    first = {**{f"SFT ({m})": sft_eval[m] for m in ("multi", "single")},
             **{f"SFT continued ({m})": more_eval[m] for m in ("multi", "single")}}
    return study.finish({
        "experiment": NAME, "sft": sft_eval, "sft_more": more_eval, "variants": stats,
        "claims": claims,
        "modes": {v: VARIANTS[v][0] for v in study.variants},
        "heldout_examples": cfg.eval.num_examples, "wall_time_s": time.perf_counter() - t_start,
        "devices": int(study.lm.mesh.devices.size), "resumed": opts.resume,
        "config": to_dict(cfg)}, study.table(stats, keys, first=first))


def _claims(stats: dict) -> dict | None:
    """Relative improvement of AEPO over naive RLVR in greedy first-point accuracy per split,
    (aepo - naive) / naive of the means over seeds, and the exploration statistics; verdicts
    from these numbers. None unless both variants ran."""
    if not {"aepo", "naive"} <= set(stats):
        return None
    a, b = stats["aepo"], stats["naive"]
    per_split = {}
    for s in EVAL_SPLITS:
        ma, mb = a[f"acc_{s}"]["mean"], b[f"acc_{s}"]["mean"]
        c = kit.LMStudy.compare(stats, "aepo", "naive", f"acc_{s}")
        per_split[s] = {"aepo": ma, "naive": mb, "absolute": ma - mb,
                        "relative": (ma - mb) / mb if mb > 0 else None,  # None: naive at 0
                        "per_seed_difference": c["per_seed_difference"],
                        "seeds_better": c["seeds_better"]}
    improves = {s: bool(r["absolute"] > 0) for s, r in per_split.items()}
    rel = {s: r["relative"] for s, r in per_split.items() if r["relative"] is not None}
    largest = max(rel, key=rel.get) if rel else None
    verdict = kit.LMStudy.verdict(all(improves.values()) and largest == "unseen",
                                  any(improves.values()))
    explore = {s: {k: {"aepo": a[f"{k}_{s}"]["mean"], "naive": b[f"{k}_{s}"]["mean"]}
                   for k in EXPLORE} for s in EVAL_SPLITS}
    wider = all(explore[s]["hit_any"]["aepo"] > explore[s]["hit_any"]["naive"]
                and explore[s]["mean_n"]["aepo"] > explore[s]["mean_n"]["naive"]
                for s in EVAL_SPLITS)
    return {
        "relative_improvement": {
            "paper": PAPER_CLAIM, "splits": per_split,
            "max_relative": max(rel.values(), default=None),
            "improves_on": [s for s, ok in improves.items() if ok], "largest_on": largest,
            "verdict": verdict},
        "exploration": {
            "paper": "multi-answer rollouts explore more candidates and hit the target at some "
                     "rank more often than single-answer RLVR",
            "splits": explore, "aepo_explores_more": wider,
            "verdict": kit.LMStudy.verdict(wider)},
    }


def _plots(study: kit.LMStudy, stats: dict, sft_eval: dict, cfg: Config, opts) -> None:
    groups = {}
    for s in EVAL_SPLITS:
        groups[s] = {f"SFT ({m})": [sft_eval[m][f"acc_{s}"]] for m in ("multi", "single")}
        groups[s].update({v: stats[v][f"acc_{s}"]["per_seed"] for v in stats})
    study.plot_bars(groups, opts.out_dir / "accuracy.png",
                    ylabel="greedy first-point accuracy (held out)",
                    title=f"{NAME}: mean ± std over {len(study.seeds)} seeds (dots: seeds)")
    curves = study.curves(("reward", "reward_n_points"), stage="grpo")
    window = max(1, cfg.grpo.steps // 20)
    for key, path, ylabel in (("reward", "reward.png", "training reward (aepo: AER; naive: hit)"),
                              ("reward_n_points", "n_points.png", "points per answer (N)")):
        study.plot_curves(curves, key, opts.out_dir / path, smooth=window, xlabel="GRPO step",
                          ylabel=ylabel, title=f"{NAME}: median and IQR over "
                          f"{len(study.seeds)} seeds (moving average {window})")


EXPERIMENT = Experiment(
    name=NAME, config_cls=Config, run=run, config=CONFIGS / f"{NAME}.yaml",
    description="GUI grounding: AEPO multi-answer GRPO vs naive RLVR (InfiGUI-G1)",
)

if __name__ == "__main__":
    from jaxrl_suite.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))

"""ExIt: does training on single self-iteration steps teach improvement over many steps?

Claim checked (Jiang, Lupu and Bachrach, "Bootstrapping Task Spaces for Self-Improvement", arXiv
2509.04575): ExIt, which trains only on single-step iterations started from the most learnable
partial histories seen so far, gives a policy that keeps improving when run for more
self-iteration steps at inference than any training episode had.

    jaxrl-suite run exit_self_improve              # full size
    jaxrl-suite run exit_self_improve --smoke      # seconds; what the tests run
    jaxrl-suite run exit_self_improve --resume     # a killed run continues where it stopped

One SFT checkpoint (a share `sft_iter_frac` of its prompts in the self-iteration format), then a
run per variant and seed from it (`LMStudy`): grpo (turn-0 tasks), naive (K-turn revision
episodes, `MultiTurnTrainer`) and exit (`ExItTrainer`), each scored greedily after 1..`eval.steps`
self-iteration steps on held-out tasks; `sampled_score` is the step-1 score of one completion per
task sampled at the training temperature (grpo.temperature; the first eval.sampled_examples
tasks). Writes summary.json, table.md and iterations.png.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Annotated

import numpy as np

from jaxrl_suite.algorithms import lm_study as kit
from jaxrl_suite.algorithms.exit import (
    ExItConfig,
    ExItTrainer,
    MultiTurnTrainer,
    evaluate_iterations,
)
from jaxrl_suite.core.config import Count, Probability, Range, check_fields, to_dict
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.core.metrics import read_metrics
from jaxrl_suite.core.parallel import print0
from jaxrl_suite.core.study import check_variants
from jaxrl_suite.envs.text import IterationMix
from jaxrl_suite_experiments import CONFIGS

NAME = "exit_self_improve"
# variant -> its trainer over the shared GRPOTrainer (all follow the `fit` protocol)
VARIANTS = {
    "grpo": lambda cfg, grpo: grpo,
    "naive": lambda cfg, grpo: MultiTurnTrainer(grpo, cfg.variants.naive_turns,
                                                cfg.exit.max_previous_chars),
    "exit": lambda cfg, grpo: ExItTrainer(grpo, cfg.exit),
}


@dataclasses.dataclass(frozen=True)
class VariantsConfig:
    names: tuple[str, ...] = tuple(VARIANTS)  # which variants to train
    naive_turns: Annotated[int, Range(ge=2)] = 3  # K of the naive fixed-depth baseline

    def __post_init__(self):
        check_fields(self, "variants.")  # the Ranges declared above
        check_variants(self.names, VARIANTS, "variants.names")


@dataclasses.dataclass(frozen=True)
class IterationEvalConfig(kit.EvalConfig):
    steps: Count = 8  # self-iteration steps at evaluation (1 = the task prompt alone)

    def __post_init__(self):
        super().__post_init__()  # check_fields(self, "eval."): every field's Range, steps too


@dataclasses.dataclass(frozen=True)
class Config:
    task: kit.TaskConfig = kit.TaskConfig(name="sort", num_items=5, max_value=99, prompt_len=112)
    model: kit.ModelConfig = kit.ModelConfig()  # model.hf_path starts from a local HF checkpoint
    sft: kit.SFTConfig = kit.SFTConfig()
    sft_iter_frac: Probability = 0.5  # share of SFT prompts in the self-iteration format
    grpo: kit.GRPOConfig = kit.GRPOConfig()  # shared by every variant
    exit: ExItConfig = ExItConfig()
    variants: VariantsConfig = VariantsConfig()
    eval: IterationEvalConfig = IterationEvalConfig(num_examples=128, batch_size=64)
    run: kit.RunConfig = kit.RunConfig(seeds=(0, 1, 2), checkpoint_every=25, keep_checkpoints=2)

    def __post_init__(self):
        check_fields(self)  # the Ranges declared above (top-level fields)


def run(cfg: Config, opts: RunOptions) -> dict:
    t_start = time.perf_counter()
    study = kit.LMStudy(NAME, cfg, opts, variants=cfg.variants.names)
    mix = IterationMix(study.lm.task, p_iter=cfg.sft_iter_frac, p_div=cfg.exit.p_div,
                       seed=study.start_seed, max_previous_chars=cfg.exit.max_previous_chars)
    sft_params = study.shared_sft(task=mix).params
    grpo = study.grpo_trainer(cfg.grpo, sft_params)
    scores = lambda params: evaluate_iterations(grpo, params, study.held_out, steps=cfg.eval.steps,
                                                batch_size=cfg.eval.batch_size).tolist()
    # the step-1 score of one sample per task at the training temperature
    sampled_score = lambda params: float(evaluate_iterations(
        grpo, params, study.held_out[: cfg.eval.sampled_examples], steps=1,
        batch_size=cfg.eval.batch_size, temperature=cfg.grpo.temperature,
        rng=study.sampled_key)[0])
    sft_scores, sft_sampled = scores(sft_params), sampled_score(sft_params)
    print0(f"[{NAME}] SFT: score by step {np.round(sft_scores, 3).tolist()}, sampled score "
           f"{sft_sampled:.3f}")

    def train(variant: str, seed: int, _) -> dict:
        t0, trainer = time.perf_counter(), VARIANTS[variant](cfg, grpo)
        state = study.fit_run(trainer, trainer.init_state(sft_params, study.grpo_key(seed)),
                              variant, seed, num_steps=cfg.grpo.steps, stage=variant,
                              postfix=("reward", "tokens"))
        records = read_metrics(study.run_dir(variant, seed) / "metrics.jsonl")
        params = state.train.params if variant == "exit" else state.params
        return {"scores": scores(params), "sampled_score": sampled_score(params),
                "train_tokens": float(sum(r["tokens"] for r in records)),
                "final_reward": float(np.mean([r["reward"] for r in records[-10:]])),
                "wall_time_s": time.perf_counter() - t0}

    results = study.run(train, fmt=lambda r: f"score by step {np.round(r['scores'], 3).tolist()}"
                                             f", sampled score {r['sampled_score']:.3f}")
    stats = study.aggregate(results, ["scores", "sampled_score", "train_tokens"])
    k = min(cfg.variants.naive_turns, cfg.eval.steps)
    claim = {v: {"gain_after_K": s["scores"]["mean"][-1] - s["scores"]["mean"][k - 1],
                 "gain_total": s["scores"]["mean"][-1] - s["scores"]["mean"][0], "K": k}
             for v, s in stats.items()}
    study.plot_means(np.arange(1, cfg.eval.steps + 1), stats, "scores",
                     opts.out_dir / "iterations.png", reference=("SFT (start)", sft_scores),
                     vline=cfg.variants.naive_turns, ylabel=f"held-out {cfg.task.name} score",
                     xlabel="self-iteration steps at evaluation (dotted: naive K)",
                     title=f"{cfg.task.name}: mean ± std over {len(cfg.run.seeds)} seeds")
    cols = sorted({1, k, cfg.eval.steps})
    heads = ["score @ 1", "sampled score @ 1", *(f"score @ {c}" for c in cols[1:]),
             "training tokens"]
    rows = {v: {**{f"score @ {c}": {m: s["scores"][m][c - 1] for m in ("mean", "std")}
                   for c in cols}, "sampled score @ 1": s["sampled_score"],
                "training tokens": s["train_tokens"]} for v, s in stats.items()}
    first = {"SFT (start)": {**{f"score @ {c}": sft_scores[c - 1] for c in cols},
                             "sampled score @ 1": sft_sampled, "training tokens": float("nan")}}
    table = study.table(rows, heads, first=first, formats={"training tokens": ".3g"})
    return study.finish({
        "experiment": NAME, "task": cfg.task.name, "sft_scores": sft_scores,
        "sft_sampled_score": sft_sampled, "variants": stats,
        "claim": claim, "heldout_examples": len(study.held_out),
        "wall_time_s": time.perf_counter() - t_start, "resumed": opts.resume,
        "config": to_dict(cfg)}, table)


EXPERIMENT = Experiment(
    name=NAME, config_cls=Config, run=run, config=CONFIGS / f"{NAME}.yaml",
    description="ExIt vs turn-0 GRPO and a naive K-turn baseline: score vs self-iteration steps",
)

if __name__ == "__main__":
    from jaxrl_suite.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))

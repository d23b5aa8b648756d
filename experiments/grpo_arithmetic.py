"""GRPO on multi-digit addition: a small causal LM trained from scratch on CPU, over 3 seeds.

Claim checked (DeepSeekMath, arXiv 2402.03300): RL with a verifiable reward and group-relative
advantages raises held-out accuracy above the supervised (SFT-only) starting point.

    jaxrl-suite run grpo_arithmetic                     # full size (minutes on a 2-core CPU)
    jaxrl-suite run grpo_arithmetic --smoke             # seconds; what the tests run
    jaxrl-suite run grpo_arithmetic --resume            # a killed run continues where it stopped
    python experiments/grpo_arithmetic.py --set grpo.steps=50

Per seed of `run.seeds` (it seeds the model init, SFT and GRPO): SFT warm-up (teacher forcing on
`<answer>a+b</answer>`) -> held-out greedy accuracy -> GRPO -> held-out greedy accuracy. Each seed
checkpoints under checkpoints/grpo_sSEED/{sft,grpo} and logs runs/grpo_sSEED/metrics.jsonl; the
study writes summary.json, table.md (mean ± std and each seed) and reward_curve.png (median and
IQR over seeds) under results/grpo_arithmetic/.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import jax
import numpy as np

from experiments import CONFIGS
from jaxrl_suite.algorithms.grpo import GRPOConfig, SFTConfig
from jaxrl_suite.algorithms.lm_study import (
    EvalConfig,
    LMStudy,
    ModelConfig,
    RunConfig,
    TaskConfig,
    eval_record,
    lm_keys,
)
from jaxrl_suite.core.config import to_dict
from jaxrl_suite.core.experiment import EvalOptions, Experiment, RunOptions
from jaxrl_suite.core.metrics import read_metrics
from jaxrl_suite.core.parallel import print0

NAME = "grpo_arithmetic"
VARIANT = "grpo"
KEYS = ("sft_accuracy", "grpo_accuracy", "gain")


@dataclasses.dataclass(frozen=True)
class Config:
    task: TaskConfig = TaskConfig(name="arithmetic", digits=2, prompt_len=6)
    model: ModelConfig = ModelConfig()  # model.hf_path starts from a local HF checkpoint
    sft: SFTConfig = SFTConfig()
    grpo: GRPOConfig = GRPOConfig()
    eval: EvalConfig = EvalConfig(num_examples=512, sampled_examples=64)
    run: RunConfig = RunConfig(seeds=(0, 1, 2))


def run(cfg: Config, opts: RunOptions) -> dict:
    t_start = time.perf_counter()
    study = LMStudy(NAME, cfg, opts, variants=(VARIANT,))

    def train(variant: str, seed: int, _) -> dict:
        t0, ckpt, run_dir = time.perf_counter(), study.checkpoint_dir(variant, seed), \
            study.run_dir(variant, seed)
        with study.log(run_dir, [(ckpt / "sft", 0), (ckpt / "grpo", cfg.sft.steps)]) as log:
            sft_params = study.sft(seed, checkpoint_dir=ckpt / "sft", logger=log).params
            grpo = study.grpo_trainer(cfg.grpo, ref_params=sft_params)
            sft_eval = study.cached(run_dir / "sft_eval.json",
                                    lambda: study.evaluate(grpo, sft_params))
            print0(f"[{NAME}] seed {seed}: held-out accuracy after SFT:  "
                   f"{sft_eval['greedy_accuracy']:.3f}")

            state = study.fit(grpo, grpo.init_state(sft_params, lm_keys(seed).grpo),
                              stage="grpo", num_steps=cfg.grpo.steps,
                              checkpoint_dir=ckpt / "grpo", logger=log,
                              step_offset=cfg.sft.steps,
                              callback=study.periodic_eval(grpo, cfg.grpo.steps),
                              postfix=("reward", "accuracy", "tokens_per_s"))
            final = study.evaluate(grpo, state.params)
            log.log({"step": cfg.sft.steps + cfg.grpo.steps, "stage": "final",
                     **eval_record(final)})
        print0(f"[{NAME}] seed {seed}: held-out accuracy after GRPO: "
               f"{final['greedy_accuracy']:.3f}")
        records = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["stage"] == "grpo"
                   ] if jax.process_index() == 0 else []  # process 0 writes the log
        tps = [r["tokens_per_s"] for r in records[1:]] or [0.0]  # step 1 includes compiling
        return {"sft_accuracy": sft_eval["greedy_accuracy"],
                "grpo_accuracy": final["greedy_accuracy"],
                "gain": final["greedy_accuracy"] - sft_eval["greedy_accuracy"],
                "sampled": {k: v for k, v in final.items() if k != "greedy_accuracy"},
                "tokens_per_s_mean": float(np.mean(tps)),
                "wall_time_s": time.perf_counter() - t0}

    results = study.run(train)
    stats = study.aggregate(results, [*KEYS, "wall_time_s"])
    study.plot_runs(["reward", "accuracy", "length"], opts.out_dir / "reward_curve.png",
                    stage="grpo", smooth=10, title=f"GRPO on {cfg.task.title}: median and IQR "
                    f"over {len(study.seeds)} seeds")
    mean = {k: stats[VARIANT][k]["mean"] for k in KEYS}
    per_seed = {f"seed {r['seed']}": r for r in study.per_variant(results)[VARIANT]}
    return study.finish({
        "experiment": NAME, "variants": stats,
        "sft_heldout_accuracy": mean["sft_accuracy"],
        "grpo_heldout_accuracy": mean["grpo_accuracy"], "gain": mean["gain"],
        "heldout_examples": len(study.held_out), "wall_time_s": time.perf_counter() - t_start,
        "devices": int(study.lm.mesh.devices.size), "processes": jax.process_count(),
        "resumed": opts.resume, "config": to_dict(cfg),
    }, study.table(stats, KEYS, first=per_seed))


def evaluate(cfg: Config, opts: EvalOptions) -> dict:
    """`jaxrl-suite eval RUN_DIR [--stage sft|grpo] [--seed S]` (`LMStudy.evaluate_checkpoint`)."""
    return LMStudy(NAME, cfg, RunOptions(out_dir=opts.run_dir),
                   variants=(VARIANT,)).evaluate_checkpoint(opts, VARIANT)


EXPERIMENT = Experiment(
    name=NAME, config_cls=Config, run=run, evaluate=evaluate, config=CONFIGS / f"{NAME}.yaml",
    description="SFT then GRPO on n-digit addition, 3 seeds (DeepSeekMath GRPO)",
)

if __name__ == "__main__":
    from jaxrl_suite.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))

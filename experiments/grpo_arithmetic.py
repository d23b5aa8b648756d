"""GRPO on 2-digit addition: a small causal LM trained from scratch on CPU, over 3 seeds.

Claim checked (DeepSeekMath, arXiv 2402.03300): RL with a verifiable reward and group-relative
advantages raises held-out accuracy above the supervised (SFT-only) starting point.

    jaxrl-suite run grpo_arithmetic                     # full size (minutes on a 2-core CPU)
    jaxrl-suite run grpo_arithmetic --smoke             # seconds; what the tests run
    jaxrl-suite run grpo_arithmetic --resume            # a killed run continues where it stopped
    python experiments/grpo_arithmetic.py --set grpo.steps=50

Per seed of `run.seeds` (it seeds the model init, SFT and GRPO): SFT (teacher forcing on
`<answer>SUM</answer>`, the sum's digits least-significant first), stopped early by the start rule
of docs/grpo.md (validation accuracy, never the held-out split) -> the start's held-out greedy and
sampled accuracy and its per-digit loss -> GRPO -> held-out greedy and sampled accuracy; and the
control: SFT continued from the same start for as many optimizer steps as GRPO takes. Each seed
checkpoints under checkpoints/grpo_sSEED/{sft,grpo,sft_more} and logs runs/grpo_sSEED/metrics.jsonl
(SFT, GRPO) and runs/sft_more_sSEED/metrics.jsonl (the control); the study writes summary.json,
table.md (mean ± std and each seed) and reward_curve.png (median and IQR over seeds) under
results/grpo_arithmetic/.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time

import jax
import numpy as np

from jaxrl_suite.algorithms.grpo_config import GRPOConfig
from jaxrl_suite.algorithms.lm_study import (
    EvalConfig,
    LMStudy,
    ModelConfig,
    RunConfig,
    TaskConfig,
    eval_record,
    lm_keys,
)
from jaxrl_suite.algorithms.sft import SFTConfig
from jaxrl_suite.core.config import to_dict
from jaxrl_suite.core.experiment import EvalOptions, Experiment, RunOptions
from jaxrl_suite.core.metrics import read_metrics
from jaxrl_suite.core.parallel import print0
from jaxrl_suite_experiments import CONFIGS

NAME = "grpo_arithmetic"
VARIANT = "grpo"
KEYS = ("sft_accuracy", "grpo_accuracy", "gain", "sft_more_accuracy", "sft_sampled",
        "grpo_sampled", "sft_more_sampled", "sft_steps")
COLUMNS = {"sft_accuracy": "SFT greedy", "grpo_accuracy": "GRPO greedy", "gain": "gain",
           "sft_more_accuracy": "SFT continued greedy", "sft_sampled": "SFT sampled",
           "grpo_sampled": "GRPO sampled", "sft_more_sampled": "SFT continued sampled",
           "sft_steps": "SFT steps"}


@dataclasses.dataclass(frozen=True)
class Config:
    task: TaskConfig = TaskConfig(name="arithmetic", digits=2, prompt_len=6, digit_order="lsb")
    model: ModelConfig = ModelConfig()  # model.hf_path starts from a local HF checkpoint
    sft: SFTConfig = SFTConfig()
    grpo: GRPOConfig = GRPOConfig()
    eval: EvalConfig = EvalConfig(num_examples=512, sampled_examples=512)
    run: RunConfig = RunConfig(seeds=(0, 1, 2))


def run(cfg: Config, opts: RunOptions) -> dict:
    t_start = time.perf_counter()
    study = LMStudy(NAME, cfg, opts, variants=(VARIANT,), seeds_on_device=True)
    vmapped = opts.out_dir / "checkpoints" / "grpo_seeds"  # run.vmap_seeds: the stacked state
    logs, starts, finals = {}, {}, {}
    stack = contextlib.ExitStack()  # the seeds' logs stay open until every run has ended

    def log_of(seed: int):  # each seed's log, opened once
        if seed not in logs:
            ckpt = study.checkpoint_dir(VARIANT, seed)
            grpo_dir = vmapped if cfg.run.vmap_seeds else ckpt / "grpo"
            logs[seed] = stack.enter_context(study.log(
                study.run_dir(VARIANT, seed), [(ckpt / "sft", 0), (grpo_dir, cfg.sft.steps)]))
        return logs[seed]

    def start(seed: int) -> tuple:  # SFT by the start rule and its evaluation, once
        if seed not in starts:
            ckpt, run_dir = study.checkpoint_dir(VARIANT, seed), study.run_dir(VARIANT, seed)
            sft_state = study.sft(seed, checkpoint_dir=ckpt / "sft", logger=log_of(seed))
            grpo = study.grpo_trainer(cfg.grpo, ref_params=sft_state.params)
            sft_eval = study.cached(run_dir / "sft_eval.json", lambda: {
                **study.evaluate(grpo, sft_state.params),
                "place_loss": study.answer_loss(grpo, sft_state.params)})
            print0(f"[{NAME}] seed {seed}: after {int(sft_state.step)} SFT steps, held-out "
                   f"greedy {sft_eval['greedy_accuracy']:.3f}, sampled "
                   f"{sft_eval['sampled_accuracy']:.3f}")
            starts[seed] = (sft_state, grpo, sft_eval)
        return starts[seed]

    def grpo_stage(seed: int):  # the host loop per seed, or every seed in one program
        sft_state, grpo, _ = start(seed)
        if not cfg.run.vmap_seeds:
            init = grpo.init_state(sft_state.params, lm_keys(seed).grpo,
                                   sft_opt_state=sft_state.opt_state)
            return study.fit(grpo, init, stage="grpo", num_steps=cfg.grpo.steps,
                             checkpoint_dir=study.checkpoint_dir(VARIANT, seed) / "grpo",
                             logger=log_of(seed), step_offset=cfg.sft.steps,
                             callback=study.periodic_eval(grpo, cfg.grpo.steps),
                             postfix=("reward", "accuracy", "tokens_per_s"))
        if seed not in finals:  # every seed (a finished one's GRPO is checkpointed: restored)
            finals.update(study.fit_seeds(
                grpo, {s: start(s)[0].params for s in study.seeds},
                checkpoint_dir=vmapped, loggers={s: log_of(s) for s in study.seeds},
                step_offset=cfg.sft.steps))
        return finals[seed]

    def train(variant: str, seed: int, _) -> dict:
        t0, run_dir = time.perf_counter(), study.run_dir(variant, seed)
        sft_state, grpo, sft_eval = start(seed)
        state = grpo_stage(seed)
        final = study.evaluate(grpo, state.params)
        log_of(seed).log({"step": cfg.sft.steps + cfg.grpo.steps, "stage": "final",
                                 **eval_record(final)})
        sft_steps = int(sft_state.step)
        # The control: the same SFT, continued from the start for as many optimizer steps.
        more = study.continued_sft(sft_state, steps=cfg.grpo.steps,
                                   checkpoint_dir=study.checkpoint_dir(variant, seed) / "sft_more",
                                   log_dir=study.run_dir("sft_more", seed))
        more_eval = study.evaluate(grpo, more.params)
        print0(f"[{NAME}] seed {seed}: held-out greedy after GRPO {final['greedy_accuracy']:.3f} "
               f"(sampled {final['sampled_accuracy']:.3f}), after continued SFT "
               f"{more_eval['greedy_accuracy']:.3f} ({more_eval['sampled_accuracy']:.3f})")
        records = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["stage"] == "grpo"
                   ] if jax.process_index() == 0 else []  # process 0 writes the log
        tps = [r["tokens_per_s"] for r in records[1:]] or [0.0]  # step 1 includes compiling
        return {"sft_accuracy": sft_eval["greedy_accuracy"],
                "sft_sampled": sft_eval["sampled_accuracy"],
                "grpo_accuracy": final["greedy_accuracy"],
                "grpo_sampled": final["sampled_accuracy"],
                "gain": final["greedy_accuracy"] - sft_eval["greedy_accuracy"],
                "sft_more_accuracy": more_eval["greedy_accuracy"],
                "sft_more_sampled": more_eval["sampled_accuracy"],
                "sft_steps": sft_steps, "sft_place_loss": sft_eval["place_loss"],
                "sampled": {k: v for k, v in final.items()
                            if k not in ("greedy_accuracy", "sampled_accuracy")},
                "tokens_per_s_mean": float(np.mean(tps)),
                "wall_time_s": time.perf_counter() - t0}

    with stack:
        results = study.run(train)
    stats = study.aggregate(results, [*KEYS, "wall_time_s"])
    study.plot_runs(["reward", "accuracy", "length"], opts.out_dir / "reward_curve.png",
                    stage="grpo", smooth=10, title=f"GRPO on {cfg.task.title}: median and IQR "
                    f"over {len(study.seeds)} seeds")
    mean = {k: stats[VARIANT][k]["mean"] for k in KEYS}
    runs = study.per_variant(results)[VARIANT]
    per_seed = {f"seed {r['seed']}": r for r in runs}
    return study.finish({
        "experiment": NAME, "variants": stats,
        "sft_heldout_accuracy": mean["sft_accuracy"],
        "grpo_heldout_accuracy": mean["grpo_accuracy"], "gain": mean["gain"],
        "sft_more_heldout_accuracy": mean["sft_more_accuracy"],
        "sft_heldout_sampled": mean["sft_sampled"], "grpo_heldout_sampled": mean["grpo_sampled"],
        "sft_place_loss": {f"seed {r['seed']}": r["sft_place_loss"] for r in runs},
        "heldout_examples": len(study.held_out), "wall_time_s": time.perf_counter() - t_start,
        "devices": int(study.lm.mesh.devices.size), "processes": jax.process_count(),
        "resumed": opts.resume, "config": to_dict(cfg),
    }, study.table(stats, COLUMNS, first=per_seed,
                   formats={"sft_steps": ".0f"}))


def evaluate(cfg: Config, opts: EvalOptions) -> dict:
    """`jaxrl-suite eval RUN_DIR [--stage sft|grpo] [--seed S]` (`LMStudy.evaluate_checkpoint`)."""
    return LMStudy(NAME, cfg, RunOptions(out_dir=opts.run_dir),
                   variants=(VARIANT,)).evaluate_checkpoint(opts, VARIANT)


EXPERIMENT = Experiment(
    name=NAME, config_cls=Config, run=run, evaluate=evaluate, config=CONFIGS / f"{NAME}.yaml",
    description="SFT then GRPO on 2-digit addition, with a continued-SFT control, 3 seeds "
                "(DeepSeekMath GRPO)",
)

if __name__ == "__main__":
    from jaxrl_suite.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))

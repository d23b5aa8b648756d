"""GenCLS++ strategies x {SFT, SFT+RL} on generated topic classification, 3 seeds.

Claims checked (GenCLS++, arXiv 2504.19898): (a) RL with the rule reward after an SFT warm-up
adds on average +3.46 % accuracy over SFT alone; (b) classification is better without an
explicit reasoning span before the label.

    jaxrl-suite run gencls_strategies               # full size (36 min on a busy 2-core CPU)
    jaxrl-suite run gencls_strategies --smoke       # seconds; what the tests run
    jaxrl-suite run gencls_strategies --resume      # a killed run continues where it stopped
    jaxrl-suite run gencls_strategies --set task.name=ag_news task.data_dir=~/tensorflow_datasets

Task: `topics` (envs/text/topics.py): the topic is the one of the sentence's agent, and every
text carries the keywords of two or three topics, so a keyword matcher (the table's first row)
does poorly. Any TFDS classification adapter works too (`task.name`, e.g. ag_news).

Per strategy (`algorithms.gencls.StrategyConfig`: base, icl_random, icl_nearest, definitions,
uncertain, numeric, ppl, reasoning) and seed: SFT on the strategy's prompts and solutions ->
held-out accuracy -> GRPO with the rule reward r = 1[label = gold] -> held-out accuracy. Each
strategy pads its prompts and completions to its own lengths (one `LMStudy` per strategy, so
one compiled program set each). "ppl" changes decoding only (the paper's inference-time
perplexity-based decoding), so it trains nothing: it evaluates the "base" strategy's SFT and
RL checkpoints of the same seed with perplexity-based decoding. Beside each greedy accuracy, a
trained strategy reports its sampled accuracy: pass@1 of one completion per held-out prompt
sampled at the training temperature (grpo.temperature; `LMStudy.sampled_accuracy`); "ppl" has
none (its decoding samples nothing). Writes summary.json (claims with verdicts), table.md,
accuracy.png (grouped bars) and reward.png (GRPO reward curves).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Annotated

import jax
import numpy as np

from jaxrl_suite.algorithms import lm_study as kit
from jaxrl_suite.algorithms.gencls import (
    StrategiesConfig,
    StrategyConfig,
    StrategyTask,
    evaluate_strategy,
    needed_lengths,
)
from jaxrl_suite.core.config import ConfigError, Range, check_fields, to_dict
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.core.parallel import print0
from jaxrl_suite.core.study import Study, seed_stats
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.envs.text.topics import TopicsTask, keyword_baseline_accuracy
from jaxrl_suite_experiments import CONFIGS

NAME = "gencls_strategies"
KEYS = {"sft_accuracy": "SFT", "sft_sampled_accuracy": "SFT sampled", "rl_accuracy": "SFT+RL",
        "rl_sampled_accuracy": "SFT+RL sampled", "gain": "RL gain",
        "rl_uncertain": "uncertain (RL)", "rl_invalid": "invalid (RL)"}
SAMPLED = ("sft_sampled_accuracy", "rl_sampled_accuracy")  # free-decoding strategies only
PAPER_GAIN = 3.46  # points of accuracy over naive SFT, the paper's average over 7 datasets


@dataclasses.dataclass(frozen=True)
class TopicsConfig:
    # topics: fraction of undecidable texts (two agents)
    ambiguous: Annotated[float, Range(ge=0, lt=1)] = 0.1
    templates: tuple[str, ...] = ("active", "passive", "fronted")  # topics: sentence forms

    def __post_init__(self):
        check_fields(self, "topics.")  # the Ranges declared above


@dataclasses.dataclass(frozen=True)
class Config:
    # task.prompt_len / grpo.max_new_tokens are caps: each strategy pads to what it needs
    task: kit.TaskConfig = kit.TaskConfig(name="topics", prompt_len=512)
    topics: TopicsConfig = TopicsConfig()
    strategies: StrategiesConfig = StrategiesConfig()
    model: kit.ModelConfig = kit.ModelConfig()  # model.hf_path starts from a local HF checkpoint
    sft: kit.SFTConfig = kit.SFTConfig()
    grpo: kit.GRPOConfig = kit.GRPOConfig(max_new_tokens=128)
    eval: kit.EvalConfig = kit.EvalConfig()
    run: kit.RunConfig = kit.RunConfig(seeds=(0, 1, 2), keep_checkpoints=2)


def base_task(cfg: Config):
    """The classification task: topics with the `topics` section, or `task.name` built by the
    kit (a TFDS adapter such as ag_news, with task.data_dir)."""
    if cfg.task.name != "topics":
        return cfg.task.build()
    try:
        return TopicsTask(ambiguous=cfg.topics.ambiguous, templates=cfg.topics.templates,
                          seed=cfg.task.seed)
    except ValueError as e:
        raise ConfigError(f"config section 'topics': {e}") from None


def strategy_study(cfg: Config, opts: RunOptions, base, name: str) -> kit.LMStudy:
    """The `LMStudy` of one trained strategy: its `StrategyTask`, prompts and completions padded
    to the multiple of 8 above what it needs (capped by task.prompt_len, grpo.max_new_tokens)."""
    task = StrategyTask(base, cfg.strategies.strategy(name), seed=cfg.task.seed)
    prompt, completion = needed_lengths(task, load_tokenizer(cfg.model.hf_path or
                                                            cfg.run.tokenizer))
    for field, need, cap in (("task.prompt_len", prompt, cfg.task.prompt_len),
                             ("grpo.max_new_tokens", completion, cfg.grpo.max_new_tokens)):
        if need > cap:
            raise ConfigError(f"config field '{field}' is {cap} but strategy {name!r} needs "
                              f"{need} tokens")
    up = lambda n, cap: min(cap, -(-n // 8) * 8)
    sub = dataclasses.replace(
        cfg, task=dataclasses.replace(cfg.task, prompt_len=up(prompt, cfg.task.prompt_len)),
        grpo=dataclasses.replace(cfg.grpo, max_new_tokens=up(completion,
                                                             cfg.grpo.max_new_tokens)))
    return kit.LMStudy(NAME, sub, opts, variants=(name,), task=task, write_config=False)


def run(cfg: Config, opts: RunOptions) -> dict:
    t_start = time.perf_counter()
    names = cfg.strategies.names
    study = Study(NAME, opts, names, cfg.run.seeds)
    study.write_config(cfg)
    base = base_task(cfg)
    studies = {v: strategy_study(cfg, opts, base, v) for v in names if cfg.strategies.twin(v)
               == v}
    trainers: dict[str, tuple] = {}  # strategy -> (SFT trainer, GRPO trainer), built once

    def trainers_of(name: str):
        if name not in trainers:
            sub = studies[name]
            trainers[name] = (sub.sft_trainer(), sub.grpo_trainer(sub.cfg.grpo, ref_params=None))
        return trainers[name]

    def evaluate(name: str, params, strategy: StrategyConfig) -> dict:
        """The strategy's held-out accuracy (and rates) under its decoding, and for free
        decoding `sampled_accuracy` at the training temperature."""
        sub, grpo = studies[name], trainers_of(name)[1]
        out = evaluate_strategy(grpo, params, sub.lm.task, sub.held_out,
                                batch_size=cfg.eval.batch_size, decoding=strategy.decoding,
                                norm=strategy.ppl_norm)
        if strategy.decoding == "free":
            out["sampled_accuracy"] = sub.sampled_accuracy(grpo, params)
        return out

    def train(variant: str, seed: int, _) -> dict:
        t0, strategy, source = time.perf_counter(), cfg.strategies.strategy(variant), \
            cfg.strategies.twin(variant)
        times = {"sft": 0.0, "grpo": 0.0}  # stage wall times (compiling included)
        sub, keys = studies[source], kit.lm_keys(seed)
        sft_trainer, grpo = trainers_of(source)
        ckpt, run_dir = study.checkpoint_dir(source, seed), study.run_dir(variant, seed)
        if source != variant:  # decoding only: the twin's checkpoints of this seed
            sft_params = sub.restore(sft_trainer, sft_trainer.init_state(sub.lm.params, keys.sft),
                                     ckpt / "sft", what=variant).params
            rl_params = sub.restore(grpo, grpo.init_state(sub.lm.params, keys.grpo),
                                    ckpt / "grpo", what=variant).params
            sft_eval = evaluate(source, sft_params, strategy)
        else:
            with sub.log(run_dir, [(ckpt / "sft", 0), (ckpt / "grpo", cfg.sft.steps)]) as log:
                init = sft_trainer.init_state(sub.lm.init_params(seed), keys.sft)
                sft_params = sub.fit(sft_trainer, init, stage="sft", num_steps=cfg.sft.steps,
                                     checkpoint_dir=ckpt / "sft", logger=log).params
                times["sft"] = time.perf_counter() - t0
                sft_eval = study.cached(run_dir / "sft_eval.json",
                                        lambda: evaluate(source, sft_params, strategy))
                t1 = time.perf_counter()
                print0(f"[{NAME}] {variant} seed {seed}: held-out accuracy after SFT: "
                       f"{sft_eval['accuracy']:.3f}")
                state = sub.fit(grpo, grpo.init_state(sft_params, keys.grpo), stage="grpo",
                                num_steps=cfg.grpo.steps, checkpoint_dir=ckpt / "grpo",
                                logger=log, step_offset=cfg.sft.steps,
                                postfix=("reward", "accuracy"))
                rl_params = state.params
                times["grpo"] = time.perf_counter() - t1
                rl_eval = evaluate(source, rl_params, strategy)
                log.log({"step": cfg.sft.steps + cfg.grpo.steps, "stage": "final",
                         "eval_accuracy": rl_eval["accuracy"]})
        if source != variant:
            rl_eval = evaluate(source, rl_params, strategy)
        sampled = {f"{stage}_sampled_accuracy": e["sampled_accuracy"] for stage, e in
                   (("sft", sft_eval), ("rl", rl_eval)) if "sampled_accuracy" in e}
        return {"sft_accuracy": sft_eval["accuracy"], "rl_accuracy": rl_eval["accuracy"],
                **sampled, "gain": rl_eval["accuracy"] - sft_eval["accuracy"],
                "sft_uncertain": sft_eval["uncertain_rate"],
                "rl_uncertain": rl_eval["uncertain_rate"],
                "sft_invalid": sft_eval["invalid_rate"], "rl_invalid": rl_eval["invalid_rate"],
                "prompt_len": sub.cfg.task.prompt_len,
                "max_new_tokens": sub.cfg.grpo.max_new_tokens,
                "sft_time_s": times["sft"], "grpo_time_s": times["grpo"],
                "wall_time_s": time.perf_counter() - t0}

    results = study.run(train)
    stats = study.aggregate(results, [k for k in (*KEYS, "sft_uncertain", "sft_invalid",
                                                  "wall_time_s") if k not in SAMPLED])
    for v, runs in study.per_variant(results).items():  # the strategies that sample
        if cfg.strategies.strategy(v).decoding == "free":
            stats[v].update({k: seed_stats([r[k] for r in runs]) for k in SAMPLED})
    keyword = keyword_baseline_accuracy(base, "test", cfg.eval.num_examples) if isinstance(
        base, TopicsTask) else None
    claims = _claims(stats, names)
    study.plot_bars({v: {"SFT": stats[v]["sft_accuracy"]["per_seed"],
                         "SFT+RL": stats[v]["rl_accuracy"]["per_seed"]} for v in names},
                    opts.out_dir / "accuracy.png", ylabel="held-out accuracy", hline=keyword,
                    ylim=(0.0, 1.0), title=f"{NAME} on {cfg.task.name}: mean ± std over "
                    f"{len(study.seeds)} seeds (dashed: keyword matcher)")
    trained = [v for v in names if v in studies]
    if jax.process_index() == 0:  # the runs' logs are written by process 0
        window = max(1, cfg.grpo.steps // 10)
        study.plot_curves(study.curves(("reward",), stage="grpo", variants=trained), "reward",
                          opts.out_dir / "reward.png", smooth=window, xlabel="GRPO step",
                          ylabel="rule reward (training batch)",
                          title=f"GRPO reward: median and IQR over {len(study.seeds)} seeds "
                                f"(moving average {window})")
    first = {} if keyword is None else {"keyword matcher": {
        "sft_accuracy": keyword, **{k: float("nan") for k in KEYS if k != "sft_accuracy"}}}
    return study.finish({
        "experiment": NAME, "task": cfg.task.name, "strategies": stats, "claims": claims,
        "keyword_baseline_accuracy": keyword,
        "lengths": {v: {"prompt_len": studies[v].cfg.task.prompt_len,
                        "max_new_tokens": studies[v].cfg.grpo.max_new_tokens} for v in studies},
        "heldout_examples": cfg.eval.num_examples, "wall_time_s": time.perf_counter() - t_start,
        "resumed": opts.resume, "config": to_dict(cfg),
    }, study.table(stats, KEYS, first=first, label="strategy"))


def _verdict(per_seed: np.ndarray) -> str:
    """"reproduced" when every seed's value is > 0, "mixed" when only the mean over seeds is."""
    return kit.LMStudy.verdict(bool((per_seed > 0).all()), per_seed.mean() > 0,
                               partly_label="mixed")


def _claims(stats: dict, names) -> dict:
    """Each claim's numbers and a verdict computed from them (accuracies in [0, 1]; *_points in
    percentage points, as the paper reports)."""
    gains = np.array([stats[v]["gain"]["per_seed"] for v in names])  # [strategies, seeds]
    per_seed = gains.mean(axis=0)  # the mean RL gain over strategies, per seed
    best = max(names, key=lambda v: stats[v]["rl_accuracy"]["mean"])
    out = {"rl_over_sft": {
        "paper": f"SFT + RL beats SFT alone by +{PAPER_GAIN} points on average",
        "mean_gain": float(per_seed.mean()), "mean_gain_points": float(100 * per_seed.mean()),
        "mean_gain_per_seed": per_seed.tolist(),
        "gain_per_strategy": {v: stats[v]["gain"]["mean"] for v in names},
        "strategies_gaining": int(sum(stats[v]["gain"]["mean"] > 0 for v in names)),
        "best_rl_strategy": best,
        "best_rl_over_base_sft": (stats[best]["rl_accuracy"]["mean"] - stats["base"][
            "sft_accuracy"]["mean"]) if "base" in names else None,
        "verdict": _verdict(per_seed)}}
    if {"base", "reasoning"} <= set(names):
        diff = np.array(stats["base"]["rl_accuracy"]["per_seed"]) - np.array(
            stats["reasoning"]["rl_accuracy"]["per_seed"])
        sft_diff = np.array(stats["base"]["sft_accuracy"]["per_seed"]) - np.array(
            stats["reasoning"]["sft_accuracy"]["per_seed"])
        out["no_reasoning_better"] = {
            "paper": "classification is better without an explicit reasoning span",
            "base_rl_accuracy": stats["base"]["rl_accuracy"]["mean"],
            "reasoning_rl_accuracy": stats["reasoning"]["rl_accuracy"]["mean"],
            "difference": float(diff.mean()), "difference_per_seed": diff.tolist(),
            "sft_difference": float(sft_diff.mean()), "verdict": _verdict(diff)}
    else:
        out["no_reasoning_better"] = {"verdict": "not measured",
                                      "needs": "strategies base and reasoning"}
    return out


EXPERIMENT = Experiment(
    name=NAME, config_cls=Config, run=run, config=CONFIGS / f"{NAME}.yaml",
    description="GenCLS++ prompt strategies x {SFT, SFT+RL} on topic classification, 3 seeds",
)

if __name__ == "__main__":
    from jaxrl_suite.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))

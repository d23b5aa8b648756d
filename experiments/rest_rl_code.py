"""ReST-RL on generated code tasks: ReST-GRPO's data filter against naive GRPO and ReST-DPO in
training, and value-model-guided MCTS (VM-MCTS) against greedy, ORM-BoN, PRM-BoN and ORM-MCTS at
equal token budgets in decoding (Zhoubian et al. 2025, arXiv 2508.19576; THUDM/ReST-RL).

Claims checked: ReST-GRPO, which keeps only problems whose sampled rewards vary and adds
partial-solution prompts cut from the best samples, raises the reward variance of GRPO's
batches and beats naive GRPO and ReST-DPO on held-out problems; VM-MCTS beats PRM-BoN and
ORM-MCTS at the same number of generated tokens.

    jaxrl-suite run rest_rl_code            # full size (see docs/rest_rl.md for the time)
    jaxrl-suite run rest_rl_code --smoke    # seconds; what the tests run
    jaxrl-suite run rest_rl_code --resume   # a killed run continues where it stopped

One SFT checkpoint on the code task (`envs/text/code.py`) starts every run; the control is the
same SFT continued for grpo.steps more steps. Variants, `rest.rounds` rounds each (docs/rest_rl.md):
  grpo       GRPO on the task's problems, grpo.steps // rounds steps a round;
  rest_grpo  each round samples rest.samples completions of rest.problems training problems,
             keeps those whose reward std >= rest.min_std, adds partial-solution prompts from
             their best samples (`curricula.rest`) and runs the same GRPO steps on that list;
  rest_dpo   the same samples; DPO on each kept problem's (best, worst) pair, rest.dpo_steps
             steps a round, the reference being the round's start.
Then, on the run with the best held-out strict accuracy: collection-mode MCTS (verified rewards,
c = 0.2) gives the value model's (VM) targets and the outcome model's (ORM) finished programs,
both `ValueLM`s warm-started from the policy; greedy and `mcts.decode_at_budgets`'s decoders run
on search.problems held-out problems at each of search.budgets generated tokens per problem.
Writes summary.json, table.md, decoding.md, variance.png and decoding.png.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import jax
import numpy as np

from jaxrl_suite.algorithms import lm_study as kit
from jaxrl_suite.algorithms.preference import PreferenceTrainer
from jaxrl_suite.algorithms.rest import (
    RestConfig,
    RestSearchConfig,
    decoding_comparison,
    rest_dpo_trainer,
    rest_grpo_task,
)
from jaxrl_suite.core.config import to_dict
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.core.metrics import pyplot, read_metrics, save_figure
from jaxrl_suite.core.parallel import print0
from jaxrl_suite.core.study import format_numbers
from jaxrl_suite.curricula.rest import filter_stats
from jaxrl_suite_experiments import CONFIGS

NAME = "rest_rl_code"


@dataclasses.dataclass(frozen=True)
class Config:
    task: kit.TaskConfig = kit.TaskConfig(name="code", level=2, prompt_len=144)
    model: kit.ModelConfig = kit.ModelConfig()
    sft: kit.SFTConfig = kit.SFTConfig()
    grpo: kit.GRPOConfig = kit.GRPOConfig(group_size=5, max_new_tokens=80)
    rest: RestConfig = RestConfig()
    search: RestSearchConfig = RestSearchConfig()
    eval: kit.EvalConfig = kit.EvalConfig(num_examples=128)
    run: kit.RunConfig = kit.RunConfig(seeds=(0, 1, 2), keep_checkpoints=2)

    def __post_init__(self):
        if self.grpo.steps % self.rest.rounds:
            raise ValueError(f"grpo.steps={self.grpo.steps} must divide into rest.rounds="
                             f"{self.rest.rounds} rounds")


def run(cfg: Config, opts: RunOptions) -> dict:
    t_start = time.perf_counter()
    study = kit.LMStudy(NAME, cfg, opts, variants=cfg.rest.names)
    task, tok, model = study.lm.task, study.lm.tokenizer, study.lm.model
    sft_state = study.shared_sft()
    sft_params = sft_state.params
    long_prompt = cfg.task.prompt_len + cfg.grpo.max_new_tokens  # prompt + a partial solution
    grpo = study.grpo_trainer(cfg.grpo, sft_params)
    rest_grpo = study.grpo_trainer(cfg.grpo, sft_params, prompt_len=long_prompt)
    dpo = PreferenceTrainer(model, tok, task, cfg.rest.dpo, mesh=study.lm.mesh,
                            prompt_len=cfg.task.prompt_len,
                            max_new_tokens=cfg.grpo.max_new_tokens, ref_params=sft_params,
                            greedy_sampler=grpo.greedy_sampler,
                            eval_sampler=grpo.eval_sampler)
    per_round = cfg.grpo.steps // cfg.rest.rounds
    round_steps = {"grpo": per_round, "rest_grpo": per_round, "rest_dpo": cfg.rest.dpo.steps}

    def evaluate(params) -> dict:
        texts, lengths = grpo.complete(params, study.held_out, batch_size=cfg.eval.batch_size)
        v = task.verify_batch(texts, study.held_out)
        return {"strict_accuracy": float(np.mean([s == 1.0 for s in v.scores])),
                "pass_rate": float(np.mean(v.scores)), "length": float(lengths.mean()),
                **{k: v for k, v in study.evaluate(grpo, params).items()
                   if k.startswith("pass@")}}

    def collect(params, seed: int, r: int) -> dict:
        """rest.samples completions of round r's problems, with their rewards."""
        c = cfg.rest
        problems = task.examples("train", r * c.problems, c.problems)
        flat = [e for e in problems for _ in range(c.samples)]
        texts, _ = grpo.complete(
            params, flat, batch_size=cfg.eval.batch_size,
            rng=jax.random.fold_in(study.grpo_key(seed), 1000 + r))
        rewards = task.verify_batch(texts, flat).scores
        shape = (c.problems, c.samples)
        return {"start": r * c.problems, "texts": np.array(texts, object).reshape(shape).tolist(),
                "rewards": np.reshape(rewards, shape).tolist()}

    def train(variant: str, seed: int, _) -> dict:
        t0, c = time.perf_counter(), cfg.rest
        ckpt, run_dir = study.checkpoint_dir(variant, seed), study.run_dir(variant, seed)
        k = round_steps[variant]
        stages = [(ckpt / f"round{r}", r * k) for r in range(c.rounds)]
        params, state, filters = sft_params, None, []
        with study.log(run_dir, stages) as log:
            for r, (directory, offset) in enumerate(stages):
                trainer = grpo
                if variant != "grpo":
                    data = study.cached(run_dir / f"round{r}_samples.json",
                                        lambda r=r, p=params: collect(p, seed, r))
                    problems = task.examples("train", data["start"], c.problems)
                    filters.append(filter_stats(data["rewards"], min_std=c.min_std))
                    trainer = (rest_grpo_task(rest_grpo, task, problems, data, c, seed, r)
                               if variant == "rest_grpo" else
                               rest_dpo_trainer(dpo, problems, data, c, params))
                if variant == "rest_dpo":
                    init = trainer.init_state(params, jax.random.fold_in(study.grpo_key(seed), r))
                elif state is None:
                    init = trainer.init_state(params, study.grpo_key(seed))
                else:  # GRPO continues its state (optimizer, step) across the rounds
                    init = state
                state = study.fit(trainer, init, stage="dpo" if variant == "rest_dpo" else "grpo",
                                  num_steps=(r + 1) * k if variant != "rest_dpo" else k,
                                  checkpoint_dir=directory, logger=log,
                                  step_offset=0 if variant != "rest_dpo" else offset,
                                  postfix=("reward", "loss"))
                params = state.params
        recs = [x for x in read_metrics(run_dir / "metrics.jsonl")
                if "reward_var" in x] if jax.process_index() == 0 else []
        out = {**evaluate(params), "wall_time_s": time.perf_counter() - t0}
        for key in ("kept_fraction", "reward_var_before", "reward_var_after"):
            values = [f[key] for f in filters if np.isfinite(f[key])]
            out[f"filter_{key}"] = float(np.mean(values)) if values else float("nan")
        # GRPO: the mean within-group reward variance of its batches; DPO trains on no batch of
        # its own, so its figure is that of the samples it collected (before the filter)
        out["reward_var"] = float(np.mean([x["reward_var"] for x in recs])) if recs else \
            out["filter_reward_var_before"]
        return out

    results = study.run(train)
    keys = ["strict_accuracy", "pass_rate", "pass@1", "reward_var", "filter_kept_fraction",
            "filter_reward_var_before", "filter_reward_var_after"]
    keys = [k for k in keys if all(k in r for r in results.values())]
    stats = study.aggregate(results, keys)
    sft_eval = study.cached(opts.out_dir / "sft_eval.json", lambda: evaluate(sft_params))
    # The control: the same SFT continued for as many optimizer steps as a GRPO run takes.
    sft_more = study.sft_control(sft_state, evaluate)
    print0(f"[{NAME}] SFT: {format_numbers(sft_eval)}; continued SFT: "
           f"{format_numbers(sft_more)}")
    best = max(results.values(), key=lambda r: (r["strict_accuracy"], r["pass_rate"]))
    trainer = {"grpo": grpo, "rest_grpo": rest_grpo, "rest_dpo": dpo}[best["variant"]]
    best_params = study.restore(  # the best run's last round's checkpoint
        trainer, trainer.init_state(study.lm.params, study.grpo_key(best["seed"])),
        study.checkpoint_dir(best["variant"], best["seed"]) / f"round{cfg.rest.rounds - 1}").params
    decoding = study.cached(opts.out_dir / "decoding.json",
                            lambda: decoding_comparison(study, cfg.search, best_params,
                                                        long_prompt))
    claims = None
    if jax.process_index() == 0:
        claims = _claims(stats, decoding, study.variants)
        curves = study.curves(("reward_var", "reward"), stage="grpo",
                              variants=[v for v in study.variants if v != "rest_dpo"])
        if curves:
            study.plot_curves(curves, "reward_var", opts.out_dir / "variance.png",
                              smooth=max(1, per_round // 5), xlabel="GRPO step",
                              ylabel="mean within-group reward variance",
                              title="reward variance of GRPO's batches")
        _plot_decoding(decoding, opts.out_dir / "decoding.png")
        (opts.out_dir / "decoding.md").write_text(_decoding_table(study, decoding))
    for name, row in (claims or {}).items():
        print0(f"[{NAME}] {name}: {format_numbers(row)}")
    return study.finish({
        "experiment": NAME, "variants": stats, "sft": sft_eval, "sft_more": sft_more,
        "claims": claims,
        "best_run": {"variant": best["variant"], "seed": best["seed"]}, "decoding": decoding,
        "wall_time_s": time.perf_counter() - t_start, "resumed": opts.resume,
        "config": to_dict(cfg)},
        study.table(stats, keys, first={"SFT": sft_eval, "SFT continued": sft_more}))


def _claims(stats: dict, decoding: dict, variants) -> dict:
    """The numbers the claims are judged by (verdicts: docs/rest_rl.md)."""
    out = {}
    for v in variants:
        if v == "rest_grpo":
            continue
        row = {}
        for k in ("strict_accuracy", "pass_rate", "reward_var"):
            if "rest_grpo" in stats and k in stats[v]:
                c = kit.LMStudy.compare(stats, "rest_grpo", v, k)
                row[f"{k}_rest_grpo_minus"], row[f"{k}_p"] = c["difference"], c["p_welch"]
        out[f"rest_grpo vs {v}"] = row
    dec = decoding["decoders"]
    for other in ("prm_bon", "orm_mcts"):
        if "vm_mcts" in dec and other in dec:
            out[f"vm_mcts vs {other}"] = {
                f"budget_{b}": dec["vm_mcts"]["accuracy"][i] - dec[other]["accuracy"][i]
                for i, b in enumerate(decoding["budgets"])}
    return out


def _decoding_table(study, decoding: dict) -> str:
    """Per decoder, its held-out strict accuracy and mean generated tokens at each budget
    (greedy: its one budget-free point in every column)."""
    cells = {name: [f"{a:.3f} ({t:.0f} tok)" for a, t in zip(row["accuracy"], row["tokens"],
                                                           strict=True)]
             for name, row in decoding["decoders"].items()}
    return study.table({name: {str(b): c[min(i, len(c) - 1)]
                               for i, b in enumerate(decoding["budgets"])}
                        for name, c in cells.items()},
                       {str(b): f"{b} tokens" for b in decoding["budgets"]}, label="decoder")


def _plot_decoding(decoding: dict, path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, row in decoding["decoders"].items():
        style = "o" if name == "greedy" else "o-"
        ax.plot(row["tokens"], row["accuracy"], style, label=name)
    ax.set_xlabel("generated tokens per problem (mean)")
    ax.set_ylabel("held-out strict accuracy")
    ax.set_title("decoding at equal token budgets")
    ax.legend()
    save_figure(fig, path)


EXPERIMENT = Experiment(
    name=NAME, config_cls=Config, run=run, config=CONFIGS / f"{NAME}.yaml",
    description="ReST-GRPO vs GRPO vs ReST-DPO on code, and VM-MCTS decoding (ReST-RL)",
)

if __name__ == "__main__":
    from jaxrl_suite.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))

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

One SFT checkpoint on the code task (`envs/text/code.py`; rewards from the sandbox) starts every
run; the control beside them is the same SFT continued for grpo.steps more steps. Variants,
`rest.rounds` rounds each:
  grpo       GRPO on the task's problems, grpo.steps // rounds steps a round;
  rest_grpo  each round samples rest.samples completions of rest.problems training problems with
             the current policy, keeps the problems whose reward std >= rest.min_std and adds
             partial-solution prompts from their best samples (`curricula.rest`), then runs the
             same GRPO steps on that list (`ExampleList`);
  rest_dpo   the same samples; DPO (`algorithms.preference`) on each kept problem's (best,
             worst) pair, rest.dpo_steps steps a round, the reference being the round's start.
Then, on the run with the best held-out strict accuracy: MCTS in collection mode (verified
rewards, c = 0.2) on search.collect_problems training problems gives value targets for the value
model (VM) and finished programs with their rewards for an outcome reward model (ORM), both
`ValueLM`s warm-started from the policy; the five decoders run on search.problems held-out
problems at each of search.budgets generated tokens per problem.
Writes summary.json, table.md, decoding.md, variance.png and decoding.png.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from typing import Annotated

import jax
import numpy as np

from jaxrl_suite.algorithms import lm_study as kit
from jaxrl_suite.algorithms.preference import PreferenceConfig, PreferencePair, PreferenceTrainer
from jaxrl_suite.algorithms.value import ValueConfig, ValueTrainer
from jaxrl_suite.core.config import (
    Count,
    NonNegative,
    Range,
    UnitInterval,
    check_fields,
    to_dict,
)
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.core.metrics import pyplot, read_metrics, save_figure
from jaxrl_suite.core.parallel import print0
from jaxrl_suite.core.study import check_variants, format_numbers
from jaxrl_suite.curricula.rest import filter_stats, keep_problem, rest_grpo_prompts
from jaxrl_suite.envs.text import ExampleList
from jaxrl_suite.models.value import ValueLM, init_from_policy
from jaxrl_suite.sampling import mcts
from jaxrl_suite_experiments import CONFIGS

NAME = "rest_rl_code"
VARIANTS = ("grpo", "rest_grpo", "rest_dpo")
DECODERS = ("greedy", "orm_bon", "prm_bon", "orm_mcts", "vm_mcts")


@dataclasses.dataclass(frozen=True)
class RestConfig:
    names: tuple[str, ...] = VARIANTS
    rounds: Count = 2  # data collection rounds per run
    problems: Count = 64  # training problems sampled per round
    samples: Annotated[int, Range(ge=2)] = 5  # completions per problem (ReST-RL's n)
    min_std: NonNegative = 0.05  # keep a problem iff its reward std (population) >= this
    # partial prompts from best samples scoring >= this (a reward: any finite value)
    best_threshold: Annotated[float, Range()] = 0.9
    frac: UnitInterval = 0.5  # ceil(frac * L) prefixes drawn per best sample of L lines
    decay: UnitInterval = 0.95  # prefix of j lines drawn with weight decay ** j (1: uniform)
    dpo: PreferenceConfig = PreferenceConfig(loss="dpo", lr=1e-4, batch_size=16, steps=10)

    def __post_init__(self):
        check_fields(self, "rest.")  # the Ranges declared above
        check_variants(self.names, VARIANTS, "rest.names")


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    collect_problems: Count = 32  # training problems searched for value targets
    collect_iterations: Count = 20  # MCTS iterations per problem (paper: 100)
    value: ValueConfig = ValueConfig(steps=300, batch_size=32, lr=1e-3)
    problems: Count = 32  # held-out problems of the decoding comparison
    budgets: tuple[Count, ...] = (400, 800, 1600)  # generated tokens per problem
    iterations: Count = 15  # VM-MCTS / ORM-MCTS iterations at test time (paper: 15)
    c: NonNegative = 0.1  # exploration constant at test time (paper: 0.1)
    batch_size: Count = 64  # rows per sampler call of the search
    decoders: tuple[str, ...] = DECODERS

    def __post_init__(self):
        check_fields(self, "search.")  # the Ranges declared above
        check_variants(self.decoders, DECODERS, "search.decoders")
        if not self.budgets:
            raise ValueError("search.budgets must not be empty")


@dataclasses.dataclass(frozen=True)
class Config:
    task: kit.TaskConfig = kit.TaskConfig(name="code", level=2, prompt_len=144)
    model: kit.ModelConfig = kit.ModelConfig()
    sft: kit.SFTConfig = kit.SFTConfig()
    grpo: kit.GRPOConfig = kit.GRPOConfig(group_size=5, max_new_tokens=80)
    rest: RestConfig = RestConfig()
    search: SearchConfig = SearchConfig()
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
                    trainer = (_rest_task_trainer(rest_grpo, task, problems, data, c, seed, r)
                               if variant == "rest_grpo" else
                               _dpo_trainer(dpo, problems, data, c, params))
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
    best_params = _restore(study, {"grpo": grpo, "rest_grpo": rest_grpo, "rest_dpo": dpo},
                           best, cfg)
    decoding = study.cached(opts.out_dir / "decoding.json",
                            lambda: _decoding(study, cfg, best_params, long_prompt))
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
        (opts.out_dir / "decoding.md").write_text(_decoding_table(decoding))
    for name, row in (claims or {}).items():
        print0(f"[{NAME}] {name}: {format_numbers(row)}")
    return study.finish({
        "experiment": NAME, "variants": stats, "sft": sft_eval, "sft_more": sft_more,
        "claims": claims,
        "best_run": {"variant": best["variant"], "seed": best["seed"]}, "decoding": decoding,
        "wall_time_s": time.perf_counter() - t_start, "resumed": opts.resume,
        "config": to_dict(cfg)},
        study.table(stats, keys, first={"SFT": sft_eval, "SFT continued": sft_more}))


def _rest_task_trainer(trainer, task, problems, data, c: RestConfig, seed: int, r: int):
    """ReST-GRPO: the round's GRPO on the kept problems plus the partial-solution prompts."""
    rng = np.random.default_rng([seed, r, 7])
    kept, partial = rest_grpo_prompts([e.prompt for e in problems], data["texts"],
                                      data["rewards"], rng, min_std=c.min_std,
                                      best_threshold=c.best_threshold, frac=c.frac,
                                      decay=c.decay)
    examples = [problems[i] for i in kept]
    examples += [dataclasses.replace(problems[i], prompt=prompt) for i, prompt in partial]
    if not examples:  # nothing varies: the round trains on its problems as they are
        examples = list(problems)
    return trainer.with_task(ExampleList(task, tuple(examples), seed=seed * 1000 + r))


def _dpo_trainer(trainer, problems, data, c: RestConfig, params):
    """ReST-DPO: (best, worst) pairs of the kept problems' samples; the round's start is the
    reference."""
    pairs = []
    for ex, texts, rewards in zip(problems, data["texts"], data["rewards"], strict=True):
        if keep_problem(rewards, c.min_std):
            pairs.append(PreferencePair(ex, texts[int(np.argmax(rewards))],
                                        texts[int(np.argmin(rewards))]))
    other = trainer.with_task(trainer.task)
    other.pairs = pairs or [PreferencePair(problems[0], data["texts"][0][0],
                                           data["texts"][0][0])]  # no pair: a no-op margin
    other.ref_params = params
    return other


def _restore(study, trainers: dict, best: dict, cfg: Config):
    """The final params of the best run (its last round's checkpoint)."""
    variant, seed = best["variant"], best["seed"]
    trainer = trainers[variant]
    return study.restore(trainer, trainer.init_state(study.lm.params, study.grpo_key(seed)),
                         study.checkpoint_dir(variant, seed) / f"round{cfg.rest.rounds - 1}").params


def _decoding(study, cfg: Config, params, long_prompt: int) -> dict:
    """Value targets by collection-mode MCTS, the VM and ORM, then the five decoders at each
    token budget on held-out problems (strict accuracy: every hidden test passes)."""
    s, task = cfg.search, study.lm.task
    searcher = study.lm_trainer(prompt_len=long_prompt)
    expand_fn = study.expand_fn(params, prompt_len=long_prompt, batch_size=s.batch_size,
                                rng=jax.random.PRNGKey(study.start_seed + 7))

    def verify(programs, problems):
        by_prompt = {e.prompt: e for e in problems}
        exs = [next(e for p, e in by_prompt.items() if prog.startswith(p)) for prog in programs]
        return task.verify_batch([p[len(e.prompt):] for p, e in zip(programs, exs, strict=True)],
                                 exs).scores

    t0 = time.perf_counter()
    train_problems = task.examples("train", 10_000, s.collect_problems)
    finished: list[tuple[str, float]] = []

    def reward_fn(programs):
        scores = verify(programs, train_problems)
        finished.extend(zip(programs, scores, strict=True))
        return np.asarray(scores, np.float32)

    collect_cfg = mcts.MCTSConfig(iterations=s.collect_iterations, c=0.2, eps=0.1)
    found = mcts.search_batch([e.prompt for e in train_problems], expand_fn, collect_cfg,
                              reward_fn=reward_fn)
    targets = [t for f in found for t in f.targets]
    vm_model = ValueLM(study.lm.model.config)
    value_fns = {}
    for name, data in (("vm", targets), ("orm", finished)):
        trainer = ValueTrainer(vm_model, study.lm.tokenizer, s.value, mesh=study.lm.mesh,
                               state_len=long_prompt)
        init = init_from_policy(vm_model.init(jax.random.PRNGKey(11), *trainer.encode(["x"])),
                                params)
        state, history = trainer.fit(trainer.init_state(init, jax.random.PRNGKey(12)),
                                     [d[0] for d in data], np.array([d[1] for d in data]),
                                     steps=s.value.steps, seed=study.start_seed)
        value_fns[name] = trainer.value_fn(state.params)
    collect_time = time.perf_counter() - t0

    problems = task.examples("test", 0, s.problems)
    prompts = [e.prompt for e in problems]

    def strict(programs):
        return float(np.mean([x == 1.0 for x in verify(programs, problems)]))

    out = {"targets": len(targets), "orm_programs": len(finished),
           "collect_time_s": collect_time, "budgets": list(s.budgets), "decoders": {}}
    if "greedy" in s.decoders:
        texts, lengths = searcher.complete(params, problems, batch_size=s.batch_size)
        out["decoders"]["greedy"] = {
            "accuracy": [strict([p + t for p, t in zip(prompts, texts, strict=True)])],
            "tokens": [float(lengths.mean())]}
    test_cfg = functools.partial(mcts.MCTSConfig, iterations=s.iterations, c=s.c, eps=0.1)
    scorers = {"orm_bon": functools.partial(mcts.orm_scores, orm_fn=value_fns["orm"]),
               "prm_bon": functools.partial(mcts.prm_scores, value_fn=value_fns["vm"])}
    guides = {"orm_mcts": value_fns["orm"], "vm_mcts": value_fns["vm"]}
    for name in [d for d in s.decoders if d != "greedy"]:
        row = {"accuracy": [], "tokens": []}
        for budget in s.budgets:
            if name in scorers:
                picks = mcts.best_of_n(prompts, expand_fn, scorers[name], budget)
            else:
                picks = mcts.search_batch(prompts, expand_fn, test_cfg(token_budget=budget),
                                          value_fn=guides[name])
            row["accuracy"].append(strict([x.program for x in picks]))
            row["tokens"].append(float(np.mean([x.tokens for x in picks])))
        out["decoders"][name] = row
    out["decode_time_s"] = time.perf_counter() - t0 - collect_time
    return out


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


def _decoding_table(decoding: dict) -> str:
    budgets = decoding["budgets"]
    head = "| decoder | " + " | ".join(f"{b} tokens" for b in budgets) + " |\n"
    head += "|---|" + "---|" * len(budgets) + "\n"
    for name, row in decoding["decoders"].items():
        cells = [f"{a:.3f} ({t:.0f} tok)" for a, t in zip(row["accuracy"], row["tokens"],
                                                        strict=True)]
        cells += [cells[0]] * (len(budgets) - len(cells))  # greedy: one budget-free point
        head += f"| {name} | " + " | ".join(cells) + " |\n"
    return head


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

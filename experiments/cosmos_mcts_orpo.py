"""COS(M+O)S on a checkable story world: MCTS over plot steps guided by a curiosity-and-coherence
value model, then iterated ORPO on the search's high- vs low-value expansions (Materzok 2025,
arXiv 2501.17104). docs/cosmos.md describes the world, the loop and the results.

Claim checked: search + ORPO brings a small policy close to the single-pass plot quality of a
model several times larger (the paper: Llama 3.2 3B within 0.06 SD of Llama 3.1 70B).

    jaxrl-suite run cosmos_mcts_orpo            # full size (docs/cosmos.md gives the time)
    jaxrl-suite run cosmos_mcts_orpo --smoke    # seconds; what the tests run
    jaxrl-suite run cosmos_mcts_orpo --resume   # a killed run continues where it stopped

Per seed, `small`: SFT of pi_0 on the bland storyteller (`envs/text/story.py`); then rounds r:
a collection search (`sampling.mcts`, reward mode: each plot's return under pi_r and the
checker, `algorithms.cosmos.PlotScorer`), the value model V_r (`ValueLM` warm-started from pi_r)
on its nodes' mixed targets, the V_r-guided search on other openings, whose best- vs worst-V
children are ORPO pairs (`mcts.preference_pairs`), and ORPO from pi_r: pi_{r+1}. Held out: greedy
plots of every pi_r, the V_0-guided and the exact-value search at one budget, KL(pi_r, pi_0) per
token, the share of pi_r's greedy steps equal to the search's, and how V_0 orders sampled plots
against Q. `large`: the same SFT of a model about 4x larger, greedy. One SFT run per model (from
the first seed) starts every run, so the greedy SFT rows have no seed spread: their uncertainty
is quality_se, the standard error of Q over the held-out openings.
Writes summary.json, table.md and quality.png.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Annotated

import jax
import numpy as np

from jaxrl_suite.algorithms import lm_study as kit
from jaxrl_suite.algorithms.cosmos import PlotScorer, PlotSearchConfig
from jaxrl_suite.algorithms.preference import PreferenceConfig, PreferencePair, PreferenceTrainer
from jaxrl_suite.algorithms.value import ValueTrainer
from jaxrl_suite.core.config import ConfigError, Count, Range, check_fields, to_dict
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.core.parallel import print0
from jaxrl_suite.core.study import format_numbers, seed_stats
from jaxrl_suite.envs.text import Example
from jaxrl_suite.envs.text.story import StoryTask
from jaxrl_suite.models.value import ValueLM
from jaxrl_suite.rewards.curiosity import CuriosityConfig, mixed_target
from jaxrl_suite.sampling import mcts, repeat_each
from jaxrl_suite_experiments import CONFIGS

NAME = "cosmos_mcts_orpo"
VARIANTS = ("small", "large")


@dataclasses.dataclass(frozen=True)
class Config:
    task: kit.TaskConfig = kit.TaskConfig(name="story", prompt_len=176)
    model: kit.ModelConfig = kit.ModelConfig()
    large: kit.ModelConfig = kit.ModelConfig()  # the "70B" stand-in, about 4x the parameters
    sft: kit.SFTConfig = kit.SFTConfig()
    # only max_new_tokens (every sampler's length) and the sampling settings are used
    grpo: kit.GRPOConfig = kit.GRPOConfig(max_new_tokens=208)
    curiosity: CuriosityConfig = CuriosityConfig(target=0.12, width=0.05)
    search: PlotSearchConfig = PlotSearchConfig()
    orpo: PreferenceConfig = PreferenceConfig(loss="orpo", lam=0.1, lr=3e-4, batch_size=8,
                                              steps=60)
    rounds: Count = 2  # search -> ORPO rounds
    # sampled plots per held-out opening for the value-vs-Q agreement
    agree_samples: Annotated[int, Range(ge=2)] = 4
    eval: kit.EvalConfig = kit.EvalConfig(num_examples=64, batch_size=64)
    run: kit.RunConfig = kit.RunConfig(seeds=(0, 1, 2), keep_checkpoints=2)

    def __post_init__(self):
        check_fields(self)  # the Ranges declared above (top-level fields)
        if self.task.name != "story":
            raise ConfigError(f"config field 'task.name' must be 'story' for {NAME}, got "
                              f"{self.task.name!r}")
        if self.orpo.loss != "orpo":
            raise ConfigError(f"config field 'orpo.loss' must be 'orpo', got {self.orpo.loss!r}")


def run(cfg: Config, opts: RunOptions) -> dict:
    t_start = time.perf_counter()
    study = kit.LMStudy(NAME, cfg, opts, variants=VARIANTS)
    large = study.sibling(cfg.large, ("large",))  # the large runs' model, task and trainers
    task: StoryTask = study.lm.task
    s, held, k = cfg.search, study.held_out, task.num_steps
    long_prompt = cfg.task.prompt_len + cfg.grpo.max_new_tokens  # an opening plus some steps
    greedy = study.lm_trainer()
    stepper = study.lm_trainer(prompt_len=long_prompt)
    scorer = PlotScorer(greedy, cfg.curiosity, batch_size=s.batch_size)
    value_trainer = ValueTrainer(ValueLM(study.lm.model.config), study.lm.tokenizer, s.value,
                                 mesh=study.lm.mesh, state_len=long_prompt)

    def search(params, seed: int, salt: int, examples, *, collect: bool = False, **fns):
        """`mcts.search_batch` from the examples' prompts; a state with K steps is finished
        (the opening has one "\\n"; each step adds one)."""
        fn = study.expand_fn(params, prompt_len=long_prompt, batch_size=s.batch_size,
                             rng=jax.random.fold_in(study.grpo_key(seed), salt),
                             finished=lambda state: state.count("\n") > k)
        return mcts.search_batch([e.prompt for e in examples], fn, s.mcts(collect=collect), **fns)

    def searched(found, examples) -> dict:
        plots = [f.program[len(e.prompt):] for f, e in zip(found, examples, strict=True)]
        return {**scorer.quality(plots, examples), "plots": plots,
                "tokens": float(np.mean([f.tokens for f in found]))}

    def collect(params, seed: int, r: int) -> dict:
        """Collection search with exact returns: value targets on every node."""
        openings = task.examples("train", 2 * r * s.collect_openings, s.collect_openings)
        step_unit: dict[str, float] = {}
        found = search(params, seed, 100 + r, openings, collect=True,
                       reward_fn=scorer.reward_fn(params, openings, step_unit))
        targets = [(st, mixed_target(step_unit.get(st), v, s.step_weight))
                   for f in found for st, v in f.targets]
        return {"states": [t[0] for t in targets], "targets": [t[1] for t in targets],
                "tokens": float(np.mean([f.tokens for f in found]))}

    def value_model(params, data: dict, seed: int):
        state, hist = value_trainer.fit_from_policy(
            params, data["states"], data["targets"], init_key=jax.random.PRNGKey(seed),
            state_key=jax.random.PRNGKey(seed + 1), seed=seed)
        return value_trainer.value_fn(state.params), float(hist["mse"][-10:].mean())

    def greedy_eval(trainer, params) -> dict:
        plots, _ = trainer.complete(params, held, batch_size=cfg.eval.batch_size)
        return {**scorer.quality(plots, held), "plots": plots}

    def sampled(params, examples, salt: int) -> list[str]:
        return greedy.complete(params, examples, batch_size=cfg.eval.batch_size,
                               rng=jax.random.PRNGKey(salt))[0]

    def train_small(seed: int, sft_params) -> dict:
        ckpt, run_dir = study.checkpoint_dir("small", seed), study.run_dir("small", seed)
        stages = [(ckpt / f"orpo{r + 1}", r * cfg.orpo.steps) for r in range(cfg.rounds)]
        out: dict = {}
        with study.log(run_dir, stages) as log:
            policies = [sft_params]
            evals = {0: study.cached(opts.out_dir / "greedy_sft.json",
                                     lambda: greedy_eval(greedy, sft_params))}
            for r in range(cfg.rounds + 1):
                params = policies[r]
                if r:
                    evals[r] = study.cached(run_dir / f"greedy{r}.json",
                                            lambda p=params: greedy_eval(greedy, p))
                if r == cfg.rounds:
                    break
                data = study.cached(run_dir / f"collect{r}.json",
                                    lambda p=params, r=r: collect(p, seed, r))

                def search_round(p=params, data=data, r=r) -> dict:
                    value_fn, mse = value_model(p, data, seed * 10 + r)
                    openings = task.examples("train", (2 * r + 1) * s.collect_openings,
                                             s.openings)
                    found = search(p, seed, 200 + r, openings, value_fn=value_fn)
                    res = {"pairs": mcts.preference_pairs(found, s.pair_margin), "value_mse": mse,
                           "tokens": float(np.mean([f.tokens for f in found]))}
                    if r == 0:  # held-out: the small policy with MCTS, and V_0 against Q
                        res["mcts"] = searched(search(p, seed, 300, held, value_fn=value_fn), held)
                        flat = repeat_each(held, cfg.agree_samples)
                        res["agreement"] = scorer.agreement(p, value_fn, flat, sampled(
                            p, flat, seed + 41), cfg.agree_samples)
                    return res

                found = study.cached(run_dir / f"search{r}.json", search_round)
                if r == 0:
                    out["mcts"], out["agreement"] = found["mcts"], found["agreement"]
                out[f"pairs_{r}"] = len(found["pairs"])
                out[f"value_mse_{r}"] = found["value_mse"]
                out[f"targets_{r}"] = len(data["targets"])
                pairs = [PreferencePair(Example(st, ""), ch, rj) for st, ch, rj in found["pairs"]]
                if not pairs:  # nothing to prefer: the policy carries over
                    policies.append(params)
                    continue
                trainer = PreferenceTrainer(
                    study.lm.model, study.lm.tokenizer, task, cfg.orpo, mesh=study.lm.mesh,
                    prompt_len=long_prompt, max_new_tokens=cfg.grpo.max_new_tokens, pairs=pairs,
                    greedy_sampler=greedy.greedy_sampler, eval_sampler=greedy.eval_sampler)
                init = trainer.init_state(params, jax.random.fold_in(study.grpo_key(seed), r))
                state = study.fit(trainer, init, stage=f"orpo{r + 1}", num_steps=cfg.orpo.steps,
                                  checkpoint_dir=ckpt / f"orpo{r + 1}", logger=log,
                                  step_offset=r * cfg.orpo.steps, postfix=("loss",))
                policies.append(state.params)
        reference = out["mcts"]["plots"]  # the search's best plots with pi_0 and V_0
        for r, params in enumerate(policies):
            out[f"greedy_{r}"] = evals[r]
            extra = study.cached(run_dir / f"shift{r}.json", lambda p=params, r=r: {
                "kl": scorer.kl(p, policies[0], held, sampled(p, held, seed + 31)) if r else 0.0,
                "match": scorer.step_match(stepper, p, held, reference,
                                           batch_size=cfg.eval.batch_size),
                **scorer.surprisal_stats(p, held, evals[r]["plots"])})
            out[f"kl_{r}"], out[f"match_{r}"] = extra["kl"], extra["match"]
            out[f"surprisal_{r}"] = {x: extra[x] for x in extra if x.startswith("surprisal")}
        return out

    def large_sft():
        """The large model's SFT, once (from the first seed), like the small one's."""
        ckpt, run_dir = large.checkpoint_dir("large") / "sft", large.run_dir("large")
        with large.log(run_dir, [(ckpt, 0)]) as log:
            sft = large.sft(large.start_seed, checkpoint_dir=ckpt, logger=log)
        return {"greedy": study.cached(run_dir / "greedy.json",
                                       lambda: greedy_eval(large.lm_trainer(), sft.params))}

    shared: dict = {}

    def train(variant: str, seed: int, sft_params) -> dict:
        t0 = time.perf_counter()
        if variant == "small":
            out = train_small(seed, sft_params)
        else:  # one SFT run; every seed reports its greedy plots (seed std 0)
            out = shared["large"] = shared.get("large") or large_sft()
        return {**_flat(out), "detail": _strip_plots(out),
                "wall_time_s": time.perf_counter() - t0}

    sft_params = study.shared_sft().params  # checkpoints/sft: every small run starts here
    results = study.run(train, sft_params, fmt=lambda r: format_numbers(
        {x: r[x] for x in r if x.endswith("quality") or x.startswith(("kl_", "match_"))}))
    for seed in study.seeds:  # the search with exact step values, after the runs (resumable)
        found = study.cached(study.run_dir("small", seed) / "mcts_exact.json", lambda seed=seed: {
            m: x for m, x in searched(search(sft_params, seed, 400, held,
                                             reward_fn=scorer.reward_fn(sft_params, held)),
                                      held).items() if m != "plots"})
        results[study.run_name("small", seed)].update(
            {f"mcts_exact_{m}": x for m, x in found.items()})
    runs = {v: [results[study.run_name(v, sd)] for sd in study.seeds] for v in VARIANTS}
    stats = {label: {m: seed_stats([x[key + m] for x in runs[variant] if key + m in x])
                     for m in _METRICS} for label, (variant, key) in _rows(cfg.rounds).items()}
    shift = {f"round_{r}": {m: seed_stats([x[f"{m}_{r}"] for x in runs["small"]])
                            for m in ("kl", "match")} for r in range(cfg.rounds + 1)}
    agree = {f"{n}_{m}": seed_stats([x[f"agreement_{n}_{m}"] for x in runs["small"]])
             for n in ("value", "return") for m in ("pair_agreement", "corr")}
    claims = _claims(stats) if jax.process_index() == 0 else None
    study.plot_bars({label.replace(", ", ",\n"): {"Q": row["quality"]["per_seed"]}
                     for label, row in stats.items()}, opts.out_dir / "quality.png",
                    ylabel="hidden quality Q", title="COS(M+O)S on the story world")
    for name, row in (claims or {}).items():
        print0(f"[{NAME}] {name}: {format_numbers(row)}")
    tables = [study.table(stats, _METRICS, label="policy"),
              study.table(shift, {"kl": "KL(pi_r, pi_0) per token",
                                  "match": "greedy steps = search's step"},
                          formats={"kl": ".4f"}, label="round"),
              study.table({n: {"pairs": agree[f"{n}_pair_agreement"], "r": agree[f"{n}_corr"]}
                           for n in ("value", "return")},
                          {"pairs": "pairs ordered like Q", "r": "Pearson r with Q"},
                          label="scorer")]
    return study.finish({
        "experiment": NAME, "rows": stats, "shift": shift, "agreement": agree,
        "claims": claims, "wall_time_s": time.perf_counter() - t_start,
        "resumed": opts.resume, "config": to_dict(cfg)}, "\n".join(tables))


_METRICS = ("quality", "quality_se", "contradiction_rate", "coherence", "progress", "variety",
            "predictability")


def _rows(rounds: int) -> dict[str, tuple[str, str]]:
    """Table row -> (variant, prefix of its flat result keys)."""
    rows = {"small, greedy (SFT)": ("small", "greedy_0_"), "small + MCTS": ("small", "mcts_"),
            "small + MCTS, exact step values": ("small", "mcts_exact_")}
    for r in range(1, rounds + 1):
        rows[f"small + {r} ORPO round{'s' if r > 1 else ''}, greedy"] = ("small", f"greedy_{r}_")
    rows["large (about 4x), greedy"] = ("large", "greedy_")
    return rows


def _flat(out: dict) -> dict:
    """The numbers of a run as flat keys (greedy_0_quality, mcts_quality, kl_1, ...)."""
    flat = {}
    for key, val in out.items():
        for m, x in (val.items() if isinstance(val, dict) else [(None, val)]):
            if isinstance(x, (int, float)):
                flat[key if m is None else f"{key}_{m}"] = float(x)
    return flat


def _strip_plots(out: dict) -> dict:
    """The run's detail without the plot texts, plus a few plots to read."""
    return {key: {**{m: x for m, x in val.items() if m != "plots"}, "examples": val["plots"][:3]}
            if isinstance(val, dict) and "plots" in val else val for key, val in out.items()}


def _claims(stats: dict) -> dict:
    """Gaps in hidden quality to the large model's single pass (what the claim is judged by)."""
    big = stats["large (about 4x), greedy"]["quality"]["mean"]
    base = stats["small, greedy (SFT)"]["quality"]["mean"]
    return {label: {"quality": row["quality"]["mean"],
                    "minus_large": row["quality"]["mean"] - big,
                    "minus_small_greedy": row["quality"]["mean"] - base}
            for label, row in stats.items() if not label.startswith("large")}


EXPERIMENT = Experiment(
    name=NAME, config_cls=Config, run=run, config=CONFIGS / f"{NAME}.yaml",
    description="COS(M+O)S: curiosity/coherence value, MCTS over plot steps, iterated ORPO",
)

if __name__ == "__main__":
    from jaxrl_suite.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))

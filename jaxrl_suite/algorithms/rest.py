"""ReST-RL's plumbing (Zhoubian et al. 2025, arXiv 2508.19576; THUDM/ReST-RL): the settings of
its data rounds and of its decoding comparison, ReST-GRPO's training list and ReST-DPO's pairs
from one round of samples, and the comparison of decoders at equal token budgets.

A round samples `RestConfig.samples` completions of `RestConfig.problems` training problems with
the current policy; `rest_grpo_task` keeps the problems whose rewards vary and adds
partial-solution prompts from their best samples (`curricula.rest.rest_grpo_prompts`), and
`rest_dpo_trainer` pairs each kept problem's best and worst sample (`curricula.rest.dpo_pairs`).
`decoding_comparison` fits the value model (VM) on collection-mode MCTS targets and the outcome
model (ORM) on the finished programs (`ValueTrainer.fit_from_policy`), then runs greedy decoding
and `sampling.mcts.decode_at_budgets`. The experiment is experiments/rest_rl_code.py
(docs/rest_rl.md).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Annotated

import jax
import numpy as np

from jaxrl_suite.algorithms.preference import PreferenceConfig, PreferencePair
from jaxrl_suite.algorithms.value import ValueConfig, ValueTrainer
from jaxrl_suite.core.config import Count, NonNegative, Range, UnitInterval, check_fields
from jaxrl_suite.core.study import check_variants
from jaxrl_suite.curricula.rest import dpo_pairs, rest_grpo_prompts
from jaxrl_suite.envs.text import ExampleList
from jaxrl_suite.models.value import ValueLM
from jaxrl_suite.sampling import mcts

VARIANTS = ("grpo", "rest_grpo", "rest_dpo")
DECODERS = ("greedy", *mcts.BUDGET_DECODERS)


@dataclasses.dataclass(frozen=True)
class RestConfig:
    """The data rounds: `rest.*`."""

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
class RestSearchConfig:
    """The value models and the decoding comparison: `search.*`."""

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


def rest_grpo_task(trainer, task, problems, data, c: RestConfig, seed: int, r: int):
    """ReST-GRPO: `trainer` on the round's kept problems plus their partial-solution prompts
    (an `ExampleList`; all the problems when none is kept). `data` holds the round's "texts"
    and "rewards" [problems][samples]."""
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


def rest_dpo_trainer(trainer, problems, data, c: RestConfig, params):
    """ReST-DPO: (best, worst) pairs of the kept problems' samples (`curricula.rest.dpo_pairs`);
    the round's start is the reference."""
    pairs = [PreferencePair(problems[i], best, worst)
             for i, best, worst in dpo_pairs(data["texts"], data["rewards"], min_std=c.min_std)]
    other = trainer.with_task(trainer.task)
    other.pairs = pairs or [PreferencePair(problems[0], data["texts"][0][0],
                                           data["texts"][0][0])]  # no pair: a no-op margin
    other.ref_params = params
    return other


def decoding_comparison(study, s: RestSearchConfig, params, long_prompt: int) -> dict:
    """Value targets by collection-mode MCTS, the VM and ORM, then greedy and the budget decoders
    on held-out problems (strict accuracy: every hidden test passes). `study` is the
    `LMStudy`; states are left-padded to `long_prompt` tokens."""
    task = study.lm.task
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

    found = mcts.search_batch([e.prompt for e in train_problems], expand_fn,
                              mcts.MCTSConfig(iterations=s.collect_iterations, c=0.2, eps=0.1),
                              reward_fn=reward_fn)
    targets = [t for f in found for t in f.targets]
    trainer = ValueTrainer(ValueLM(study.lm.model.config), study.lm.tokenizer, s.value,
                           mesh=study.lm.mesh, state_len=long_prompt)
    value_fns = {}
    for name, data in (("vm", targets), ("orm", finished)):
        state, _ = trainer.fit_from_policy(
            params, [d[0] for d in data], [d[1] for d in data], init_key=jax.random.PRNGKey(11),
            state_key=jax.random.PRNGKey(12), seed=study.start_seed, steps=s.value.steps)
        value_fns[name] = trainer.value_fn(state.params)
    collect_time = time.perf_counter() - t0

    problems = task.examples("test", 0, s.problems)
    prompts = [e.prompt for e in problems]

    def strict(programs):
        return float(np.mean([x == 1.0 for x in verify(programs, problems)]))

    out = {"targets": len(targets), "orm_programs": len(finished),
           "collect_time_s": collect_time, "budgets": list(s.budgets), "decoders": {}}
    if "greedy" in s.decoders:
        texts, lengths = study.lm_trainer(prompt_len=long_prompt).complete(
            params, problems, batch_size=s.batch_size)
        out["decoders"]["greedy"] = {
            "accuracy": [strict([p + t for p, t in zip(prompts, texts, strict=True)])],
            "tokens": [float(lengths.mean())]}
    picked = mcts.decode_at_budgets(
        prompts, expand_fn, s.budgets, vm_fn=value_fns["vm"], orm_fn=value_fns["orm"],
        config=mcts.MCTSConfig(iterations=s.iterations, c=s.c, eps=0.1),
        decoders=[d for d in s.decoders if d != "greedy"])
    for name, picks in picked.items():
        out["decoders"][name] = {"accuracy": [strict([x.program for x in p]) for p in picks],
                                 "tokens": [float(np.mean([x.tokens for x in p])) for p in picks]}
    out["decode_time_s"] = time.perf_counter() - t0 - collect_time
    return out


__all__ = ["DECODERS", "VARIANTS", "RestConfig", "RestSearchConfig", "decoding_comparison",
           "rest_dpo_trainer", "rest_grpo_task"]

"""Multi-turn tool-use RL: SFT on a scripted expert's tool-use episodes, then GRPO over whole
episodes with the tools, against the same model answering directly and against SFT alone; and
off-policy rollouts with a staleness bound against the synchronous run.

Tasks (`tool_mix`, envs/text/tools): long arithmetic (calculator), "which line defines the
function that ..." in a generated repo (code_search: AST index + BM25), and "fix f so its
hidden tests pass" (run_tests: the sandbox). Each problem's episodes alternate model turns and
tool outputs (`algorithms.agent`); the reward is the final answer's score.

    jaxrl-suite run agent_tools             # full size (see docs/agents.md for the time)
    jaxrl-suite run agent_tools --smoke     # seconds; what the tests run
    jaxrl-suite run agent_tools --resume    # a killed run continues where it stopped

Two SFT checkpoints: `sft_tools` on the expert's tool-use episodes, `sft_direct` on its direct
answers (one turn, no tools), and beside each the control `sft_more_tools` / `sft_more_direct`:
the same SFT continued for grpo.steps more optimizer steps. Variants, one GRPO run per seed:
  tools        GRPO over tool-use episodes from sft_tools, synchronous rollouts;
  direct       GRPO over one-turn direct answers from sft_direct (no tools);
  tools_async  as tools, rollouts generated in the background with parameters up to
               variants.max_staleness updates old (truncated importance weights on stale
               tokens); grpo.dynamic_sampling does not apply to it (`grpo_config`).
Greedy held-out episodes score each run and the SFT checkpoints: success per sub-task, turns
per episode, format-failure and tool-error rates; `sampled_success` is the success of one
episode per problem sampled at the training temperature (grpo.temperature). Writes
summary.json, table.md, curves.png and success.png.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import jax

from jaxrl_suite.algorithms import lm_study as kit
from jaxrl_suite.algorithms.agent import (
    AgentConfig,
    AgentTrainer,
    episode_metrics,
    expert_episodes,
)
from jaxrl_suite.algorithms.executors import make_executor
from jaxrl_suite.core.config import ConfigError, Count, check_fields, to_dict
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.core.parallel import print0
from jaxrl_suite.core.study import Study, check_variants, format_numbers
from jaxrl_suite.envs.text.tools.base import ToolTask
from jaxrl_suite_experiments import CONFIGS

NAME = "agent_tools"
VARIANTS = ("tools", "direct", "tools_async")
METRICS = ("success", "sampled_success", "turns", "tool_calls", "format_fail_rate",
           "tool_error_rate", "truncated_frac")
CURVES = ("reward", "turns", "format_fail_rate")


@dataclasses.dataclass(frozen=True)
class VariantsConfig:
    names: tuple[str, ...] = VARIANTS
    max_staleness: Count = 1  # tools_async: rollouts may use parameters this many updates old

    def __post_init__(self):
        check_fields(self, "variants.")  # the Ranges declared above
        check_variants(self.names, VARIANTS, "variants.names")


@dataclasses.dataclass(frozen=True)
class Config:
    task: kit.TaskConfig = kit.TaskConfig(name="tool_mix", prompt_len=112)
    model: kit.ModelConfig = kit.ModelConfig()
    sft: kit.SFTConfig = kit.SFTConfig()
    demos: Count = 3072  # expert episodes of the SFT data (a fixed set, cycled)
    grpo: kit.GRPOConfig = kit.GRPOConfig(max_new_tokens=96)  # max_new_tokens: one turn
    agent: AgentConfig = AgentConfig()  # agent.tools / max_staleness are set per variant
    variants: VariantsConfig = VariantsConfig()
    eval: kit.EvalConfig = kit.EvalConfig(num_examples=96)
    run: kit.RunConfig = kit.RunConfig(seeds=(0, 1, 2), keep_checkpoints=2)

    def __post_init__(self):
        check_fields(self)  # the Ranges declared above (top-level fields)
        if not self.agent.tools or self.agent.max_staleness:
            raise ValueError("agent.tools and agent.max_staleness are set per variant here; use "
                             "variants.names / variants.max_staleness")


def agent_config(cfg: Config, variant: str) -> AgentConfig:
    """The episode settings of `variant`: direct answers have one turn and no tools."""
    if variant == "direct":  # one turn: its trajectory is one turn's tokens
        return dataclasses.replace(cfg.agent, tools=False, max_turns=1,
                                   episode_tokens=cfg.grpo.max_new_tokens)
    if variant == "tools_async":
        return dataclasses.replace(cfg.agent, max_staleness=cfg.variants.max_staleness)
    return cfg.agent


def grpo_config(cfg: Config, variant: str) -> kit.GRPOConfig:
    """The GRPO settings of `variant`: tools_async keeps every background rollout, so dynamic
    sampling (an on-policy redraw of groups whose rewards are all equal) is off there."""
    if variant == "tools_async":
        return dataclasses.replace(cfg.grpo, dynamic_sampling=False)
    return cfg.grpo


def by_kind(task: ToolTask, episodes) -> dict:
    """`episode_metrics` of all episodes, plus success per sub-task ("success/<name>")."""
    out = episode_metrics(episodes)
    kinds = getattr(task, "kind", None)
    if kinds is not None:
        for name in dict.fromkeys(kinds(ep.example) for ep in episodes):
            part = [ep for ep in episodes if kinds(ep.example) == name]
            out[f"success/{name}"] = episode_metrics(part)["success"]
    return out


def run(cfg: Config, opts: RunOptions) -> dict:
    t_start = time.perf_counter()
    study = kit.LMStudy(NAME, cfg, opts, variants=cfg.variants.names)
    task = study.lm.task
    if not isinstance(task, ToolTask):
        raise ConfigError(f"config field 'task.name': {cfg.task.name!r} is not a tool task")
    tools_pool = make_executor(cfg.agent.executor, cfg.agent.workers)
    reward_pool = make_executor(cfg.agent.executor, cfg.agent.workers)
    agents: list[AgentTrainer] = []

    def agent_for(variant: str, ref_params) -> AgentTrainer:
        grpo = study.grpo_trainer(grpo_config(cfg, variant), ref_params)
        agent = AgentTrainer(grpo, agent_config(cfg, variant), executor=tools_pool,
                             reward_executor=reward_pool)
        agents.append(agent)
        return agent

    def held_out_eval(agent: AgentTrainer, params) -> dict:
        """Greedy held-out episodes (`by_kind`), and `sampled_success`: the success of one
        episode per problem sampled by the rollout sampler, at the training temperature."""
        sampled = agent.episodes(params, study.held_out, sampler=agent.grpo.sampler)
        return {**by_kind(task, agent.episodes(params, study.held_out)),
                "sampled_success": episode_metrics(sampled)["success"]}

    def sft_stage(name: str, variant: str):
        """One SFT checkpoint on the expert's episodes (tool use, or direct answers)."""
        agent = agent_for(variant, study.lm.params)
        t0 = time.perf_counter()
        demos = expert_episodes(agent.runner, task.examples("train", 0, cfg.demos),
                                executor=tools_pool)
        demo_time = time.perf_counter() - t0
        state, trainer = study.episode_sft(agent.runner, demos, name=name)
        evaluation = study.cached(study.run_dir(name) / "eval.json", lambda: {
            **held_out_eval(agent, state.params),
            "demo_success": episode_metrics(demos)["success"], "demo_time_s": demo_time,
            "demo_turns": episode_metrics(demos)["turns"]})
        print0(f"[{NAME}] {name}: {format_numbers(evaluation)}")
        # The control: the same SFT continued for as many optimizer steps as a GRPO run takes.
        more_name = name.replace("sft_", "sft_more_")
        more_eval = study.sft_control(state, lambda params: held_out_eval(agent, params),
                                      name=more_name, trainer=trainer)
        print0(f"[{NAME}] {more_name}: {format_numbers(more_eval)}")
        return state.params, {name: evaluation, more_name: more_eval}

    try:
        start, sft_evals = {}, {}
        if {"tools", "tools_async"} & set(study.variants):
            start["tools"], evals = sft_stage("sft_tools", "tools")
            sft_evals.update(evals)
        if "direct" in study.variants:
            start["direct"], evals = sft_stage("sft_direct", "direct")
            sft_evals.update(evals)

        def train(variant: str, seed: int, _) -> dict:
            params = start["direct" if variant == "direct" else "tools"]
            agent = agent_for(variant, params)
            t0 = time.perf_counter()
            try:
                state = study.fit_run(agent, agent.init_state(params, study.grpo_key(seed)),
                                      variant, seed, num_steps=cfg.grpo.steps,
                                      postfix=("reward", "turns"))
            finally:
                agent.close()
            wall = time.perf_counter() - t0
            return {**held_out_eval(agent, state.params), "wall_time_s": wall}

        results = study.run(train)
    finally:
        for agent in agents:
            agent.close()
        tools_pool.shutdown()
        reward_pool.shutdown()
    kinds = [f"success/{n}" for n in getattr(task, "names", ())]
    keys = [*METRICS, *kinds, "wall_time_s"]
    stats = study.aggregate(results, keys)
    claims = _claims(stats, sft_evals)
    if jax.process_index() == 0:
        curves = study.curves(CURVES, stage="grpo")
        window = max(1, cfg.grpo.steps // 10)
        for metric in CURVES:
            study.plot_curves(curves, metric, opts.out_dir / f"{metric}.png", smooth=window,
                              xlabel="GRPO step", ylabel=metric,
                              title=f"{NAME}: median and IQR over {len(study.seeds)} seeds "
                                    f"(moving average {window})")
        groups = {k.split("/")[1]: {v: [r[k] for r in runs] for v, runs in
                                    study.per_variant(results).items()} for k in kinds}
        for k in kinds:
            for name, ev in sft_evals.items():
                groups[k.split("/")[1]][name] = [ev[k]]
        study.plot_bars(groups, opts.out_dir / "success.png", ylabel="held-out success",
                        ylim=(0, 1))
    table = study.table(stats, {k: k for k in keys}, first={
        name: {k: ev.get(k, float("nan")) for k in keys} for name, ev in sft_evals.items()},
        formats={"wall_time_s": ".0f"})
    return study.finish({
        "experiment": NAME, "sft": sft_evals, "variants": stats, "claims": claims,
        "heldout_examples": len(study.held_out), "wall_time_s": time.perf_counter() - t_start,
        "resumed": opts.resume, "config": to_dict(cfg)}, table)


def _claims(stats: dict, sft_evals: dict) -> dict:
    """The numbers the comparisons are judged by (no verdicts: see docs/agents.md): success of
    GRPO with tools against direct answers and against SFT alone, and the staleness run's wall
    time and success against the synchronous one; tools against direct seed by seed
    (`Study.compare`)."""
    mean = lambda v, k: stats[v][k]["mean"] if v in stats else None
    out = {}
    for key in ("success", "sampled_success"):
        out.update({f"tools_{key}": mean("tools", key), f"direct_{key}": mean("direct", key),
                    **{f"{name}_{key}": sft_evals.get(name, {}).get(key) for name in
                       ("sft_tools", "sft_direct", "sft_more_tools", "sft_more_direct")}})
    if "tools" in stats and "direct" in stats:  # seed by seed (differences, Welch p)
        out["tools_vs_direct"] = {key: Study.compare(stats, "tools", "direct", key)
                                  for key in ("success", "sampled_success")}
    if "tools" in stats and "tools_async" in stats:
        out["async_wall_time_ratio"] = mean("tools", "wall_time_s") / mean("tools_async",
                                                                           "wall_time_s")
        out["async_success"] = mean("tools_async", "success")
    return out


EXPERIMENT = Experiment(
    name=NAME, config_cls=Config, run=run, config=CONFIGS / f"{NAME}.yaml",
    description="multi-turn tool-use GRPO vs direct answers vs SFT; staleness-bounded rollouts",
)

if __name__ == "__main__":
    from jaxrl_suite.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))

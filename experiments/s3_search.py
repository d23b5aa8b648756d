"""s3: a searcher trained by RL for a frozen generator, with the Gain-Beyond-RAG reward, against
searchers trained on final accuracy and on retrieval recall, over the number of training
questions.

Claim checked (s3, Jiang et al. 2025, arXiv 2505.14146; pat-jj/s3): training only the searcher,
with the generator frozen, on the Gain Beyond RAG reward (GBR = Acc(G(q, D_searcher)) -
Acc(G(q, D_naive))) gives strong downstream accuracy from little data: 2.4k training questions
against baselines trained on 70x more.

    jaxrl-suite run s3_search              # full size (see docs/s3.md for the time)
    jaxrl-suite run s3_search --smoke      # seconds; what the tests run
    jaxrl-suite run s3_search --resume     # a killed run continues where it stopped

The corpus is a generated fact world (`envs/text/facts.py`): two-hop questions ("In which country
was Mira Tolvek born?") whose second passage shares no name with the question, among
near-duplicate distractors, under BM25 (`bm25s`). Stages:
  1. the generator: an LM trained once by SFT to answer from given passages
     (`envs.text.search.ReaderTask`), then frozen; its accuracy from the naive top-k retrieval
     of every question (`algorithms.s3.SearchReward.naive_accuracy`) is naive RAG, and the
     training questions it already answers are dropped from the GBR runs' pools
     (search.drop_solved), as the authors do;
  2. the searcher's SFT start: a scripted expert's episodes in the authors' format on training
     questions outside every RL pool, mixed with a lazy expert that stops at once (search.lazy);
  3. GRPO over searcher episodes (`algorithms.agent.AgentTrainer` with the `SearchReward`
     episode reward), one run per reward x number of training questions x seed. Rewards:
       gbr      Gain Beyond RAG (the paper);
       gbr_acc  GBR + Acc(D_searcher) (what the authors' code trains on);
       acc      Acc(D_searcher), end-to-end on final accuracy (baseline);
       recall   recall of the gold passages, a retrieval-only reward (baseline);
     With GRPO's group-relative advantages Acc(D_naive) is a constant within a question's
     group and cancels: gbr and acc give one question the same advantages, and so does
     gbr_acc on the questions naive RAG misses once the group's std scales it
     (`tests/rewards/test_gbr.py`), unlike under the authors' PPO with a learned critic. What
     tells the GBR runs from the acc runs here is their pool (search.drop_solved), so the
     default run trains gbr, acc and recall;
  4. held-out evaluation, greedy: the generator's accuracy from each searcher's documents
     (`success`), its gain over naive RAG, gold-passage recall, queries and turns per episode;
     `sampled_success` is that accuracy for one searcher episode per question sampled at the
     training temperature (the rollout sampler, grpo.temperature; the first
     eval.sampled_examples questions).
Writes summary.json (the claims, with verdicts computed from the numbers), table.md,
accuracy.png (held-out accuracy against the number of training questions, per reward, mean and
std over seeds, naive RAG and the SFT searcher as references) and reward.png.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import jax
import numpy as np

from jaxrl_suite.algorithms import lm_study as kit
from jaxrl_suite.algorithms.agent import (
    AgentConfig,
    AgentTrainer,
    episode_metrics,
    expert_episodes,
)
from jaxrl_suite.algorithms.executors import make_executor
from jaxrl_suite.algorithms.s3 import GeneratorConfig, QuestionPools, SearchConfig, SearchReward
from jaxrl_suite.core.config import (
    Count,
    check_fields,
    to_dict,
)
from jaxrl_suite.core.experiment import Experiment, RunOptions
from jaxrl_suite.core.parallel import print0
from jaxrl_suite.core.study import check_variants, format_numbers, seed_stats, verdict
from jaxrl_suite.envs.text.facts import FactWorld
from jaxrl_suite.envs.text.search import ReaderTask, SearchTask, question_ids
from jaxrl_suite.rewards.gbr import SEARCH_REWARDS
from jaxrl_suite_experiments import CONFIGS

NAME = "s3_search"
PAPER_CLAIM = ("training the searcher alone on Gain Beyond RAG gives strong downstream "
               "accuracy from little data (2.4k questions vs baselines with 70x more)")
METRICS = ("success", "sampled_success", "reward_gbr", "reward_recall", "reward_docs",
           "reward_queries", "turns", "format_fail_rate", "truncated_frac")
LABELS = {"success": "accuracy", "sampled_success": "sampled accuracy",
          "reward_gbr": "gain over RAG", "reward_recall": "gold recall",
          "reward_docs": "documents", "reward_queries": "queries", "turns": "turns",
          "format_fail_rate": "format fails", "truncated_frac": "truncated"}


@dataclasses.dataclass(frozen=True)
class VariantsConfig:
    rewards: tuple[str, ...] = ("gbr", "acc", "recall")  # gbr_acc: the same advantages as gbr
    sizes: tuple[Count, ...] = (30, 100, 240)  # training questions of the RL runs

    def __post_init__(self):
        check_fields(self, "variants.")  # the Ranges declared above
        check_variants(self.rewards, SEARCH_REWARDS.names(), "variants.rewards")
        if not self.sizes or list(self.sizes) != sorted(set(self.sizes)):
            raise ValueError(f"variants.sizes must be non-empty and increasing, got "
                             f"{list(self.sizes)}")


@dataclasses.dataclass(frozen=True)
class Config:
    # the searcher's task is built from the facts and search sections (task.name: s3_search)
    task: kit.TaskConfig = kit.TaskConfig(name="s3_search", prompt_len=128)
    facts: FactWorld = FactWorld(n_people=1800, n_first_names=120, n_cities=150,
                                 n_countries=20, n_companies=120)
    search: SearchConfig = SearchConfig()
    model: kit.ModelConfig = kit.ModelConfig(vocab_size=2048, max_len=528)  # the searcher
    sft: kit.SFTConfig = kit.SFTConfig(steps=400, batch_size=16, lr=2e-3)
    demos: Count = 1024  # expert episodes of the searcher's SFT (cycled)
    grpo: kit.GRPOConfig = kit.GRPOConfig(steps=30, prompts_per_step=8, group_size=4,
                                          max_new_tokens=40, lr=2e-4)
    agent: AgentConfig = AgentConfig(max_turns=3, episode_tokens=352, obs_chars=400,
                                     executor="thread")
    generator: GeneratorConfig = GeneratorConfig()
    variants: VariantsConfig = VariantsConfig()
    eval: kit.EvalConfig = kit.EvalConfig(num_examples=128, batch_size=32)
    run: kit.RunConfig = kit.RunConfig(seeds=(0, 1, 2), tokenizer="bpe:2048",
                                       keep_checkpoints=2, checkpoint_every=10)

    def __post_init__(self):
        check_fields(self)  # the Ranges declared above (top-level fields)
        if self.task.name != SearchTask.name:
            raise ValueError(f"task.name must be {SearchTask.name!r} (the task is built from "
                             f"the facts and search sections), got {self.task.name!r}")
        need = self.task.prompt_len + self.agent.episode_tokens + self.grpo.max_new_tokens
        if need > self.model.max_len:
            raise ValueError(f"model.max_len ({self.model.max_len}) must hold task.prompt_len + "
                             f"agent.episode_tokens + grpo.max_new_tokens = {need}")
        if self.generator.prompt_len + self.generator.max_new_tokens > \
                self.generator.model.max_len:
            raise ValueError("generator.model.max_len must hold generator.prompt_len + "
                             "generator.max_new_tokens")
        if self.generator.max_docs < self.search.top_k:
            raise ValueError(f"generator.max_docs ({self.generator.max_docs}) must be >= "
                             f"search.top_k ({self.search.top_k}): naive RAG reads top_k")


def search_task(cfg: Config, **fields) -> SearchTask:
    return cfg.search.task(cfg.task.seed, cfg.facts, **fields)


def variant_name(reward: str, size: int) -> str:
    return f"{reward}_n{size}"


def run(cfg: Config, opts: RunOptions) -> dict:
    t_start = time.perf_counter()
    task = search_task(cfg)
    names = [variant_name(r, n) for r in cfg.variants.rewards for n in cfg.variants.sizes]
    study = kit.LMStudy(NAME, cfg, opts, variants=names, task=task)
    g = cfg.generator
    reader_task = ReaderTask(seed=cfg.task.seed, facts=cfg.facts, max_docs=g.max_docs,
                             top_k=cfg.search.top_k)
    gen_study = study.sibling(g.model, ("generator",), task=reader_task,
                              prompt_len=g.prompt_len, max_new_tokens=g.max_new_tokens,
                              sft=g.sft, tokenizer=g.tokenizer)

    # 1. the frozen generator, naive RAG, and the RL question pools
    gen_params = gen_study.shared_sft(name="generator").params
    reader = gen_study.lm_trainer()
    gen_eval = study.cached(study.run_dir("generator") / "eval.json", lambda: {
        "gold_context_accuracy": reader.evaluate(gen_params, gen_study.held_out,
                                                 batch_size=g.batch_size)["accuracy"]})
    print0(f"[{NAME}] generator: {format_numbers(gen_eval)}")

    def reward_fn(kind: str, run_task: SearchTask) -> SearchReward:
        return SearchReward(run_task, reader, gen_params, tokenizer=study.lm.tokenizer,
                            kind=kind, unselected=cfg.search.unselected, max_docs=g.max_docs,
                            batch_size=g.batch_size)

    probe = reward_fn("gbr", task)
    train_ids = question_ids(cfg.facts, cfg.task.seed, "train")
    naive = study.cached(opts.out_dir / "naive_rag.json", lambda: {
        "train": probe.naive_accuracy(train_ids).tolist(),
        "test": probe.naive_accuracy([ex.meta[0] for ex in study.held_out]).tolist()})
    pools = QuestionPools(train_ids, naive["train"], cfg.search, max(cfg.variants.sizes))
    sft_ids, unsolved = pools.sft, pools.unsolved

    sft_task = search_task(cfg, pool=tuple(sft_ids))
    naive_rag = float(np.mean(naive["test"]))
    print0(f"[{NAME}] naive RAG: held-out accuracy {naive_rag:.3f}; training questions it "
           f"answers {np.mean(naive['train']):.3f}; unsolved training questions "
           f"{len(unsolved)}")

    tools_pool = make_executor(cfg.agent.executor, cfg.agent.workers)
    agents: list[AgentTrainer] = []

    def agent_for(run_task: SearchTask, ref_params, kind: str) -> AgentTrainer:
        grpo = study.grpo_trainer(cfg.grpo, ref_params, task=run_task)
        agent = AgentTrainer(grpo, cfg.agent, executor=tools_pool, reward_executor=tools_pool,
                             episode_reward=reward_fn(kind, run_task))
        agents.append(agent)
        return agent

    def evaluate(agent: AgentTrainer, params) -> dict:
        """Greedy held-out episodes' `episode_metrics`, and `sampled_success`: the success of
        one episode per question by the rollout sampler (at the training temperature)."""
        greedy = agent.evaluate(params, study.held_out)
        sampled = agent.evaluate(params, study.held_out[: cfg.eval.sampled_examples],
                                 sampler=agent.grpo.sampler)
        return {**greedy, "sampled_success": sampled["success"]}

    try:
        # 2. the searcher's SFT start
        sft_agent = agent_for(sft_task, study.lm.params, "gbr")
        demos = expert_episodes(sft_agent.runner, sft_task.examples("train", 0, cfg.demos),
                                executor=tools_pool)
        sft_agent.episode_reward(demos)  # the demonstrations' generator accuracy
        sft_params = study.episode_sft(sft_agent.runner, demos, name="sft",
                                       task=sft_task)[0].params
        sft_eval = study.cached(study.run_dir("sft") / "eval.json", lambda: {
            **evaluate(sft_agent, sft_params),
            **{f"demo_{k}": v for k, v in episode_metrics(demos).items()
               if k in ("success", "reward_queries", "turns")}})
        print0(f"[{NAME}] SFT searcher: {format_numbers(sft_eval)}")

        # 3. GRPO per reward x pool size x seed
        def train(variant: str, seed: int, _) -> dict:
            kind, size = variant.rsplit("_n", 1)
            run_task = search_task(cfg, pool=pools.pool(kind, int(size)))
            agent = agent_for(run_task, sft_params, kind)
            t0 = time.perf_counter()
            try:
                state = study.fit_run(agent, agent.init_state(sft_params, study.grpo_key(seed)),
                                      variant, seed, num_steps=cfg.grpo.steps,
                                      postfix=("reward", "success"))
            finally:
                agent.close()
            return {**evaluate(agent, state.params), "wall_time_s": time.perf_counter() - t0}

        results = study.run(train)
    finally:
        for agent in agents:
            agent.close()
        tools_pool.shutdown()

    stats = study.aggregate(results, [*METRICS, "wall_time_s"])
    claims = _claims(cfg, stats, naive_rag, sft_eval["success"])
    if jax.process_index() == 0:
        by_reward = {r: {"success": seed_stats([
            [results[study.run_name(variant_name(r, n), s)]["success"]
             for n in cfg.variants.sizes] for s in study.seeds])}
            for r in cfg.variants.rewards}
        sizes = list(cfg.variants.sizes)
        study.plot_means(sizes, by_reward, "success", opts.out_dir / "accuracy.png",
                         reference=("naive RAG", [naive_rag] * len(sizes)),
                         xlabel="training questions", ylabel="held-out accuracy",
                         xscale="log", title=f"{NAME}: generator accuracy from the searcher's "
                                             f"documents (SFT searcher {sft_eval['success']:.2f})")
        curves = study.curves(("reward",), stage="grpo")
        window = max(1, cfg.grpo.steps // 10)
        study.plot_curves(curves, "reward", opts.out_dir / "reward.png", smooth=window,
                          xlabel="GRPO step", ylabel="training reward",
                          title=f"{NAME}: median and IQR over {len(study.seeds)} seeds")
    table = study.table(stats, {k: LABELS[k] for k in METRICS}, first={
        "naive RAG": {k: {"success": naive_rag, "reward_gbr": 0.0,
                          "reward_docs": float(cfg.search.top_k)}.get(k, float("nan"))
                      for k in METRICS},
        "SFT searcher": {k: sft_eval.get(k, float("nan")) for k in METRICS}})
    return study.finish({
        "experiment": NAME, "paper_claim": PAPER_CLAIM, "generator": gen_eval,
        "naive_rag": naive_rag, "naive_rag_train": float(np.mean(naive["train"])),
        "unsolved_training_questions": len(unsolved), "sft": sft_eval, "variants": stats,
        "claims": claims,
        "heldout_examples": len(study.held_out), "wall_time_s": time.perf_counter() - t_start,
        "resumed": opts.resume, "config": to_dict(cfg)}, table)


def _claims(cfg: Config, stats: dict, naive_rag: float, sft: float) -> dict:
    """The data-efficiency claim from the numbers: held-out accuracy of each reward at each
    pool size; "reproduced" if GBR at the smallest pool beats naive RAG and the SFT searcher
    and is at least every baseline reward (acc, recall) at the largest pool (mean over
    seeds); which of gbr / gbr_acc does better at the smallest pool."""
    sizes, rewards = cfg.variants.sizes, cfg.variants.rewards
    acc = {r: {n: stats[variant_name(r, n)]["success"]["mean"] for n in sizes} for r in rewards}
    out = {"accuracy": acc, "naive_rag": naive_rag, "sft_searcher": sft}
    small, large = sizes[0], sizes[-1]
    if "gbr" in rewards:
        baselines = [r for r in ("acc", "recall") if r in rewards]
        beats_start = acc["gbr"][small] > max(naive_rag, sft)
        data_eff = all(acc["gbr"][small] >= acc[b][large] for b in baselines)
        out["gbr_small_vs_baselines_large"] = {
            b: acc["gbr"][small] - acc[b][large] for b in baselines}
        out["verdict"] = verdict(beats_start and data_eff and bool(baselines), beats_start)
    if "gbr" in rewards and "gbr_acc" in rewards:
        out["gbr_vs_gbr_acc_small"] = acc["gbr"][small] - acc["gbr_acc"][small]
    return out


EXPERIMENT = Experiment(
    name=NAME, config_cls=Config, run=run, config=CONFIGS / f"{NAME}.yaml",
    description="s3: a searcher trained on Gain Beyond RAG for a frozen generator, by data size",
)

if __name__ == "__main__":
    from jaxrl_suite.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))

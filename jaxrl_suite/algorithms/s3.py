"""s3: a searcher trained by RL for a frozen generator, rewarded by Gain Beyond RAG.

Jiang et al. 2025, "s3: You Don't Need That Much Data to Train a Search Agent via RL",
arXiv 2505.14146 (code: pat-jj/s3). The searcher's episodes are tool-use episodes
(`algorithms.agent`) of a `envs.text.search.SearchTask`; `SearchReward` is their episode-level
reward (`AgentTrainer(episode_reward=...)`): for each finished episode it

  1. reads the documents the searcher handed over from the episode's text
     (`rewards.gbr.selected_documents`: <important_info> selections of the environment's
     <information> blocks, at most `max_docs` of them, in order);
  2. asks the frozen generator (an `LMTrainer` with its params; greedy) to answer the question
     from them (`envs.text.search.reader_prompt`), in fixed-size batches;
  3. scores the answer by the reader's task (`ReaderTask.verify_batch`): Acc =
     `rewards.qa.span_match` of the gold entity;
  4. sets the episode's score (Acc, so `success` is the generation accuracy), its training
     reward by `kind` (`rewards.gbr.search_reward`: gbr, gbr_acc, acc or recall) and the
     components acc, acc_naive, gbr, recall, docs, selected, queries.

Acc(D_naive), the generator's accuracy from the naive top-k retrieval on the raw question, is
computed once per question and cached (`naive_accuracy`); the experiment also uses it to drop
the training questions naive RAG already answers, as the authors do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Annotated

import numpy as np

from jaxrl_suite.algorithms.agent import Episode, episode_segments
from jaxrl_suite.algorithms.sft import LMTrainer, SFTConfig
from jaxrl_suite.core.config import ConfigError, Count, Probability, Range, check_fields
from jaxrl_suite.core.study import check_variants
from jaxrl_suite.envs.text.base import Example
from jaxrl_suite.envs.text.facts import FactWorld
from jaxrl_suite.envs.text.search import SearchTask, reader_prompt
from jaxrl_suite.envs.text.tokenizer import Tokenizer
from jaxrl_suite.models.hf import ModelConfig
from jaxrl_suite.rewards.gbr import (
    SEARCH_REWARDS,
    Selection,
    passage_recall,
    search_reward,
    selected_documents,
)


class SearchReward:
    """The s3 episode reward (module docstring).

    task: the searcher's `SearchTask` (its world, top_k, max_select); reader: an `LMTrainer` of
    the generator on its reading task (`ReaderTask`, which scores Acc; its tokenizer, prompt
    length and greedy sampler); params: the generator's frozen params; tokenizer: the
    searcher's, which decodes the episodes (the generator may have another: it sees text only);
    kind: the reward (`rewards.gbr.SEARCH_REWARDS`); unselected: "all" (the authors: a block no
    turn selected from gives all its documents) or "none"; max_docs: the generator's context
    cap; batch_size: rows of one generator call."""

    def __init__(self, task: SearchTask, reader: LMTrainer, params, *, tokenizer: Tokenizer,
                 kind: str = "gbr", unselected: str = "all", max_docs: int = 8,
                 batch_size: int = 64):
        if kind not in SEARCH_REWARDS:
            raise ValueError(f"s3 reward kind must be one of {SEARCH_REWARDS.names()}, got "
                             f"{kind!r}")
        if unselected not in ("all", "none"):
            raise ValueError(f"unselected must be 'all' or 'none', got {unselected!r}")
        if max_docs < 1 or batch_size < 1:
            raise ValueError(f"max_docs and batch_size must be >= 1, got {max_docs}, "
                             f"{batch_size}")
        self.task, self.reader, self.params, self.tokenizer = task, reader, params, tokenizer
        self.kind, self.unselected = kind, unselected
        self.max_docs, self.batch_size = max_docs, batch_size
        self._naive: dict[int, float] = {}

    # ---- the generator ----
    def accuracy(self, questions: Sequence[int], documents: Sequence[Sequence[str]]
                 ) -> np.ndarray:
        """Acc: the generator's greedy answer to world.questions[q] from each document list,
        scored by the reader's task (`ReaderTask`: 1.0 where it holds the gold entity)."""
        world = self.task.world
        examples = [Example(prompt=reader_prompt(world.questions[q].text, docs),
                            answer=world.questions[q].answer)
                    for q, docs in zip(questions, documents, strict=True)]
        if not examples:
            return np.zeros((0,), np.float32)
        texts, _ = self.reader.complete(self.params, examples, batch_size=self.batch_size)
        return np.array(self.reader.task.verify_batch(texts, examples).scores, np.float32)

    def naive_documents(self, question: int) -> list[str]:
        world = self.task.world
        return [world.passages[i] for i in self.task.naive(question)][: self.max_docs]

    def naive_accuracy(self, questions: Sequence[int]) -> np.ndarray:
        """Acc(D_naive) per question, computed once per question (cached)."""
        todo = list(dict.fromkeys(q for q in questions if q not in self._naive))
        if todo:
            acc = self.accuracy(todo, [self.naive_documents(q) for q in todo])
            self._naive.update(zip(todo, acc.tolist(), strict=True))
        return np.array([self._naive[q] for q in questions], np.float32)

    # ---- the episode reward ----
    def selection(self, ep: Episode) -> Selection:
        """The documents episode `ep` hands the generator (cut to max_docs)."""
        sel = selected_documents(episode_segments(ep, self.tokenizer),
                                 top_k=self.task.top_k, max_select=self.task.max_select,
                                 unselected=self.unselected)
        return sel._replace(documents=sel.documents[: self.max_docs])

    def __call__(self, episodes: Sequence[Episode]) -> None:
        if not episodes:
            return
        world = self.task.world
        questions = [ep.example.meta[0] for ep in episodes]
        selections = [self.selection(ep) for ep in episodes]
        acc = self.accuracy(questions, [s.documents for s in selections])
        naive = self.naive_accuracy(questions)
        for ep, q, sel, a, n in zip(episodes, questions, selections, acc, naive, strict=True):
            gold = [world.passages[g] for g in world.questions[q].gold]
            recall = passage_recall(sel.documents, gold)
            ep.score = float(a)
            ep.reward = search_reward(self.kind, float(a), float(n), recall)
            ep.components = {"acc": float(a), "acc_naive": float(n), "gbr": float(a - n),
                             "recall": recall, "docs": float(len(sel.documents)),
                             "selected": float(sel.selected), "queries": float(sel.queries)}


@dataclasses.dataclass(frozen=True)
class GeneratorConfig:
    """The frozen generator (reader) an s3 searcher is trained for: its model, SFT and sizes."""

    model: ModelConfig = ModelConfig(vocab_size=1024, d_model=128, n_layers=4,
                                             n_heads=4, n_kv_heads=4, d_ff=512, max_len=208)
    sft: SFTConfig = SFTConfig(steps=1500, batch_size=32, lr=2e-3)
    tokenizer: str = "bpe:1024"  # its own (it only ever reads text), like run.tokenizer
    prompt_len: Count = 200  # documents + question
    max_new_tokens: Count = 8  # the answer
    max_docs: Count = 8  # documents in its context (training contexts hold 2..max_docs)
    batch_size: Count = 64  # rows of one generator call

    def __post_init__(self):
        check_fields(self, "generator.")  # the Ranges declared above


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """The searcher's task options and its training questions' split (SFT vs RL pools)."""

    # documents per <information> block (1..9: one-digit document numbers)
    top_k: Annotated[int, Range(ge=1, le=9)] = 8
    max_select: Count = 3  # documents one <important_info> may select (<= top_k)
    lazy: Probability = 0.3  # the SFT expert's chance to stop at once with the naive documents
    unselected: str = "all"  # a block no turn selects from: "all" its documents (authors), "none"
    # the rewards whose RL pools drop the training questions naive RAG already answers (the
    # authors' s3 recipe); the other rewards' pools are the training questions as they come
    drop_solved: tuple[str, ...] = ("gbr", "gbr_acc")
    sft_questions: Count = 512  # the last training questions: the SFT demonstrations' (no pool's)

    def __post_init__(self):
        check_fields(self, "search.")  # the Ranges declared above
        if self.unselected not in ("all", "none"):
            raise ValueError(f"search.unselected must be 'all' or 'none', got "
                             f"{self.unselected!r}")
        if self.drop_solved:  # may be empty: no pool drops solved questions
            check_variants(self.drop_solved, SEARCH_REWARDS.names(), "search.drop_solved")

    def task(self, seed: int, facts: FactWorld, **fields) -> SearchTask:
        """The searcher's `SearchTask` over the fact world `facts` with these options."""
        return SearchTask(seed=seed, facts=facts, top_k=self.top_k, max_select=self.max_select,
                          lazy=self.lazy, **fields)


class QuestionPools:
    """The training questions of an s3 study, split as the authors do: the last
    search.sft_questions are the SFT demonstrations' (`sft`), the rest are RL candidates; a
    reward in search.drop_solved draws its pool from the candidates naive RAG does not answer
    (`unsolved`), the others from the candidates as they come. `solved[i]`: naive RAG's
    accuracy on `train_ids[i]`. The largest pool must fit (a one-line ConfigError if not)."""

    def __init__(self, train_ids: Sequence[int], solved: Sequence[float],
                 search: SearchConfig, largest: int):
        self.search = search
        self.sft = list(train_ids[-search.sft_questions:])
        self.candidates = list(train_ids[: len(train_ids) - search.sft_questions])
        by_id = dict(zip(train_ids, solved, strict=True))
        self.unsolved = [q for q in self.candidates if by_id[q] == 0]
        if len(self.unsolved) < largest:
            raise ConfigError(
                f"config field 'variants.sizes': the largest pool ({largest}) needs more than "
                f"the {len(self.unsolved)} training questions outside search.sft_questions that "
                "naive RAG does not answer; make facts.n_people larger or search.sft_questions "
                "smaller")

    def pool(self, reward: str, size: int) -> tuple[int, ...]:
        """The first `size` questions of `reward`'s pool."""
        return tuple((self.unsolved if reward in self.search.drop_solved
                      else self.candidates)[:size])


__all__ = ["GeneratorConfig", "QuestionPools", "SearchConfig", "SearchReward"]

"""s3's two tasks over the generated fact world (`envs.text.facts`): the searcher's episodes and
the frozen generator's reading.

s3 (Jiang et al. 2025, arXiv 2505.14146; pat-jj/s3) splits retrieval-augmented QA into a
*searcher*, trained by RL, and a *generator* that answers from the documents the searcher hands
it and is never trained by RL.

`SearchTask` ("s3_search", a `ToolTask`): the searcher's episodes in the authors' format
(`rewards.gbr`). The prompt is the question and the naive top-k retrieval,

    In which country was Mira Tolvek born?
    <information>[1] Mira Tolvek was born in Danow.
    [2] ...</information>

and each model turn selects documents of the latest block and either searches again or stops
(one line in the episode):

    <important_info>[1]</important_info><search_complete>False</search_complete>
    <query> Danow</query>

A <query> runs the "search" tool (BM25 over the world's passages, top_k documents), whose output
comes back as the next <information> block; <search_complete>True</search_complete> ends the
episode. `score` is 0: a searcher has no answer of its own; the episode reward
(`algorithms.s3.SearchReward`) runs the generator on the selected documents.

Training questions: problem i of "train" is question pool[i % len(pool)], with pool the task's
`pool` of question indices (the experiment's subset of N training questions, without those that
naive RAG already answers) or, when empty, every training question in a seeded order; "test"
cycles over every held-out question the same way. The splits are facts_qa's (by person).

The scripted expert (`expert_turns`, the SFT demonstrations): if the naive block holds an
answering passage (the combined one, or both hops) it selects it and stops; otherwise it selects
the first hop, searches the bridge entity's name, selects the second hop and stops. With
probability `lazy` per problem (seeded) it is the lazy searcher instead: it selects the first
`max_select` naive documents and stops, which is naive RAG. The SFT start thus mixes the two and
leaves RL to learn when searching pays.

`ReaderTask` ("s3_reader"): the generator's SFT data: prompt = `reader_prompt(question, docs)`,
documents "[i] text" then "Q: question" and "A:", answer = the gold entity. Training contexts
hold both gold passages (or the combined one) and distractors (near-duplicates among them, from
the naive retrieval and the bridge's search), 2..max_docs documents in a seeded order, so the
generator learns to read, not to recall. `score` is `rewards.qa.span_match`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from jaxrl_suite.envs.text.base import TASKS, Example, Task, stable_hash
from jaxrl_suite.envs.text.facts import (
    FactsQATask,
    FactWorld,
    World,
    naive_ids,
    world_retriever,
)
from jaxrl_suite.envs.text.tools.base import TOOLS, ToolError, ToolTask, Turn
from jaxrl_suite.rewards.gbr import (
    COMPLETE_CLOSE,
    COMPLETE_OPEN,
    IMPORTANT_CLOSE,
    IMPORTANT_OPEN,
    INFO_CLOSE,
    INFO_OPEN,
    MAX_SELECT,
    QUERY_CLOSE,
    QUERY_OPEN,
    format_documents,
    information_block,
    parse_search_turn,
)
from jaxrl_suite.rewards.qa import span_match


def _facts(task_name: str, facts) -> FactWorld:
    """A FactWorld from a FactWorld or a YAML mapping (one-line error naming the field)."""
    if isinstance(facts, Mapping):
        known = {f.name for f in dataclasses.fields(FactWorld)}
        unknown = sorted(map(str, set(facts) - known))
        if unknown:
            raise ValueError(f"{task_name}: unknown facts field {unknown[0]!r}; expected one of "
                             f"{sorted(known)}")
        return FactWorld(**facts)
    if not isinstance(facts, FactWorld):
        raise ValueError(f"{task_name}: facts must be a FactWorld, got {type(facts).__name__}")
    return facts


@functools.lru_cache(maxsize=32)
def question_ids(facts: FactWorld, seed: int, split: str) -> tuple[int, ...]:
    """Indices of the world's questions in `split` (facts_qa's split: by person), in a seeded
    order."""
    qa = FactsQATask(seed=seed, facts=facts)
    world = qa.world
    want = split == "test"
    ids = [i for i, q in enumerate(world.questions)
           if (stable_hash(q.subject) % 10 == 0) == want]
    if not ids:
        raise ValueError(f"the fact world has no {split!r} questions (n_people too small)")
    order = np.random.default_rng([seed, 7, want]).permutation(len(ids))
    return tuple(ids[int(j)] for j in order)


def reader_prompt(question: str, documents: Sequence[str]) -> str:
    """The generator's prompt: the documents as "[i] text" lines, then "Q: ..." and "A:"."""
    docs = format_documents(documents)
    return f"{docs}\nQ: {question}\nA:" if docs else f"Q: {question}\nA:"


def search_turn(important: Sequence[int], *, query: str | None = None) -> str:
    """A searcher turn in the authors' format: the selection, the completion flag (True when
    there is no query) and the query. The query follows a space (the parser strips it): with a
    BPE tokenizer a name after a space is the token it is in the passages, so the searcher
    copies the token it read rather than spelling a rarer space-less form of it."""
    ids = ", ".join(str(i) for i in important)
    out = (f"{IMPORTANT_OPEN}[{ids}]{IMPORTANT_CLOSE}"
           f"{COMPLETE_OPEN}{query is None}{COMPLETE_CLOSE}")
    return out if query is None else f"{out}{QUERY_OPEN} {query}{QUERY_CLOSE}"


def _search(args: dict, context: Any) -> str:
    """The "search" tool: the top-k passages of the world for args["query"], as an
    <information> body. context = (FactWorld, seed, top_k)."""
    query = args.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ToolError("query must be a non-empty string")
    facts, seed, k = context
    world = facts.build(seed)
    return format_documents([world.passages[i] for i in world_retriever(world).search(query, k)])


if "search" not in TOOLS:
    TOOLS.register("search", _search)


@dataclasses.dataclass(frozen=True)
class SearchTask(ToolTask):
    """The s3 searcher's episodes over a fact world (module docstring).

    meta = (question index, gold passage ids, naive top-k ids). `pool`: the training questions
    (indices into world.questions; empty = all); `lazy`: the expert's chance of being the lazy
    searcher."""

    name: ClassVar[str] = "s3_search"
    tools: ClassVar[tuple[str, ...]] = ("search",)
    seed: int = 0
    facts: FactWorld = FactWorld()
    top_k: int = 8  # documents per <information> block (the naive one and each search's)
    max_select: int = MAX_SELECT  # documents one <important_info> may select
    pool: tuple[int, ...] = ()  # training questions (indices into world.questions); () = all
    lazy: float = 0.3  # the scripted expert's chance to stop at once with the naive documents

    def __post_init__(self):
        object.__setattr__(self, "facts", _facts(self.name, self.facts))
        object.__setattr__(self, "pool", tuple(int(i) for i in self.pool))
        if not 1 <= self.top_k <= 9:  # one-digit document numbers
            raise ValueError(f"{self.name}: top_k must be in 1..9, got {self.top_k}")
        if not 1 <= self.max_select <= self.top_k:
            raise ValueError(f"{self.name}: max_select must be in 1..top_k, got "
                             f"{self.max_select}")
        if not 0.0 <= self.lazy <= 1.0:
            raise ValueError(f"{self.name}: lazy must be in [0, 1], got {self.lazy}")
        train = set(question_ids(self.facts, self.seed, "train"))
        bad = [i for i in self.pool if i not in train]
        if bad:
            raise ValueError(f"{self.name}: pool holds question {bad[0]}, which is not a "
                             f"training question")

    @property
    def world(self) -> World:
        return self.facts.build(self.seed)

    def questions(self, split: str) -> tuple[int, ...]:
        """The question indices problem i of `split` cycles over."""
        if split == "train" and self.pool:
            return self.pool
        return question_ids(self.facts, self.seed, split)

    def naive(self, question: int) -> tuple[int, ...]:
        """The naive top-k passage ids of a question (BM25 on its raw text; cached)."""
        return naive_ids(self.world, question, self.top_k)

    def _generate(self, rng: np.random.Generator) -> Example:
        raise NotImplementedError("SearchTask cycles over its question lists (see example)")

    def example(self, split: str, index: int) -> Example:
        if index < 0:
            raise ValueError(f"index must be >= 0, got {index}")
        ids = self.questions(split)
        q = ids[index % len(ids)]
        question = self.world.questions[q]
        naive = self.naive(q)
        prompt = question.text + "\n" + information_block(
            [self.world.passages[i] for i in naive])
        return Example(prompt=prompt, answer=question.answer, meta=(q, question.gold, naive))

    def tool_context(self, ex: Example) -> Any:
        return (self.facts, self.seed, self.top_k)

    def parse_turn(self, text: str) -> Turn:
        turn = parse_search_turn(text, top_k=self.top_k, max_select=self.max_select)
        if turn.error:
            return Turn("malformed", error=turn.error)
        if turn.complete:
            return Turn("answer", answer="")
        return Turn("tool", name="search", args={"query": turn.query})

    def observation(self, text: str) -> str:
        return f"{INFO_OPEN}{text}{INFO_CLOSE}"

    def solution(self, ex: Example) -> str:
        return self.expert_turns(ex)[-1]

    def texts(self, n: int = 2048) -> list[str]:
        """Tokenizer text: each prompt with all the expert's turns (queries included)."""
        return [e.prompt + "".join(self.expert_turns(e)) for e in self.examples("train", 0, n)]

    def score(self, completion: str, ex: Example) -> float:
        return 0.0  # the episode reward (algorithms.s3.SearchReward) scores a searcher

    def expert_turns(self, ex: Example, *, tools: bool = True) -> list[str]:
        q, gold, naive = ex.meta
        question = self.world.questions[q]
        rank = {pid: r + 1 for r, pid in enumerate(naive)}
        lazy = np.random.default_rng([self.seed, 11, q]).random() < self.lazy
        if lazy or not tools:
            return [search_turn(range(1, min(self.max_select, len(naive)) + 1))]
        if question.shortcut in rank:
            return [search_turn([rank[question.shortcut]])]
        if all(g in rank for g in gold):
            return [search_turn([rank[g] for g in gold])]
        first = [rank[gold[0]]] if gold[0] in rank else []
        found = world_retriever(self.world).search(question.bridge, self.top_k)
        second = [found.index(gold[1]) + 1] if gold[1] in found else []
        return [search_turn(first, query=question.bridge), search_turn(second)]


@dataclasses.dataclass(frozen=True)
class ReaderTask(Task):
    """The generator's reading task (module docstring): documents + question -> the entity.

    meta = (question index,). Problem i of a split is question ids[i % len(ids)] of that
    split, with a context of 2..max_docs documents drawn by a seeded generator from the gold
    passages and distractors."""

    name: ClassVar[str] = "s3_reader"
    seed: int = 0
    facts: FactWorld = FactWorld()
    max_docs: int = 6  # documents in a context (the generator's context cap)
    top_k: int = 8  # distractors come from the naive and the bridge's top_k

    def __post_init__(self):
        object.__setattr__(self, "facts", _facts(self.name, self.facts))
        if not 2 <= self.max_docs <= 9:
            raise ValueError(f"{self.name}: max_docs must be in 2..9, got {self.max_docs}")
        if self.top_k < 1:
            raise ValueError(f"{self.name}: top_k must be >= 1, got {self.top_k}")

    @property
    def world(self) -> World:
        return self.facts.build(self.seed)

    def _generate(self, rng: np.random.Generator) -> Example:
        raise NotImplementedError("ReaderTask cycles over its question lists (see example)")

    def documents(self, q: int, rng: np.random.Generator) -> list[str]:
        """A training context for question q: the gold passages (or the combined one) and
        distractors, 2..max_docs documents in random order."""
        world = self.world
        question = world.questions[q]
        if question.shortcut >= 0 and rng.random() < 0.5:
            gold = [question.shortcut]
        else:
            gold = list(question.gold)
        found = world_retriever(world).search(question.bridge, self.top_k)
        pool = [i for i in dict.fromkeys((*naive_ids(world, q, self.top_k), *found))
                if i not in gold and i not in question.gold and i != question.shortcut]
        n = int(rng.integers(len(gold), self.max_docs + 1)) - len(gold)
        picks = [pool[int(j)] for j in rng.permutation(len(pool))[:n]]
        ids = gold + picks
        return [world.passages[ids[int(j)]] for j in rng.permutation(len(ids))]

    def example(self, split: str, index: int) -> Example:
        if index < 0:
            raise ValueError(f"index must be >= 0, got {index}")
        ids = question_ids(self.facts, self.seed, split)
        q = ids[index % len(ids)]
        question = self.world.questions[q]
        rng = np.random.default_rng([self.seed, 13, split == "test", index])
        return Example(prompt=reader_prompt(question.text, self.documents(q, rng)),
                       answer=question.answer, meta=(q,))

    def solution(self, ex: Example) -> str:
        return ex.answer

    def score(self, completion: str, ex: Example) -> float:
        return span_match(completion if isinstance(completion, str) else None, ex.answer)


TASKS.register(SearchTask.name, SearchTask)
TASKS.register(ReaderTask.name, ReaderTask)

__all__ = ["ReaderTask", "SearchTask", "question_ids", "reader_prompt", "search_turn"]

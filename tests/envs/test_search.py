"""s3's searcher and reader tasks (envs/text/search.py) and the search reward
(algorithms/s3.py) with a scripted reader: no model, no compile."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jaxrl_suite.algorithms.agent import (
    AgentConfig,
    EpisodeRunner,
    episode_segments,
    expert_episodes,
)
from jaxrl_suite.algorithms.s3 import SearchReward
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text.facts import FactWorld
from jaxrl_suite.envs.text.search import (
    ReaderTask,
    SearchTask,
    question_ids,
    reader_prompt,
    search_turn,
)
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.envs.text.tools.base import run_tool
from jaxrl_suite.rewards.gbr import information_blocks, parse_documents, selected_documents

TOK = load_tokenizer()
FACTS = FactWorld(n_people=300, n_first_names=40)
TASK = SearchTask(facts=FACTS, lazy=0.0)
CFG = AgentConfig(max_turns=3, episode_tokens=1100, obs_chars=400)
PROMPT_LEN = 400


def _runner(task=TASK):
    return EpisodeRunner(task, TOK, None, CFG, prompt_len=PROMPT_LEN, mesh=make_mesh(1),
                         params_source=lambda: (None, 0))


def test_prompt_is_the_question_and_the_naive_block():
    ex = TASK.example("train", 0)
    q, gold, naive = ex.meta
    question = TASK.world.questions[q]
    assert ex.prompt.startswith(question.text + "\n<information>[1] ")
    (block,) = information_blocks(ex.prompt)
    assert block == {r + 1: TASK.world.passages[i] for r, i in enumerate(naive)}
    assert len(naive) == TASK.top_k and gold == question.gold and ex.answer == question.answer
    # problems cycle over the split's questions; the splits are disjoint, by person
    train, test = question_ids(FACTS, 0, "train"), question_ids(FACTS, 0, "test")
    assert not set(train) & set(test) and len(train) + len(test) == len(TASK.world.questions)
    assert TASK.example("train", len(train)) == TASK.example("train", 0)
    subjects = {TASK.world.questions[i].subject for i in test}
    assert not subjects & {TASK.world.questions[i].subject for i in train}


def test_a_pool_restricts_the_training_questions():
    train = question_ids(FACTS, 0, "train")
    task = dataclasses.replace(TASK, pool=train[5:8])
    assert [task.example("train", i).meta[0] for i in range(6)] == [*train[5:8]] * 2
    assert task.example("test", 0) == TASK.example("test", 0)
    test_q = question_ids(FACTS, 0, "test")[0]
    with pytest.raises(ValueError, match="pool holds question .* not a training question"):
        dataclasses.replace(TASK, pool=(test_q,))
    for field, value in (("top_k", 10), ("max_select", 0), ("lazy", 1.5)):
        with pytest.raises(ValueError, match=field):
            dataclasses.replace(TASK, **{field: value})
    with pytest.raises(ValueError, match="unknown facts field 'people'"):
        SearchTask(facts={"people": 3})


def test_turns_map_onto_tool_calls_answers_and_errors():
    assert TASK.parse_turn(search_turn([1, 2], query="Danow")) == (
        "tool", "search", {"query": "Danow"}, None, "")
    assert TASK.parse_turn(search_turn([1])).kind == "answer"
    assert TASK.parse_turn("<query></query>").kind == "malformed"
    assert TASK.parse_turn("the answer is Veldor").kind == "malformed"
    assert TASK.observation("[1] x") == "<information>[1] x</information>"
    ctx = TASK.tool_context(TASK.example("train", 0))
    bridge = TASK.world.questions[TASK.example("train", 0).meta[0]].bridge
    out = run_tool("search", {"query": bridge}, ctx, 400)
    assert out.ok and parse_documents(out.text)[1].startswith(bridge)
    assert not run_tool("search", {"query": ""}, ctx).ok  # an error observation, no raise
    assert not run_tool("search", {"q": "x"}, ctx).ok
    assert run_tool("search", {"query": "zzzz qqqq"}, ctx) == ("", True)  # nothing found


def test_expert_episodes_hand_the_generator_both_gold_passages():
    examples = TASK.examples("train", 0, 24)
    eps = expert_episodes(_runner(), examples)
    world = TASK.world
    searched = 0
    for ep in eps:
        q, gold, naive = ep.example.meta
        question = world.questions[q]
        segs = episode_segments(ep, TOK)
        sel = selected_documents(segs, top_k=TASK.top_k, max_select=TASK.max_select)
        assert sel.malformed == 0 and ep.format_errors == 0 and ep.tool_errors == 0
        answering = ({world.passages[question.shortcut]} if question.shortcut >= 0 else set())
        gold_text = {world.passages[g] for g in gold}
        assert gold_text <= set(sel.documents) or answering & set(sel.documents)
        searched += sel.queries
        if sel.queries:  # a search: the bridge query, then its block; 2 turns
            assert ep.turns == 2 and sel.blocks == 2
            assert segs[1][1].endswith(f"<query> {question.bridge}</query>")
    assert searched >= 12  # most questions need the second hop


def test_the_lazy_expert_is_naive_rag():
    task = dataclasses.replace(TASK, lazy=1.0)
    ex = task.example("train", 3)
    assert task.expert_turns(ex) == [search_turn([1, 2, 3])]
    ep = expert_episodes(_runner(task), [ex])[0]
    sel = selected_documents(episode_segments(ep, TOK))
    assert sel.documents == [task.world.passages[i] for i in ex.meta[2][:3]]


def test_reader_contexts_hold_the_gold_and_distractors():
    reader = ReaderTask(facts=FACTS, max_docs=6)
    world = reader.world
    sizes = []
    for i in range(60):
        ex = reader.example("train", i)
        question = world.questions[ex.meta[0]]
        docs = list(parse_documents(ex.prompt.split("\nQ: ")[0]).values())
        assert ex.prompt.endswith(f"\nQ: {question.text}\nA:") and ex.answer == question.answer
        gold = {world.passages[g] for g in question.gold}
        shortcut = world.passages[question.shortcut] if question.shortcut >= 0 else None
        assert gold <= set(docs) or shortcut in docs
        assert len(set(docs)) == len(docs) <= 6
        sizes.append(len(docs))
        assert reader.score(f" {ex.answer}", ex) == 1.0 and reader.score("nothing", ex) == 0.0
        assert reader.score(None, ex) == 0.0
    assert min(sizes) <= 3 and max(sizes) == 6
    assert reader.example("test", 0).meta[0] in question_ids(FACTS, 0, "test")
    assert reader_prompt("Q?", []) == "Q: Q?\nA:"


# ------------------------------------------------------------------ the episode reward


class OracleReader:
    """A stand-in generator that reads like a perfect one: it answers the question's entity
    iff the context states both hops (or the combined passage), else "unknown". Written from the
    world's relation tables, independently of the reward's code."""

    def __init__(self, task):
        self.world, self.tokenizer, self.calls = task.world, TOK, []
        self.task = ReaderTask(seed=task.seed, facts=task.facts)  # its verifier scores Acc

    def complete(self, params, examples, *, batch_size):
        self.calls.append(len(examples))
        world = self.world
        by_text = {q.text: q for q in world.questions}
        out = []
        for ex in examples:
            docs_text, question_text = ex.prompt.rsplit("\nQ: ", 1)
            question = by_text[question_text[: -len("\nA:")]]
            docs = set(parse_documents(docs_text).values())
            gold = {world.passages[g] for g in question.gold}
            combined = question.shortcut >= 0 and world.passages[question.shortcut] in docs
            out.append(question.answer if gold <= docs or combined else "unknown")
        return out, np.zeros(len(out))


def test_search_reward_is_gain_beyond_rag_of_the_generator():
    reader = OracleReader(TASK)
    examples = TASK.examples("train", 0, 16)
    expert = expert_episodes(_runner(), examples)
    lazy = expert_episodes(_runner(dataclasses.replace(TASK, lazy=1.0)), examples)
    for kind in ("gbr", "gbr_acc", "acc", "recall"):
        reward = SearchReward(TASK, reader, None, tokenizer=TOK, kind=kind, max_docs=8)
        for ep in [*expert, *lazy]:
            ep.reward = None
        reward([*expert, *lazy])
        naive = reward.naive_accuracy([ep.example.meta[0] for ep in expert])
        for ep, n in zip(expert, naive, strict=True):
            assert ep.score == 1.0 and ep.components["acc_naive"] == n
            want = {"gbr": 1.0 - n, "gbr_acc": 2.0 - n, "acc": 1.0,
                    "recall": ep.components["recall"]}[kind]
            assert ep.reward == want
        for ep in lazy:  # naive RAG's own top 3: no gain over the naive top 8
            assert ep.components["gbr"] <= 0.0 and ep.components["queries"] == 0.0
    assert 0 < naive.mean() < 1  # some questions naive RAG answers, most not
    # Acc(D_naive) is computed once per question: a second call runs no generator on them
    calls = len(reader.calls)
    reward.naive_accuracy([ep.example.meta[0] for ep in expert])
    assert len(reader.calls) == calls
    with pytest.raises(ValueError, match="kind"):
        SearchReward(TASK, reader, None, tokenizer=TOK, kind="f1")

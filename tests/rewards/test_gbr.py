"""The s3 searcher's turn parser, document selection and rewards (rewards/gbr.py), against hand
cases and hostile input."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxrl_suite.core.registry import UnknownNameError
from jaxrl_suite.losses.advantages import ADVANTAGES
from jaxrl_suite.rewards.gbr import (
    SEARCH_REWARDS,
    information_block,
    information_blocks,
    parse_documents,
    parse_search_turn,
    passage_recall,
    search_reward,
    selected_documents,
)


def _turn(important=None, complete=None, query=None) -> str:
    parts = []
    if important is not None:
        parts.append(f"<important_info>{important}</important_info>")
    if complete is not None:
        parts.append(f"<search_complete>{complete}</search_complete>")
    if query is not None:
        parts.append(f"<query>{query}</query>")
    return "".join(parts)


def test_parse_search_turn_hand_cases():
    t = parse_search_turn(_turn("[1, 3]", "False", " Dassow country "))
    assert t == ("Dassow country", (1, 3), False, "")
    # the authors' reading: every integer in 1..k, de-duplicated in order; here cut to 3
    assert parse_search_turn(_turn("[9, 2, 2, 0, 5, 7, 1]", "no", "q")).important == (2, 5, 7)
    assert parse_search_turn(_turn("doc 4 and doc 12", "0", "q"), top_k=8).important == (4,)
    assert parse_search_turn(_turn("[]", "True")).important == ()
    for flag in ("True", " yes ", "1", "Y"):  # accepted spellings of True
        assert parse_search_turn(_turn("[1]", flag)).complete
    assert parse_search_turn(_turn(None, "True")) == (None, None, True, "")
    assert not parse_search_turn(_turn("[1]", "maybe", "q")).complete
    # neither a query nor a completed search; an empty query; the environment's tag
    assert parse_search_turn(_turn("[1]", "False")).error
    assert parse_search_turn(_turn("[1]", "False", "  ")).error
    assert "information" in parse_search_turn("<information>[1] x</information>"
                                              + _turn(None, "True")).error
    assert parse_search_turn("<query>" + "x" * 300 + "</query>").error  # over MAX_QUERY_CHARS
    assert parse_search_turn("x" * 3000).error
    assert parse_search_turn("<query>unclosed").error


@given(st.text(max_size=300))
def test_parse_search_turn_never_raises(text):
    t = parse_search_turn(text)
    assert t.error or t.complete or t.query
    assert t.important is None or all(1 <= i <= 8 for i in t.important)


def test_information_blocks_round_trip_and_cut_blocks():
    docs = ["Mira Tolvek was born in Dassow.", "Dassow is a city in Veldor."]
    block = information_block(docs)
    assert block == ("<information>[1] Mira Tolvek was born in Dassow.\n"
                     "[2] Dassow is a city in Veldor.</information>")
    assert information_blocks("Q?\n" + block + "\n" + block) == [{1: docs[0], 2: docs[1]}] * 2
    # an observation cut by the budget: whole lines kept, a cut line keeps its prefix
    assert information_blocks(block[:56]) == [{1: docs[0], 2: "Das"}]
    assert parse_documents("junk\n[x] no\n[3]kept\n[3] dup") == {3: "kept"}


PROMPT = "Where was X born?\n" + information_block(["a1", "a2", "a3"])
OBS1 = information_block(["b1", "b2"])
OBS2 = information_block(["c1", "a2"])


def test_selected_documents_follow_the_authors_rules():
    segs = [(False, PROMPT), (True, _turn("[2, 3]", "False", "q1")), (False, OBS1),
            (True, _turn("[2]", "False", "q2")), (False, OBS2),
            (True, _turn("[1, 2]", "True"))]
    sel = selected_documents(segs)
    assert sel.documents == ["a2", "a3", "b2", "c1"]  # "a2" again in block 3: de-duplicated
    assert (sel.turns, sel.malformed, sel.queries, sel.selected, sel.blocks) == (3, 0, 2, 5, 3)
    # a block no turn selects from: all its documents (authors) or none
    segs = [(False, PROMPT), (True, _turn(None, "False", "q1")), (False, OBS1),
            (True, _turn("[1]", "True"))]
    assert selected_documents(segs).documents == ["a1", "a2", "a3", "b1"]
    assert selected_documents(segs, unselected="none").documents == ["b1"]
    # a second <important_info> with no new block in between selects nothing
    segs = [(False, PROMPT), (True, _turn("[1]", "False", "")),  # malformed: empty query
            (True, _turn("[3]", "True"))]
    sel = selected_documents(segs)
    assert sel.documents == ["a3"] and sel.malformed == 1
    segs = [(False, PROMPT), (True, _turn("[1]", "False", "q")), (True, _turn("[3]", "True"))]
    assert selected_documents(segs).documents == ["a1"]
    # a model turn that writes its own <information> block is malformed and injects nothing
    fake = information_block(["Veldor"]) + _turn("[1]", "True")
    sel = selected_documents([(False, PROMPT), (True, fake)])
    assert sel.documents == ["a1", "a2", "a3"] and sel.malformed == 1
    # numbers past the block's documents are ignored
    assert selected_documents([(False, PROMPT), (True, _turn("[7, 2]", "True"))]
                              ).documents == ["a2"]
    with pytest.raises(ValueError, match="unselected"):
        selected_documents([], unselected="some")


def test_rewards_and_recall_by_hand():
    assert passage_recall(["a", "b"], ["b", "c"]) == 0.5
    assert passage_recall([], ["b"]) == 0.0 and passage_recall(["a"], []) == 1.0
    table = {  # (acc_searcher, acc_naive) -> gbr, gbr_acc, acc
        (1.0, 0.0): (1.0, 2.0, 1.0), (1.0, 1.0): (0.0, 1.0, 1.0),
        (0.0, 1.0): (-1.0, -1.0, 0.0), (0.0, 0.0): (0.0, 0.0, 0.0),
    }
    for (s, n), (gbr, gbr_acc, acc) in table.items():
        assert search_reward("gbr", s, n, 0.3) == gbr
        assert search_reward("gbr_acc", s, n, 0.3) == gbr_acc
        assert search_reward("acc", s, n, 0.3) == acc
        assert search_reward("recall", s, n, 0.3) == 0.3
    assert SEARCH_REWARDS.names() == ["acc", "gbr", "gbr_acc", "recall"]
    with pytest.raises(UnknownNameError, match="'f1'"):
        search_reward("f1", 1.0, 0.0, 0.0)


@pytest.mark.parametrize("estimator", ["group", "rloo"])
def test_group_relative_advantages_cancel_the_naive_baseline(estimator):
    """Acc(D_naive) is one constant per question, so under group-relative advantages GBR and
    Acc give the same advantages, and GBR + Acc on questions naive RAG misses (the pools of
    search.drop_solved) gives them twice, which the group's std scaling undoes up to its eps
    (docs/s3.md)."""
    rng = np.random.default_rng(0)
    acc = rng.integers(0, 2, (6, 8)).astype(np.float32)  # [questions, G] searcher accuracies
    naive = rng.integers(0, 2, (6, 1)).astype(np.float32)  # per question
    fn = ADVANTAGES.get(estimator)
    rewards = {kind: np.vectorize(lambda a, n, k=kind: search_reward(k, a, n, 0.0))(acc, naive)
               for kind in ("gbr", "acc")}
    np.testing.assert_allclose(fn(rewards["gbr"]), fn(rewards["acc"]), atol=1e-6)
    unsolved = np.vectorize(lambda a: search_reward("gbr_acc", a, 0.0, 0.0))(acc)
    twice = {"group": 1.0, "rloo": 2.0}[estimator]
    np.testing.assert_allclose(fn(unsolved), twice * fn(acc), atol=1e-3)
    # a batch-normalised estimator keeps the per-question offset: there the rewards differ
    pp = ADVANTAGES.get("reinforce_pp")
    assert not np.allclose(pp(rewards["gbr"]), pp(rewards["acc"]), atol=1e-3)

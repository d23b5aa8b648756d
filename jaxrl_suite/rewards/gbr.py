"""The s3 searcher's turn format, the documents it hands the generator, and its rewards.

s3 (Jiang et al. 2025, "s3: You Don't Need That Much Data to Train a Search Agent via RL",
arXiv 2505.14146; code: pat-jj/s3) trains only a *searcher*; a frozen generator answers from
the documents the searcher selected. The episode, in the authors' format:

    prompt: the question and <information> the naive top-k retrieval </information>
    turn t: <important_info>[1, 3]</important_info><search_complete>False</search_complete>
            <query>next query</query>
    env:    <information> top-k documents of that query </information>
    ...     (at most 3 turns; <search_complete>True</search_complete> ends the search)

Documents in an <information> block are lines "[i] text" (i = 1..k). An <important_info> list
applies to the most recent <information> block before it (`selected_documents`, as the authors'
`extract_titles_and_texts`); a block that no <important_info> refers to contributes all its
documents (the authors' rule; `unselected="none"` drops them instead). The generator's context
is the selected documents, de-duplicated, in order.

Rewards (`search_reward`), with Acc(D) = 1 iff the normalised gold answer occurs as a token run
in the generator's answer from the question and documents D (`rewards.qa.span_match`):

    gbr      GBR = Acc(D_searcher) - Acc(D_naive)     Gain Beyond RAG (the paper's reward)
    gbr_acc  GBR + Acc(D_searcher)                    what the authors' code trains on
    acc      Acc(D_searcher)                          end-to-end on final accuracy (baseline)
    recall   |gold ∩ D_searcher| / |gold|             a retrieval-only reward (baseline)

D_naive is the naive top-k retrieval on the raw question. Everything here parses model output
and never evaluates it: a malformed turn selects nothing and is counted, it never raises. The
<information> blocks are read only from text the environment wrote (the prompt and the tool
observations), never from the policy's own turns, so a searcher cannot inject documents.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from jaxrl_suite.core.registry import Registry

QUERY_OPEN, QUERY_CLOSE = "<query>", "</query>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"
IMPORTANT_OPEN, IMPORTANT_CLOSE = "<important_info>", "</important_info>"
COMPLETE_OPEN, COMPLETE_CLOSE = "<search_complete>", "</search_complete>"
MAX_SELECT = 3  # documents one <important_info> may select (the "at most 3")
MAX_TURN_CHARS = 2_000  # a longer turn is malformed (never scanned)
MAX_QUERY_CHARS = 200
_TRUE = frozenset({"true", "yes", "1", "y"})  # the authors' accepted spellings of True
_DOC_RE = re.compile(r"^\[(\d{1,2})\] ?(.*)$")
_INT_RE = re.compile(r"\d{1,3}")


class SearchTurn(NamedTuple):
    """One parsed searcher turn. query: the text inside <query> (None if absent); important:
    the selected document numbers (None without an <important_info> tag); complete: the
    <search_complete> flag (False when absent, as the authors read it); error: why the turn is
    malformed ("" when it is not)."""

    query: str | None
    important: tuple[int, ...] | None
    complete: bool
    error: str = ""


def _between(text: str, open_tag: str, close_tag: str) -> str | None:
    """The text between the first `open_tag` and the next `close_tag` (None if either is
    missing)."""
    i = text.find(open_tag)
    if i < 0:
        return None
    j = text.find(close_tag, i + len(open_tag))
    return None if j < 0 else text[i + len(open_tag): j]


def parse_search_turn(text: str, *, top_k: int = 8, max_select: int = MAX_SELECT) -> SearchTurn:
    """Reads one searcher turn; never raises.

    <important_info>: every integer in it that is a document number 1..top_k, de-duplicated in
    order (the authors' parser), cut to the first `max_select`. <search_complete>: True iff its
    stripped, lower-cased text is one of true / yes / 1 / y. <query>: stripped, at most
    MAX_QUERY_CHARS. A turn is malformed when it is longer than MAX_TURN_CHARS, holds an
    <information> tag (only the environment writes those), or neither completes the search nor
    asks a non-empty query."""
    if len(text) > MAX_TURN_CHARS:
        return SearchTurn(None, None, False, f"turn longer than {MAX_TURN_CHARS} characters")
    if INFO_OPEN in text or INFO_CLOSE in text:
        return SearchTurn(None, None, False, "a turn may not write <information>")
    raw = _between(text, IMPORTANT_OPEN, IMPORTANT_CLOSE)
    important = None
    if raw is not None:
        ids = [int(m) for m in _INT_RE.findall(raw)]
        important = tuple(dict.fromkeys(i for i in ids if 1 <= i <= top_k))[:max_select]
    flag = _between(text, COMPLETE_OPEN, COMPLETE_CLOSE)
    complete = flag is not None and flag.strip().lower() in _TRUE
    query = _between(text, QUERY_OPEN, QUERY_CLOSE)
    if query is not None:
        query = query.strip()
        if len(query) > MAX_QUERY_CHARS:
            return SearchTurn(None, important, complete,
                              f"query longer than {MAX_QUERY_CHARS} characters")
    if not complete and not query:
        return SearchTurn(query, important, False,
                          "no <query> and no <search_complete>True</search_complete>")
    return SearchTurn(query, important, complete)


def format_documents(passages: Sequence[str]) -> str:
    """An <information> block's body: one line "[i] text" per passage, i = 1.."""
    return "\n".join(f"[{i}] {p}" for i, p in enumerate(passages, 1))


def information_block(passages: Sequence[str]) -> str:
    """<information>[1] ..\\n[2] ..</information>."""
    return f"{INFO_OPEN}{format_documents(passages)}{INFO_CLOSE}"


def parse_documents(body: str) -> dict[int, str]:
    """{number: text} of an environment-written block body (`format_documents`); lines that do
    not parse are skipped (a block cut short by the observation budget keeps its whole lines;
    a cut last line keeps its prefix)."""
    out = {}
    for line in body.split("\n"):
        m = _DOC_RE.match(line)
        if m:
            out.setdefault(int(m.group(1)), m.group(2).strip())
    return out


def information_blocks(text: str) -> list[dict[int, str]]:
    """Every <information> block of environment-written `text`, parsed (an unclosed last block
    counts up to the end of the text)."""
    out, pos = [], 0
    while (i := text.find(INFO_OPEN, pos)) >= 0:
        j = text.find(INFO_CLOSE, i)
        end = len(text) if j < 0 else j
        out.append(parse_documents(text[i + len(INFO_OPEN): end]))
        pos = end
    return out


class Selection(NamedTuple):
    """What a searcher episode hands the generator: documents (de-duplicated texts, in order),
    turns (model turns), malformed (malformed turns), queries (well-formed queries issued),
    selected (documents chosen by <important_info>, before de-duplication), blocks (the
    <information> blocks shown)."""

    documents: list[str]
    turns: int
    malformed: int
    queries: int
    selected: int
    blocks: int


def selected_documents(segments: Sequence[tuple[bool, str]], *, top_k: int = 8,
                       max_select: int = MAX_SELECT, unselected: str = "all") -> Selection:
    """The generator's documents from a searcher episode, given as its text segments in order:
    (True, a model turn) or (False, environment text: the prompt, an observation).

    Each environment segment's <information> blocks are appended to the list of blocks; a model
    turn's <important_info> selects documents of the most recent block that is not yet
    selected from (a later <important_info> with no new block in between selects nothing, as in
    the authors' `extract_titles_and_texts`). Blocks no turn selected from contribute all
    their documents when `unselected` is "all" (the authors), none when "none"."""
    if unselected not in ("all", "none"):
        raise ValueError(f"unselected must be 'all' or 'none', got {unselected!r}")
    blocks: list[dict[int, str]] = []
    used: set[int] = set()
    picks: list[tuple[int, list[str]]] = []  # (block index, its selected texts)
    turns = malformed = queries = selected = 0
    for is_model, text in segments:
        if not is_model:
            blocks += information_blocks(text)
            continue
        turns += 1
        turn = parse_search_turn(text, top_k=top_k, max_select=max_select)
        if turn.error:
            malformed += 1
            continue
        queries += bool(turn.query) and not turn.complete
        if turn.important is not None and blocks and len(blocks) - 1 not in used:
            b = len(blocks) - 1
            used.add(b)
            texts = [blocks[b][i] for i in turn.important if i in blocks[b]]
            selected += len(texts)
            picks.append((b, texts))
    chosen = {b: texts for b, texts in picks}
    docs: list[str] = []
    for b, block in enumerate(blocks):
        if b in chosen:
            docs += chosen[b]
        elif unselected == "all":
            docs += [block[i] for i in sorted(block)]
    return Selection(list(dict.fromkeys(docs)), turns, malformed, queries, selected,
                     len(blocks))


def passage_recall(documents: Sequence[str], gold: Sequence[str]) -> float:
    """|gold ∩ documents| / |gold| (1.0 when there is no gold passage)."""
    if not gold:
        return 1.0
    have = set(documents)
    return sum(g in have for g in gold) / len(gold)


def _gbr(acc_searcher: float, acc_naive: float, recall: float) -> float:
    return acc_searcher - acc_naive


def _gbr_acc(acc_searcher: float, acc_naive: float, recall: float) -> float:
    return (acc_searcher - acc_naive) + acc_searcher


def _acc(acc_searcher: float, acc_naive: float, recall: float) -> float:
    return acc_searcher


def _recall(acc_searcher: float, acc_naive: float, recall: float) -> float:
    return recall


SEARCH_REWARDS: Registry = Registry("search reward")
SEARCH_REWARDS.register("gbr", _gbr)
SEARCH_REWARDS.register("gbr_acc", _gbr_acc)
SEARCH_REWARDS.register("acc", _acc)
SEARCH_REWARDS.register("recall", _recall)


def search_reward(kind: str, acc_searcher: float, acc_naive: float, recall: float) -> float:
    """The searcher's reward of kind `kind` (module docstring): gbr = acc_searcher - acc_naive,
    gbr_acc = gbr + acc_searcher, acc = acc_searcher, recall = recall."""
    return float(SEARCH_REWARDS.get(kind)(acc_searcher, acc_naive, recall))


__all__ = [
    "COMPLETE_CLOSE",
    "COMPLETE_OPEN",
    "IMPORTANT_CLOSE",
    "IMPORTANT_OPEN",
    "INFO_CLOSE",
    "INFO_OPEN",
    "MAX_SELECT",
    "QUERY_CLOSE",
    "QUERY_OPEN",
    "SEARCH_REWARDS",
    "SearchTurn",
    "Selection",
    "format_documents",
    "information_block",
    "information_blocks",
    "parse_documents",
    "parse_search_turn",
    "passage_recall",
    "search_reward",
    "selected_documents",
]

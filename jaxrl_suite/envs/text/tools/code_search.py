"""Code search over a generated Python repository: the `code_search` tool and the
`repo_search` task ("which line defines the function that ...? Answer path:line.").

`generate_repo(seed, n_modules, entities_per_module)` writes a small, deterministic codebase:
modules of verb_noun functions and classes with methods, each with a one-line docstring such as
"Merges stale spans in place." Docstrings come in families of near-duplicates (same verb and
noun, another adjective or qualifier), so a query needs the distinguishing words.

`RepoIndex(repo)` parses the sources with `ast` (the generated code is never imported or run):
one `Entry` per class, function and method, with its qualified name ("stats.Table.merge_spans"
= module stem + class + name), path, line span, docstring and source. `RepoIndex.search` ranks
exact ids first (the qualified name, or a unique bare name), then substrings of the qualified
names, then BM25 (`bm25s`) over the name parts, docstring and source tokens
(`envs.text.retrieval.tokenize`).

The tool's context is a problem's repository parameters (seed, n_modules, entities_per_module);
it regenerates the repository and caches its index per process (`repo_index`).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import logging
import re
from collections.abc import Mapping
from typing import ClassVar, NamedTuple

import numpy as np

from jaxrl_suite.envs.text.base import TASKS, Example
from jaxrl_suite.envs.text.retrieval import STOPWORDS, tokenize
from jaxrl_suite.envs.text.tools.base import TOOLS, ToolError, ToolTask, format_call
from jaxrl_suite.rewards.format import answer_tags, extract_answer
from jaxrl_suite.rewards.match import string_match

# ---- the generated repository ----------------------------------------------------------------

MODULES = ("shapes", "io", "storage", "parsing", "net", "stats", "jobs", "graph")
CLASSES = ("Box", "Table", "Queue", "Cache", "Buffer", "Grid", "Pool", "Store", "Ring", "Heap",
           "Frame", "Ledger", "Router", "Tracker")  # no word shared with the docstrings
VERBS = (  # (name part, docstring form); the S-stemmer maps the second onto the first
    ("merge", "Merges"), ("split", "Splits"), ("sort", "Sorts"), ("count", "Counts"),
    ("load", "Loads"), ("parse", "Parses"), ("scale", "Scales"), ("find", "Finds"),
    ("group", "Groups"), ("clip", "Clips"), ("rank", "Ranks"), ("pack", "Packs"),
)
ADJECTIVES = ("overlapping", "stale", "empty", "nested", "duplicate", "missing", "negative",
              "large", "cached", "pending", "unique", "hidden")
NOUNS = ("spans", "points", "rows", "keys", "tokens", "records", "edges", "weights", "paths",
         "scores", "labels", "cells")
QUALIFIERS = ("in place", "by length", "from disk", "to a dict", "in batches", "with a limit",
              "by index", "lazily", "in reverse", "at once")
_BODIES = (  # a couple of plausible lines; {a} is the argument, {n} a small number
    ("out = [x for x in {a} if x is not None]", "return out"),
    ("total = 0", "for x in {a}:", "    total += {n}", "return total"),
    ("if not {a}:", "    return None", "return {a}[{n}]"),
    ("size = len({a}) // {n}", "return list({a})[:size]"),
    ("step = {n}", "return {a}[::step]"),
    ("seen = set()", "keep = [x for x in {a} if x not in seen]", "seen.update(keep)",
     "return keep[:{n}]"),
)


class _Spec(NamedTuple):
    verb: int
    adj: int
    noun: int
    qual: int

    def docstring(self) -> str:
        return (f"{VERBS[self.verb][1]} {ADJECTIVES[self.adj]} {NOUNS[self.noun]} "
                f"{QUALIFIERS[self.qual]}.")


def _draw_specs(rng: np.random.Generator, n: int) -> list[_Spec]:
    """`n` distinct docstring specs in families: a (verb, noun) pair with 1-3 variants that
    differ in the adjective or qualifier (near-duplicate docstrings)."""
    specs: list[_Spec] = []
    seen: set[_Spec] = set()
    while len(specs) < n:
        verb, noun = int(rng.integers(len(VERBS))), int(rng.integers(len(NOUNS)))
        adj, qual = int(rng.integers(len(ADJECTIVES))), int(rng.integers(len(QUALIFIERS)))
        for j in range(int(rng.integers(1, 4))):
            if j:  # a variant: another adjective or another qualifier
                if rng.random() < 0.5:
                    adj = int(rng.integers(len(ADJECTIVES)))
                else:
                    qual = int(rng.integers(len(QUALIFIERS)))
            spec = _Spec(verb, adj, noun, qual)
            if spec not in seen and len(specs) < n:
                seen.add(spec)
                specs.append(spec)
    order = rng.permutation(len(specs))
    return [specs[int(i)] for i in order]


def _function_source(rng: np.random.Generator, spec: _Spec, taken: set[str],
                     indent: str) -> list[str]:
    """The lines of one def (a method if `indent`), its name unique among `taken`."""
    verb, noun = VERBS[spec.verb][0], NOUNS[spec.noun]
    for name in (f"{verb}_{noun}", f"{verb}_{ADJECTIVES[spec.adj]}_{noun}",
                 f"{verb}_{noun}_{QUALIFIERS[spec.qual].split()[-1]}"):
        if name not in taken:
            break
    else:
        name = f"{verb}_{noun}_{len(taken)}"
    taken.add(name)
    n = int(rng.integers(1, 5))
    params = ("self, " if indent else "") + noun + (f", limit={n}" if rng.random() < 0.3 else "")
    body = _BODIES[int(rng.integers(len(_BODIES)))]
    inner = indent + "    "
    return ([f"{indent}def {name}({params}):", f'{inner}"""{spec.docstring()}"""']
            + [inner + line.format(a=noun, n=n) for line in body])


def generate_repo(seed: int, n_modules: int = 4, entities_per_module: int = 6) -> dict[str, str]:
    """A deterministic generated codebase {path: source}: `n_modules` modules (of `MODULES`),
    each with `entities_per_module` functions and methods (module-level functions and one or two
    classes, each with at least one method), every def with a one-line docstring."""
    if not 1 <= n_modules <= len(MODULES):
        raise ValueError(f"n_modules must be in [1, {len(MODULES)}], got {n_modules}")
    if not 2 <= entities_per_module <= 12:
        raise ValueError(f"entities_per_module must be in [2, 12], got {entities_per_module}")
    rng = np.random.default_rng([seed, n_modules, entities_per_module])
    stems = [MODULES[int(i)] for i in rng.permutation(len(MODULES))[:n_modules]]
    class_names = iter([CLASSES[int(i)] for i in rng.permutation(len(CLASSES))])
    specs = iter(_draw_specs(rng, n_modules * entities_per_module))
    repo = {}
    for stem in stems:
        n_classes = 1 if entities_per_module < 3 else int(rng.integers(1, 3))
        n_free = int(rng.integers(1, entities_per_module - n_classes + 1))
        cuts = sorted(int(c) for c in rng.choice(
            np.arange(1, entities_per_module - n_free), n_classes - 1, replace=False))
        sizes = np.diff([0, *cuts, entities_per_module - n_free]).tolist()  # >= 1 method each
        lines = [f'"""Helpers for {stem}."""']
        taken: set[str] = set()
        for _ in range(n_free):
            lines += ["", "", *_function_source(rng, next(specs), taken, "")]
        for size in sizes:
            cls = next(class_names)
            methods = [next(specs) for _ in range(size)]
            lines += ["", "", f"class {cls}:",
                      f'    """A {cls.lower()} of {NOUNS[methods[0].noun]}."""']
            method_names: set[str] = set()
            for spec in methods:
                lines += ["", *_function_source(rng, spec, method_names, "    ")]
        repo[f"{stem}.py"] = "\n".join(lines) + "\n"
    return repo


# ---- the index ------------------------------------------------------------------------------

class Entry(NamedTuple):
    """One indexed class, function or method.

    qualname: module stem + class + name, e.g. "stats.Table.merge_spans"; kind: "class",
    "function" or "method"; start, end: 1-based lines of the `def`/`class` and the last line."""

    qualname: str
    kind: str
    path: str
    start: int
    end: int
    docstring: str
    source: str


class Hit(NamedTuple):
    """A search result: the entry, the stage that found it ("id", "substring" or "bm25") and
    its BM25 score (0.0 for the first two stages)."""

    entry: Entry
    stage: str
    score: float = 0.0


class RepoIndex:
    """An AST index of a repository {path: source} with exact-id, substring and BM25 search."""

    def __init__(self, repo: Mapping[str, str]):
        import bm25s  # deferred: a second or so of imports, only needed once a tool runs

        logging.getLogger("bm25s").setLevel(logging.WARNING)  # it sets itself to DEBUG

        entries = []
        for path, source in repo.items():
            lines = source.splitlines()
            stem = path.rsplit("/", 1)[-1].removesuffix(".py")
            for node in ast.parse(source, filename=path).body:
                entries += self._entries(node, stem, path, lines)
        self.repo = dict(repo)
        self.entries: tuple[Entry, ...] = tuple(entries)
        self.by_name = {e.qualname: e for e in self.entries}
        bare: dict[str, list[Entry]] = {}
        for e in self.entries:
            bare.setdefault(e.qualname.rsplit(".", 1)[-1], []).append(e)
        self._unique_bare = {name: es[0] for name, es in bare.items() if len(es) == 1}
        self._bm25 = bm25s.BM25()
        self._bm25.index([self._document(e) for e in self.entries], show_progress=False)

    @staticmethod
    def _entries(node: ast.AST, stem: str, path: str, lines: list[str]) -> list[Entry]:
        def entry(node, qualname: str, kind: str) -> Entry:
            source = "\n".join(lines[node.lineno - 1:node.end_lineno])
            return Entry(qualname, kind, path, node.lineno, node.end_lineno,
                         ast.get_docstring(node) or "", source)

        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return [entry(node, f"{stem}.{node.name}", "function")]
        if not isinstance(node, ast.ClassDef):
            return []
        out = [entry(node, f"{stem}.{node.name}", "class")]
        for child in node.body:
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                out.append(entry(child, f"{stem}.{node.name}.{child.name}", "method"))
        return out

    @staticmethod
    def _document(e: Entry) -> list[str]:
        """BM25 tokens: name parts, docstring, source (a class: its header line only, so that
        its methods' docstrings do not make it outrank them)."""
        source = e.source.splitlines()[0] if e.kind == "class" else e.source
        return tokenize(e.qualname) + tokenize(e.docstring) + tokenize(source)

    def bm25_scores(self, query: str) -> np.ndarray:
        """The BM25 score of each entry (in `entries` order) for `query`; zeros if no query
        token is in the vocabulary."""
        tokens = list(dict.fromkeys(tokenize(query)))
        ids = self._bm25.get_tokens_ids(tokens)
        if not ids:
            return np.zeros(len(self.entries), np.float32)
        return np.asarray(self._bm25.get_scores_from_ids(ids))

    def search(self, query: str, k: int = 3) -> list[Hit]:
        """Up to `k` hits: the entry whose qualified name (or unique bare name) is `query`,
        then entries whose qualified name contains it (case-insensitive, 3+ characters), then
        the positive-BM25 entries by descending score (ties: index order)."""
        q = query.strip()
        hits: list[Hit] = []
        found: set[str] = set()

        def add(e: Entry, stage: str, score: float = 0.0):
            if e.qualname not in found and len(hits) < k:
                found.add(e.qualname)
                hits.append(Hit(e, stage, score))

        exact = self.by_name.get(q) or self._unique_bare.get(q)
        if exact is not None:
            add(exact, "id")
        if len(q) >= 3:
            for e in self.entries:
                if q.lower() in e.qualname.lower():
                    add(e, "substring")
        if len(hits) < k:
            scores = self.bm25_scores(q)
            for i in np.argsort(-scores, kind="stable"):
                if scores[i] <= 0 or len(hits) >= k:
                    break
                add(self.entries[int(i)], "bm25", float(scores[i]))
        return hits


@functools.lru_cache(maxsize=64)
def repo_index(seed: int, n_modules: int = 4, entities_per_module: int = 6) -> RepoIndex:
    """The (per-process cached) index of `generate_repo(seed, n_modules, entities_per_module)`."""
    return RepoIndex(generate_repo(seed, n_modules, entities_per_module))


# ---- the tool -------------------------------------------------------------------------------

MAX_QUERY_CHARS = 200
MAX_K = 5
DOC_CHARS = 32  # docstrings are cut to this many characters in the tool's output


def format_hit(hit: Hit) -> str:
    """One output line: "stats.py:14-17 stats.Table.merge_spans: Merges stale spans lazily." """
    e = hit.entry
    doc = e.docstring.splitlines()[0] if e.docstring else ""
    if len(doc) > DOC_CHARS:
        doc = doc[:DOC_CHARS - 3] + "..."
    return f"{e.path}:{e.start}-{e.end} {e.qualname}: {doc}"


@TOOLS.register("code_search")
def code_search(args: dict, context) -> str:
    """Searches the problem's generated repository. args: {"query": str, "k": int in [1, 5]
    (default 3)}; context: (seed, n_modules, entities_per_module). One line per hit (see
    `format_hit`), or "no match"."""
    unknown = set(args) - {"query", "k"}
    if unknown:
        raise ToolError(f"unknown argument {sorted(map(str, unknown))[0][:20]!r}; "
                        "expected query, k")
    query, k = args.get("query"), args.get("k", 3)
    if not isinstance(query, str):
        raise ToolError("query must be a string")
    if len(query) > MAX_QUERY_CHARS:
        raise ToolError(f"query longer than {MAX_QUERY_CHARS} characters")
    if not query.strip():
        raise ToolError("empty query")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ToolError(f"k must be an integer in [1, {MAX_K}]")
    if (not isinstance(context, tuple | list) or len(context) != 3
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in context)):
        raise ToolError("no repository for this problem")
    hits = repo_index(*context).search(query, k)
    return "\n".join(map(format_hit, hits)) if hits else "no match"


# ---- the task -------------------------------------------------------------------------------

class RepoSearchMeta(NamedTuple):
    """A repo_search problem: the repository parameters, the target's qualified name and the
    scripted expert's query."""

    repo_seed: int
    n_modules: int
    entities_per_module: int
    qualname: str
    query: str


def expert_query(entry: Entry) -> str:
    """The expert's query: the content words of the target's docstring, e.g. "Merges stale
    spans in place." -> "merges stale spans place"."""
    words = re.findall(r"[A-Za-z0-9]+", entry.docstring.lower())
    return " ".join(w for w in words if w not in STOPWORDS)


def describe(entry: Entry) -> str:
    """The prompt's description of the target: its docstring as a clause ("merges stale spans
    in place")."""
    doc = entry.docstring.strip().rstrip(".")
    return doc[:1].lower() + doc[1:]


@dataclasses.dataclass(frozen=True)
class RepoSearchTask(ToolTask):
    """Find the line that defines a function, described by its docstring, in a generated repo.

    Prompt: "Which line defines the function that merges stale spans in place? Answer
    path:line."; answer "stats.py:14" (the `def` line; methods count as functions). Each problem
    has its own repository (its seed drawn from the problem's rng, in `meta`), searchable with
    the `code_search` tool (context: the repository parameters). Problems are drawn so that the
    expert's query (`expert_query`) ranks the target strictly first. `score` is 1.0 iff the
    first <answer> content is exactly the answer, else 0.0."""

    name: ClassVar[str] = "repo_search"
    tools: ClassVar[tuple[str, ...]] = ("code_search",)
    seed: int = 0
    n_modules: int = 4
    entities_per_module: int = 6

    def __post_init__(self):
        generate_repo(0, self.n_modules, self.entities_per_module)  # validates the params

    def _generate(self, rng: np.random.Generator) -> Example:
        for _ in range(100):
            repo_seed = int(rng.integers(2**31 - 1))
            index = repo_index(repo_seed, self.n_modules, self.entities_per_module)
            defs = [e for e in index.entries if e.kind != "class"]
            target = defs[int(rng.integers(len(defs)))]
            query = expert_query(target)
            hits = index.search(query, 2)
            if hits[0].entry != target or (len(hits) > 1 and hits[1].score >= hits[0].score
                                           - 1e-3):
                continue  # the expert's query must find the target first, unambiguously
            meta = RepoSearchMeta(repo_seed, self.n_modules, self.entities_per_module,
                                  target.qualname, query)
            return Example(
                prompt=f"Which line defines the function that {describe(target)}? "
                       "Answer path:line.",
                answer=f"{target.path}:{target.start}", meta=meta)
        raise RuntimeError(f"{self!r}: no unambiguous problem in 100 draws")

    def tool_context(self, ex: Example) -> tuple[int, int, int]:
        return tuple(ex.meta[:3])

    def solution(self, ex: Example) -> str:
        return answer_tags(ex.answer)

    def score(self, completion: str, ex: Example) -> float:
        if not isinstance(completion, str):
            return 0.0
        return string_match(extract_answer(completion), ex.answer, normalize=str.strip)

    def expert_turns(self, ex: Example, *, tools: bool = True) -> list[str]:
        if not tools:
            return [self.solution(ex)]
        return [format_call("code_search", query=ex.meta[4]), self.solution(ex)]


TASKS.register(RepoSearchTask.name, RepoSearchTask)

__all__ = [
    "DOC_CHARS",
    "MAX_K",
    "MAX_QUERY_CHARS",
    "Entry",
    "Hit",
    "RepoIndex",
    "RepoSearchMeta",
    "RepoSearchTask",
    "code_search",
    "describe",
    "expert_query",
    "format_hit",
    "generate_repo",
    "repo_index",
    "tokenize",
]

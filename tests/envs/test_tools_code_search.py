"""code_search tool and repo_search task: generated repo, AST index, search order, tool output,
hostile arguments, task scoring and the expert's consistency with the real tool."""

import ast
import pickle
import re

import pytest

from jaxrl_suite.envs.text.base import TASKS, make_task
from jaxrl_suite.envs.text.tools.base import (
    TOOLS,
    ToolError,
    format_call,
    parse_turn,
    run_tool,
)
from jaxrl_suite.envs.text.tools.code_search import (
    DOC_CHARS,
    RepoIndex,
    RepoSearchTask,
    code_search,
    generate_repo,
    repo_index,
    tokenize,
)

HAND_REPO = {
    "geo.py": (
        '"""Geo."""\n'                      # 1
        "import not_a_real_module\n"        # 2: never imported by the index
        "raise SystemExit(3)\n"             # 3: never run
        "\n"                                # 4
        "def scale(box):\n"                 # 5
        '    """Grows the box."""\n'        # 6
        "    return box\n"                  # 7
        "\n"                                # 8
        "def scale_all(boxes):\n"           # 9
        '    """Grows every box."""\n'      # 10
        "    return boxes\n"                # 11
        "\n"                                # 12
        "class Box:\n"                      # 13
        '    """A box."""\n'                # 14
        "\n"                                # 15
        "    def area(self):\n"             # 16
        '        """Area of the box."""\n'  # 17
        "        w = 2\n"                   # 18
        "        return w * w\n"            # 19
        "\n"                                # 20
        "class Ring:\n"                     # 21
        '    """A ring."""\n'               # 22
        "    def area(self):\n"             # 23
        '        """Scale the ring area."""\n'  # 24
        "        return 1\n"                # 25
    ),
}


def _defs_by_scanning(source: str) -> dict[str, int]:
    """{qualname-without-module: line} of every def/class, by scanning the text (no ast)."""
    out, cls = {}, None
    for i, line in enumerate(source.splitlines(), 1):
        m = re.match(r"^( *)(def|class) (\w+)", line)
        if not m:
            continue
        if m.group(1) == "":
            cls = m.group(3) if m.group(2) == "class" else None
            out[m.group(3)] = i
        else:
            out[f"{cls}.{m.group(3)}"] = i
    return out


# ---- generation and index ----------------------------------------------------------------------

def test_generate_repo_is_deterministic_and_parses():
    repo = generate_repo(5, 3, 5)
    assert repo == generate_repo(5, 3, 5)
    assert repo != generate_repo(6, 3, 5)
    assert len(repo) == 3
    for source in repo.values():
        tree = ast.parse(source)
        defs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        assert len(defs) == 5 and 1 <= len(classes) <= 2
        assert all(ast.get_docstring(n) for n in [tree, *defs, *classes])
        assert all(re.fullmatch(r"[a-z]+(_[a-z]+)+", d.name) for d in defs)  # verb_noun


@pytest.mark.parametrize("kwargs", [dict(n_modules=0), dict(n_modules=9),
                                    dict(entities_per_module=1)])
def test_generate_repo_rejects_bad_sizes(kwargs):
    with pytest.raises(ValueError):
        generate_repo(0, **kwargs)
    with pytest.raises(ValueError):
        RepoSearchTask(**kwargs)


def test_docstrings_are_near_duplicates():
    """Retrieval is non-trivial: docstrings share words; every docstring is still unique."""
    idx = repo_index(11)
    docs = [e.docstring for e in idx.entries if e.kind != "class"]
    assert len(set(docs)) == len(docs) == 24
    words = [w for d in docs for w in tokenize(d)]
    assert max(words.count(w) for w in set(words)) >= 4


def test_hand_repo_index_names_and_spans():
    idx = RepoIndex(HAND_REPO)  # would exit / fail on import if the code were run
    got = {e.qualname: (e.kind, e.path, e.start, e.end, e.docstring) for e in idx.entries}
    assert got == {
        "geo.scale": ("function", "geo.py", 5, 7, "Grows the box."),
        "geo.scale_all": ("function", "geo.py", 9, 11, "Grows every box."),
        "geo.Box": ("class", "geo.py", 13, 19, "A box."),
        "geo.Box.area": ("method", "geo.py", 16, 19, "Area of the box."),
        "geo.Ring": ("class", "geo.py", 21, 25, "A ring."),
        "geo.Ring.area": ("method", "geo.py", 23, 25, "Scale the ring area."),
    }
    assert idx.by_name["geo.Box.area"].source.splitlines()[0] == "    def area(self):"


def test_generated_index_lines_match_a_text_scan():
    repo = generate_repo(3)
    idx = RepoIndex(repo)
    for path, source in repo.items():
        stem, lines = path.removesuffix(".py"), source.splitlines()
        scanned = {f"{stem}.{k}": v for k, v in _defs_by_scanning(source).items()}
        indexed = {e.qualname: e for e in idx.entries if e.path == path}
        assert {q: e.start for q, e in indexed.items()} == scanned
        for e in indexed.values():
            assert lines[e.start - 1].strip().startswith(("def ", "class "))
            assert f'"""{e.docstring}"""' in lines[e.start]  # the next line
            assert e.end == len(lines) or lines[e.end].strip() == ""  # ends before a gap
            assert e.source == "\n".join(lines[e.start - 1:e.end])


def test_tokenize_splits_names_drops_stopwords_and_stems():
    assert tokenize("Merges the stale_spans.lazily INTO entries") == [
        "merge", "stale", "span", "lazily", "entry"]
    assert tokenize(".*([|\\") == []


# ---- search ------------------------------------------------------------------------------------

def test_search_order_exact_id_then_substring_then_bm25():
    idx = RepoIndex(HAND_REPO)
    hits = idx.search("scale", k=5)
    assert [(h.entry.qualname, h.stage) for h in hits] == [
        ("geo.scale", "id"), ("geo.scale_all", "substring"), ("geo.Ring.area", "bm25")]
    assert hits[2].score > 0
    assert [h.entry.qualname for h in idx.search("scale", k=2)] == ["geo.scale", "geo.scale_all"]
    # a full qualified name is an id; an ambiguous bare name is not (both are substrings)
    assert [(h.entry.qualname, h.stage) for h in idx.search("geo.Box.area", k=1)] == [
        ("geo.Box.area", "id")]
    assert [h.stage for h in idx.search("area", k=2)] == ["substring", "substring"]
    assert idx.search("unrelated words", k=3) == []


def test_bm25_needs_the_distinguishing_words():
    """The expert's query ranks the target first in every problem; the verb and noun alone
    (what a function name says) often do not."""
    task = RepoSearchTask(seed=1)
    exs = task.examples("train", 0, 40) + task.examples("test", 0, 10)
    short_ok = 0
    for ex in exs:
        idx = repo_index(*task.tool_context(ex))
        hits = idx.search(ex.meta.query, k=3)
        assert hits[0].entry.qualname == ex.meta.qualname and hits[0].stage == "bm25"
        assert len(hits) < 2 or hits[0].score > hits[1].score
        words = ex.meta.query.split()
        short_ok += idx.search(f"{words[0]} {words[2]}", k=1)[0].entry.qualname == ex.meta.qualname
    assert short_ok < 0.8 * len(exs)


# ---- the tool ----------------------------------------------------------------------------------

def test_tool_output_format():
    assert TOOLS.get("code_search") is code_search
    ctx = (4, 4, 6)
    idx = repo_index(*ctx)
    target = next(e for e in idx.entries if e.kind == "method")
    out = code_search({"query": target.qualname, "k": 1}, ctx)
    line = out.splitlines()[0]
    path, start = line.split()[0].split(":")[0], int(line.split(":")[1].split("-")[0])
    assert (path, start) == (target.path, target.start)
    assert generate_repo(*ctx)[path].splitlines()[start - 1].lstrip().startswith("def ")
    assert line.startswith(f"{target.path}:{target.start}-{target.end} {target.qualname}: ")
    assert out.count("\n") == 0
    noun = target.qualname.rsplit("_", 1)[-1]
    for query, k in [(target.docstring, 3), (noun, 5), (target.qualname, 2)]:
        out = code_search({"query": query, "k": k}, ctx)
        lines = out.splitlines()
        assert len(lines) == k  # each query matches at least k entries
        for line in lines:
            m = re.fullmatch(r"([a-z]+\.py):(\d+)-(\d+) ([A-Za-z_.]+): (.*)", line)
            assert m and int(m[2]) < int(m[3]) and len(m[5]) <= DOC_CHARS
        assert len(out) <= 100 * k
    assert code_search({"query": "zzz qqq"}, ctx) == "no match"
    assert len(code_search({"query": target.docstring}, ctx).splitlines()) == 3  # default k


@pytest.mark.parametrize("args", [
    {"query": "x " * 5_000},
    {"query": 5}, {"query": None}, {"query": ["merge"]}, {}, {"query": "   "},
    {"query": "rows", "k": 0}, {"query": "rows", "k": 6}, {"query": "rows", "k": True},
    {"query": "rows", "k": "3"}, {"query": "rows", "k": 2.0}, {"query": "rows", "extra": 1},
])
def test_tool_rejects_bad_arguments(args):
    with pytest.raises(ToolError):
        code_search(args, (0, 4, 6))
    out = run_tool("code_search", args, (0, 4, 6))
    assert not out.ok and out.text.startswith("error:") and len(out.text) < 100


@pytest.mark.parametrize("query", [".*([", "merge_(spans)|.*", "\\d+$^", "\x00\x01", "ünï 🙂",
                                   '"}</tool>', "a", "io"])
def test_tool_survives_special_characters(query):
    out = run_tool("code_search", {"query": query}, (0, 4, 6))
    assert out.ok and out.text
    assert out.text == "no match" or all(re.match(r"[a-z]+\.py:\d+-\d+ ", x)
                                          for x in out.text.splitlines())


@pytest.mark.parametrize("context", [None, (1, 2), ("0", 4, 6), (0, 99, 6)])
def test_tool_without_a_valid_repo_is_an_error_observation(context):
    out = run_tool("code_search", {"query": "rows"}, context)
    assert not out.ok and out.text.startswith("error:")


def test_index_is_cached_per_process():
    assert repo_index(2, 4, 6) is repo_index(2, 4, 6)
    assert repo_index(2, 4, 6) is not repo_index(3, 4, 6)


# ---- the task ----------------------------------------------------------------------------------

def test_task_examples():
    task = make_task("repo_search", seed=2)
    assert TASKS.get("repo_search") is RepoSearchTask and task.tools == ("code_search",)
    exs = task.examples("train", 0, 30)
    assert exs == RepoSearchTask(seed=2).examples("train", 0, 30)  # deterministic
    test = task.examples("test", 0, 10)
    assert not {e.prompt for e in exs} & {e.prompt for e in test}
    assert len({e.meta.repo_seed for e in exs}) == 30  # a repository per problem
    for ex in exs + test:
        hash(ex.meta)
        ctx = task.tool_context(ex)
        assert ctx == (ex.meta.repo_seed, 4, 6) and pickle.loads(pickle.dumps(ctx)) == ctx
        assert len(ex.prompt) < 100 and ex.prompt.endswith("? Answer path:line.")
        name = ex.meta.qualname.rsplit(".", 1)[-1]
        assert name not in ex.prompt  # described by its docstring, not by its name
        path, line = ex.answer.split(":")
        source_lines = generate_repo(*ctx)[path].splitlines()
        assert re.match(rf"\s*def {name}\(", source_lines[int(line) - 1])
        doc = source_lines[int(line)].strip().strip('"').rstrip(".")
        assert doc[:1].lower() + doc[1:] in ex.prompt
        assert task.score(task.solution(ex), ex) == 1.0


@pytest.mark.parametrize("completion, want", [
    ("<answer>stats.py:30</answer>", 1.0),
    ("thinking... <answer> stats.py:30 </answer> trailing", 1.0),
    ("<answer>stats.py:31</answer>", 0.0),
    ("<answer>stats.py:30-33</answer>", 0.0),
    ("<answer>io.py:30</answer>", 0.0),
    ("<answer>stats.py:30", 0.0),
    ("stats.py:30", 0.0),
    ("", 0.0),
    (None, 0.0),
    ("<answer></answer><answer>stats.py:30</answer>", 0.0),
])
def test_score(completion, want):
    task = RepoSearchTask()
    ex = task.example("train", 0)
    ex = type(ex)(prompt=ex.prompt, answer="stats.py:30", meta=ex.meta)
    assert task.score(completion, ex) == want


def test_expert_turns_match_the_real_tool():
    task = RepoSearchTask(seed=3)
    for ex in task.examples("train", 0, 20) + task.examples("test", 0, 5):
        call, final = task.expert_turns(ex)
        assert final == task.solution(ex) == f"<answer>{ex.answer}</answer>"
        assert task.expert_turns(ex, tools=False) == [final]
        turn = parse_turn(call)
        assert turn.kind == "tool" and turn.name == "code_search"
        assert call == format_call("code_search", query=ex.meta.query)
        assert set(turn.args["query"].split()) <= set(re.findall(r"[a-z]+", ex.prompt))
        out = run_tool(turn.name, turn.args, task.tool_context(ex))
        assert out.ok and out.text.startswith(ex.answer + "-")
        assert parse_turn(final).kind == "answer" and task.score(final, ex) == 1.0

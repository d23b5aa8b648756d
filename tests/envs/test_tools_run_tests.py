"""The run_tests tool (a body of f against hidden tests, in the sandbox) and the fix_tests task.

The generated programs are also checked in-process against their hidden tests, as test_code.py
does (our own generated code, so `exec` of it here is fine); model-like input only ever runs
in the sandbox. The sandbox tests skip where the sandbox cannot be set up.
"""

import os
import pickle
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from jaxrl_suite.envs.text.base import TASKS, extract_answer, make_task
from jaxrl_suite.envs.text.code import live_neighbours, render
from jaxrl_suite.envs.text.tools.base import TOOLS, ToolError, parse_turn, run_tool
from jaxrl_suite.envs.text.tools.run_tests import (
    MAX_CODE_CHARS,
    FixMeta,
    FixTestsTask,
    RunTestsContext,
    function_source,
    observation,
    run_tests,
)
from jaxrl_suite.rewards.sandbox import SandboxResult

CTX = RunTestsContext("def f(x):", "assert f(2) == 7\nassert f(5) == 16\nassert f(10) == 31\n",
                      timeout_s=0.5)
GOOD = "def f(x):\n    return x * 3 + 1\n"


@pytest.fixture(scope="module")
def sandbox():
    """The process-wide sandbox pool the tool and the task use; skips where it cannot work."""
    if not os.path.exists("/proc/self/ns/mnt"):
        pytest.skip("the sandbox needs Linux namespaces and /proc")
    from jaxrl_suite.rewards import sandbox as sandbox_lib

    try:
        return sandbox_lib.default_pool()
    except RuntimeError as e:
        pytest.skip(f"no sandbox here: {e}")


def _concurrently(fn, items):
    with ThreadPoolExecutor(len(items)) as ex:
        return list(ex.map(fn, items))


# ----------------------------------------------------------------------------- the tool


@pytest.mark.parametrize("code", [
    "return x * 3 + 1",
    "    return x * 3 + 1\n",
    "\n\n        return x * 3 + 1\n\n",
    "return x * 3 + 1\r\n",
])
def test_function_source_indents_the_body(code):
    assert function_source("def f(x):", code) == GOOD


def test_function_source_multiline():
    want = "def f(xs):\n    s = 0\n    for x in xs:\n        s += x\n    return s\n"
    body = "s = 0\nfor x in xs:\n    s += x\nreturn s"
    assert function_source("def f(xs):", body) == want
    assert function_source("def f(xs):", "    " + body.replace("\n", "\n    ")) == want
    # a body whose first line lost its indentation (what extract_answer leaves)
    assert function_source("def f(xs):", "s = 0\n    for x in xs:\n        s += x\n"
                                         "    return s\n") == want
    # nested code right after an unindented first line is kept as it is
    assert function_source("def f(xs):", "for x in xs:\n    return x") == (
        "def f(xs):\n    for x in xs:\n        return x\n")


def test_observation_formats():
    assert observation(SandboxResult(6, 6, "ok")) == "passed 6/6"
    failed = SandboxResult(4, 6, "failed", failure="f([1, 2]) should be [2, -4], got [3, 6]")
    assert observation(failed) == "passed 4/6; f([1,2]) should be [2,-4], got [3,6]"
    assert observation(SandboxResult(0, 6, "timeout")) == "timeout (passed 0/6)"
    assert observation(SandboxResult(0, 6, "forbidden")) == "forbidden (passed 0/6)"
    long = observation(SandboxResult(0, 6, "failed", failure="f(1) should be " + "9" * 200))
    assert len(long) == 100 and long.endswith("...")


@pytest.mark.parametrize("args", [{}, {"code": 5}, {"code": None}, {"code": ["return 1"]},
                                  {"body": "return 1"}])
def test_bad_args(args):
    with pytest.raises(ToolError, match='need "code"'):
        run_tests(args, CTX)
    out = run_tool("run_tests", args, CTX)
    assert not out.ok and out.text.startswith('error: args need "code"')


def test_too_long_code_and_no_context():
    out = run_tool("run_tests", {"code": "x = 1\n" * 500}, CTX)
    assert (out.ok, out.text) == (False, f"error: code longer than {MAX_CODE_CHARS} characters")
    out = run_tool("run_tests", {"code": "return 1"}, None)
    assert (out.ok, out.text) == (False, "error: this problem has no tests to run")


@pytest.mark.parametrize("code", ["return (", "return x +", "x = 1\n  y = 2\n z = 3", "\x00",
                                  "return 1\ndef", "return '\ud800' + 1)"])
def test_syntax_error_is_an_observation(code):
    """Invalid Python is answered without a sandbox call."""
    assert run_tool("run_tests", {"code": code}, CTX) == ("syntax error", True)


def test_context_is_picklable():
    assert pickle.loads(pickle.dumps(CTX)) == CTX
    assert TOOLS.get("run_tests") is run_tests


def test_tool_in_the_sandbox(sandbox, tmp_path):
    target = tmp_path / f"pwned-{uuid.uuid4().hex}"
    lists = RunTestsContext("def f(xs):", "assert f([1, 2]) == [2, 4]\n")
    calls = {
        "good": ({"code": "return x * 3 + 1"}, CTX),
        "indented": ({"code": "    return x * 3 + 1\n"}, CTX),
        "second fails": ({"code": "return x * 3 + 1 if x < 5 else x * 3"}, CTX),
        "raises": ({"code": "raise ValueError('no')"}, CTX),
        "loop": ({"code": "while True:\n    pass"}, CTX),
        "writes": ({"code": f"open({str(target)!r}, 'w').write('x')\nreturn x * 3 + 1"}, CTX),
        "lists": ({"code": "return [x * 3 for x in xs]"}, lists),
    }
    outs = dict(zip(calls, _concurrently(lambda c: run_tool("run_tests", *c), calls.values()),
                    strict=True))
    assert all(out.ok for out in outs.values()), outs
    text = {k: out.text for k, out in outs.items()}
    assert text["good"] == text["indented"] == "passed 3/3"
    assert text["second fails"] == "passed 1/3; f(5) should be 16, got 15"
    assert text["raises"] == "passed 0/3; f(2) should be 7, raised ValueError"
    assert text["loop"] == "timeout (passed 0/3)"
    assert text["writes"] == "forbidden (passed 0/3)"
    assert not target.exists()  # the code ran in the sandbox, not here
    assert text["lists"] == "passed 0/1; f([1,2]) should be [2,4], got [3,6]"


# ----------------------------------------------------------------------------- the task


def _in_process_passes(header, body, tests):
    """How many hidden tests def line + body passes, run here (our own generated code)."""
    namespace = {}
    exec(f"{header}\n{body}", namespace)  # trusted: a program of the grammar
    passed = 0
    for line in tests.splitlines():
        try:
            exec(line, namespace)
            passed += 1
        except AssertionError:
            pass
    return passed


def _flat(consts):
    return [c for slot in consts for c in slot]


@pytest.mark.parametrize("level", [1, 2, 3])
def test_examples(level):
    task = FixTestsTask(level=level)
    for ex in task.examples("train", 0, 40):
        meta = ex.meta
        assert isinstance(meta, FixMeta) and hash(ex)
        assert meta.header == ("def f(x):" if level == 1 else "def f(xs):")
        buggy = render(meta.buggy)[0]
        assert ex.prompt == f"Fix f so its tests pass:\n{meta.header}\n{buggy}"
        assert '"""' not in ex.prompt and len(ex.prompt) < 130
        assert ex.answer == render(meta.program)[0] != buggy
        assert meta.buggy in live_neighbours(meta.program)
        diff = [b - a for a, b in zip(_flat(meta.program.consts), _flat(meta.buggy.consts),
                                      strict=True) if a != b]
        assert diff in ([1], [-1])  # one constant off by one
        n = len(meta.tests.splitlines())
        assert n == 6
        assert _in_process_passes(meta.header, ex.answer, meta.tests) == n
        assert _in_process_passes(meta.header, buggy, meta.tests) < n  # the tests catch it


def test_registry_split_and_context():
    assert TASKS.get("fix_tests") is FixTestsTask
    task = make_task("fix_tests", level=2, seed=3, timeout_s=1.5, memory_mb=128)
    assert task.tools == ("run_tests",)
    assert task.examples("train", 0, 10) == FixTestsTask(level=2, seed=3).examples("train", 0, 10)
    train = {ex.answer for ex in task.examples("train", 0, 100)}
    test = {ex.answer for ex in task.examples("test", 0, 15)}
    assert not train & test  # the split is by the correct program
    ex = task.example("train", 0)
    assert task._problem_key(ex) == ex.answer
    ctx = task.tool_context(ex)
    assert ctx == RunTestsContext(ex.meta.header, ex.meta.tests, 1.5, 128)
    assert pickle.loads(pickle.dumps(ctx)) == ctx
    for bad, match in (({"level": 4}, "level must be"), ({"timeout_s": 0}, "timeout_s"),
                       ({"memory_mb": 1}, "memory_mb")):
        with pytest.raises(ValueError, match=match):
            FixTestsTask(**bad)


def test_expert_turns_text():
    task = FixTestsTask(level=3)
    ex = task.example("train", 1)
    first, second, answer = task.expert_turns(ex)
    turns = [parse_turn(first), parse_turn(second)]
    assert [(t.kind, t.name) for t in turns] == [("tool", "run_tests")] * 2
    assert function_source(ex.meta.header, turns[0].args["code"]) == (
        f"{ex.meta.header}\n{render(ex.meta.buggy)[0]}")
    assert function_source(ex.meta.header, turns[1].args["code"]) == (
        f"{ex.meta.header}\n{ex.answer}")
    assert answer == task.solution(ex) == f"<answer>{turns[1].args['code']}</answer>"
    assert function_source(ex.meta.header, extract_answer(answer)) == (
        f"{ex.meta.header}\n{ex.answer}")  # the dedented body is the same function
    assert task.expert_turns(ex, tools=False) == [task.solution(ex)]


def test_expert_episode_and_verify_batch(sandbox):
    task = FixTestsTask(level=1)
    exs = [FixTestsTask(level=level).example("train", 2) for level in (1, 2, 3)]
    calls = [(parse_turn(turn), task.tool_context(ex))
             for ex in exs for turn in task.expert_turns(ex)[:2]]
    outs = _concurrently(lambda c: run_tool(c[0].name, c[0].args, c[1]), calls)
    for ex, (buggy, fixed) in zip(exs, zip(outs[::2], outs[1::2], strict=True), strict=True):
        k = _in_process_passes(ex.meta.header, render(ex.meta.buggy)[0], ex.meta.tests)
        assert buggy.ok and buggy.text.startswith(f"passed {k}/6; f(")
        assert " should be " in buggy.text and ", got " in buggy.text
        assert len(buggy.text) <= 100
        assert fixed == ("passed 6/6", True)

    ex = exs[2]
    buggy = render(ex.meta.buggy)[0]
    k = _in_process_passes(ex.meta.header, buggy, ex.meta.tests)
    completions = [
        task.solution(ex),
        f"<answer>{buggy}</answer>",
        "I give up",
        "<answer>return (</answer>",
        "<answer>import os\nos.system('true')\nreturn 1</answer>",
        "<answer>\n" + ex.answer.replace("    ", "", 1) + "</answer>",
    ]
    verdicts = task.verify_batch(completions, [ex] * len(completions))
    assert verdicts.scores == [1.0, k / 6, 0.0, 0.0, 0.0, 1.0]
    assert verdicts.outcomes == ["ok", "failed", "no_answer", "syntax", "forbidden", "ok"]
    assert task.score(task.solution(ex), ex) == 1.0
    assert task.score(f"<answer>{buggy}</answer>", ex) == k / 6
    with pytest.raises(ValueError, match="2 completions for 1 examples"):
        task.verify_batch(["a", "b"], [ex])

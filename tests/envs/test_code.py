"""CodeTask (generated function-writing problems with hidden tests) and MBPPTask (JSONL).

The generated programs are checked in-process against the grammar's trusted evaluator (our own
code, so `exec` of it here is fine); the sandbox tests skip until `rewards.sandbox` exists.
"""

import ast
import itertools
import json

import numpy as np
import pytest

from jaxrl_suite.envs.text import TASKS, CodeTask, MBPPTask
from jaxrl_suite.envs.text import code as code_lib
from jaxrl_suite.envs.text.base import stable_hash
from jaxrl_suite.envs.text.code import live_neighbours, mbpp_prompt, render, run_program

LEVELS = (1, 2, 3)
N_DRAWS = 200


def _draws(level, n=N_DRAWS, split="train", **kwargs):
    return CodeTask(level=level, **kwargs).examples(split, 0, n)


def _parse_tests(tests):
    """[(input, output)] of `assert f(<literal>) == <literal>` lines; fails on any other form."""
    pairs = []
    for line in tests.splitlines():
        node = ast.parse(line).body[0]
        assert isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare)
        call, (op,), (right,) = node.test.left, node.test.ops, node.test.comparators
        assert isinstance(op, ast.Eq) and call.func.id == "f" and len(call.args) == 1
        pairs.append((ast.literal_eval(call.args[0]), ast.literal_eval(right)))
    return pairs


def _passes_in_process(prompt, body, tests):
    """Whether prompt + body passes every hidden test, run here (trusted, generated code)."""
    namespace = {}
    exec(prompt + body, namespace)  # our own generated code
    try:
        exec(tests, namespace)
    except AssertionError:
        return False
    return True


def _mbpp_lines(texts):
    problems = {
        "add": ("def add(a, b):\r\n    return a + b", ["assert add(1, 2) == 3",
                                                      "assert add(-1, 1) == 0"]),
        "square": ("def square(n):\n    return n * n\n", ["assert square(3) == 9",
                                                          "assert square(0) == 0"]),
        "rev": ("def rev(s):\n    return s[::-1]", ["assert rev('ab') == 'ba'",
                                                    "assert rev('') == ''"]),
        "fact": ("import math\ndef fact(n):\n    return math.factorial(n)",
                 ["assert fact(3) == 6", "assert fact(4) == 24"]),
    }
    lines = []
    for (name, (code, tests)), text in zip(problems.items(), texts, strict=True):
        rec = {"prompt": text.format(name=name), "code": code, "test_list": tests}
        if name == "fact":
            rec["test_imports"] = ["import math"]
        lines.append(json.dumps(rec))
    return lines


def _texts_in_both_splits():
    """Problem texts of which the first lands in "test" and the others in "train"."""
    first_tests = ["assert add(1, 2) == 3", "assert square(3) == 9", "assert rev('ab') == 'ba'",
                   "assert fact(3) == 6"]
    texts = []
    for i, test in enumerate(first_tests):
        for k in itertools.count():
            text = f"Write a function {{name}} (variant {k})."
            name = test.split("(")[0].removeprefix("assert ")
            is_test = stable_hash(mbpp_prompt(text.format(name=name), test)) % 10 == 0
            if is_test == (i == 0):
                texts.append(text)
                break
    return texts


@pytest.fixture
def mbpp_file(tmp_path):
    path = tmp_path / "mbpp.jsonl"
    path.write_text("\n".join(_mbpp_lines(_texts_in_both_splits())) + "\n\n")
    return path


# ----------------------------------------------------------------------------- generation


def test_registered_and_deterministic():
    assert TASKS.get("code") is CodeTask and TASKS.get("mbpp_jsonl") is MBPPTask
    for level in LEVELS:
        a = CodeTask(level=level, seed=1).examples("train", 0, 20)
        assert a == CodeTask(level=level, seed=1).examples("train", 0, 20)
        assert a != CodeTask(level=level, seed=2).examples("train", 0, 20)
        assert all(ex.answer == CodeTask(level=level).solution(ex) for ex in a)


@pytest.mark.parametrize("level", LEVELS)
def test_splits_disjoint_by_program(level):
    train = {ex.meta.program for ex in _draws(level, 400)}
    test = {ex.meta.program for ex in _draws(level, 100, split="test")}
    assert len(test) > 20 and not train & test
    # the key is the program: the same body never crosses splits, whatever its examples
    task = CodeTask(level=level)
    assert all(task._problem_key(ex) == render(ex.meta.program)[0]
               for ex in _draws(level, 20, split="test"))


@pytest.mark.parametrize("level", LEVELS)
def test_canonical_solution_passes_hidden_tests(level):
    task = CodeTask(level=level)
    for ex in _draws(level):
        pairs = _parse_tests(ex.meta.tests)
        inputs = [a for a, _ in pairs]
        assert len(pairs) == task.n_hidden and len(set(map(repr, inputs))) == len(inputs)
        assert all(run_program(ex.meta.program, a) == o for a, o in pairs)
        assert len({repr(o) for _, o in pairs}) > 1  # outputs vary
        for a, o in pairs[: task.n_shown]:  # the shown examples are the first hidden tests
            assert f"f({a!r}) == {o!r}" in ex.prompt
        assert _passes_in_process(ex.prompt, task.solution(ex), ex.meta.tests)


@pytest.mark.parametrize("level, n_lines", [(1, 1), (2, 2), (3, 4)])
def test_prompt_and_completion_shape_and_length(level, n_lines):
    examples = _draws(level, 300)
    assert max(len(ex.prompt.encode()) for ex in examples) <= 170
    assert max(len(ex.answer.encode()) for ex in examples) <= 100
    header = "def f(x):\n" if level == 1 else "def f(xs):\n"
    for ex in examples:
        assert ex.prompt.startswith(header + '    """') and ex.prompt.endswith('"""\n')
        lines = ex.answer.splitlines(keepends=True)
        assert len(lines) == n_lines
        assert all(line.startswith("    ") and line.endswith("\n") for line in lines)
        ast.parse(ex.prompt + ex.answer)


@pytest.mark.parametrize("level", LEVELS)
def test_wording_is_a_function_of_the_program(level):
    examples = _draws(level, 300) + CodeTask(level=level, seed=5).examples("train", 0, 300)
    sentence = {}
    for ex in examples:
        words = ex.prompt.split('"""')[1].split(" f(")[0]
        assert sentence.setdefault(ex.meta.program, words) == words
    assert len(set(sentence.values())) == len(sentence)  # and it names the program


@pytest.mark.parametrize("level", LEVELS)
def test_wrong_constant_fails_a_hidden_test(level):
    checked = 0
    for ex in _draws(level):
        pairs = _parse_tests(ex.meta.tests)
        for wrong in live_neighbours(ex.meta.program):
            assert any(run_program(wrong, a) != o for a, o in pairs), (ex.answer, wrong)
            checked += 1
        wrong_body = render(live_neighbours(ex.meta.program)[0])[0]
        assert not _passes_in_process(ex.prompt, wrong_body, ex.meta.tests)
    assert checked >= 2 * N_DRAWS


@pytest.mark.parametrize("level", LEVELS)
def test_other_programs_fail_the_hidden_tests(level):
    examples = _draws(level)
    rng = np.random.default_rng(0)
    pairs = tested = 0
    for i, j in rng.integers(0, len(examples), (400, 2)):
        a, b = examples[i].meta.program, examples[j].meta.program
        probe = code_lib._PROBES[code_lib._FAMILIES[a.family].arg]
        if a == b or all(run_program(a, x) == run_program(b, x) for x in probe):
            continue  # the same function
        pairs += 1
        tested += any(run_program(b, x) != o for x, o in _parse_tests(examples[i].meta.tests))
    assert pairs > 300 and tested == pairs


def test_bad_options_raise():
    with pytest.raises(ValueError, match="level must be 1, 2 or 3, got level=4"):
        CodeTask(level=4)
    with pytest.raises(ValueError, match="n_hidden must be in"):
        CodeTask(n_shown=3, n_hidden=3)
    with pytest.raises(ValueError, match="n_shown must be >= 0"):
        CodeTask(n_shown=-1)
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        CodeTask(timeout_s=0)


@pytest.mark.parametrize("completion", [
    "    return x +\n",  # syntax error
    "return x\n",  # not indented: the docstring-only body ends, then a top-level return
    "\x00\xff\ud800 garbage \x7f",  # garbage bytes (and an unencodable surrogate)
    "    " + "(" * 500 + "\n",  # too deeply nested
], ids=range(4))
def test_malformed_completions_score_zero_without_the_sandbox(monkeypatch, completion):
    def no_sandbox():
        raise AssertionError("the sandbox must not be called")

    monkeypatch.setattr(code_lib, "_sandbox", no_sandbox)
    task = CodeTask(level=1)
    ex = task.example("train", 0)
    assert task.score(completion, ex) == 0.0
    assert task.score_batch([completion], [ex]) == [0.0]
    assert task.feedback(completion, ex) == "syntax error"


# ----------------------------------------------------------------------------- sandbox


def test_score_batch_in_the_sandbox():
    pytest.importorskip("jaxrl_suite.rewards.sandbox")
    completions, examples, expected = [], [], []
    for level in LEVELS:
        task = CodeTask(level=level)
        for ex in task.examples("train", 0, 2):
            wrong = render(live_neighbours(ex.meta.program)[0])[0]
            for completion, want in [(task.solution(ex), 1.0), (wrong, "<1"), ("", 0.0),
                                     ("\x00\xff garbage", 0.0), ("    return (\n", 0.0)]:
                completions.append(completion)
                examples.append(ex)
                expected.append(want)
    scores = CodeTask().score_batch(completions, examples)
    for score, want, completion in zip(scores, expected, completions, strict=True):
        if want == "<1":
            assert 0.0 <= score < 1.0, completion
        else:
            assert score == want, completion


def test_score_results_and_feedback_in_the_sandbox():
    pytest.importorskip("jaxrl_suite.rewards.sandbox")
    task = CodeTask(level=3, timeout_s=1.0)
    ex = task.example("train", 0)
    assert task.score(task.solution(ex), ex) == 1.0
    assert task.feedback(task.solution(ex), ex) == "6 of 6 tests pass"
    good, loop = task.results_batch([task.solution(ex), "    while True:\n        pass\n"],
                                    [ex, ex])
    assert (good.passed, good.total, good.status, good.reward) == (6, 6, "ok", 1.0)
    assert loop.status not in ("ok", "failed") and loop.reward == 0.0


def test_mbpp_in_the_sandbox(mbpp_file):
    pytest.importorskip("jaxrl_suite.rewards.sandbox")
    task = MBPPTask(path=str(mbpp_file))
    examples = task.examples("train", 0, 3)
    wrong = "def square(n):\n    return n + n\n"  # passes square(0) == 0 only
    scores = task.score_batch([task.solution(ex) for ex in examples] + [wrong],
                              examples + [next(ex for ex in examples if "square" in ex.prompt)])
    assert scores[:3] == [1.0, 1.0, 1.0] and scores[3] == 0.5


# ----------------------------------------------------------------------------- MBPP JSONL


def test_mbpp_examples_splits_and_prompt(mbpp_file):
    task = TASKS.get("mbpp_jsonl")(path=str(mbpp_file), seed=3)
    assert (task.size("train"), task.size("test")) == (3, 1)
    (test_ex,) = task.examples("test", 0, 1)
    assert test_ex.prompt.startswith("# Write a function add (variant ")
    assert test_ex.prompt.endswith(").\n# Example: assert add(1, 2) == 3\n")
    assert test_ex.answer == task.solution(test_ex) == "def add(a, b):\n    return a + b\n"
    assert test_ex.meta.tests == "assert add(1, 2) == 3\nassert add(-1, 1) == 0\n"
    train = task.examples("train", 0, 6)
    assert train[3:] == train[:3] and len({ex.prompt for ex in train}) == 3  # cyclic
    assert all(stable_hash(ex.prompt) % 10 != 0 for ex in train)
    fact = next(ex for ex in train if "fact" in ex.prompt)
    assert fact.prompt.endswith("# Example: assert fact(3) == 6\nimport math\n")
    for ex in train:  # the reference code passes its tests, run here (our own fixture)
        assert _passes_in_process(ex.prompt, ex.answer, ex.meta.tests)


def test_mbpp_errors(tmp_path, mbpp_file):
    with pytest.raises(ValueError, match="pass path="):
        MBPPTask()
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match=f"'{missing}' does not exist"):
        MBPPTask(path=str(missing)).example("train", 0)
    lines = mbpp_file.read_text().splitlines()
    for field in ("prompt", "code", "test_list"):
        rec = json.loads(lines[1])
        del rec[field]
        bad = tmp_path / f"no_{field}.jsonl"
        bad.write_text("\n".join([lines[0], json.dumps(rec), lines[2]]))
        with pytest.raises(ValueError, match=f"^{bad}:2: missing field '{field}'"):
            MBPPTask(path=str(bad)).example("train", 0)
    bad = tmp_path / "bad_tests.jsonl"
    for tests, match in [([], "field 'test_list' must be a non-empty list"),
                         (["assert f(1) == 1", "print(1)"], "field 'test_list' item 1 is not")]:
        bad.write_text(json.dumps({"prompt": "p", "code": "c", "test_list": tests}))
        with pytest.raises(ValueError, match=f"^{bad}:1: {match}"):
            MBPPTask(path=str(bad)).example("train", 0)
    only_train = tmp_path / "one.jsonl"
    only_train.write_text(lines[1] + "\n")
    with pytest.raises(ValueError, match="split 'test' is empty"):
        MBPPTask(path=str(only_train)).example("test", 0)

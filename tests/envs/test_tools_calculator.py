"""The calculator tool (safe arithmetic, checked against Python's own arithmetic and hostile
input) and the tool_arithmetic task."""

import builtins
import re

import numpy as np
import pytest

from jaxrl_suite.envs.text.base import TASKS, Example, make_task
from jaxrl_suite.envs.text.tools.base import (
    TOOLS,
    ToolError,
    ToolOutput,
    parse_turn,
    run_tool,
)
from jaxrl_suite.envs.text.tools.calculator import (
    MAX_EXPR_CHARS,
    ToolArithmeticTask,
    calculator,
    evaluate,
    format_number,
)


def calc(expr):
    return calculator({"expr": expr}, None)


# The reference values are Python's arithmetic on the same numbers, written out in the test.
EXACT = [
    ("4821*5719-3021", 4821 * 5719 - 3021),
    ("3021-4821*5719", 3021 - 4821 * 5719),
    ("(12+7)*(3-10)", (12 + 7) * (3 - 10)),
    (" 1 + 2 ", 3),
    ("7//2", 7 // 2),
    ("-7//2", -7 // 2),
    ("7%3", 7 % 3),
    ("-7%3", -7 % 3),
    ("2**64", 2**64),
    ("(-3)**3", (-3) ** 3),
    ("-3**2", -(3**2)),
    ("+5", 5),
    ("--5", 5),
    ("1_000*3", 3000),
    ("10**20/10", 10**19),  # exact: an int division that divides stays an int
    ("123456789012345*987654321", 123456789012345 * 987654321),
    ("10**30", 10**30),
    ("-10**30", -(10**30)),
    ("(" * 90 + "1" + ")" * 90, 1),
    ("-" * 199 + "1", -1),
]


@pytest.mark.parametrize("expr,value", EXACT)
def test_exact_integer_arithmetic(expr, value):
    assert evaluate(expr) == value and type(evaluate(expr)) is int
    assert calc(expr) == str(value)


def test_random_products_match_python():
    rng = np.random.default_rng(0)
    for _ in range(300):
        a, b, c = (int(v) for v in rng.integers(-(10**9), 10**9, 3))
        assert calc(f"{a}*{b}+{c}") == str(a * b + c)
        assert calc(f"({a})*({b})-({c})") == str(a * b - c)
        if b:
            assert calc(f"{a}//{b}") == str(a // b) and calc(f"{a}%{b}") == str(a % b)


@pytest.mark.parametrize("expr,text", [
    ("6/3", "2"),  # an integral float prints as an int
    ("7/2", "3.5"),
    ("1/3", "0.333333"),
    ("-2/3", "-0.666667"),
    ("2**0.5", "1.414214"),
    ("2**-3", "0.125"),
    ("7.5//2", "3"),
    ("-0.0", "0"),
    ("1e-7", "1e-07"),  # rounds to 0 at 6 decimals: 6 significant digits instead
    ("1/3000000", "3.33333e-07"),
    ("0.1+0.2", "0.3"),
    ("1e25", "1e+25"),  # integral but past 2**53: not printed as a misleading int
])
def test_float_output(expr, text):
    assert calc(expr) == text


def test_format_number():
    assert format_number(42) == "42" and format_number(42.0) == "42"
    assert format_number(-1.0000000001) == "-1" and format_number(2.5) == "2.5"


HOSTILE = {
    "__import__('os')": "function calls not allowed",
    "__import__('os').system('true')": "not allowed",
    "().__class__": "attributes not allowed",
    "(1).real": "attributes not allowed",
    "a+1": "names not allowed",
    "x": "names not allowed",
    "(1,2)": "tuples not allowed",
    "[1][0]": "subscripts not allowed",
    "1<2": "comparisons not allowed",
    "1 and 2": "and/or not allowed",
    "lambda: 1": "lambdas not allowed",
    "'a'*3": "strings not allowed",
    "b'a'": "strings not allowed",
    "f'{1}'": "strings not allowed",
    "True+1": "bool not allowed",
    "1j": "complex not allowed",
    "...": "ellipsis not allowed",
    "1 if 1 else 2": "if-expressions not allowed",
    "(y:=1)": "assignments not allowed",
    "{1: 2}": "dicts not allowed",
    "~1": "operator Invert not allowed",
    "not 1": "operator Not not allowed",
    "1<<5": "operator LShift not allowed",
    "2@3": "operator MatMult not allowed",
    "2**10**10": "exponent too large",
    "9**9**9": "exponent too large",
    "2**65": "exponent too large",
    "99999**64": "result too large",
    "10**31": "result too large",
    "10**30+1": "result too large",
    "10**20*10**20": "result too large",
    "1e999": "result too large",
    "1e300": "result too large",
    "9" * 150: "result too large",
    "(-8)**(1/3)": "not a real number",
    "1/0": "division by zero",
    "1//0": "division by zero",
    "1%0": "division by zero",
    "1.0/0.0": "division by zero",
    "0**-1": "division by zero",
    "9" * 400: f"longer than {MAX_EXPR_CHARS}",
    "1+" * 100 + "1": f"longer than {MAX_EXPR_CHARS}",
    "": "not an arithmetic expression",
    "1;2": "not an arithmetic expression",
    "import os": "not an arithmetic expression",
    "1 +": "not an arithmetic expression",
    "1\x00": "not an arithmetic expression",
    "(" * 199 + ")": "not an arithmetic expression",
}


@pytest.mark.parametrize("expr", sorted(HOSTILE))
def test_hostile_input_is_a_tool_error(expr):
    # refused before anything big is computed; the time each takes: benchmarks/bench_hostile.py
    with pytest.raises(ToolError, match=re.escape(HOSTILE[expr])):
        calc(expr)


def test_never_evaluates_code(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("eval/exec called")

    monkeypatch.setattr(builtins, "eval", refuse)
    monkeypatch.setattr(builtins, "exec", refuse)
    assert calc("4821*5719-3021") == str(4821 * 5719 - 3021)
    with pytest.raises(ToolError):
        calc("__import__('os')")


@pytest.mark.parametrize("args", [{}, {"expr": 5}, {"expr": None}, {"expr": ["1+1"]},
                                  {"exp": "1+1"}])
def test_bad_args(args):
    with pytest.raises(ToolError, match='need "expr"'):
        calculator(args, None)
    out = run_tool("calculator", args)
    assert not out.ok and out.text.startswith("error: args need")


def test_through_run_tool():
    assert TOOLS.get("calculator") is calculator
    assert run_tool("calculator", {"expr": "4821*5719-3021"}) == ToolOutput("27568278", True)
    assert run_tool("calculator", {"expr": "1/0"}) == ToolOutput("error: division by zero",
                                                                 False)


# ----------------------------------------------------------------------------- the task

PROMPT = re.compile(r"What is (\d+)([*+-])(\d+)([*+-])(\d+)\?")


def _reference(prompt):
    """The answer recomputed from the prompt's numbers with Python's arithmetic."""
    x, op1, y, op2, z = PROMPT.fullmatch(prompt).groups()
    x, y, z = int(x), int(y), int(z)
    if op1 == "*":  # a*b+c or a*b-c
        return x * y + z if op2 == "+" else x * y - z
    assert op2 == "*"  # c+a*b or c-a*b
    return x + y * z if op1 == "+" else x - y * z


@pytest.mark.parametrize("digits", [1, 4, 12])
def test_examples(digits):
    task = ToolArithmeticTask(digits=digits)
    exs = task.examples("train", 0, 200)
    forms = set()
    for ex in exs:
        assert len(ex.prompt) < 60
        assert ex.answer == str(_reference(ex.prompt))
        expr, a, b, c = ex.meta
        assert ex.prompt == f"What is {expr}?"
        for n in (a, b, c):
            assert len(str(n)) == digits
        forms.add(re.sub(r"\d+", "n", expr))
        assert calc(expr) == ex.answer  # the tool gets it right
        hash(ex)
    assert forms == {"n*n+n", "n*n-n", "n+n*n", "n-n*n"}


def test_registry_split_and_determinism():
    assert TASKS.get("tool_arithmetic") is ToolArithmeticTask
    task = make_task("tool_arithmetic", digits=3, seed=5)
    assert task.tools == ("calculator",) and task.tool_context(task.example("train", 0)) is None
    assert task.examples("train", 0, 20) == ToolArithmeticTask(digits=3, seed=5).examples(
        "train", 0, 20)
    assert task.examples("train", 0, 20) != ToolArithmeticTask(digits=3, seed=6).examples(
        "train", 0, 20)
    train = {ex.prompt for ex in task.examples("train", 0, 300)}
    test = {ex.prompt for ex in task.examples("test", 0, 100)}
    assert not train & test and len(test) > 90
    def key(expr, a, b, c):
        prompt = f"What is {expr}?"
        return task._problem_key(Example(prompt, str(_reference(prompt)), (expr, a, b, c)))

    same = {key("12*34+56", 12, 34, 56), key("56+34*12", 34, 12, 56), key("34*12+56", 34, 12, 56)}
    assert len(same) == 1  # one problem, one split
    other = {key("12*34-56", 12, 34, 56), key("56-12*34", 12, 34, 56), key("12*34+57", 12, 34, 57)}
    assert len(same | other) == 4
    for bad in (0, 13):
        with pytest.raises(ValueError, match="digits must be in"):
            ToolArithmeticTask(digits=bad)


def test_score_and_expert_turns():
    task = ToolArithmeticTask()
    ex = task.example("train", 3)
    n = ex.answer
    assert task.solution(ex) == f"<answer>{n}</answer>"
    assert task.score(task.solution(ex), ex) == 1.0
    assert task.score(f"I computed it. <answer> {n} </answer>", ex) == 1.0
    for wrong in (f"<answer>{int(n) + 1}</answer>", f"<answer>{n}.0</answer>", n,
                  f"<answer>{n}", "", "<answer></answer>", "\x00" * 1000):
        assert task.score(wrong, ex) == 0.0
    call, answer = task.expert_turns(ex)
    turn = parse_turn(call)
    assert (turn.kind, turn.name, turn.args) == ("tool", "calculator", {"expr": ex.meta[0]})
    assert run_tool(turn.name, turn.args, task.tool_context(ex)) == ToolOutput(n, True)
    assert answer == task.solution(ex) and task.score(answer, ex) == 1.0
    assert task.expert_turns(ex, tools=False) == [task.solution(ex)]

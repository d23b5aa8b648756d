"""tools.base: the call format (parse_turn, format_call, format_observation) on malformed and
hostile turns, and run_tool's error handling and truncation."""

import json

import pytest

from jaxrl_suite.envs.text.base import Example
from jaxrl_suite.envs.text.tools.base import (
    MAX_CALL_CHARS,
    MAX_OUTPUT_CHARS,
    TOOLS,
    ToolError,
    ToolOutput,
    ToolTask,
    Turn,
    format_call,
    format_observation,
    parse_turn,
    run_tool,
)


def test_format_call_is_compact_json_and_parses_back():
    call = format_call("calculator", expr="1+2")
    assert call == '<tool>{"name":"calculator","args":{"expr":"1+2"}}</tool>'
    assert parse_turn(call) == Turn("tool", name="calculator", args={"expr": "1+2"})
    odd = format_call("run_tests", code='s = "é"\n\treturn 1')
    assert "é" in odd  # not ASCII-escaped: fewer bytes
    assert parse_turn(odd).args == {"code": 's = "é"\n\treturn 1'}
    assert parse_turn(format_call("t", code="a\nb\t\"c\"")).args == {"code": "a\nb\t\"c\""}
    assert parse_turn(format_call("t")) == Turn("tool", name="t", args={})


def test_format_observation():
    assert format_observation("passed 6/6") == "<result>passed 6/6</result>"


def test_answers_and_the_first_call():
    assert parse_turn("so <answer> 42 </answer>") == Turn("answer", answer="42")
    two = format_call("a", x=1) + " " + format_call("b", x=2)
    assert parse_turn(two) == Turn("tool", name="a", args={"x": 1})
    # a call wins over an answer in the same turn
    assert parse_turn("<answer>7</answer>" + format_call("a")).kind == "tool"
    assert parse_turn("text before " + format_call("a") + " after").name == "a"


@pytest.mark.parametrize("text,error", [
    ('<tool>{"name":"calculator","args":{}}', "unclosed <tool> tag"),
    ('<answer>3</answer><tool>{"name":"c"}', "unclosed <tool> tag"),
    ("just thinking", "no <tool> call and no <answer>"),
    ("", "no <tool> call and no <answer>"),
    ("<answer>3", "no <tool> call and no <answer>"),
    ("<tool>{name: calculator}</tool>", "tool call is not JSON (JSONDecodeError)"),
    ("<tool></tool>", "tool call is not JSON (JSONDecodeError)"),
    ('<tool>{"name":"c",}</tool>', "tool call is not JSON (JSONDecodeError)"),
    ("<tool>[1, 2]</tool>", "tool call must be a JSON object"),
    ('<tool>"calculator"</tool>', "tool call must be a JSON object"),
    ("<tool>null</tool>", "tool call must be a JSON object"),
    ("<tool>42</tool>", "tool call must be a JSON object"),
    ('<tool>{"args":{"expr":"1"}}</tool>', 'tool call has no "name" string'),
    ('<tool>{"name":"","args":{}}</tool>', 'tool call has no "name" string'),
    ('<tool>{"name":5,"args":{}}</tool>', 'tool call has no "name" string'),
    ('<tool>{"name":null}</tool>', 'tool call has no "name" string'),
    ('<tool>{"name":"c","args":[1]}</tool>', 'tool "args" must be a JSON object'),
    ('<tool>{"name":"c","args":"1+2"}</tool>', 'tool "args" must be a JSON object'),
    ('<tool>{"name":"c","args":null}</tool>', 'tool "args" must be a JSON object'),
])
def test_malformed_turns(text, error):
    assert parse_turn(text) == Turn("malformed", error=error)


def test_call_size_limit():
    def call_of(n):  # a valid call whose payload is exactly n characters
        base = json.dumps({"name": "c", "args": {"s": ""}}, separators=(",", ":"))
        return format_call("c", s="x" * (n - len(base)))

    at_limit = parse_turn(call_of(MAX_CALL_CHARS))
    assert at_limit.kind == "tool" and len(at_limit.args["s"]) > MAX_CALL_CHARS - 30
    assert parse_turn(call_of(MAX_CALL_CHARS + 1)) == Turn(
        "malformed", error=f"tool call longer than {MAX_CALL_CHARS} characters")
    huge = "<tool>" + "[" * 1_000_000 + "</tool>"
    assert parse_turn(huge).error == f"tool call longer than {MAX_CALL_CHARS} characters"


def test_deep_nesting_within_the_limit_never_raises():
    turn = parse_turn("<tool>" + "[" * 999 + "]" * 999 + "</tool>")
    assert turn.error in ("tool call is not JSON (RecursionError)",  # either way not a call
                          "tool call must be a JSON object")
    nested = parse_turn('<tool>{"name":"c","args":{"a":' + "[" * 900 + "]" * 900 + "}}</tool>")
    assert nested.kind in ("tool", "malformed")


@pytest.fixture
def test_tools(monkeypatch):
    """Tools registered for one test only."""

    def echo(args, context):
        return f"{args.get('s', '')}|{context}"

    def complain(args, context):
        raise ToolError("bad input: no x")

    def buggy(args, context):
        raise KeyError("secret internal detail")

    def number(args, context):
        return 42

    def chatty(args, context):
        return "y" * 10_000

    tools = {"t_echo": echo, "t_complain": complain, "t_buggy": buggy, "t_number": number,
             "t_chatty": chatty}
    for name, fn in tools.items():
        monkeypatch.setitem(TOOLS._entries, name, fn)
    return tools


def test_run_tool_outcomes(test_tools):
    assert run_tool("t_echo", {"s": "hi"}, context=("ctx",)) == ToolOutput("hi|('ctx',)", True)
    assert run_tool("t_complain", {}) == ToolOutput("error: bad input: no x", False)
    out = run_tool("t_buggy", {})
    assert out == ToolOutput("error: t_buggy failed (KeyError)", False)
    assert "secret" not in out.text  # a tool's bug does not leak its message
    assert run_tool("t_number", {}) == ToolOutput("42", True)


def test_run_tool_unknown_name(test_tools):
    out = run_tool("nope", {})
    assert not out.ok and out.text.startswith("error: unknown tool 'nope'; tools: ")
    assert "t_echo" in out.text.split("; tools: ")[1]
    long = run_tool("z" * 500, {})
    assert not long.ok and "z" * 40 in long.text and "z" * 41 not in long.text


def test_run_tool_truncates(test_tools):
    out = run_tool("t_chatty", {})
    assert out == ToolOutput("y" * MAX_OUTPUT_CHARS, True)
    assert run_tool("t_chatty", {}, max_chars=10) == ToolOutput("y" * 10, True)
    assert run_tool("t_complain", {}, max_chars=8) == ToolOutput("error: b", False)


def test_tool_task_default_context():
    class Echo(ToolTask):
        name = "echo_tool_task"
        seed = 0

        def _generate(self, rng):
            return Example("p", "a", meta=(1, 2))

        def solution(self, ex):
            return "<answer>a</answer>"

        def score(self, completion, ex):
            return 0.0

        def expert_turns(self, ex, *, tools=True):
            return [self.solution(ex)]

    task = Echo()
    assert task.tools == () and task.tool_context(Example("p", "a", (1, 2))) == (1, 2)
    with pytest.raises(TypeError):
        type("NoExpert", (ToolTask,), {"_generate": None, "solution": None, "score": None})()

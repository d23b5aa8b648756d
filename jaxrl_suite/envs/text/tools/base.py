"""Tool use for LM agents: the call format, the tool registry and the interface of tool tasks.

A model turn is the text the policy writes before its EOS. It either calls one tool,

    <tool>{"name": "calculator", "args": {"expr": "4821*5719-3021"}}</tool>

or ends the episode with a final answer, <answer>...</answer>. `parse_turn` reads a turn with
`json.loads` (never `eval`): model output is hostile input, and a malformed turn becomes a
`Turn(kind="malformed", error=...)` that the episode runner answers with an error observation.

A tool is a plain function `tool(args: dict, context) -> str` registered in `TOOLS`; `context`
is the task's per-problem data (`ToolTask.tool_context`, picklable, so a tool runs in a process
pool or on a Ray worker). A tool signals bad arguments by raising `ToolError`; `run_tool` never
raises: every failure becomes an observation starting with "error:" and `ok=False`.
"""

from __future__ import annotations

import abc
import json
import re
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

from jaxrl_suite.core.registry import Registry, UnknownNameError
from jaxrl_suite.envs.text.base import Example, Task, extract_answer

TOOL_OPEN, TOOL_CLOSE = "<tool>", "</tool>"
RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"  # an observation, as the model sees it
MAX_CALL_CHARS = 2_000  # a longer <tool> payload is malformed (never parsed)
MAX_OUTPUT_CHARS = 400  # tool outputs are cut to this many characters

_TOOL_RE = re.compile(re.escape(TOOL_OPEN) + r"(.*?)" + re.escape(TOOL_CLOSE), re.S)


class ToolError(Exception):
    """A tool's complaint about its arguments or input; the message is shown to the model."""


class Turn(NamedTuple):
    """One parsed model turn.

    kind: "tool" (a well-formed call), "answer" (an <answer> tag and no call) or "malformed";
    name, args: the call; answer: the text inside <answer>; error: why a turn is malformed."""

    kind: str
    name: str = ""
    args: dict | None = None
    answer: str | None = None
    error: str = ""


class ToolOutput(NamedTuple):
    """A tool's observation text and whether the call succeeded (False: an "error: ..." text)."""

    text: str
    ok: bool


def format_call(name: str, **args) -> str:
    """The canonical call text, e.g. format_call("calculator", expr="1+2") ->
    '<tool>{"name":"calculator","args":{"expr":"1+2"}}</tool>' (compact JSON: fewer tokens)."""
    payload = json.dumps({"name": name, "args": args}, separators=(",", ":"), ensure_ascii=False)
    # "</" -> "<\/" (the same JSON string) so that an argument holding "</tool>" cannot end the
    # call early
    return f"{TOOL_OPEN}{payload.replace('</', '<' + chr(92) + '/')}{TOOL_CLOSE}"


def format_observation(text: str) -> str:
    """The observation as it is appended to the trajectory: <result>text</result>."""
    return f"{RESULT_OPEN}{text}{RESULT_CLOSE}"


def parse_turn(text: str) -> Turn:
    """Reads one model turn; never raises.

    The first <tool>...</tool> block, if any, is the call: its payload must be a JSON object
    {"name": str, "args": object} of at most MAX_CALL_CHARS characters. Without a call block the
    turn is an answer if it holds <answer>...</answer>. Anything else is malformed, with the
    reason in `error` (an unclosed <tool>, bad JSON, a missing name, ...)."""
    match = _TOOL_RE.search(text)
    if match is None:
        if TOOL_OPEN in text:
            return Turn("malformed", error="unclosed <tool> tag")
        answer = extract_answer(text)
        if answer is not None:
            return Turn("answer", answer=answer)
        return Turn("malformed", error="no <tool> call and no <answer>")
    payload = match.group(1)
    if len(payload) > MAX_CALL_CHARS:
        return Turn("malformed", error=f"tool call longer than {MAX_CALL_CHARS} characters")
    try:
        call = json.loads(payload)
    except (ValueError, RecursionError) as e:  # json.JSONDecodeError is a ValueError
        return Turn("malformed", error=f"tool call is not JSON ({type(e).__name__})")
    if not isinstance(call, dict):
        return Turn("malformed", error="tool call must be a JSON object")
    name, args = call.get("name"), call.get("args", {})
    if not isinstance(name, str) or not name:
        return Turn("malformed", error="tool call has no \"name\" string")
    if not isinstance(args, dict):
        return Turn("malformed", error="tool \"args\" must be a JSON object")
    return Turn("tool", name=name, args=args)


Tool = Callable[[dict, Any], str]
TOOLS: Registry[Tool] = Registry("tool")


def run_tool(name: str, args: dict, context: Any = None,
             max_chars: int = MAX_OUTPUT_CHARS) -> ToolOutput:
    """Runs registered tool `name` on `args` with the problem's `context`; never raises.

    Unknown tools, `ToolError`s and any other exception (a tool bug must not stop a run) become
    ToolOutput("error: ...", ok=False); the text is cut to `max_chars` characters. Module-level
    and picklable: the dispatchers' executors run it in worker processes."""
    try:
        tool = TOOLS.get(name)
    except UnknownNameError:
        return ToolOutput(f"error: unknown tool {name[:40]!r}; tools: "
                          f"{', '.join(TOOLS.names())}", False)
    try:
        text, ok = str(tool(args, context)), True
    except ToolError as e:
        text, ok = f"error: {e}", False
    except Exception as e:  # noqa: BLE001 - a tool's bug is an observation, not a crash
        text, ok = f"error: {name} failed ({type(e).__name__})", False
    return ToolOutput(text[:max_chars], ok)


class ToolTask(Task):
    """A verifiable task solved with tools: a `Task` (prompt, answer, `score` of the final
    answer turn) plus what the episode runner needs.

    tools: names of the `TOOLS` the task allows (a call to another is an error observation).
    tool_context(ex): the per-problem data the tools receive (picklable; default `ex.meta`).
    expert_turns(ex, tools): the scripted expert's model turns, the last one an <answer>; the
      SFT demonstrations are these turns with the real tools' observations between them. With
      tools=False, the single direct-answer turn of the no-tools baseline.
    parse_turn(text), observation(text): the turn and observation formats (defaults: the
      <tool>/<answer>/<result> format above).
    `solution(ex)` is the final answer turn (what a direct answer should say)."""

    tools: ClassVar[tuple[str, ...]] = ()

    def tool_context(self, ex: Example) -> Any:
        return ex.meta

    def parse_turn(self, text: str) -> Turn:
        """Reads one model turn (default: the <tool>/<answer> format, `parse_turn`). A task
        with its own turn format (the s3 searcher's <query>/<search_complete> tags) maps it
        onto `Turn`: "tool" (run `name` on `args`), "answer" (the episode ends) or
        "malformed". Must never raise."""
        return parse_turn(text)

    def observation(self, text: str) -> str:
        """A tool's output as it is appended to the trajectory (default <result>text</result>,
        `format_observation`)."""
        return format_observation(text)

    @abc.abstractmethod
    def expert_turns(self, ex: Example, *, tools: bool = True) -> list[str]:
        """The scripted expert's model turns for `ex` (see the class docstring)."""


__all__ = [
    "MAX_CALL_CHARS",
    "MAX_OUTPUT_CHARS",
    "RESULT_CLOSE",
    "RESULT_OPEN",
    "TOOLS",
    "TOOL_CLOSE",
    "TOOL_OPEN",
    "Tool",
    "ToolError",
    "ToolOutput",
    "ToolTask",
    "Turn",
    "format_call",
    "format_observation",
    "parse_turn",
    "run_tool",
]

"""The `run_tests` tool (a candidate body of `f` against the problem's hidden tests, in the
sandbox) and the task that needs it, `fix_tests`.

run_tests: args {"code": "return x * 3 + 2"} -> one short line:

    "passed 6/6"
    "passed 4/6; f(5) should be 17, got 16"       (the first failing test, from the sandbox)
    "passed 0/6; f(5) should be 17, raised ZeroDivisionError"
    "timeout (passed 0/6)"                         (also memory, forbidden, error, output_limit)
    "syntax error"                                 (not valid Python; nothing is run)

`code` is the body of f: it is dedented and indented 4 spaces under the problem's def line, so
"return x * 3 + 2" and "    return x * 3 + 2\\n" both work (and a first line without its
indentation before indented lines, as `extract_answer` leaves a body). The program runs only in
the sandbox (`rewards.sandbox`), never here.

fix_tests: the prompt is a generated `code` program with one constant off by one and no
docstring, "Fix f so its tests pass:\\ndef f(x):\\n    return x * 3 + 1\\n"; the hidden tests,
reachable only through `run_tests`, are the spec. The reward is the fraction of them that the
def line + the body in <answer> passes.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, NamedTuple

import numpy as np

from jaxrl_suite.envs.text import code as code_lib
from jaxrl_suite.envs.text.base import TASKS, Example, Verdicts, extract_answer
from jaxrl_suite.envs.text.code import LEVELS, CodeTask, Program, is_python, live_neighbours, render
from jaxrl_suite.envs.text.tools.base import TOOLS, ToolError, ToolTask, format_call
from jaxrl_suite.rewards.format import answer_tags

if TYPE_CHECKING:
    from jaxrl_suite.rewards.sandbox import SandboxResult

MAX_CODE_CHARS = 2_000  # a longer "code" argument is refused
MAX_OBSERVATION_CHARS = 100
_LIST_COMMA = re.compile(r", (?=[-\d\[(])")  # "[1, 2]" -> "[1,2]" in observations


class RunTestsContext(NamedTuple):
    """What the run_tests tool gets for one problem (picklable): the def line of f, e.g.
    "def f(x):", the hidden tests (`assert ...` lines) and the sandbox limits."""

    header: str
    tests: str
    timeout_s: float = 2.0
    memory_mb: int = 256


def function_source(header: str, code: str) -> str:
    """`header` + `code` as f's body: dedented, then indented 4 spaces under the def line.

    If that is not valid Python and the first line has no indentation while the others do (a
    body whose first line was stripped), the first line is put at the others' indentation."""
    lines = code.replace("\r\n", "\n").split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    body = "\n".join(lines)
    source = f"{header}\n{textwrap.indent(textwrap.dedent(body), '    ')}\n"
    if len(lines) > 1 and lines[0][:1] not in (" ", "\t") and not is_python(source):
        rest = textwrap.dedent("\n".join(lines[1:]))
        fixed = f"{header}\n{textwrap.indent(lines[0] + chr(10) + rest, '    ')}\n"
        if is_python(fixed):
            return fixed
    return source


def _sandbox_source(header: str, code: str) -> str:
    """`function_source`, unencodable characters replaced by '?' (as the code tasks do)."""
    return function_source(header, code).encode("utf-8", "replace").decode("utf-8")


def observation(result: SandboxResult) -> str:
    """The run_tests observation of a `SandboxResult` (see the module docstring)."""
    passed = f"passed {result.passed}/{result.total}"
    if result.status == "ok":
        return passed
    if result.status == "failed":
        text = f"{passed}; {_LIST_COMMA.sub(',', result.failure)}" if result.failure else passed
        if len(text) > MAX_OBSERVATION_CHARS:
            text = text[: MAX_OBSERVATION_CHARS - 3] + "..."
        return text
    return f"{result.status} ({passed})"


@TOOLS.register("run_tests")
def run_tests(args: dict, context: RunTestsContext) -> str:
    """The run_tests tool: args {"code": "<the body of f>"}, context a `RunTestsContext`; the
    observation (see the module docstring). ToolError on a missing, non-string or too long
    "code"."""
    if not isinstance(context, RunTestsContext):
        raise ToolError("this problem has no tests to run")
    code = args.get("code") if isinstance(args, dict) else None
    if not isinstance(code, str):
        raise ToolError('args need "code", the body of f as a string')
    if len(code) > MAX_CODE_CHARS:
        raise ToolError(f"code longer than {MAX_CODE_CHARS} characters")
    source = _sandbox_source(context.header, code)
    if not is_python(source):
        return "syntax error"
    result = code_lib._sandbox().run_tests(source, context.tests, timeout_s=context.timeout_s,
                                           memory_mb=context.memory_mb)
    return observation(result)


class FixMeta(NamedTuple):
    """`Example.meta` of a fix_tests problem (hashable): f's def line, the hidden tests, the
    correct program and the buggy one shown in the prompt."""

    header: str
    tests: str
    program: Program
    buggy: Program


def _call_code(body: str) -> str:
    """A body as the expert passes it to run_tests: dedented, without the final newline."""
    return textwrap.dedent(body).rstrip("\n")


@dataclasses.dataclass(frozen=True)
class FixTestsTask(ToolTask):
    """Fix a function against hidden tests, with the run_tests tool.

    A problem is a `CodeTask(level)` program and its 6 hidden tests; the prompt shows, without
    a docstring, a neighbour of it (one constant off by +-1, which the hidden tests catch):
    "Fix f so its tests pass:\\ndef f(x):\\n    return x * 3 + 1\\n". answer: the correct body
    (CodeTask's); meta: `FixMeta`; tool_context: a `RunTestsContext`. Reward (`score`): the
    fraction of the hidden tests that the def line + the <answer> body passes in the sandbox,
    0.0 without an answer, for one that is not Python, and on a timeout or crash. The expert
    runs the tests on the buggy body, then on the correct one, then answers. The split is by
    the correct program.
    """

    name: ClassVar[str] = "fix_tests"
    tools: ClassVar[tuple[str, ...]] = ("run_tests",)
    seed: int = 0
    level: int = 1  # CodeTask's level: 1 one line, 2 two lines, 3 a loop
    timeout_s: float = 2.0  # sandbox wall-clock limit per program (the tool's too)
    memory_mb: int = 256  # sandbox memory limit per program (the tool's too)

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ValueError(f"fix_tests: level must be 1, 2 or 3, got level={self.level}")
        code_lib._check_limits(self.name, self.timeout_s, self.memory_mb)

    def _generate(self, rng: np.random.Generator) -> Example:
        ex = CodeTask(level=self.level, seed=self.seed)._generate(rng)
        program = ex.meta.program
        neighbours = live_neighbours(program)  # never None: CodeTask draws only live programs
        buggy = neighbours[int(rng.integers(len(neighbours)))]
        header = ex.prompt.split("\n", 1)[0]  # "def f(x):"
        prompt = f"Fix f so its tests pass:\n{header}\n{render(buggy)[0]}"
        return Example(prompt=prompt, answer=ex.answer,
                       meta=FixMeta(header, ex.meta.tests, program, buggy))

    def _problem_key(self, ex: Example) -> str:
        return ex.answer  # the correct body names the program

    def tool_context(self, ex: Example) -> RunTestsContext:
        return RunTestsContext(ex.meta.header, ex.meta.tests, self.timeout_s, self.memory_mb)

    def solution(self, ex: Example) -> str:
        """The correct body, dedented as the expert passes it to run_tests (fewer tokens)."""
        return answer_tags(_call_code(ex.answer))

    def expert_turns(self, ex: Example, *, tools: bool = True) -> list[str]:
        if not tools:
            return [self.solution(ex)]
        buggy = render(ex.meta.buggy)[0]
        return [format_call("run_tests", code=_call_code(buggy)),
                format_call("run_tests", code=_call_code(ex.answer)), self.solution(ex)]

    def _source(self, completion: str, ex: Example) -> str | None:
        """def line + the <answer> body (None without an answer)."""
        answer = extract_answer(completion)
        return None if answer is None else _sandbox_source(ex.meta.header, answer)

    def score(self, completion: str, ex: Example) -> float:
        source = self._source(completion, ex)
        if source is None or not is_python(source):
            return 0.0
        return code_lib._sandbox().run_tests(source, ex.meta.tests, timeout_s=self.timeout_s,
                                             memory_mb=self.memory_mb).reward

    def verify_batch(self, completions: Sequence[str], examples: Sequence[Example]) -> Verdicts:
        """Scores and outcomes (the sandbox's status; "no_answer" or "syntax", scored 0.0
        without a sandbox call), the batch run concurrently in the shared sandbox pool."""
        if len(completions) != len(examples):
            raise ValueError(f"{len(completions)} completions for {len(examples)} examples")
        scores, outcomes = [0.0] * len(completions), ["no_answer"] * len(completions)
        run = []
        for i, (c, ex) in enumerate(zip(completions, examples, strict=True)):
            source = self._source(c, ex)
            if source is not None and not is_python(source):
                outcomes[i] = "syntax"
            elif source is not None:
                run.append((i, source))
        if run:
            results = code_lib.default_pool().run(
                [s for _, s in run], [examples[i].meta.tests for i, _ in run],
                timeout_s=self.timeout_s, memory_mb=self.memory_mb)
            for (i, _), result in zip(run, results, strict=True):
                scores[i], outcomes[i] = result.reward, result.status
        return Verdicts(scores, outcomes)


TASKS.register(FixTestsTask.name, FixTestsTask)

__all__ = [
    "MAX_CODE_CHARS",
    "FixMeta",
    "FixTestsTask",
    "RunTestsContext",
    "function_source",
    "observation",
    "run_tests",
]

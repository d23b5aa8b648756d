"""Code generation with hidden unit tests: generated function-writing problems (`code`) and an
MBPP-style JSONL adapter (`mbpp_jsonl`), scored by running the program in the sandbox.

`code`: the prompt is a Python function header and a docstring that states the operation in
words plus `n_shown` input/output examples; the completion is the function body; prompt +
completion is a whole function `f`. Three levels of a small grammar of integer and list
functions, sized for byte-level models trained from scratch (prompt <= ~170 bytes, canonical body
<= ~100 bytes):

    level 1, one line (f(x), x an int):
        def f(x):
            \"\"\"Return x times 6 minus 4. f(24) == 140; f(21) == 122\"\"\"
            return x * 6 - 4
    level 2, two lines (f(xs), a map, then a filter or a reduction):
        def f(xs):
            \"\"\"Each x plus 6; keep those above 13. f([14, 10]) == [20, 16]; f([4]) == []\"\"\"
            ys = [x + 6 for x in xs]
            return [y for y in ys if y > 13]
    level 3, four lines (f(xs), a loop: a conditional sum, or a fold "s becomes ..."):
        def f(xs):
            \"\"\"Start at 6; add 4*x for each x above 9. f([1, 12, 11]) == 98; f([7]) == 6\"\"\"
            s = 6
            for x in xs:
                if x > 9: s += x * 4
            return s

The docstring's wording is a deterministic function of the program. Expected outputs come from a
trusted evaluator of the grammar (`run_program`: Python functions per operation, never `eval` of
strings). Every generated program is non-degenerate (its outputs vary with the input and each of
its constants matters), and its hidden inputs (the shown ones first, `n_hidden` in all) tell it
apart from every program one constant step away (e.g. `x * 4 + 1` for `x * 3 + 1`) that differs
from it anywhere on a fixed probe set. The train/test split is by program (`_problem_key` is the
canonical body), so the same function with other examples never crosses splits.

Reward (`score`): the fraction of hidden tests (`Example.meta.tests`, lines
`assert f(<literals>) == <literal>`) that prompt + completion passes in the sandbox
(`jaxrl_suite.rewards.sandbox.run_tests`), 0.0 on a timeout, crash or a completion that is not
valid Python (checked here first, without a sandbox call). `score_batch` / `results_batch` run a
batch concurrently in one process-wide `default_pool()`. The sandbox module is imported on first
use, so the tasks can be built (and their problems generated) without it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import os
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import numpy as np

from jaxrl_suite.envs.text.base import (
    TASKS,
    TEST_BUCKETS,
    Example,
    Task,
    Verdicts,
    stable_hash,
)
from jaxrl_suite.envs.text.tfds_tasks import SOURCE_CACHE, DatasetTask, read_jsonl

if TYPE_CHECKING:
    from jaxrl_suite.rewards.sandbox import SandboxPool, SandboxResult

LEVELS = (1, 2, 3)
_MAX_HIDDEN = 20  # n_hidden bound: level 1 draws distinct ints from a 41-value domain
_INT_DOMAIN = (0, 40)  # level-1 inputs x, inclusive
_ITEM_DOMAIN = (0, 20)  # list items, inclusive
_SHOWN_LEN = (1, 4)  # length of a shown list input (the prompt stays short)
_HIDDEN_LEN = (2, 7)  # length of a hidden-only list input
_PROGRAM_DRAWS = 1000  # resampling bounds of `_generate`
_INPUT_DRAWS = 64


# ----------------------------------------------------------------------------- the grammar


def _any(*consts: int) -> bool:
    return True


class _Part(NamedTuple):
    """One operation of the grammar, filled into a slot of a `_Family`."""

    code: str  # Python source, {0}, {1}, ... for the constants: "x * {0} + {1}"
    words: str  # the same in words: "x times {0} plus {1}"
    fn: Callable[..., Any]  # trusted evaluator: fn(*values, *consts), e.g. (x, a, b) -> x*a+b
    ranges: tuple[tuple[int, int], ...] = ()  # inclusive sampling range of each constant
    valid: Callable[..., bool] = _any  # which constants make a program (a divisor > 0, r < m)


def _positive(a: int, *_: int) -> bool:
    return a >= 1


def _residue(m: int, r: int) -> bool:
    return 0 <= r < m


_EXPRS = {  # level 1: the returned expression of x
    "mul_add": _Part("x * {0} + {1}", "x times {0} plus {1}", lambda x, a, b: x * a + b,
                     ((2, 9), (1, 9))),
    "mul_sub": _Part("x * {0} - {1}", "x times {0} minus {1}", lambda x, a, b: x * a - b,
                     ((2, 9), (1, 9))),
    "div_add": _Part("x // {0} + {1}", "x floor-divided by {0}, plus {1}",
                     lambda x, a, b: x // a + b, ((2, 9), (1, 9)), _positive),
    "mod_mul": _Part("x % {0} * {1}", "x mod {0}, times {1}", lambda x, a, b: x % a * b,
                     ((2, 9), (2, 9)), _positive),
    "add_mul": _Part("(x + {0}) * {1}", "x plus {0}, times {1}", lambda x, a, b: (x + a) * b,
                     ((1, 9), (2, 9))),
    "max": _Part("max(x, {0})", "the larger of x and {0}", lambda x, a: max(x, a), ((5, 35),)),
    "min": _Part("min(x, {0})", "the smaller of x and {0}", lambda x, a: min(x, a), ((5, 35),)),
    "dist": _Part("abs(x - {0})", "the distance from x to {0}", lambda x, a: abs(x - a),
                  ((5, 35),)),
}
_MAPS = {  # level 2, line 1: ys = [<map> for x in xs]
    "mul": _Part("x * {0}", "times {0}", lambda x, a: x * a, ((2, 5),)),
    "add": _Part("x + {0}", "plus {0}", lambda x, a: x + a, ((1, 9),)),
    "sub": _Part("x - {0}", "minus {0}", lambda x, a: x - a, ((1, 9),)),
    "div": _Part("x // {0}", "floor-divided by {0}", lambda x, a: x // a, ((2, 5),), _positive),
    "mod": _Part("x % {0}", "mod {0}", lambda x, a: x % a, ((3, 9),), _positive),
}
_TAILS = {  # level 2, line 2: a filter or a reduction of ys
    "keep_mod": _Part("return [y for y in ys if y % {0} == {1}]",
                      "keep those that are {1} mod {0}",
                      lambda ys, m, r: [y for y in ys if y % m == r], ((2, 5), (0, 4)), _residue),
    "keep_gt": _Part("return [y for y in ys if y > {0}]", "keep those above {0}",
                     lambda ys, t: [y for y in ys if y > t], ((0, 30),)),
    "keep_lt": _Part("return [y for y in ys if y < {0}]", "keep those below {0}",
                     lambda ys, t: [y for y in ys if y < t], ((1, 30),)),
    "sum": _Part("return sum(ys)", "return their sum", sum),
    "max": _Part("return max(ys)", "return the largest", max),
}
_INITS = {"init": _Part("{0}", "{0}", lambda a: a, ((0, 9),))}  # level 3: s = <init>
_CONDS = {  # level 3, conditional sum: if <cond>: s += <term>
    "mod": _Part("x % {0} == {1}", "that is {1} mod {0}", lambda x, m, r: x % m == r,
                 ((2, 5), (0, 4)), _residue),
    "gt": _Part("x > {0}", "above {0}", lambda x, t: x > t, ((2, 18),)),
    "lt": _Part("x < {0}", "below {0}", lambda x, t: x < t, ((2, 18),)),
}
_TERMS = {
    "x": _Part("x", "x", lambda x: x),
    "mul": _Part("x * {0}", "{0}*x", lambda x, a: x * a, ((2, 5),)),
    "one": _Part("1", "1", lambda x: 1),
}
_UPDATES = {  # level 3, fold: s = <update>
    "horner": _Part("s * {0} + x", "s*{0} + x", lambda s, x, a: s * a + x, ((2, 3),)),
    "mod_sum": _Part("(s + x) % {0}", "(s + x) mod {0}", lambda s, x, m: (s + x) % m,
                     ((5, 13),), _positive),
    "cap_sum": _Part("min(s + x, {0})", "the smaller of s + x and {0}",
                     lambda s, x, c: min(s + x, c), ((10, 40),)),
    "dist": _Part("abs(s - x)", "|s - x|", lambda s, x: abs(s - x)),
}


def _run_sum_if(ops, xs):
    init, cond, term = ops
    s = init()
    for x in xs:
        if cond(x):
            s += term(x)
    return s


def _run_fold(ops, xs):
    init, update = ops
    s = init()
    for x in xs:
        s = update(s, x)
    return s


class _Family(NamedTuple):
    """A program shape: slots filled with parts, its body lines, its sentence, its evaluator."""

    level: int
    arg: str  # "x" (an int) or "xs" (a list of ints)
    slots: tuple[dict[str, _Part], ...]
    lines: tuple[str, ...]  # body lines without the 4-space indent; {i}: slot i's code
    words: str  # the docstring's sentence; {i}: slot i's words
    run: Callable[[list[Callable], Any], Any]  # run(ops, arg), ops[i] slot i's bound part


_FAMILIES = {
    "expr": _Family(1, "x", (_EXPRS,), ("return {0}",), "Return {0}.",
                    lambda ops, x: ops[0](x)),
    "map": _Family(2, "xs", (_MAPS, _TAILS), ("ys = [{0} for x in xs]", "{1}"),
                   "Each x {0}; {1}.", lambda ops, xs: ops[1]([ops[0](x) for x in xs])),
    "sum_if": _Family(3, "xs", (_INITS, _CONDS, _TERMS),
                      ("s = {0}", "for x in xs:", "    if {1}: s += {2}", "return s"),
                      "Start at {0}; add {2} for each x {1}.", _run_sum_if),
    "fold": _Family(3, "xs", (_INITS, _UPDATES),
                    ("s = {0}", "for x in xs:", "    s = {1}", "return s"),
                    "Start at s = {0}; for each x, s becomes {1}.", _run_fold),
}


class Program(NamedTuple):
    """One program of the grammar, e.g. Program("expr", ("mul_add",), ((3, 1),)) is
    `return x * 3 + 1`."""

    family: str  # a key of _FAMILIES
    parts: tuple[str, ...]  # one part name per slot
    consts: tuple[tuple[int, ...], ...]  # the constants of each slot's part


def _slot_parts(prog: Program) -> list[_Part]:
    return [slot[name] for slot, name in zip(_FAMILIES[prog.family].slots, prog.parts,
                                             strict=True)]


def run_program(prog: Program, arg: Any) -> Any:
    """The trusted evaluator: `prog` applied to `arg` (an int at level 1, else a list of ints)."""
    ops = [functools.partial(lambda f, c, *v: f(*v, *c), part.fn, c)
           for part, c in zip(_slot_parts(prog), prog.consts, strict=True)]
    return _FAMILIES[prog.family].run(ops, arg)


def render(prog: Program) -> tuple[str, str]:
    """(body, docstring sentence) of `prog`; the body is indented lines, each ending in "\\n"."""
    family = _FAMILIES[prog.family]
    parts = _slot_parts(prog)
    codes = [p.code.format(*c) for p, c in zip(parts, prog.consts, strict=True)]
    words = [p.words.format(*c) for p, c in zip(parts, prog.consts, strict=True)]
    body = "".join(f"    {line.format(*codes)}\n" for line in family.lines)
    return body, family.words.format(*words)


def _draw_program(rng: np.random.Generator, level: int) -> Program:
    names = [name for name, fam in _FAMILIES.items() if fam.level == level]
    family = names[int(rng.integers(len(names)))]
    parts, consts = [], []
    for slot in _FAMILIES[family].slots:
        name = list(slot)[int(rng.integers(len(slot)))]
        part = slot[name]
        while True:
            c = tuple(int(rng.integers(lo, hi + 1)) for lo, hi in part.ranges)
            if part.valid(*c):
                break
        parts.append(name)
        consts.append(c)
    return Program(family, tuple(parts), tuple(consts))


def _neighbours(prog: Program) -> list[tuple[tuple[int, int], Program]]:
    """((slot, constant index), program) for each valid program one constant step (+-1) away."""
    out = []
    for i, (part, c) in enumerate(zip(_slot_parts(prog), prog.consts, strict=True)):
        for j in range(len(c)):
            for step in (-1, 1):
                new = c[:j] + (c[j] + step,) + c[j + 1:]
                if part.valid(*new):
                    consts = prog.consts[:i] + (new,) + prog.consts[i + 1:]
                    out.append(((i, j), prog._replace(consts=consts)))
    return out


def _probe_inputs(arg: str) -> tuple:
    if arg == "x":
        return tuple(range(_INT_DOMAIN[0], _INT_DOMAIN[1] + 1))
    lo, hi = _ITEM_DOMAIN
    rng = np.random.default_rng(0)
    singles = [[v] for v in range(lo, hi + 1)]
    lists = [rng.integers(lo, hi + 1, int(rng.integers(2, 6))).tolist() for _ in range(60)]
    return tuple(singles + lists)


_PROBES = {arg: _probe_inputs(arg) for arg in ("x", "xs")}


@functools.lru_cache(maxsize=1 << 16)
def live_neighbours(prog: Program) -> tuple[Program, ...] | None:
    """The neighbours (one constant step away) of `prog` that differ from it on the probe set,
    or None if `prog` is degenerate: constant on the probe set, or with a constant whose steps
    change nothing there."""
    probe = _PROBES[_FAMILIES[prog.family].arg]
    outs = [run_program(prog, a) for a in probe]
    if all(o == outs[0] for o in outs):
        return None
    live, mattering = [], set()
    for pos, nb in _neighbours(prog):
        if any(run_program(nb, a) != o for a, o in zip(probe, outs, strict=True)):
            live.append(nb)
            mattering.add(pos)
    n_consts = sum(len(c) for c in prog.consts)
    return tuple(live) if len(mattering) == n_consts else None


def _draw_inputs(rng: np.random.Generator, arg: str, n_shown: int, n_hidden: int) -> list:
    if arg == "x":
        lo, hi = _INT_DOMAIN
        return [int(v) + lo for v in rng.choice(hi - lo + 1, n_hidden, replace=False)]
    inputs: list[list[int]] = []
    while len(inputs) < n_hidden:
        lo, hi = _SHOWN_LEN if len(inputs) < n_shown else _HIDDEN_LEN
        xs = rng.integers(_ITEM_DOMAIN[0], _ITEM_DOMAIN[1] + 1, int(rng.integers(lo, hi + 1)))
        if xs.tolist() not in inputs:
            inputs.append(xs.tolist())
    return inputs


def _distinguishes(prog: Program, neighbours: Sequence[Program], inputs: list,
                   n_shown: int) -> bool:
    """Whether the outputs on `inputs` vary (also on the shown ones, if two or more) and tell
    `prog` from each of `neighbours`."""
    outs = [run_program(prog, a) for a in inputs]
    shown = outs[:n_shown]
    if all(o == outs[0] for o in outs) or len(shown) > 1 and all(o == shown[0] for o in shown):
        return False
    return all(any(run_program(nb, a) != o for a, o in zip(inputs, outs, strict=True))
               for nb in neighbours)


def assert_lines(inputs: Sequence[Any], outputs: Sequence[Any]) -> str:
    """The hidden tests: one `assert f(<input>) == <output>` line per pair (literals only)."""
    return "".join(f"assert f({a!r}) == {o!r}\n" for a, o in zip(inputs, outputs, strict=True))


# ----------------------------------------------------------------------------- sandbox scoring


class CodeMeta(NamedTuple):
    """`Example.meta` of a code problem (a plain tuple, so it stays hashable)."""

    tests: str  # the hidden tests, one `assert ...` line each
    program: Program | None = None  # the generated program (None for dataset problems)


def _sandbox():
    """The sandbox module, imported on first use (the tasks build without it)."""
    from jaxrl_suite.rewards import sandbox

    return sandbox


def default_pool() -> SandboxPool:
    """The process-wide sandbox pool, made on first use with min(4, cpu_count) workers: the
    sandbox's own `default_pool()`, so `run_tests` (score, feedback) and the batches share it."""
    return _sandbox().default_pool()


def is_python(source: str) -> bool:
    """Whether `source` compiles as Python (nothing is run): a syntax error, a top-level
    `return` or a null byte make it not."""
    try:
        with warnings.catch_warnings():  # model output: its SyntaxWarnings are not ours
            warnings.simplefilter("ignore")
            compile(source, "<completion>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


class _SandboxScored:
    """Sandbox scoring shared by the code tasks: the program is prompt + completion, run against
    `ex.meta.tests`. Needs the dataclass fields `timeout_s` and `memory_mb`."""

    timeout_s: float
    memory_mb: int

    def program(self, completion: str, ex: Example) -> str:
        """The source run in the sandbox: prompt + completion (unencodable characters -> '?')."""
        return (ex.prompt + completion).encode("utf-8", "replace").decode("utf-8")

    def _programs(self, completions: Sequence[str], examples: Sequence[Example]) -> list[str]:
        if len(completions) != len(examples):
            raise ValueError(f"{len(completions)} completions for {len(examples)} examples")
        return [self.program(c, ex) for c, ex in zip(completions, examples, strict=True)]

    def _limits(self) -> dict[str, Any]:
        return {"timeout_s": self.timeout_s, "memory_mb": self.memory_mb}

    def score(self, completion: str, ex: Example) -> float:
        """Fraction of the hidden tests passed in the sandbox; 0.0 on a timeout, crash or
        forbidden call, and without a sandbox call if prompt + completion is not valid Python."""
        source = self.program(completion, ex)
        if not is_python(source):
            return 0.0
        return _sandbox().run_tests(source, ex.meta.tests, **self._limits()).reward

    def results_batch(self, completions: Sequence[str],
                      examples: Sequence[Example]) -> list[SandboxResult]:
        """The sandbox's results (passed, total, status, detail) of each completion, run
        concurrently in `default_pool()`; malformed completions are run too (their status)."""
        programs = self._programs(completions, examples)
        if not programs:
            return []
        return default_pool().run(programs, [ex.meta.tests for ex in examples],
                                  **self._limits())

    def verify_batch(self, completions: Sequence[str], examples: Sequence[Example]) -> Verdicts:
        """Scores (passed / total, 0.0 on a timeout, crash or forbidden call) and outcomes (the
        sandbox's status; "syntax" for a completion that is not valid Python, scored 0.0
        without a sandbox call), the batch run concurrently in `default_pool()`."""
        programs = self._programs(completions, examples)
        scores, outcomes = [0.0] * len(programs), ["syntax"] * len(programs)
        run = [i for i, p in enumerate(programs) if is_python(p)]
        if run:
            results = default_pool().run([programs[i] for i in run],
                                         [examples[i].meta.tests for i in run], **self._limits())
            for i, result in zip(run, results, strict=True):
                scores[i], outcomes[i] = result.reward, result.status
        return Verdicts(scores, outcomes)

    def score_batch(self, completions: Sequence[str], examples: Sequence[Example]) -> list[float]:
        """`verify_batch(...).scores`."""
        return self.verify_batch(completions, examples).scores

    def feedback(self, completion: str, ex: Example) -> str:
        """"syntax error", "k of n tests pass", or the sandbox status ("timeout (0 of n tests
        pass)"); never the expected outputs."""
        source = self.program(completion, ex)
        if not is_python(source):
            return "syntax error"
        result = _sandbox().run_tests(source, ex.meta.tests, **self._limits())
        passed = f"{result.passed} of {result.total} tests pass"
        return passed if result.status in ("ok", "failed") else f"{result.status} ({passed})"


def _check_limits(task: str, timeout_s: float, memory_mb: int) -> None:
    if not timeout_s > 0:
        raise ValueError(f"{task}: timeout_s must be > 0, got timeout_s={timeout_s}")
    if memory_mb < 16:
        raise ValueError(f"{task}: memory_mb must be >= 16, got memory_mb={memory_mb}")


# ----------------------------------------------------------------------------- code


@dataclasses.dataclass(frozen=True)
class CodeTask(_SandboxScored, Task):
    """Write the body of `f` from its docstring; the reward is the fraction of hidden tests
    passed in the sandbox (see the module docstring for the grammar and the checks).

    `example(split, i).meta` is a `CodeMeta` (the hidden tests and the program); `answer` and
    `solution` are the canonical body. The split is by program.
    """

    name: ClassVar[str] = "code"
    level: int = 1  # 1: one-line int function; 2: list map + filter/reduce; 3: a loop
    n_shown: int = 2  # input/output examples in the docstring
    n_hidden: int = 6  # hidden tests (the shown inputs first), checked by the reward
    seed: int = 0
    timeout_s: float = 2.0  # sandbox wall-clock limit per program
    memory_mb: int = 256  # sandbox memory limit per program

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ValueError(f"code: level must be 1, 2 or 3, got level={self.level}")
        if self.n_shown < 0:
            raise ValueError(f"code: n_shown must be >= 0, got n_shown={self.n_shown}")
        if not self.n_shown < self.n_hidden <= _MAX_HIDDEN:
            raise ValueError(f"code: n_hidden must be in (n_shown, {_MAX_HIDDEN}], got "
                             f"n_hidden={self.n_hidden} with n_shown={self.n_shown}")
        _check_limits(self.name, self.timeout_s, self.memory_mb)

    def _generate(self, rng: np.random.Generator) -> Example:
        for _ in range(_PROGRAM_DRAWS):
            prog = _draw_program(rng, self.level)
            neighbours = live_neighbours(prog)
            if neighbours is None:
                continue
            arg = _FAMILIES[prog.family].arg
            for _ in range(_INPUT_DRAWS):
                inputs = _draw_inputs(rng, arg, self.n_shown, self.n_hidden)
                if _distinguishes(prog, neighbours, inputs, self.n_shown):
                    return self._example(prog, inputs)
        raise RuntimeError(f"{self!r}: no testable program in {_PROGRAM_DRAWS} draws")

    def _example(self, prog: Program, inputs: list) -> Example:
        body, words = render(prog)
        outputs = [run_program(prog, a) for a in inputs]
        shown = "; ".join(f"f({a!r}) == {o!r}"
                          for a, o in zip(inputs[: self.n_shown], outputs, strict=False))
        doc = f"{words} {shown}" if shown else words
        prompt = f'def f({_FAMILIES[prog.family].arg}):\n    """{doc}"""\n'
        return Example(prompt=prompt, answer=body,
                       meta=CodeMeta(tests=assert_lines(inputs, outputs), program=prog))

    def _problem_key(self, ex: Example) -> str:
        return ex.answer  # the canonical body names the program

    def solution(self, ex: Example) -> str:
        return ex.answer


# ----------------------------------------------------------------------------- MBPP JSONL


def mbpp_prompt(text: str, first_test: str, imports: Sequence[str] = ()) -> str:
    """The MBPP prompt, Python comments then the test's imports:

        # <each line of the problem text>
        # Example: <the first test>
        <each test import line>

    so that prompt + a program (the completion) is a Python file."""
    lines = [f"# {line}".rstrip() for line in text.strip().splitlines()]
    lines.append(f"# Example: {first_test.strip()}")
    return "".join(f"{line}\n" for line in [*lines, *imports])


def _strings(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(v, str) and v.strip() for v in value)


def _is_assert(test: str) -> bool:
    try:
        body = ast.parse(test.strip()).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return len(body) == 1 and isinstance(body[0], ast.Assert)


def _read_mbpp(path: str, prompt_field: str) -> list[Example]:
    """The problems of an MBPP-style JSONL file, in file order; cached until the file changes."""

    def row(rec: dict) -> Example:
        for field in (prompt_field, "code"):
            if not isinstance(rec[field], str) or not rec[field].strip():
                raise ValueError(f"field '{field}' must be a non-empty string")
        if not _strings(rec["test_list"]):
            raise ValueError("field 'test_list' must be a non-empty list of assert strings")
        for k, test in enumerate(rec["test_list"]):
            if not _is_assert(test):
                raise ValueError(f"field 'test_list' item {k} is not one assert statement: "
                                 f"{test[:60]!r}")
        if "test_imports" in rec and not (rec["test_imports"] == []
                                          or _strings(rec["test_imports"])):
            raise ValueError("field 'test_imports' must be a list of strings")
        tests = [t.strip() for t in rec["test_list"]]
        code = rec["code"].replace("\r\n", "\n").strip("\n") + "\n"
        prompt = mbpp_prompt(rec[prompt_field], tests[0], rec.get("test_imports", ()))
        return Example(prompt=prompt, answer=code,
                       meta=CodeMeta(tests="".join(f"{t}\n" for t in tests)))

    return read_jsonl(path, (prompt_field, "code", "test_list"), "MBPP JSONL", row)


@dataclasses.dataclass(frozen=True)
class MBPPTask(_SandboxScored, DatasetTask):
    """MBPP-style problems from a local JSONL file, one object a line with `prompt` (the
    problem text; the field is `prompt_field`, e.g. "text" for the original MBPP file), `code`
    (the reference solution) and `test_list` (assert strings), and optionally `test_imports`.

    Prompt: `mbpp_prompt` (the text and the first test as comments, then the test imports);
    completion: a whole program (`solution` is `code`, "\\r\\n" -> "\\n"); hidden tests:
    `test_list`, one per line; meta: `CodeMeta(tests)`. Split: a problem is "test" iff the
    stable hash of its prompt is 0 mod 10 (as `Task.example`); `example(split, i)` visits that
    split's problems in a permutation drawn from (seed, split), cyclically (`DatasetTask`).
    Reward: the fraction of the tests passed in the sandbox.
    """

    name: ClassVar[str] = "mbpp_jsonl"
    path: str = ""  # the JSONL file
    prompt_field: str = "prompt"  # the field holding the problem text
    timeout_s: float = 2.0  # sandbox wall-clock limit per program
    memory_mb: int = 256  # sandbox memory limit per program

    def __post_init__(self):
        if not self.path:
            raise ValueError("mbpp_jsonl: pass path=<a JSONL file with 'prompt', 'code' and "
                             "'test_list' fields>")
        _check_limits(self.name, self.timeout_s, self.memory_mb)

    def _records(self, split: str) -> Sequence[Example]:
        path = os.path.expanduser(self.path)
        rows = _read_mbpp(path, self.prompt_field)
        key = ("mbpp_split", os.path.abspath(path), self.prompt_field, split)
        cached = SOURCE_CACHE.get(key)
        if cached is None or cached[0] is not rows:  # (re)split when the file was re-read
            part = [ex for ex in rows if (stable_hash(self._problem_key(ex)) % TEST_BUCKETS
                                          == 0) == (split == "test")]
            cached = SOURCE_CACHE[key] = (rows, part)
        return cached[1]

    def _where(self, split: str) -> str:
        return f"MBPP JSONL file '{self.path}' split {split!r}"

    def _to_example(self, record: Example) -> Example:
        return record

    def solution(self, ex: Example) -> str:
        return ex.answer


for _cls in (CodeTask, MBPPTask):
    TASKS.register(_cls.name, _cls)

__all__ = [
    "LEVELS",
    "CodeMeta",
    "CodeTask",
    "MBPPTask",
    "Program",
    "assert_lines",
    "default_pool",
    "is_python",
    "live_neighbours",
    "mbpp_prompt",
    "render",
    "run_program",
]

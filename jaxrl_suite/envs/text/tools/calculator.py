"""The `calculator` tool (safe arithmetic) and the task that needs it, `tool_arithmetic`.

calculator: args {"expr": "4821*5719-3021"} -> "27568278". The expression is parsed with
`ast.parse(expr, mode="eval")` and the tree is walked here (nothing is compiled or run): only int
and float literals, + - * / // % ** and unary + -, in any parentheses. Model input is hostile, so
every size is capped: the expression (MAX_EXPR_CHARS), exponents (|exp| <= MAX_EXPONENT, and no
power whose result would pass MAX_MAGNITUDE is computed) and every intermediate result
(|x| <= MAX_MAGNITUDE). Anything else raises `ToolError` with a short reason.

tool_arithmetic: "What is 4821*5719-3021?" -> "<answer>27568278</answer>": a product of two
`digits`-digit numbers and a third number, too long to work out in one's head.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import operator
from typing import ClassVar

import numpy as np

from jaxrl_suite.envs.text.base import TASKS, Example, extract_answer
from jaxrl_suite.envs.text.tools.base import TOOLS, ToolError, ToolTask, format_call
from jaxrl_suite.rewards.format import answer_tags
from jaxrl_suite.rewards.match import string_match

MAX_EXPR_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**30  # a larger |intermediate result| is an error
_MAX_LOG10 = 30  # log10(MAX_MAGNITUDE): bounds a power before it is computed
_ALLOWED = "use numbers and + - * / // % ** ( )"

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_NAMES = {  # how a rejected node is named in the error
    ast.Name: "names", ast.Call: "function calls", ast.Attribute: "attributes",
    ast.Subscript: "subscripts", ast.Compare: "comparisons", ast.BoolOp: "and/or",
    ast.Lambda: "lambdas", ast.Tuple: "tuples", ast.List: "lists", ast.Dict: "dicts",
    ast.Set: "sets", ast.JoinedStr: "strings", ast.IfExp: "if-expressions",
    ast.NamedExpr: "assignments",
}


def _checked(x: int | float) -> int | float:
    """`x` if it is a finite real number within MAX_MAGNITUDE, else ToolError."""
    if type(x) not in (int, float):
        raise ToolError("result is not a real number")
    if isinstance(x, float) and not math.isfinite(x) or abs(x) > MAX_MAGNITUDE:
        raise ToolError("result too large (limit 1e30)")
    return x


def _power(base: int | float, exp: int | float) -> int | float:
    """base ** exp, refused before it is computed if |exp| > MAX_EXPONENT or the result would
    pass MAX_MAGNITUDE."""
    if abs(exp) > MAX_EXPONENT:
        raise ToolError(f"exponent too large (limit {MAX_EXPONENT})")
    if base == 0 and exp < 0:
        raise ToolError("division by zero")
    if abs(base) not in (0, 1) and exp * math.log10(abs(base)) > _MAX_LOG10:
        raise ToolError("result too large (limit 1e30)")
    return base**exp


def _eval(node: ast.AST) -> int | float:
    """The value of an allowed expression tree; ToolError on anything else."""
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        if type(node.value) in (int, float):
            return _checked(node.value)
        kind = "strings" if isinstance(node.value, str | bytes) else type(node.value).__name__
        raise ToolError(f"{kind} not allowed; {_ALLOWED}")
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        a, b = _eval(node.left), _eval(node.right)
        op = type(node.op)
        if op is ast.Pow:
            return _checked(_power(a, b))
        if op is ast.Div and type(a) is int and type(b) is int and b and a % b == 0:
            return _checked(a // b)  # exact: 10**20/10 stays an int
        try:
            return _checked(_BINOPS[op](a, b))
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
    if isinstance(node, ast.BinOp | ast.UnaryOp):
        raise ToolError(f"operator {type(node.op).__name__} not allowed; {_ALLOWED}")
    what = _NAMES.get(type(node), type(node).__name__)
    raise ToolError(f"{what} not allowed; {_ALLOWED}")


def evaluate(expr: str) -> int | float:
    """The value of arithmetic expression `expr` (see the module docstring); ToolError if it is
    not one, or is too long, too large or divides by zero."""
    if len(expr) > MAX_EXPR_CHARS:
        raise ToolError(f"expression longer than {MAX_EXPR_CHARS} characters")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ToolError("not an arithmetic expression") from None
    try:
        return _eval(tree)
    except (OverflowError, RecursionError):
        raise ToolError("result too large (limit 1e30)") from None


def format_number(x: int | float) -> str:
    """The calculator's output text: an int as is ("42"); a float rounded to 6 decimals
    ("0.333333"), as an int if that is integral ("5", not "5.0"); a nonzero float that rounds
    to 0 with 6 significant digits ("1.23457e-07")."""
    if type(x) is int:
        return str(x)
    rounded = round(x, 6)
    if rounded == 0 and x != 0:
        return repr(float(f"{x:.6g}"))
    if rounded.is_integer() and abs(rounded) < 2**53:
        return str(int(rounded))
    return repr(rounded)


@TOOLS.register("calculator")
def calculator(args: dict, context: object = None) -> str:
    """The calculator tool: args {"expr": "<arithmetic>"} -> the value as text (see
    `format_number`); ToolError on a missing or bad expression."""
    expr = args.get("expr") if isinstance(args, dict) else None
    if not isinstance(expr, str):
        raise ToolError('args need "expr", the arithmetic as a string')
    return format_number(evaluate(expr))


_FORMS = ("{a}*{b}+{c}", "{a}*{b}-{c}", "{c}+{a}*{b}", "{c}-{a}*{b}")
_MAX_DIGITS = 12  # keeps the prompt under 50 characters and the result under 1e25


@dataclasses.dataclass(frozen=True)
class ToolArithmeticTask(ToolTask):
    """Arithmetic to do with the calculator: "What is 4821*5719-3021?", answer "27568278".

    The expression is a*b+c, a*b-c, c+a*b or c-a*b (one form drawn uniformly), a, b and c drawn
    uniformly among the `digits`-digit numbers; meta = (expression, a, b, c). The answer is the
    exact integer (Python's own arithmetic). Reward (`score`): 1.0 iff the first <answer>
    content, stripped, is exactly that integer. The expert calls the calculator on the
    expression as written in the prompt, then answers; tool_context is None. a*b+c, b*a+c and
    c+a*b share a split.
    """

    name: ClassVar[str] = "tool_arithmetic"
    tools: ClassVar[tuple[str, ...]] = ("calculator",)
    digits: int = 4
    seed: int = 0

    def __post_init__(self):
        if not 1 <= self.digits <= _MAX_DIGITS:
            raise ValueError(f"tool_arithmetic: digits must be in [1, {_MAX_DIGITS}], got "
                             f"digits={self.digits}")

    def _generate(self, rng: np.random.Generator) -> Example:
        lo = 0 if self.digits == 1 else 10 ** (self.digits - 1)
        a, b, c = (int(v) for v in rng.integers(lo, 10**self.digits, 3))
        form = int(rng.integers(len(_FORMS)))
        expr = _FORMS[form].format(a=a, b=b, c=c)
        value = (a * b + c, a * b - c, c + a * b, c - a * b)[form]
        return Example(prompt=f"What is {expr}?", answer=str(value), meta=(expr, a, b, c))

    def _problem_key(self, ex: Example) -> str:
        _, a, b, c = ex.meta
        return f"{min(a, b)}*{max(a, b)},{c}={ex.answer}"  # the factors, c and the value

    def tool_context(self, ex: Example) -> None:
        return None

    def solution(self, ex: Example) -> str:
        return answer_tags(ex.answer)

    def score(self, completion: str, ex: Example) -> float:
        return string_match(extract_answer(completion), ex.answer)

    def expert_turns(self, ex: Example, *, tools: bool = True) -> list[str]:
        if not tools:
            return [self.solution(ex)]
        return [format_call("calculator", expr=ex.meta[0]), self.solution(ex)]


TASKS.register(ToolArithmeticTask.name, ToolArithmeticTask)

__all__ = [
    "MAX_EXPONENT",
    "MAX_EXPR_CHARS",
    "MAX_MAGNITUDE",
    "ToolArithmeticTask",
    "calculator",
    "evaluate",
    "format_number",
]

"""Safe arithmetic expressions: an exact parser (never `eval`) and the countdown reward.

`parse_expression` is a small recursive-descent parser over `fractions.Fraction`: only integer
literals, + - * / and parentheses, with bounded length and nesting, so a hostile completion can
cost neither time nor memory. The countdown task (`envs.text.countdown`) scores its answers with
`expression_reward`; a calculator tool can evaluate with `parse_expression(text)` (no number
restriction).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from fractions import Fraction

MAX_EXPRESSION_CHARS = 100  # longer answers are invalid (and never parsed)
MAX_PAREN_DEPTH = 20  # deeper parenthesis nesting is invalid
_DIGITS = "0123456789"


def parse_expression(text: str, numbers: Iterable[int] | None = None) -> Fraction:
    """Evaluates an arithmetic expression, exactly, as a Fraction.

    Grammar: expr := term (('+'|'-') term)*;  term := factor (('*'|'/') factor)*;
    factor := INT | '(' expr ')'.  Whitespace is ignored; there is no unary minus or power; INT is
    ASCII digits without leading zeros. With `numbers`, each literal must be one of them and is
    used at most as many times as it appears there (not every number has to be used); with None,
    any literal is allowed.

    Raises:
      ValueError: if the text is malformed, longer than MAX_EXPRESSION_CHARS, nested deeper than
        MAX_PAREN_DEPTH, uses an unavailable number, or divides by zero.
    """
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    available = None if numbers is None else Counter(numbers)
    return _Parser(_tokenize(text), available).parse()


def expression_reward(content: str | None, numbers: Iterable[int], target: int, *,
                      graded: bool = False) -> float:
    """The countdown reward of an answer `content` (None: no answer) over `numbers`.

        r = 1                                            if value(content) == target
          = 0.5 * max(0, 1 - |value - target| / target)  if graded and the expression is valid
          = 0                                            otherwise (malformed, invalid, missing)

    The graded miss is < 0.5, so a miss never ties a hit; it is computed in exact arithmetic and
    clipped before the float conversion (no overflow). `target` > 0.
    """
    if content is None:
        return 0.0
    try:
        value = parse_expression(content, numbers)
    except ValueError:
        return 0.0
    if value == target:
        return 1.0
    if not graded:
        return 0.0
    miss = min(abs(value - target) / target, Fraction(1))  # clipped first: no float overflow
    return 0.5 * float(1 - miss)


def _tokenize(text: str) -> list[str]:
    tokens, i = [], 0
    while i < len(text):
        c = text[i]
        if c in _DIGITS:
            j = i + 1
            while j < len(text) and text[j] in _DIGITS:
                j += 1
            tokens.append(text[i:j])
            i = j
            continue
        if c in "+-*/()":
            tokens.append(c)
        elif not c.isspace():
            raise ValueError(f"unexpected character {c!r}")
        i += 1
    return tokens


class _Parser:
    """Recursive descent over `tokens`, consuming numbers from the multiset `available` (None:
    any literal)."""

    def __init__(self, tokens: list[str], available: Counter | None):
        self.tokens, self.pos, self.available = tokens, 0, available

    def parse(self) -> Fraction:
        value = self._expr(0)
        if self.pos != len(self.tokens):
            raise ValueError(f"unexpected token {self.tokens[self.pos]!r}")
        return value

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _next(self) -> str:
        token = self._peek()
        if token is None:
            raise ValueError("unexpected end of expression")
        self.pos += 1
        return token

    def _expr(self, depth: int) -> Fraction:
        value = self._term(depth)
        while self._peek() in ("+", "-"):
            op, rhs = self._next(), self._term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def _term(self, depth: int) -> Fraction:
        value = self._factor(depth)
        while self._peek() in ("*", "/"):
            op, rhs = self._next(), self._factor(depth)
            if op == "*":
                value *= rhs
            elif rhs == 0:
                raise ValueError("division by zero")
            else:
                value /= rhs
        return value

    def _factor(self, depth: int) -> Fraction:
        token = self._next()
        if token == "(":
            if depth >= MAX_PAREN_DEPTH:
                raise ValueError(f"parentheses nested deeper than {MAX_PAREN_DEPTH}")
            value = self._expr(depth + 1)
            if self._next() != ")":
                raise ValueError("expected ')'")
            return value
        if token[0] not in _DIGITS:
            raise ValueError(f"expected a number or '(', got {token!r}")
        if len(token) > 1 and token[0] == "0":
            raise ValueError(f"leading zero in {token!r}")
        n = int(token)
        if self.available is not None:
            if self.available[n] <= 0:
                raise ValueError(f"number {n} is not available")
            self.available[n] -= 1
        return Fraction(n)


__all__ = ["MAX_EXPRESSION_CHARS", "MAX_PAREN_DEPTH", "expression_reward", "parse_expression"]

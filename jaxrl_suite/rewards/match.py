"""Answer matchers: exact string match, numeric match and positional (list) match.

Each takes the extracted answer content (`rewards.format.extract_answer`; None when the completion
has no answer) and the gold answer, and returns a reward in [0, 1]. They parse, never evaluate,
and never raise on `str` input: a malformed or missing prediction scores 0.0.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal, InvalidOperation

MAX_NUMBER_CHARS = 64  # longer texts are not numbers (and never parsed)
MAX_INT_DIGITS = 18  # `parse_numbers`: longer integers make the list malformed

_NUMBER = re.compile(r"[+-]?\$?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)")

Matcher = Callable[[str | None, str], float]


def string_match(prediction: str | None, gold: str, *,
                 normalize: Callable[[str], str] | None = None) -> float:
    """Exact match: 1.0 iff n(prediction) == n(gold), with n = `normalize` (default: identity).

    A None prediction (no answer) scores 0.0. "0579" does not match "579" unless `normalize` says
    so; e.g. `normalize=str.casefold` for label names, `normalize_text`, or SQuAD's
    `rewards.qa.normalize_answer` (that is `rewards.qa.exact_match`).
    """
    if prediction is None:
        return 0.0
    if normalize is None:
        return float(prediction == gold)
    return float(normalize(prediction) == normalize(gold))


def normalize_text(text: str) -> str:
    """Case-folds and collapses each whitespace run to one space: " Hi \\t You" -> "hi you"."""
    return " ".join(text.casefold().split())


def parse_number(text: str) -> Decimal | None:
    """The number in `text`, exactly, or None if `text` is not one number.

    Surrounding whitespace, one trailing period, a `$` after the optional sign and thousands
    separators ("1,234", not "1,2") are ignored: "$1,234.50" -> Decimal("1234.50"), "-7." ->
    Decimal("-7"). Anything else ("72%", "72 apples", "1e3", "7/2") is not a number. Decimals
    compare by value, so parse_number("72.0") == parse_number("72"). Texts longer than
    MAX_NUMBER_CHARS are not numbers.
    """
    body = text.strip()
    if len(body) > MAX_NUMBER_CHARS:
        return None
    body = body.removesuffix(".")
    if not _NUMBER.fullmatch(body):
        return None
    try:
        return Decimal(body.replace("$", "").replace(",", ""))
    except InvalidOperation:  # unreachable for a full match; kept so parsing never raises
        return None


def numeric_match(prediction: str | None, gold: str) -> float:
    """1.0 iff both parse as numbers (`parse_number`) of equal value, else 0.0.

    "72.0", "$72" and " 72. " match "72"; "72 apples" and a gold that is not a number never match.
    """
    if prediction is None:
        return 0.0
    value = parse_number(prediction)
    return float(value is not None and value == parse_number(gold))


def best_match(prediction: str | None, golds: Iterable[str], match: Matcher) -> float:
    """max_g match(prediction, g) over the accepted answers `golds` (0.0 if there are none)."""
    return max((match(prediction, g) for g in golds), default=0.0)


def parse_numbers(content: str) -> list[int] | None:
    """Space-separated non-negative integers, e.g. "3 7 19" -> [3, 7, 19]; None if malformed.

    Each item is decimal digits only (Unicode decimal digits such as "٣" count, as for `int`;
    "²" or "-7" make the list malformed), at most MAX_INT_DIGITS of them; an empty list is
    malformed.
    """
    parts = content.split()
    if not parts or not all(p.isdecimal() and len(p) <= MAX_INT_DIGITS for p in parts):
        return None
    return [int(p) for p in parts]


def positional_matches(prediction: Sequence[int], gold: Sequence[int]) -> int:
    """#{i < len(gold) : prediction[i] == gold[i]}: how many positions hold the gold item (a
    longer prediction is cut at len(gold); a shorter one misses the rest)."""
    return sum(a == b for a, b in zip(prediction[: len(gold)], gold, strict=False))


__all__ = [
    "MAX_INT_DIGITS",
    "MAX_NUMBER_CHARS",
    "Matcher",
    "best_match",
    "normalize_text",
    "numeric_match",
    "parse_number",
    "parse_numbers",
    "positional_matches",
    "string_match",
]

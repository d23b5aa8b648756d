"""rewards.match: exact string match, numeric match, best-of-aliases and the integer-list match,
on hand-worked cases."""

from decimal import Decimal

import pytest

from jaxrl_suite.rewards import (
    MAX_NUMBER_CHARS,
    best_match,
    normalize_text,
    numeric_match,
    parse_number,
    parse_numbers,
    positional_matches,
    string_match,
    token_f1,
)


def test_string_match_is_exact_unless_normalised():
    assert string_match("579", "579") == 1.0
    assert string_match("0579", "579") == 0.0
    assert string_match("579.0", "579") == 0.0
    assert string_match("Sports", "sports") == 0.0
    assert string_match("Sports", "sports", normalize=str.casefold) == 1.0
    assert string_match(None, "579") == 0.0  # no answer
    assert string_match(None, "", normalize=str.casefold) == 0.0


def test_normalize_text():
    assert normalize_text(" Hello \t World\n") == "hello world"
    assert normalize_text("STRASSE") == normalize_text("straße")  # casefold, not lower
    assert string_match("Hello  world", "hello world", normalize=normalize_text) == 1.0
    assert string_match("hello, world", "hello world", normalize=normalize_text) == 0.0


@pytest.mark.parametrize("text, expected", [
    ("72", Decimal(72)),
    ("  72. ", Decimal(72)),
    ("72.0", Decimal(72)),
    ("1,234,567", Decimal(1234567)),
    ("$1,234.50", Decimal("1234.5")),
    ("-$5", Decimal(-5)),
    ("+.5", Decimal("0.5")),
    ("٧٢", Decimal(72)),  # Unicode decimal digits read as `Decimal` reads them
    ("1" * MAX_NUMBER_CHARS, Decimal("1" * MAX_NUMBER_CHARS)),
])
def test_parse_number(text, expected):
    assert parse_number(text) == expected


@pytest.mark.parametrize("text", [
    "", ".", "-", "$", "1,23", "12,34", "$-5", "7..", "72%", "72 apples", "1e3", "7/2", "NaN",
    "Infinity", "0x10", "1_000", "²", "1" * (MAX_NUMBER_CHARS + 1),
])
def test_parse_number_refuses(text):
    assert parse_number(text) is None


def test_numeric_match():
    assert numeric_match("72.0", "72") == 1.0
    assert numeric_match("$72", "72") == 1.0
    assert numeric_match("1,234", "1234") == 1.0
    assert numeric_match("-0", "0") == 1.0
    assert numeric_match("71.99", "72") == 0.0
    assert numeric_match("72 apples", "72") == 0.0
    assert numeric_match(None, "72") == 0.0
    assert numeric_match("seven", "seven") == 0.0  # a gold that is not a number never matches


def test_best_match_takes_the_best_alias():
    assert best_match("red barn", ["Ohio", "the red barn door"], token_f1) == pytest.approx(0.8)
    assert best_match("72.0", ["seventy-two", "72"], numeric_match) == 1.0
    assert best_match("x", [], string_match) == 0.0
    assert best_match(None, ["x"], string_match) == 0.0


@pytest.mark.parametrize("content, expected", [
    (" 3  7 19 ", [3, 7, 19]),
    ("0 0", [0, 0]),
    ("٣ 4", [3, 4]),  # Unicode decimal digits, as `int` reads them
    ("1" * 18, [int("1" * 18)]),
    ("", None),
    ("3,4", None),
    ("3 -7", None),
    ("3 7.0", None),
    ("² 3", None),  # a digit that is not decimal: `int` would raise (it used to crash SortTask)
    ("1" * 19, None),
])
def test_parse_numbers(content, expected):
    assert parse_numbers(content) == expected


@pytest.mark.parametrize("prediction, gold, expected", [
    ([3, 7, 19, 42], [3, 7, 19, 42], 4),
    ([7, 3, 19, 42], [3, 7, 19, 42], 2),
    ([3, 7, 1, 1, 1], [3, 7], 2),  # cut at len(gold)
    ([3], [3, 7, 9], 1),  # a shorter answer misses the rest
    ([], [1], 0),
])
def test_positional_matches(prediction, gold, expected):
    assert positional_matches(prediction, gold) == expected

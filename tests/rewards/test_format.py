"""rewards.format: answer extraction, answer tags and the format reward (hand-worked cases; the
basic cases are in tests/envs/test_arithmetic.py, which predates this package)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxrl_suite.rewards import answer_tags, extract_answer, format_reward


@pytest.mark.parametrize("text, expected", [
    ("<answer>579</answer>", "579"),
    ("<answer><answer>1</answer></answer>", "<answer>1"),  # first open, first close after it
    ("<answer>\n\t</answer>", ""),
    ("<answer>12", None),
    ("12</answer>", None),
    ("", None),
    ("<ANSWER>1</ANSWER>", None),  # tags are case-sensitive
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("<answer>not checked</answer>", 1.0),  # format only: the content is the verifiers' job
    ("<answer><answer>1</answer>", 0.0),
    ("<answer>1</answer></answer>", 0.0),
    ("</answer>1<answer>", 0.0),
    ("<answer>1</answer>\u200b", 0.0),  # a zero-width space is not whitespace
])
def test_format_reward(text, expected):
    assert format_reward(text) == expected


@given(st.text().filter(lambda s: "<answer>" not in s and "</answer>" not in s))
def test_answer_tags_round_trip(content):
    completion = answer_tags(content)
    assert completion == f"<answer>{content}</answer>"
    assert extract_answer(completion) == content.strip()
    assert format_reward(completion) == 1.0

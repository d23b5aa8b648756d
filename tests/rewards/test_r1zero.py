"""VisualThinker-R1-Zero's rewards (rewards/r1zero.py) on hand-written completions, and the
linear scans against the anchor's own regexes (grpo.py) on random tag soup."""

import re
import time

import numpy as np
import pytest

from jaxrl_suite.rewards import (
    extract_letters,
    length_reward,
    r1zero_accuracy,
    r1zero_answer,
    think_answer_format,
    think_span,
)

# the anchor's code, verbatim in effect (src/open-r1-multimodal/src/open_r1/grpo.py)
ANCHOR_FORMAT = r"<think>.*?</think>\s*<answer>.*?</answer>"


def anchor_format(completion: str) -> float:
    return 1.0 if re.fullmatch(ANCHOR_FORMAT, "<think>" + completion, re.DOTALL) else 0.0


def anchor_answer(content: str) -> str:
    m = re.search(r"<answer>(.*?)</answer>", content)
    return m.group(1).strip() if m else content.strip()


# The prompt ends inside "<think>", so completions start mid-thought.
@pytest.mark.parametrize("completion, expected", [
    ("red circle at (0,1).</think><answer>left</answer>", 1.0),
    ("</think><answer>left</answer>", 1.0),  # an empty think counts
    ("x</think> \n <answer>left</answer>", 1.0),  # whitespace between the blocks
    ("x</think><answer></answer>", 1.0),  # an empty answer still has the format
    ("<think>x</think><answer>left</answer>", 1.0),  # a repeated open tag sits inside .*?
    ("x</think><answer>a</answer>b</think><answer>c</answer>", 1.0),  # lazy .*? + full match
    ("x</think><answer>left</answer> ", 0.0),  # trailing text (even a space) after the answer
    ("x</think><answer>left</answer>\nthanks", 0.0),
    ("x</think>so<answer>left</answer>", 0.0),  # text between the blocks
    ("<answer>left</answer>", 0.0),  # missing think close
    ("x<answer>left</answer></think>", 0.0),  # blocks in the wrong order
    ("x</think><answer>left", 0.0),  # unclosed answer
    ("x</think><answer>left</answer", 0.0),
    ("x</think>", 0.0),
    ("", 0.0),
    ("x</Think><answer>left</answer>", 0.0),  # tags are case-sensitive
], ids=range(16))
def test_format_hand_cases(completion, expected):
    assert think_answer_format(completion) == expected
    assert anchor_format(completion) == expected


def test_format_without_the_prompts_think():
    c = "<think>a</think><answer>b</answer>"
    assert think_answer_format(c, prompt_opens=False) == 1.0
    assert think_answer_format("a</think><answer>b</answer>", prompt_opens=False) == 0.0


def test_format_and_answer_scans_equal_the_anchors_regexes_on_tag_soup():
    rng = np.random.default_rng(0)
    parts = ["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "a", "B", "(C)", "<",
             "</", ">"]
    for _ in range(4000):
        s = "".join(parts[i] for i in rng.integers(0, len(parts), rng.integers(0, 12)))
        assert think_answer_format(s) == anchor_format(s), s
        assert r1zero_answer(s) == anchor_answer(s), s


def test_think_span():
    assert think_span("abc</think><answer>1</answer>") == "abc"
    assert think_span(" a </think>") == " a "
    assert think_span("<answer>1</answer>") is None  # never closed
    assert think_span("<answer>1</answer>", prompt_opens=False) is None
    assert think_span("<think>q</think><answer>1</answer>", prompt_opens=False) == "q"
    assert think_span("x</think>y</think>") == "x"  # the first close


@pytest.mark.parametrize("completion, golds, expected", [
    ("x</think><answer>left</answer>", "left", 1.0),
    ("x</think><answer> left </answer>", "left", 1.0),  # stripped
    ("x</think><answer>Left</answer>", "left", 0.0),  # exact, case-sensitive
    ("x</think><answer>the left</answer>", "left", 0.0),
    ("x</think><answer>3.0</answer>", "3", 1.0),  # numeric (math_verify's stand-in)
    ("x</think><answer>three</answer>", "3", 0.0),
    ("x</think><answer>(B) right</answer>", ("right", "B"), 1.0),  # the letter path
    ("x</think><answer>right</answer>", ("right", "B"), 1.0),  # the text path
    ("x</think><answer>(A) left</answer>", ("right", "B"), 0.0),
    ("x</think><answer>left</answer><answer>right</answer>", "right", 0.0),  # first counts
    ("left", "left", 1.0),  # no answer tag: the whole completion (the anchor's fallback)
    ("so it is B", "B", 1.0),  # ... and its last stand-alone letter
    ("x</think><answer>le\nft</answer>", "left", 0.0),  # no DOTALL: compared whole
    ("", "left", 0.0),
], ids=range(14))
def test_accuracy_hand_cases(completion, golds, expected):
    assert r1zero_accuracy(completion, golds) == expected


def test_extract_letters_is_the_anchors_regex():
    assert extract_letters("A B") == ["A"]  # findall's matches do not overlap
    assert extract_letters("(B) or C") == ["B", "C"]
    assert extract_letters("AB [H]") == ["H"]
    assert extract_letters("I") == []  # A-H only


def test_length_reward():
    assert length_reward(250) == pytest.approx(0.25)
    np.testing.assert_allclose(length_reward(np.array([[0, 10], [700, 3]])),
                               [[0.0, 0.01], [0.7, 0.003]])
    assert length_reward(10, per_token=0.01) == pytest.approx(0.1)


def test_hostile_inputs_are_linear():
    huge = ["</think><answer></answer>" * 8000 + "x", "<answer>" * 40_000,
            "<think>" + " " * 200_000, "</think>" + "\n" * 100_000 + "<answer" * 10_000]
    t0 = time.perf_counter()
    for s in huge:
        assert think_answer_format(s) in (0.0, 1.0)
        assert r1zero_accuracy(s, ("left", "B")) in (0.0, 1.0)
        think_span(s)
    assert time.perf_counter() - t0 < 2.0

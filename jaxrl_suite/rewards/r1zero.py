"""VisualThinker-R1-Zero's rewards: the think/answer format, the accuracy reward and the naive
length reward, as the anchor computes them.

Anchor: turningpoint-ai/VisualThinker-R1-Zero, `src/open-r1-multimodal/src/open_r1/grpo.py`
(`format_reward`, `accuracy_reward`, `length_reward`; R1-Zero recipe of DeepSeek-R1, arXiv
2501.12948; VisualThinker-R1-Zero, arXiv 2503.05132). There the base model's prompt ends inside
the think block ("...Assistant: Let me solve this step by step.\\n<think>") and the completion
is a plain string, so `format_reward` matches "<think>" + completion: the prompt's `<think>` IS
counted, by prefixing it. `prompt_opens=True` (the default) does the same; `prompt_opens=False`
matches the completion alone (a prompt that does not open the think block).

Completions are hostile input: everything here is linear time and never raises on a `str` (the
anchor's regexes are rewritten as scans that accept exactly the same strings; the tests compare
them with the regexes).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from jaxrl_suite.rewards.format import ANSWER_CLOSE, ANSWER_OPEN
from jaxrl_suite.rewards.match import parse_number

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
LENGTH_PER_TOKEN = 0.001  # the anchor's naive length reward per completion token

_JOIN = re.compile(r"</think>\s*<answer>")
_LETTERS = re.compile(r"(^|\s|\[|\()([A-H])(\s|\]|\)|$)")  # the anchor's `extract_letters`


def _opened(completion: str, prompt_opens: bool) -> str:
    return THINK_OPEN + completion if prompt_opens else completion


def think_span(completion: str, *, prompt_opens: bool = True) -> str | None:
    """The think text: in t = ("<think>" if prompt_opens else "") + completion, the text between
    the first "<think>" and the first "</think>" after it (unstripped); None if t has no such
    pair. "abc</think><answer>1</answer>" -> "abc" (prompt_opens); "<answer>1</answer>" -> None
    (prompt_opens=False)."""
    t = _opened(completion, prompt_opens)
    start = t.find(THINK_OPEN)
    if start < 0:
        return None
    start += len(THINK_OPEN)
    end = t.find(THINK_CLOSE, start)
    return None if end < 0 else t[start:end]


def think_answer_format(completion: str, *, prompt_opens: bool = True) -> float:
    """The anchor's format reward: 1.0 iff t fully matches
    `<think>.*?</think>\\s*<answer>.*?</answer>` (re.DOTALL), t = "<think>" + completion if
    prompt_opens else completion; else 0.0.

    r_format(y) = 1[t = "<think>" a "</think>" w "<answer>" b "</answer>"], a and b any text (tags
    included), w whitespace. So an empty think counts, text after the closing answer tag or
    before the think does not, and nested or repeated tags inside a or b do (the anchor's lazy
    `.*?` under a full match). Computed as one linear scan: t starts with "<think>", ends with
    "</answer>", and "</think>" w "<answer>" occurs between them.
    """
    t = _opened(completion, prompt_opens)
    if not (t.startswith(THINK_OPEN) and t.endswith(ANSWER_CLOSE)):
        return 0.0
    hit = _JOIN.search(t, len(THINK_OPEN), len(t) - len(ANSWER_CLOSE))
    return float(hit is not None)


def extract_letters(text: str) -> list[str]:
    """The anchor's `extract_letters` (written for RAVEN): the option letters A-H standing alone
    (after start / whitespace / "[" / "(", before whitespace / "]" / ")" / end), by its regex's
    `findall`, whose matches do not overlap: "A B" -> ["A"], "(B) or C" -> ["B", "C"]."""
    return [m[1] for m in _LETTERS.findall(text)]


def r1zero_answer(completion: str) -> str:
    """The anchor's student answer: the stripped content of the first `<answer>(.*?)</answer>`
    (re.search without DOTALL: the content holds no newline), else the whole completion,
    stripped."""
    i = completion.find(ANSWER_OPEN)
    close = newline = -1
    while i >= 0:
        start = i + len(ANSWER_OPEN)
        if close < start:  # the next close / newline after `start`, each found once per move
            close = completion.find(ANSWER_CLOSE, start)
            if close < 0:
                break
        if newline < start:
            newline = completion.find("\n", start)
            newline = len(completion) if newline < 0 else newline
        if close < newline:
            return completion[start:close].strip()
        i = completion.find(ANSWER_OPEN, start)
    return completion.strip()


def r1zero_accuracy(completion: str, golds: str | Sequence[str]) -> float:
    """The anchor's accuracy reward: 1.0 iff the student answer a = `r1zero_answer(completion)`
    matches one accepted answer g in `golds`, else 0.0, where a matches g iff

        a == g                                   (the anchor's string match)
        or extract_letters(a)[-1] == g           (its letter match, e.g. g = "B")
        or parse_number(a) == parse_number(g)    (g a number; stands in for math_verify)

    The anchor first tries math_verify's symbolic `verify(parse(content), parse(solution))` on
    the whole completion; we replace it by exact numeric equality of the answer (so "3.0" and
    " 3 " match "3"), which never reads numbers from the think text. Note the anchor's fallback:
    a completion without a closed answer on one line is compared whole, so its last stand-alone
    letter can match a letter gold.
    """
    answers = (golds,) if isinstance(golds, str) else tuple(golds)
    a = r1zero_answer(completion)
    letters = extract_letters(a)
    value = parse_number(a)
    for g in answers:
        if a == g or (letters and letters[-1] == g):
            return 1.0
        if value is not None and value == parse_number(g):
            return 1.0
    return 0.0


def length_reward(num_tokens, *, per_token: float = LENGTH_PER_TOKEN):
    """The anchor's naive length reward: r_len = per_token * |y|, |y| the completion's token
    count (the anchor counts Qwen2-VL tokens of the decoded completion; count with the run's
    tokenizer). Scalar or array in, same shape out."""
    out = per_token * np.asarray(num_tokens, dtype=np.float64)
    return float(out) if out.ndim == 0 else out


__all__ = [
    "LENGTH_PER_TOKEN",
    "THINK_CLOSE",
    "THINK_OPEN",
    "extract_letters",
    "length_reward",
    "r1zero_accuracy",
    "r1zero_answer",
    "think_answer_format",
    "think_span",
]

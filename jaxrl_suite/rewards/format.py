"""The `<answer>...</answer>` completion format: answer extraction and the format reward.

Every verifiable text task asks for its answer inside answer tags; the correctness verifiers
(`rewards.match`, `rewards.qa`, `rewards.expression`) score the extracted content, and
`format_reward` rewards the bare format (R1-style format reward, DeepSeek-R1, arXiv 2501.12948).
Completions are hostile input: every function here is linear time and never raises on a `str`.
"""

from __future__ import annotations

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"


def extract_answer(text: str) -> str | None:
    """Returns the stripped content of the first `<answer>...</answer>` in `text`, else None.

    The first opening tag counts, closed by the first closing tag after it:
    "a <answer> 12 </answer> b <answer>3</answer>" -> "12"; "<answer>12" -> None. Linear time
    (plain `str.find`), so arbitrarily long garbage is cheap.
    """
    start = text.find(ANSWER_OPEN)
    if start < 0:
        return None
    start += len(ANSWER_OPEN)
    end = text.find(ANSWER_CLOSE, start)
    return None if end < 0 else text[start:end].strip()


def answer_tags(content: str) -> str:
    """Wraps `content` as a well-formatted completion: "<answer>content</answer>"."""
    return f"{ANSWER_OPEN}{content}{ANSWER_CLOSE}"


def format_reward(text: str) -> float:
    """1.0 iff `text` is one `<answer>...</answer>` and nothing else but whitespace, else 0.0.

    r_format(y) = 1[strip(y) = "<answer>" c "</answer>", c holding no answer tag]
    """
    body = text.strip()
    ok = (
        body.startswith(ANSWER_OPEN)
        and body.endswith(ANSWER_CLOSE)
        and body.count(ANSWER_OPEN) == 1
        and body.count(ANSWER_CLOSE) == 1
    )
    return 1.0 if ok else 0.0


__all__ = ["ANSWER_CLOSE", "ANSWER_OPEN", "answer_tags", "extract_answer", "format_reward"]

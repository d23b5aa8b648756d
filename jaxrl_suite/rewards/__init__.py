"""Verifiable rewards on decoded text: answer format, exact / numeric / list matches, SQuAD EM
and F1, safe arithmetic expressions, AEPO's adaptive exploration reward (aepo.py) and the
composite screening reward with its collapse report (composite.py), s3's searcher format,
document selection and Gain-Beyond-RAG rewards (gbr.py), VisualThinker-R1-Zero's think/answer
format, accuracy and length rewards (r1zero.py) and SpatialTree's auto-think rules
(auto_think.py), and KF-GRPO's contrastive, saliency-weighted bonus on arrays (kf_grpo.py).
Plain Python on `str`, run between jitted calls; `jax_verify` computes the
answer-format, exact-match and number-list rewards from token ids inside JAX, equal to these.

A completion is hostile input: these functions parse, never evaluate, are linear in the input (or
refuse inputs over a length cap) and never raise on a `str`; a malformed answer scores 0.0. The
text tasks (`envs.text`) build their `score` from them. This package imports nothing above
`core`, so any layer may use it.
"""

from jaxrl_suite.rewards.aepo import aepo_reward, aepo_text_reward, parse_points
from jaxrl_suite.rewards.auto_think import (
    auto_think_level_rewards,
    auto_think_probe_rewards,
    is_thinking,
    level_mode_term,
)
from jaxrl_suite.rewards.composite import (
    CompositeConfig,
    collapse_report,
    composite_components,
    parse_screening,
)
from jaxrl_suite.rewards.expression import (
    MAX_EXPRESSION_CHARS,
    MAX_PAREN_DEPTH,
    expression_reward,
    parse_expression,
)
from jaxrl_suite.rewards.format import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    answer_tags,
    extract_answer,
    format_reward,
)
from jaxrl_suite.rewards.gbr import (
    SEARCH_REWARDS,
    parse_search_turn,
    passage_recall,
    search_reward,
    selected_documents,
)
from jaxrl_suite.rewards.jax_verify import TokenVerifier
from jaxrl_suite.rewards.kf_grpo import T_GRPO, contrast_gate, kf_grpo_rewards
from jaxrl_suite.rewards.match import (
    MAX_INT_DIGITS,
    MAX_NUMBER_CHARS,
    Matcher,
    best_match,
    normalize_text,
    numeric_match,
    parse_number,
    parse_numbers,
    positional_matches,
    string_match,
)
from jaxrl_suite.rewards.qa import (
    QA_METRICS,
    exact_match,
    normalize_answer,
    span_match,
    token_f1,
)
from jaxrl_suite.rewards.r1zero import (
    THINK_CLOSE,
    THINK_OPEN,
    extract_letters,
    length_reward,
    r1zero_accuracy,
    r1zero_answer,
    think_answer_format,
    think_span,
)

__all__ = [
    "ANSWER_CLOSE",
    "ANSWER_OPEN",
    "MAX_EXPRESSION_CHARS",
    "MAX_INT_DIGITS",
    "MAX_NUMBER_CHARS",
    "MAX_PAREN_DEPTH",
    "QA_METRICS",
    "SEARCH_REWARDS",
    "THINK_CLOSE",
    "THINK_OPEN",
    "T_GRPO",
    "CompositeConfig",
    "Matcher",
    "TokenVerifier",
    "aepo_reward",
    "aepo_text_reward",
    "answer_tags",
    "auto_think_level_rewards",
    "auto_think_probe_rewards",
    "best_match",
    "collapse_report",
    "composite_components",
    "contrast_gate",
    "exact_match",
    "expression_reward",
    "extract_answer",
    "extract_letters",
    "format_reward",
    "is_thinking",
    "kf_grpo_rewards",
    "length_reward",
    "level_mode_term",
    "normalize_answer",
    "normalize_text",
    "numeric_match",
    "parse_expression",
    "parse_number",
    "parse_numbers",
    "parse_points",
    "parse_screening",
    "parse_search_turn",
    "passage_recall",
    "positional_matches",
    "r1zero_accuracy",
    "r1zero_answer",
    "search_reward",
    "selected_documents",
    "span_match",
    "string_match",
    "think_answer_format",
    "think_span",
    "token_f1",
]

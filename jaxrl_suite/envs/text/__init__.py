"""Verifiable text tasks (arithmetic, countdown, sort), the self-iteration prompt format and the
tokenizer wrapper used by LM RL."""

from jaxrl_suite.envs.text.arithmetic import ArithmeticTask
from jaxrl_suite.envs.text.base import (
    SPLITS,
    TASKS,
    Example,
    Task,
    answer_tags,
    extract_answer,
    format_reward,
    make_task,
)
from jaxrl_suite.envs.text.countdown import CountdownMeta, CountdownTask, parse_expression
from jaxrl_suite.envs.text.iteration import IterationMix, iteration_prompt, previous_answer
from jaxrl_suite.envs.text.sort import SortTask, parse_numbers
from jaxrl_suite.envs.text.tokenizer import Tokenizer, load_tokenizer

__all__ = [
    "SPLITS",
    "TASKS",
    "ArithmeticTask",
    "CountdownMeta",
    "CountdownTask",
    "SortTask",
    "Example",
    "IterationMix",
    "Task",
    "Tokenizer",
    "answer_tags",
    "extract_answer",
    "format_reward",
    "iteration_prompt",
    "load_tokenizer",
    "make_task",
    "parse_expression",
    "parse_numbers",
    "previous_answer",
]

"""Verifiable text tasks (arithmetic, countdown, sort, count; code, with hidden tests run in the
sandbox; plots in a checkable story world, envs/text/story;
tool-use tasks for agents, envs/text/tools; GUI grounding, gui.py (AEPO); resume screening,
screening.py; topic classification, topics.py (GenCLS++); multi-hop QA over a generated fact
world, facts.py, and s3's searcher and reader tasks over it, search.py; dataset-backed: gsm8k,
ag_news, imdb, trivia_qa, nq_open from TFDS, jsonl and MBPP-style jsonl from a local file), BM25
passage retrieval (retrieval.py), the self-iteration prompt format and the tokenizer wrapper
used by LM RL."""

from jaxrl_suite.envs.text.arithmetic import ArithmeticTask
from jaxrl_suite.envs.text.base import (
    SPLITS,
    TASKS,
    Example,
    ExampleList,
    Task,
    answer_tags,
    extract_answer,
    format_reward,
    make_task,
)
from jaxrl_suite.envs.text.code import CodeTask, MBPPTask
from jaxrl_suite.envs.text.count import CountTask
from jaxrl_suite.envs.text.countdown import CountdownMeta, CountdownTask, parse_expression
from jaxrl_suite.envs.text.dialects import DialectsTask
from jaxrl_suite.envs.text.facts import FactsQATask, FactWorld, naive_topk, world_retriever
from jaxrl_suite.envs.text.gui import GuiTask
from jaxrl_suite.envs.text.iteration import IterationMix, iteration_prompt, previous_answer
from jaxrl_suite.envs.text.retrieval import Retriever
from jaxrl_suite.envs.text.screening import ScreeningTask
from jaxrl_suite.envs.text.search import ReaderTask, SearchTask
from jaxrl_suite.envs.text.sort import SortTask, parse_numbers
from jaxrl_suite.envs.text.story import StoryTask
from jaxrl_suite.envs.text.tfds_tasks import (
    AgNewsTask,
    ClassificationTask,
    DatasetTask,
    Gsm8kTask,
    ImdbTask,
    JsonlTask,
    NqOpenTask,
    QaTask,
    TfdsTask,
    TriviaQaTask,
    clear_dataset_cache,
    exact_match,
    normalize_answer,
    parse_number,
    token_f1,
)
from jaxrl_suite.envs.text.tokenizer import Tokenizer, load_tokenizer
from jaxrl_suite.envs.text.tools import (  # tool tasks (registers them and their tools)
    FixTestsTask,
    RepoSearchTask,
    ToolArithmeticTask,
    ToolMix,
    ToolTask,
)
from jaxrl_suite.envs.text.topics import TopicsTask

__all__ = [
    "SPLITS",
    "TASKS",
    "AgNewsTask",
    "ArithmeticTask",
    "ClassificationTask",
    "CodeTask",
    "CountTask",
    "CountdownMeta",
    "CountdownTask",
    "DialectsTask",
    "FactWorld",
    "FactsQATask",
    "FixTestsTask",
    "RepoSearchTask",
    "ToolArithmeticTask",
    "ToolMix",
    "ToolTask",
    "DatasetTask",
    "Gsm8kTask",
    "GuiTask",
    "MBPPTask",
    "ImdbTask",
    "JsonlTask",
    "NqOpenTask",
    "QaTask",
    "ReaderTask",
    "Retriever",
    "ScreeningTask",
    "SearchTask",
    "SortTask",
    "StoryTask",
    "Example",
    "ExampleList",
    "IterationMix",
    "Task",
    "TfdsTask",
    "Tokenizer",
    "TopicsTask",
    "TriviaQaTask",
    "answer_tags",
    "clear_dataset_cache",
    "exact_match",
    "extract_answer",
    "format_reward",
    "iteration_prompt",
    "load_tokenizer",
    "make_task",
    "naive_topk",
    "normalize_answer",
    "parse_expression",
    "parse_number",
    "parse_numbers",
    "previous_answer",
    "token_f1",
    "world_retriever",
]

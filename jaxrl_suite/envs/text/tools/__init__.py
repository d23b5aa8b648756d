"""Tools for LM agents (a registry: calculator, code_search, run_tests) and the tasks that need
them (see `base` for the call format)."""

from jaxrl_suite.envs.text.tools.base import (
    TOOLS,
    ToolError,
    ToolOutput,
    ToolTask,
    Turn,
    format_call,
    format_observation,
    parse_turn,
    run_tool,
)
from jaxrl_suite.envs.text.tools.calculator import ToolArithmeticTask
from jaxrl_suite.envs.text.tools.code_search import RepoIndex, RepoSearchTask, generate_repo
from jaxrl_suite.envs.text.tools.mix import ToolMix
from jaxrl_suite.envs.text.tools.run_tests import FixTestsTask

__all__ = [
    "TOOLS",
    "FixTestsTask",
    "RepoIndex",
    "RepoSearchTask",
    "ToolArithmeticTask",
    "ToolMix",
    "generate_repo",
    "ToolError",
    "ToolOutput",
    "ToolTask",
    "Turn",
    "format_call",
    "format_observation",
    "parse_turn",
    "run_tool",
]

"""The tool-task mixture and the expert's episodes of every tool task, with the real tools."""

import pytest

from jaxrl_suite.algorithms.agent import AgentConfig, EpisodeRunner, expert_episodes
from jaxrl_suite.algorithms.executors import LocalToolExecutor
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text import load_tokenizer, make_task
from jaxrl_suite.envs.text.tools import ToolMix, ToolOutput, run_tool

NAMES = ("tool_arithmetic", "repo_search", "fix_tests")


def test_mix_routes_problems_to_their_sub_tasks():
    mix = make_task("tool_mix")
    assert isinstance(mix, ToolMix) and mix.tools == ("calculator", "code_search", "run_tests")
    for i in range(6):
        ex = mix.example("train", i)
        part, inner = mix.part(ex)
        assert mix.kind(ex) == NAMES[i % 3] == part.name
        assert inner == make_task(NAMES[i % 3]).example("train", i // 3)
        assert mix.solution(ex) == part.solution(inner)
        assert mix.tool_context(ex) == part.tool_context(inner)
        assert mix.expert_turns(ex, tools=False) == [part.solution(inner)]
    with pytest.raises(ValueError, match="not a tool task"):
        ToolMix(names=("arithmetic",))


def test_mix_verifies_each_problem_with_its_own_verifier():
    mix = make_task("tool_mix")
    examples = mix.examples("train", 0, 6)
    right = [mix.solution(ex) for ex in examples]
    wrong = ["<answer>1</answer>"] * 6
    v = mix.verify_batch(right[:3] + wrong[3:], examples)
    assert v.scores[:3] == [1.0] * 3 and v.scores[3] == v.scores[4] == 0.0
    assert v.scores[5] < 1.0  # fix_tests: the body "1" fails the hidden tests
    assert v.outcomes[2] == "ok" and v.outcomes[0] == "scored"
    with pytest.raises(ValueError, match="completions for"):
        mix.verify_batch(right[:2], examples)


def test_expert_episodes_of_every_tool_task_succeed_with_the_real_tools():
    mix = make_task("tool_mix")
    runner = EpisodeRunner(mix, load_tokenizer(), None, AgentConfig(max_turns=4,
                           episode_tokens=384, obs_chars=240), prompt_len=104,
                           mesh=make_mesh(1))
    with LocalToolExecutor(2, kind="thread") as ex:
        eps = expert_episodes(runner, mix.examples("train", 0, 9), executor=ex)
    for ep in eps:
        assert ep.score == 1.0 and ep.tool_errors == 0 and not ep.truncated, ep.final
        assert ep.tool_calls == (2 if mix.kind(ep.example) == "fix_tests" else 1)


def test_tools_are_registered_in_worker_processes():
    with LocalToolExecutor(1) as ex:
        out = ex.submit(run_tool, "calculator", {"expr": "6*7"}, None).result(timeout=120)
    assert out == ToolOutput("42", True)

"""The agent_tools experiment (issue 20) through the CLI at smoke size, resumed."""

import json
import re

import pytest
from lm_helpers import killed_and_resumed

from jaxrl_suite.cli import main
from jaxrl_suite.core.config import load_config
from jaxrl_suite.core.metrics import read_metrics
from jaxrl_suite_experiments.agent_tools import (
    EXPERIMENT,
    VARIANTS,
    Config,
    agent_config,
    grpo_config,
)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("agent_tools")
    assert main(["run", "agent_tools", "--smoke", "--no-progress", "--out", str(out)]) == 0
    return out, json.loads((out / "summary.json").read_text())


def test_smoke_run_writes_results(smoke):
    out, summary = smoke
    assert list(summary["variants"]) == list(VARIANTS)
    assert set(summary["sft"]) == {"sft_tools", "sft_direct", "sft_more_tools",
                                   "sft_more_direct"}
    for name in ("table.md", "success.png", "reward.png", "turns.png"):
        assert (out / name).is_file(), name
    for name, sft in summary["sft"].items():
        if not name.startswith("sft_more"):  # the SFTs record their demonstrations
            assert sft["demo_success"] == 1.0  # the expert's episodes, real tools, all solved
        assert 0.0 <= sft["sampled_success"] <= 1.0  # one episode sampled at grpo.temperature
    assert summary["sft"]["sft_direct"]["demo_turns"] == 1.0
    assert summary["sft"]["sft_more_direct"]["turns"] == 1.0  # the direct SFT, continued
    assert summary["sft"]["sft_tools"]["demo_turns"] > 2.0  # 2-3 turns a problem
    for stats in summary["variants"].values():
        assert 0.0 <= stats["success"]["mean"] <= 1.0
        assert 0.0 <= stats["sampled_success"]["mean"] <= 1.0
        for kind in ("tool_arithmetic", "repo_search", "fix_tests"):
            assert f"success/{kind}" in stats
    assert summary["variants"]["direct"]["turns"]["mean"] == 1.0
    assert "sampled_success" in (out / "table.md").read_text()


def test_runs_log_episode_metrics_and_staleness(smoke):
    out, _ = smoke
    for variant in VARIANTS:
        recs = [r for r in read_metrics(out / "runs" / f"{variant}_s0" / "metrics.jsonl")
                if r["stage"] == "grpo"]
        assert [r["step"] for r in recs] == [1, 2]
        for r in recs:
            for k in ("reward", "turns", "format_fail_rate", "tool_error_rate", "loss"):
                assert k in r, (variant, k)
            assert r["max_staleness"] <= (1 if variant == "tools_async" else 0)
    # the async run's second rollout was generated while the first update ran
    recs = read_metrics(out / "runs" / "tools_async_s0" / "metrics.jsonl")
    assert [r for r in recs if r.get("stage") == "grpo"][1]["stale_token_frac"] > 0


def test_continued_sft_control_resumes_the_sft(smoke):
    """The control continues each SFT from its last step for grpo.steps (2) more steps."""
    out, _ = smoke
    for name in ("sft_more_tools", "sft_more_direct"):
        recs = [r for r in read_metrics(out / "runs" / name / "metrics.jsonl")
                if r["stage"] == "sft_more"]
        assert [r["step"] for r in recs] == [3, 4], name  # smoke: sft.steps 2
        assert all(r["loss"] > 0 for r in recs)
        assert (out / "checkpoints" / name / "4").is_dir()


def test_resume_reads_finished_runs_back(smoke):
    out, summary = smoke
    assert main(["run", "agent_tools", "--smoke", "--no-progress", "--resume", "--out",
                 str(out)]) == 0
    again = json.loads((out / "summary.json").read_text())
    assert again["variants"] == summary["variants"] and again["sft"] == summary["sft"]


def test_a_killed_run_resumes_exactly(tmp_path):
    """A run killed after step 2 of 4 and resumed logs the uninterrupted run's steps 3 and 4:
    the episodes' sampling key is the train state's, the data cursor the checkpoint's."""
    sets = ["--set", "variants.names=[tools]", "--set", "grpo.steps=4",
            "--set", "run.checkpoint_every=2"]
    straight, killed = killed_and_resumed("agent_tools", sets, tmp_path, ["tools_s0"],
                                          killed_at=2)

    def grpo_records(out):
        # every logged number but the timings and lm_fill (the runner's padding ratio, counted
        # from the start of the process, not of the run)
        return [{k: v for k, v in r.items() if not re.search("time|per_s|lm_fill", k)}
                for r in read_metrics(out / "runs" / "tools_s0" / "metrics.jsonl")
                if r["stage"] == "grpo"]

    a, b = grpo_records(straight), grpo_records(killed)
    assert [r["step"] for r in b] == [1, 2, 3, 4]  # each step once
    assert len({r["length"] for r in a}) > 1  # the steps sample different episodes
    assert a == b
    ra = json.loads((straight / "runs" / "tools_s0" / "result.json").read_text())
    rb = json.loads((killed / "runs" / "tools_s0" / "result.json").read_text())
    assert {k: v for k, v in ra.items() if "time" not in k} == \
        {k: v for k, v in rb.items() if "time" not in k}


def test_variants_set_the_episode_settings():
    cfg = Config()
    assert agent_config(cfg, "direct").tools is False
    assert agent_config(cfg, "direct").max_turns == 1
    assert agent_config(cfg, "tools_async").max_staleness == cfg.variants.max_staleness
    assert agent_config(cfg, "tools") == cfg.agent
    yaml = load_config(Config, EXPERIMENT.default_config())  # issue 42's rule
    assert yaml.grpo.dynamic_sampling and yaml.grpo.group_size == 8
    assert grpo_config(yaml, "tools") == yaml.grpo
    assert not grpo_config(yaml, "tools_async").dynamic_sampling  # refused with staleness
    with pytest.raises(ValueError, match="set per variant"):
        Config(agent=agent_config(cfg, "tools_async"))

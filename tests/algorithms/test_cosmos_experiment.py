"""The cosmos_mcts_orpo experiment (issue 21) through the CLI at smoke size, then resumed after a
simulated kill."""

import json

import pytest

from jaxrl_suite.cli import main
from jaxrl_suite.core.config import ConfigError
from jaxrl_suite.core.metrics import read_metrics
from jaxrl_suite_experiments.cosmos_mcts_orpo import Config

ROWS = ["small, greedy (SFT)", "small + MCTS", "small + MCTS, exact step values",
        "small + 1 ORPO round, greedy",
        "small + 2 ORPO rounds, greedy", "large (about 4x), greedy"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("cosmos")
    assert main(["run", "cosmos_mcts_orpo", "--smoke", "--no-progress", "--out", str(out)]) == 0
    return out, json.loads((out / "summary.json").read_text())


def test_smoke_run_writes_every_row(smoke):
    out, summary = smoke
    assert list(summary["rows"]) == ROWS
    for name in ("table.md", "quality.png", "summary.json"):
        assert (out / name).is_file(), name
    for label, row in summary["rows"].items():
        q = row["quality"]["mean"]
        assert -0.5 <= q <= 2.5, label  # the range of Q
        assert 0.0 <= row["contradiction_rate"]["mean"] <= 1.0, label
    assert set(summary["shift"]) == {"round_0", "round_1", "round_2"}
    assert summary["shift"]["round_0"]["kl"]["mean"] == 0.0  # pi_0 against itself
    assert "small + MCTS" in summary["claims"]
    assert "| small + MCTS |" in (out / "table.md").read_text()


def test_small_run_trains_two_orpo_rounds_from_the_shared_sft(smoke):
    out, _ = smoke
    assert [r["stage"] for r in read_metrics(out / "metrics.jsonl")] == ["sft"] * 2
    assert [r["stage"] for r in read_metrics(out / "runs" / "large" / "metrics.jsonl")] == \
        ["sft"] * 2
    recs = read_metrics(out / "runs" / "small_s0" / "metrics.jsonl")
    assert [r["stage"] for r in recs] == ["orpo1"] * 2 + ["orpo2"] * 2
    assert [r["step"] for r in recs] == [1, 2, 3, 4]  # one step count across the rounds
    result = json.loads((out / "runs" / "small_s0" / "result.json").read_text())
    search = json.loads((out / "runs" / "small_s0" / "search0.json").read_text())
    # the held-out search kept to its budget: at most one expansion (2 samples) past 200 tokens
    assert search["mcts"]["tokens"] <= 200 + 2 * Config().grpo.max_new_tokens
    assert result["targets_0"] > 0 and result["pairs_0"] == len(search["pairs"])
    for state, chosen, rejected in search["pairs"]:
        assert state.count("\n") >= 1 and chosen.strip() and rejected.strip()


def test_resume_after_a_kill_redoes_only_the_missing_run(smoke):
    out, summary = smoke
    # killed after the last ORPO round, before its greedy evaluation, and before the large run:
    # the restored round-2 policy must decode the same plots
    (out / "runs" / "small_s0" / "greedy2.json").unlink()
    (out / "runs" / "small_s0" / "result.json").unlink()
    (out / "runs" / "large_s0" / "result.json").unlink()  # ... before the large run
    (out / "summary.json").unlink()
    assert main(["run", "cosmos_mcts_orpo", "--smoke", "--no-progress", "--resume", "--out",
                 str(out)]) == 0
    again = json.loads((out / "summary.json").read_text())
    assert again["rows"] == summary["rows"] and again["shift"] == summary["shift"]


def test_config_names_the_field_at_fault():
    with pytest.raises(ConfigError, match="task.name"):
        Config(task=Config().task.__class__(name="arithmetic"))
    with pytest.raises(ConfigError, match="orpo.loss"):
        Config(orpo=Config().orpo.__class__(loss="dpo"))

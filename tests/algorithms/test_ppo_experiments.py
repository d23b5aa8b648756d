"""The CARL and SPaCE experiments end to end through the CLI at --smoke size."""

import json
from pathlib import Path

import pytest

from jaxrl_suite.cli import main

SMOKE = ["--smoke", "--no-progress"]


def test_carl_generalization_smoke_writes_table_heatmap_and_curves(tmp_path, capsys):
    out = tmp_path / "carl"
    assert main(["run", "carl_generalization", *SMOKE, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["results"]) == {"default_hidden", "dist_hidden", "dist_visible"}
    r = summary["results"]["dist_visible"]
    assert len(r["held_out"]["per_seed"]) == 2  # 2 seeds in the smoke config
    assert r["held_out"]["q25"] <= r["held_out"]["median"] <= r["held_out"]["q75"]
    assert "visible_minus_hidden" in summary["claim"]
    for png in ("heatmap.png", "learning_curves.png"):
        assert (out / png).stat().st_size > 1000
    assert "held-out grid" in capsys.readouterr().out


def test_space_curriculum_smoke_reports_steps_to_threshold(tmp_path, capsys):
    out = tmp_path / "space"
    assert main(["run", "space_curriculum", *SMOKE, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["results"]) == {"space", "round_robin", "random", "spdrl"}
    assert len(summary["instances"]) >= 20
    sizes = summary["results"]["space"]["final_curriculum_metrics"]["curriculum/set_size"]
    assert 1 <= sizes <= len(summary["instances"])
    assert (out / "learning_curves.png").stat().st_size > 1000
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, len(records) + 1))
    assert "steps (median)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "carl_generalization", "--smoke", "--set", "run.variants=[oracle]"], "oracle"),
        (["run", "space_curriculum", "--smoke", "--set", "run.curricula=[alp_gmm]"], "alp_gmm"),
        (["run", "space_curriculum", "--smoke", "--set", "ppo.num_minibatches=3"],
         "num_minibatches"),
        (["run", "carl_generalization", "--smoke", "--set", "context.grid_x=[7.0,1.0]"],
         "eval_contexts: CartPole-v1 context 'length'=7.0"),
        (["run", "space_curriculum", "--smoke", "--set", "instances.values_y=[6.0,500.0]"],
         "CartPole-v1 context 'force_mag'=500.0 is outside its bounds"),
    ],
)
def test_bad_config_is_one_line_exit_2(argv, message, tmp_path, capsys):
    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_resumed_space_run_logs_each_step_once(tmp_path):
    out = tmp_path / "space"
    argv = ["run", "space_curriculum", *SMOKE, "--out", str(out),
            "--set", "run.curricula=[space,round_robin]"]
    assert main(argv) == 0
    first = (out / "summary.json").read_text()
    # A finished run resumed again restores every chunk from its checkpoints and reruns nothing.
    assert main([*argv, "--resume"]) == 0
    again = json.loads((out / "summary.json").read_text())
    assert again["results"] == json.loads(first)["results"]
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps))
    assert Path(out / "checkpoints" / "space").is_dir()

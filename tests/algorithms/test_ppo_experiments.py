"""The CARL and SPaCE experiments end to end through the CLI at --smoke size; the figures are
checked against the data behind them (`core.metrics.record_figures`)."""

import json
from pathlib import Path

import numpy as np
import pytest

from jaxrl_suite.cli import main
from jaxrl_suite.core.metrics import record_figures

SMOKE = ["--smoke", "--no-progress"]


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _line(axes: dict, label: str) -> dict:
    (line,) = [ln for ln in axes["lines"] if ln["label"] == label]
    return line


def test_carl_generalization_smoke_writes_table_heatmap_and_curves(tmp_path, capsys):
    out = tmp_path / "carl"
    with record_figures() as figs:
        assert main(["run", "carl_generalization", *SMOKE, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    variants = ["default_hidden", "dist_hidden", "dist_visible"]
    assert list(summary["results"]) == variants
    for v in variants:
        r = summary["results"][v]
        assert len(r["held_out"]["per_seed"]) == 2  # 2 seeds in the smoke config
        for k in ("in_distribution", "held_out", "grid"):  # median and IQR of the seeds
            q25, med, q75 = np.percentile(r[k]["per_seed"], [25, 50, 75])
            assert (r[k]["q25"], r[k]["median"], r[k]["q75"]) == pytest.approx((q25, med, q75))
        gap = np.subtract(r["in_distribution"]["per_seed"], r["held_out"]["per_seed"])
        assert r["gap"]["median"] == pytest.approx(np.median(gap))
    claim = summary["claim"]
    assert claim["visible_minus_hidden"] == pytest.approx(
        summary["results"]["dist_visible"]["held_out"]["median"]
        - summary["results"]["dist_hidden"]["held_out"]["median"])

    # heatmap.png: one panel per variant, its image the median grid, the training box in red
    heat = figs["heatmap.png"]
    panels = {a["title"]: a for a in heat["axes"] if a["title"] in variants}
    assert list(panels) == variants
    inside = np.asarray(summary["inside_training_box"])
    for v, ax in panels.items():
        assert (ax["xlabel"], ax["ylabel"]) == ("length", "gravity")
        assert ax["xticklabels"] == [f"{x:g}" for x in summary["grid_x"]]
        median_grid = np.asarray(summary["results"][v]["grid_median"])  # [x, y]
        np.testing.assert_allclose(ax["images"][0], median_grid.T)
        assert ax["patches"] == inside.sum()

    # learning_curves.png: per variant, the median over seeds of the mean grid return per chunk;
    # with 2 seeds the median is the mean, which metrics.jsonl logs as grid_return
    curves = figs["learning_curves.png"]["axes"][0]
    assert curves["xlabel"] == "env steps per seed"
    assert curves["legend"] == variants and curves["bands"] == len(variants)
    for v in variants:
        logged = _records(out / "runs" / v)  # one record per chunk
        assert [r["step"] for r in logged] == [1, 2]
        line = _line(curves, v)
        np.testing.assert_array_equal(line["x"], [r["env_steps"] for r in logged])
        np.testing.assert_allclose(line["y"], [r["grid_return"] for r in logged], rtol=1e-5)
        assert line["y"][-1] == pytest.approx(summary["results"][v]["grid"]["median"], rel=1e-5)
    assert "held-out grid" in capsys.readouterr().out
    table = (out / "table.md").read_text()
    med = summary["results"]["dist_visible"]["held_out"]["median"]
    assert "| dist_visible | - | " in table and f"{med:.1f} [" in table


def test_space_curriculum_smoke_reports_steps_to_threshold(tmp_path, capsys):
    out = tmp_path / "space"
    with record_figures() as figs:
        assert main(["run", "space_curriculum", *SMOKE, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    curricula = ["space", "round_robin", "random", "spdrl"]
    assert list(summary["results"]) == curricula
    assert len(summary["instances"]) >= 20
    sizes = summary["results"]["space"]["final_curriculum_metrics"]["curriculum/set_size"]
    assert 1 <= sizes <= len(summary["instances"])
    # learning_curves.png: per curriculum, the median over seeds of the mean return over all
    # instances after each chunk (metrics.jsonl logs the same median), and the threshold
    ax = figs["learning_curves.png"]["axes"][0]
    assert ax["legend"] == curricula and ax["bands"] == len(curricula)
    assert ax["ylabel"] == f"mean return over {len(summary['instances'])} instances"
    for c in curricula:
        line = _line(ax, c)
        np.testing.assert_array_equal(line["x"], summary["env_steps"])
        records = _records(out / "runs" / c)
        assert [r["step"] for r in records] == list(range(1, len(summary["env_steps"]) + 1))
        logged = [r["mean_return_all_instances"] for r in records]
        np.testing.assert_allclose(line["y"], logged, rtol=1e-6)
        final = summary["results"][c]["final_mean_return"]["median"]
        assert line["y"][-1] == pytest.approx(final, rel=1e-6)
    (threshold,) = [ln for ln in ax["lines"] if ln["label"].startswith("_")]
    np.testing.assert_array_equal(threshold["y"], summary["threshold"])
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
    # A finished run resumed again reads every unit's result.json and reruns nothing; a unit
    # killed after its last chunk's checkpoint (its result.json lost) restores every chunk.
    (out / "runs" / "round_robin" / "result.json").unlink()
    assert main([*argv, "--resume"]) == 0
    again = json.loads((out / "summary.json").read_text())
    assert again["results"] == json.loads(first)["results"]
    for c in ("space", "round_robin"):
        steps = [r["step"] for r in _records(out / "runs" / c)]
        assert steps == sorted(set(steps)) and steps
    assert Path(out / "checkpoints" / "space").is_dir()

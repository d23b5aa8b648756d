"""The ELMUR experiments end to end through the CLI at --smoke size; the figures are checked
against the data behind them (`core.metrics.record_figures`)."""

import json

import numpy as np
import pytest

from jaxrl_suite.cli import main
from jaxrl_suite.core.metrics import record_figures

SMOKE = ["--smoke", "--no-progress"]


def test_elmur_tmaze_smoke_writes_the_success_table_and_plot(tmp_path, capsys):
    out = tmp_path / "tmaze"
    with record_figures() as figs:
        assert main(["run", "elmur_tmaze", *SMOKE, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["results"]) == {"elmur", "transformer"}
    for r in summary["results"].values():
        assert set(r["lengths"]) == {"20", "200"}
        for n, cell in r["lengths"].items():
            assert len(cell["success_per_seed"]) == 2  # 2 seeds in the smoke config
            assert 0.0 <= cell["success_mean"] <= 1.0
            # Each episode ends at the junction turn or at the time limit L + 2.
            assert int(n) + 1 <= cell["episode_steps"] <= int(n) + 2
        assert r["data_return"] == pytest.approx(1.0)  # oracle data: every episode succeeds
    assert summary["claim"]["elmur_success_at_longest"] == (
        summary["results"]["elmur"]["lengths"]["200"]["success_mean"])
    # success.png: success rate against corridor length (log x), mean and a +-std band per model
    (ax,) = figs["success.png"]["axes"]
    assert ax["xscale"] == "log" and ax["ylabel"] == "success rate"
    assert ax["legend"] == ["memoryless (50 %)", "elmur", "transformer"] and ax["bands"] == 2
    for model, r in summary["results"].items():
        (line,) = [ln for ln in ax["lines"] if ln["label"] == model]
        np.testing.assert_array_equal(line["x"], [20, 200])
        want = [r["lengths"][n]["success_mean"] for n in ("20", "200")]
        np.testing.assert_allclose(line["y"], want)
    (ref,) = [ln for ln in ax["lines"] if ln["label"] == "memoryless (50 %)"]
    np.testing.assert_array_equal(ref["y"], [0.5, 0.5])
    # Each model is a Study unit: runs/MODEL/{metrics.jsonl, result.json}, steps 1..n in the unit
    for model, r in summary["results"].items():
        run = out / "runs" / model
        assert json.loads((run / "result.json").read_text()) == r
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [rec["step"] for rec in records] == list(range(1, len(records) + 1))
        assert records[-3]["loss"] == pytest.approx(r["final_loss"])  # last training block
        assert [rec["corridor_length"] for rec in records[-2:]] == [20, 200]
        assert [rec["success"] for rec in records[-2:]] == [
            r["lengths"][n]["success_mean"] for n in ("20", "200")]
    table = (out / "table.md").read_text()
    assert "| model | L=20 | L=200 |" in table and "eval time per env step" in table
    for model, r in summary["results"].items():  # the table's cells are the summary's numbers
        cells = [f"{r['lengths'][n]['success_mean']:.2f} ± {r['lengths'][n]['success_std']:.2f}"
                 for n in ("20", "200")]
        assert f"| {model} | {' | '.join(cells)} |" in table
    assert "T-Maze success" in capsys.readouterr().out
    # --resume of the finished study (no checkpoints: its units' result.json) retrains nothing
    (out / "runs" / "transformer" / "result.json").unlink()  # as if killed in that unit
    assert main(["run", "elmur_tmaze", *SMOKE, "--out", str(out), "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "elmur: done before" in printed and "transformer: done before" not in printed
    again = json.loads((out / "summary.json").read_text())
    assert again["results"]["elmur"] == summary["results"]["elmur"]
    assert main(["run", "elmur_tmaze", *SMOKE, "--out", str(tmp_path / "none"), "--resume"]) == 2
    assert "no finished run in" in capsys.readouterr().err


def test_elmur_popgym_smoke_writes_the_return_table_and_plot(tmp_path, capsys):
    out = tmp_path / "popgym"
    with record_figures() as figs:
        assert main(["run", "elmur_popgym", *SMOKE, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["results"]) == {"CountRecall-easy"}
    cells = summary["results"]["CountRecall-easy"]
    assert set(cells) == {"elmur", "transformer", "gru"}
    for cell in cells.values():
        assert len(cell["return_per_seed"]) == 2
        assert -1.0 - 1e-5 <= cell["return_mean"] <= 1.0 + 1e-5
        assert cell["data_return"] < 1.0  # noisy oracle data (eps_max = 0.5)
    # returns.png: per model one bar per task, its height the mean return over seeds
    (ax,) = figs["returns.png"]["axes"]
    assert ax["xticklabels"] == ["CountRecall-easy"] and ax["legend"] == list(cells)
    for model, cell in cells.items():
        np.testing.assert_allclose(ax["bars"][model], [cell["return_mean"]], rtol=1e-6)
    # Each (task, model) is a Study unit: runs/TASK-DIFFICULTY/MODEL/{metrics.jsonl, result.json}
    for model, cell in cells.items():
        run = out / "runs" / "CountRecall-easy" / model
        assert json.loads((run / "result.json").read_text()) == cell
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [rec["step"] for rec in records] == list(range(1, len(records) + 1))
        assert records[-1]["loss"] == pytest.approx(cell["final_loss"])
    table = (out / "table.md").read_text()
    assert "| task | elmur | transformer | gru | data |" in table
    row = [f"{c['return_mean']:.3f} ± {c['return_std']:.3f}" for c in cells.values()]
    assert f"| CountRecall-easy | {' | '.join(row)} | {cells['elmur']['data_return']:.3f} ± " \
        in table
    assert "mean episode return" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "elmur_tmaze", "--smoke", "--set", "eval.episodes=[4]"], "eval.episodes"),
        (["run", "elmur_tmaze", "--smoke", "--set", "run.models=[lstm]"], "lstm"),
        (["run", "elmur_popgym", "--smoke", "--set", "run.tasks=[Autoencode]"], "Autoencode"),
        (["run", "elmur_popgym", "--smoke", "--set", "run.difficulties=[extreme]"], "extreme"),
        (["run", "elmur_popgym", "--smoke", "--set", "elmur.n_heads=3"], "n_heads"),
    ],
)
def test_bad_config_is_one_line_exit_2(argv, message, tmp_path, capsys):
    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err

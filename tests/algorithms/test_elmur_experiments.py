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
    assert ax["legend"] == ["elmur", "transformer", "memoryless (50 %)"] and ax["bands"] == 2
    for model, r in summary["results"].items():
        (line,) = [ln for ln in ax["lines"] if ln["label"] == model]
        np.testing.assert_array_equal(line["x"], [20, 200])
        want = [r["lengths"][n]["success_mean"] for n in ("20", "200")]
        np.testing.assert_allclose(line["y"], want)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, len(records) + 1))
    assert "T-Maze success" in capsys.readouterr().out


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

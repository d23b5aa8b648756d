"""The oppo_offline_pref experiment end to end through the CLI at --smoke size; the figures are
checked against the data behind them (`core.metrics.record_figures`)."""

import json

import numpy as np
import pytest

from jaxrl_suite.cli import main
from jaxrl_suite.core.metrics import record_figures

SMOKE = ["run", "oppo_offline_pref", "--smoke", "--no-progress"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("oppo") / "run"
    with record_figures() as figs:
        assert main([*SMOKE, "--out", str(out)]) == 0
    return out, figs


def test_smoke_writes_table_plots_datasets_and_claim(smoke_run, capsys):
    out, figs = smoke_run
    summary = json.loads((out / "summary.json").read_text())
    res = summary["results"]["medium-replay"]
    assert set(res) == {"bc", "pref_iql", "oppo", "oracle_iql"}
    for r in res.values():
        assert len(r["scores"]) == 2  # 2 seeds in the smoke config
        assert r["score_mean"] == pytest.approx(np.mean(r["scores"]))
        assert r["score_std"] == pytest.approx(np.std(r["scores"]))
    assert -1 <= res["pref_iql"]["diagnostics"]["reward_corr"][0] <= 1
    claim = summary["claim"]["medium-replay"]
    assert claim["oppo_minus_pref_iql"] == pytest.approx(
        res["oppo"]["score_mean"] - res["pref_iql"]["score_mean"])
    holds = res["oppo"]["score_mean"] >= res["pref_iql"]["score_mean"]
    assert claim["oppo_ge_pref_iql"] is holds
    assert summary["claim"]["holds_on"] == f"{int(holds)}/1"  # one dataset in the smoke config
    # table.md: per dataset the behaviour data's mean, then each method's mean ± std over seeds
    row = next(r for r in (out / "table.md").read_text().splitlines()
               if r.startswith("| medium-replay |"))  # the first table's row
    beh = summary["datasets"]["medium-replay"]["episode_score_mean"]
    assert row.split(" | ")[1] == f"{beh:.1f}"
    assert row.endswith(" | ".join(f"{r['score_mean']:.1f} ± {r['score_std']:.1f}"
                                   for r in res.values()) + " |")
    assert (out / "config.json").is_file() and not (out / "metrics.jsonl").exists()
    # returns.png: one bar per method at the dataset, its height the mean score; dots: the seeds
    (bars,) = figs["returns.png"]["axes"]
    assert bars["xticklabels"] == ["medium-replay"] and bars["legend"] == list(res)
    for m, r in res.items():
        np.testing.assert_allclose(bars["bars"][m], [r["score_mean"]], rtol=1e-6)
    dots = np.concatenate([pts[:, 1] for pts in bars["scatter"]])
    np.testing.assert_allclose(dots, [x for r in res.values() for x in r["scores"]], rtol=1e-6)
    oppo = json.loads((out / "runs/medium-replay/oppo/result.json").read_text())
    z, ctx = oppo["zspace"], oppo["contexts"]
    # zspace.png: the labelled segments' phi in PCA coordinates and z* as a star
    (zs, _colorbar) = figs["zspace.png"]["axes"]
    points, star = zs["scatter"]
    np.testing.assert_allclose(points, z["pc"], rtol=1e-6)
    np.testing.assert_allclose(star, [z["z_star"]], rtol=1e-6)
    assert zs["xlabel"].startswith("PC 1 (") and zs["legend"] == ["z*"]
    assert len(ctx["near_phi_score"]) == len(ctx["best_phi_score"]) == 2
    assert all(g > 0 for g in ctx["z_star_to_nearest_phi"])
    assert "| nearest phi to z* |" in (out / "table.md").read_text()
    assert len(z["pc"]) == len(z["returns"]) == 2 * 32  # both segments of every labelled pair
    # the saved datasets are in the D4RL layout and reload as they were written
    data = np.load(out / "data" / "medium-replay.npz")
    assert {"observations", "actions", "rewards", "terminals", "timeouts",
            "next_observations"} <= set(data.files)
    assert summary["datasets"]["medium-replay"]["rows"] == len(data["rewards"])


def test_resume_reruns_only_the_missing_unit(smoke_run, capsys):
    out, _ = smoke_run
    before = json.loads((out / "summary.json").read_text())
    (out / "runs/medium-replay/bc/result.json").unlink()  # as if killed during the bc unit
    capsys.readouterr()
    assert main([*SMOKE, "--out", str(out), "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "data reloaded" in printed
    assert printed.count("done before") == 3
    for m in ("pref_iql", "oppo", "oracle_iql"):
        assert f"[oppo_offline_pref] medium-replay/{m}: done before" in printed
    assert "[oppo_offline_pref] medium-replay/bc: normalised" in printed
    for m in ("bc", "pref_iql", "oppo", "oracle_iql"):  # every unit has its result.json again
        saved = json.loads((out / f"runs/medium-replay/{m}/result.json").read_text())
        assert saved["unit"] == f"medium-replay/{m}" and saved["seeds"] == [0, 1]
    after = json.loads((out / "summary.json").read_text())
    for m in ("oppo", "pref_iql", "oracle_iql"):
        assert after["results"]["medium-replay"][m] == before["results"]["medium-replay"][m]
    # the recomputed unit reproduces its first run exactly (same data, same keys)
    assert (after["results"]["medium-replay"]["bc"]["scores"]
            == before["results"]["medium-replay"]["bc"]["scores"])


@pytest.mark.parametrize("override, message", [
    ("run.methods=[cql]", "run.methods must be distinct entries of ['bc', 'pref_iql'"),
    ("oppo.segment_length=7", "oppo.segment_length=7 must equal prefs.segment_length=5"),
    ("run.datasets=[replay]", "run.datasets must be distinct entries of ['random'"),
])
def test_bad_config_is_one_line_exit_2(override, message, tmp_path, capsys):
    assert main([*SMOKE, "--set", override, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err

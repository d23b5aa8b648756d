"""The weak_to_strong experiment (issue 24) through the CLI at smoke size: one run shared by the
output checks (PGR is the formula of the reported accuracies), a resumed run, the claim verdicts
on synthetic numbers, and config errors naming the field."""

import json

import numpy as np
import pytest

from jaxrl_suite.cli import main
from jaxrl_suite.core.checkpoint import Checkpointer
from jaxrl_suite_experiments.weak_to_strong import _claims

SMOKE = ["--smoke", "--no-progress"]
PAIR = "1x16:1x16"


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, module_figures):
    out = tmp_path_factory.mktemp("w2s")
    assert main(["run", "weak_to_strong", *SMOKE, "--out", str(out)]) == 0
    return out, json.loads((out / "summary.json").read_text()), module_figures


def test_summary_pgr_is_the_formula_of_the_accuracies(smoke):
    out, summary, figs = smoke
    assert list(summary["tasks"]) == ["dialects"]
    task = summary["tasks"]["dialects"]
    assert list(task["pairs"]) == [PAIR]
    r = task["pairs"][PAIR]
    acc = {k: np.array(r[f"{k}_accuracy"]["per_seed"]) for k in ("weak", "ceiling", "naive",
                                                                 "aux")}
    assert all(len(v) == 2 and ((0 <= v) & (v <= 1)).all() for v in acc.values())
    for s in ("naive", "aux"):
        expect = (acc[s] - acc["weak"]) / (acc["ceiling"] - acc["weak"])
        np.testing.assert_allclose(r[f"pgr_{s}"]["per_seed"], expect)
        assert r[f"pgr_{s}"]["median"] == pytest.approx(np.median(expect))
    # the units' results are what the summary reports
    weak = json.loads((out / "runs" / "dialects" / "weak_1x16" / "result.json").read_text())
    assert weak["accuracy"] == list(acc["weak"]) and weak["seeds"] == [0, 1]
    assert Checkpointer(out / "checkpoints" / "dialects" / "pretrain_1x16").all_steps() == [0]
    assert np.load(out / "checkpoints" / "dialects" / "weak_1x16" / "weak_labels.npy").shape == (
        2, 16, 2)
    assert "scratch_accuracy" in task["ceiling"]["1x16"]
    c = summary["claims"]
    assert c["per_pair"]["dialects"][PAIR]["naive_median"] == pytest.approx(
        r["pgr_naive"]["median"])
    assert c["verdict"] in ("reproduced", "partly reproduced", "not reproduced")
    table = (out / "table.md").read_text().splitlines()
    assert table[2].startswith(f"| dialects {PAIR} |")
    (ax,) = figs["pgr.png"]["axes"]
    assert ax["legend"] == ["naive", "aux"]
    assert "accuracy.png" in figs


def test_resume_reads_the_finished_study_back(smoke, capsys):
    out, summary, _ = smoke
    capsys.readouterr()
    assert main(["run", "weak_to_strong", *SMOKE, "--out", str(out), "--resume"]) == 0
    printed = capsys.readouterr().out
    assert f"dialects/{PAIR.replace(':', '_to_')}: done before" in printed
    again = json.loads((out / "summary.json").read_text())
    assert again["tasks"] == summary["tasks"] and again["resumed"]


def test_claims_follow_the_numbers():
    pgr = {"t": {"a": {"naive": [0.1, 0.2, 0.3], "aux": [0.5, 0.6, 0.7]},
                 "b": {"naive": [0.2, 0.2, 0.2], "aux": [0.4, 0.1, 0.9]}}}
    c = _claims(pgr)
    assert c["verdict"] == "reproduced" and c["per_pair"]["t"]["a"]["naive_median"] == 0.2
    pgr["t"]["b"]["aux"] = [0.1, 0.1, 0.1]  # aux below naive on one pair
    c = _claims(pgr)
    assert c["verdict"] == "partly reproduced" and not c["aux_above_naive"]
    assert c["naive_pgr_positive"]
    assert _claims({"t": {"a": {"naive": [-0.1] * 3, "aux": [-0.2] * 3}}})["verdict"] == \
        "not reproduced"


@pytest.mark.parametrize(("override", "field"), [
    ("run.tasks=[imdb]", "run.tasks"),
    ("run.pairs=[1x32]", "run.pairs"),
    ("run.seeds=[0,0]", "run.seeds"),
    ("dialects.n_b=0", "config field 'dialects.n_b' must be >= 1, got 0"),
    ("loss.aux_coef=2.0", "loss.aux_coef"),
    ("strong.warmup=500", "train.warmup"),
])
def test_config_errors_name_the_field(override, field, tmp_path, capsys):
    assert main(["run", "weak_to_strong", "--set", override, "--out", str(tmp_path)]) == 2
    assert field in capsys.readouterr().err

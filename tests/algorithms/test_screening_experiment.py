"""The resume_screening experiment (issue 23, arXiv 2511.16073) through the CLI at smoke size:
one module-scoped run, checked for its table, collapse reports, claims and plots."""

import json
from pathlib import Path

import numpy as np
import pytest

from jaxrl_suite.cli import main
from jaxrl_suite.core.config import load_config
from jaxrl_suite.core.metrics import read_metrics
from jaxrl_suite.envs.text.screening import KeywordATS, ScreeningTask
from jaxrl_suite.rewards.composite import COMPONENTS, collapse_report
from jaxrl_suite_experiments.resume_screening import (
    METRICS,
    SAMPLED,
    VARIANTS,
    Config,
    evaluate_decisions,
    variant_task,
)

SMOKE = ["--smoke", "--no-progress"]
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "resume_screening.yaml"
SEEDS = (0, 1)  # the smoke section's


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, module_figures):
    out = tmp_path_factory.mktemp("resume_screening")
    assert main(["run", "resume_screening", *SMOKE, "--out", str(out)]) == 0
    return out, json.loads((out / "summary.json").read_text()), module_figures


def _records(out, run):
    return [r for r in read_metrics(out / "runs" / run / "metrics.jsonl") if r["stage"] == "grpo"]


def test_config_has_the_guard_and_the_kl_on_and_the_paper_weightings():
    cfg = load_config(Config, CONFIG)
    assert cfg.grpo.collapse_entropy > 0 and cfg.grpo.beta > 0 and cfg.run.seeds == (0, 1, 2)
    agg, gentle = variant_task(cfg, "aggressive").reward, variant_task(cfg, "gentle").reward
    assert agg.false_selected > agg.correct and agg.false_rejected == 0  # one heavy penalty
    assert gentle.false_selected == gentle.false_rejected < gentle.correct
    assert variant_task(cfg, "gentle").examples("test", 0, 5) == \
        ScreeningTask(seed=cfg.task.seed).examples("test", 0, 5)  # the same pairs


def test_summary_table_and_metrics(smoke):
    out, summary, _ = smoke
    table = summary["table"]
    assert list(table) == ["keyword ATS", "SFT", *VARIANTS]
    # beside the greedy figures, those of decisions sampled at the training temperature (SFT
    # and GRPO; the keyword ATS samples nothing)
    assert not set(SAMPLED) & set(table["keyword ATS"])
    for name, row in table.items():
        for k in (*METRICS, *(SAMPLED if name != "keyword ATS" else ())):
            value = row[k]["mean"] if isinstance(row[k], dict) else row[k]
            assert 0.0 <= value <= 1.0, (row, k)
    for v in VARIANTS:
        for k in (*METRICS, *SAMPLED):
            assert len(summary["variants"][v][k]["per_seed"]) == len(SEEDS)
    # the ATS threshold is fitted on training pairs only (the smoke config's 200)
    ats = KeywordATS.fit(ScreeningTask().examples("train", 0, 200))
    assert summary["ats"]["threshold"] == ats.threshold
    lines = (out / "table.md").read_text().splitlines()
    assert lines[0] == ("| model | accuracy | sampled_accuracy | precision | recall | f1 | "
                        "sampled_f1 | selected_rate | invalid_rate |")
    assert lines[2].startswith("| keyword ATS |") and lines[3].startswith("| SFT |")
    assert lines[2].split(" | ")[2] == "-"  # the keyword ATS samples nothing
    assert len(lines) == 4 + len(VARIANTS)


def test_logs_components_entropy_and_the_guard(smoke):
    out, summary, _ = smoke
    for v in VARIANTS:
        w = summary["weights"][v]
        signed = {"correct": w["correct"], "false_selected": -w["false_selected"],
                  "false_rejected": -w["false_rejected"], "calibration": w["calibration"],
                  "format": w["format"], "length": -w["length"]}
        for seed in SEEDS:
            recs = _records(out, f"{v}_s{seed}")
            assert [r["step"] for r in recs] == [1, 2]
            for r in recs:
                # GRPO trained on the composite reward: its batch mean is the weighted sum of
                # the logged component means
                assert r["reward"] == pytest.approx(
                    sum(signed[c] * r[f"reward_{c}"] for c in COMPONENTS), abs=1e-5)
                assert 0.0 <= r["outcome_entropy"] <= np.log2(3) + 1e-9
                assert r["collapse"] == float(r["outcome_entropy"] < 0.5)
                assert np.isfinite(r["kl"])
            # the summary's report is the detector on this log
            rep = summary["collapse_reports"][f"{v}_s{seed}"]
            assert rep == collapse_report(recs, 0.5)
            assert rep["guard_flags"] == rep["steps_below"]
            assert set(rep["final_fractions"]) == {"selected", "rejected", "invalid"}
    warned = [name for name, rep in summary["collapse_reports"].items() if rep["warned"]]
    assert [w.split(":")[0] for w in summary["warnings"]] == warned


def test_claims_follow_the_numbers(smoke):
    _, summary, _ = smoke
    claims, mean = summary["claims"], {v: {k: s[k]["mean"] for k in METRICS}
                                       for v, s in summary["variants"].items()}
    verdicts = {"reproduced", "not reproduced"}
    hack = claims["reward_hacking"]
    runs = {v: [summary["collapse_reports"][f"{v}_s{s}"]["collapsed"]
                or summary["variants"][v]["recall"]["per_seed"][i] <= 0.05
                for i, s in enumerate(SEEDS)] for v in VARIANTS}
    assert hack["collapsed_runs"] == {v: sum(runs[v]) for v in VARIANTS}
    majority = sum(runs["aggressive"]) >= max(1, -(-len(SEEDS) // 2))
    assert hack["verdict"] == ("reproduced" if majority and sum(runs["gentle"]) == 0
                               else "not reproduced")
    for v in VARIANTS:
        c = claims[f"{v}_beats_ats"]
        assert c["verdict"] in verdicts
        assert (c["verdict"] == "reproduced") == (
            mean[v]["accuracy"] > summary["ats"]["accuracy"] and mean[v]["f1"] >
            summary["ats"]["f1"])
        c = claims[f"{v}_beats_sft"]
        assert (c["verdict"] == "reproduced") == (mean[v]["accuracy"] >
                                                  summary["sft"]["accuracy"])
    assert claims["paper_numbers"]["paper"] == {"accuracy": 0.91, "recall": 0.85,
                                                "precision": 1.0}


def test_plots(smoke):
    out, summary, figures = smoke
    for name in ("entropy.png", "components.png", "metrics.png"):
        assert (out / name).stat().st_size > 1000, name
    ax, = figures["entropy.png"]["axes"]
    lines = {line["label"]: line["y"] for line in ax["lines"]}
    for v in VARIANTS:  # the median over seeds of the logged entropy (2 steps: unsmoothed)
        seeds = [[r["outcome_entropy"] for r in _records(out, f"{v}_s{s}")] for s in SEEDS]
        np.testing.assert_allclose(lines[v], np.median(seeds, axis=0))
    assert any(np.allclose(y, 0.5) for label, y in lines.items() if label not in VARIANTS)
    bars = figures["metrics.png"]["axes"][0]["bars"]
    keys = ("accuracy", "precision", "recall", "f1")
    np.testing.assert_allclose(bars["keyword ATS"], [summary["ats"][k] for k in keys])
    np.testing.assert_allclose(bars["SFT"], [summary["sft"][k] for k in keys])
    for v in VARIANTS:
        np.testing.assert_allclose(bars[v], [summary["variants"][v][k]["mean"] for k in keys])
    titles = [a["title"] for a in figures["components.png"]["axes"] if a.get("title")]
    assert all(any(t.startswith(f"reward_{c}") for t in titles) for c in COMPONENTS)


def test_resume_reuses_finished_runs(smoke, capsys):
    out, summary, _ = smoke
    assert main(["run", "resume_screening", *SMOKE, "--out", str(out), "--resume"]) == 0
    assert capsys.readouterr().out.count("done before") == len(VARIANTS) * len(SEEDS)
    again = json.loads((out / "summary.json").read_text())
    assert again["table"] == summary["table"] and again["claims"] == summary["claims"]
    assert again["resumed"] is True


@pytest.mark.parametrize("override, message", [
    ("grpo.collapse_entropy=0", "grpo.collapse_entropy must be > 0"),
    ("grpo.beta=0", "grpo.beta must be > 0"),
    ("weights.aggressive.false_selected=-1",
     "config field 'weights.aggressive.false_selected' must be >= 0, got -1.0"),
    ("weights.names=[aggressive,bogus]", "names must be distinct entries"),
    ("task.name=arithmetic", "task.name must be 'screening'"),
    ("weights.gentle.lenght=1", "unknown config key 'weights.gentle.lenght'"),
])
def test_bad_config_is_one_line_exit_2(override, message, tmp_path, capsys):
    assert main(["run", "resume_screening", *SMOKE, "--set", override,
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_sampled_decisions_come_from_one_sample_per_pair_at_the_temperature():
    """`evaluate_decisions` with a temperature scores the trainer's sampled completions (at that
    temperature, with that key) by the same metrics as the greedy ones."""
    examples = ScreeningTask().examples("test", 0, 4)
    right = [ScreeningTask().solution(e) for e in examples]
    wrong = ["no answer"] * 4

    class Scripted:
        def complete(self, params, exs, *, batch_size, rng=None, temperature=None):
            if rng is None:
                assert (batch_size, temperature) == (2, None)
                return wrong, np.ones(len(exs))
            assert (batch_size, rng, temperature) == (2, "key", 0.7)
            return right, np.ones(len(exs))

    greedy = evaluate_decisions(Scripted(), None, examples, 2)
    sampled = evaluate_decisions(Scripted(), None, examples, 2, temperature=0.7, rng="key")
    assert greedy["accuracy"] == 0.0 and sampled["accuracy"] == 1.0
    assert sampled["invalid_rate"] == 0.0 and greedy["invalid_rate"] == 1.0

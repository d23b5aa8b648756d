"""The aepo_grounding experiment (issue 23) through the CLI at smoke size: one run shared by the
output checks, a resumed run, the claim verdicts on synthetic numbers, and config errors."""

import json
import shutil

import numpy as np
import pytest

from jaxrl_suite.cli import main
from jaxrl_suite.core.metrics import read_metrics
from jaxrl_suite.core.study import seed_stats
from jaxrl_suite_experiments.aepo_grounding import VARIANTS, _claims

SMOKE = ["--smoke", "--no-progress"]
SPLITS = ("seen", "unseen")
STATS = ("acc", "mean_n", "hit_any", "first_hit", "format")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, module_figures):
    out = tmp_path_factory.mktemp("aepo")
    assert main(["run", "aepo_grounding", *SMOKE, "--out", str(out)]) == 0
    return out, json.loads((out / "summary.json").read_text()), module_figures


def _grpo(out, run):
    return [r for r in read_metrics(out / "runs" / run / "metrics.jsonl") if r["stage"] == "grpo"]


def test_summary_fields(smoke):
    out, summary, _ = smoke
    assert list(summary["variants"]) == list(VARIANTS)
    assert summary["modes"] == {"aepo": "multi", "naive": "single"}
    for variant, stats in summary["variants"].items():
        for k in STATS:
            for s in SPLITS:
                v = stats[f"{k}_{s}"]
                assert len(v["per_seed"]) == 2, (variant, k, s)
                assert 0.0 <= v["mean"] <= (4.0 if k == "mean_n" else 1.0)
        result = json.loads((out / "runs" / f"{variant}_s0" / "result.json").read_text())
        assert result["acc_seen"] == stats["acc_seen"]["per_seed"][0]
    for mode in ("multi", "single"):  # the shared SFT start, evaluated in both answer modes
        assert set(summary["sft"][mode]) == {f"{k}_{s}" for k in STATS for s in SPLITS}
        assert set(summary["sft_more"][mode]) == set(summary["sft"][mode])  # and continued
    table = (out / "table.md").read_text().splitlines()
    assert [row.split("|")[1].strip() for row in table[2:]] == [
        "SFT (multi)", "SFT (single)", "SFT continued (multi)", "SFT continued (single)",
        "aepo", "naive"]
    # the control continues the SFT from its last step for grpo.steps (smoke: 3 + 2) steps
    more = [r["step"] for r in read_metrics(out / "runs" / "sft_more" / "metrics.jsonl")
            if r["stage"] == "sft_more"]
    assert more == [4, 5]
    cfg = summary["config"]
    assert cfg["grpo"]["advantage"] == "rloo" and cfg["task"]["name"] == "gui_grounding"


def test_claims_follow_the_numbers(smoke):
    _, summary, _ = smoke
    claim = summary["claims"]["relative_improvement"]
    for s in SPLITS:
        a = summary["variants"]["aepo"][f"acc_{s}"]
        b = summary["variants"]["naive"][f"acc_{s}"]
        row = claim["splits"][s]
        assert row["absolute"] == pytest.approx(a["mean"] - b["mean"])
        want = (a["mean"] - b["mean"]) / b["mean"] if b["mean"] > 0 else None
        assert row["relative"] == (pytest.approx(want) if want is not None else None)
        assert row["per_seed_difference"] == pytest.approx(
            np.subtract(a["per_seed"], b["per_seed"]).tolist())
    assert claim["verdict"] in ("reproduced", "partly reproduced", "not reproduced")
    assert claim["improves_on"] == [s for s in SPLITS if claim["splits"][s]["absolute"] > 0]
    explore = summary["claims"]["exploration"]
    for s in SPLITS:
        for k in ("mean_n", "hit_any"):
            assert explore["splits"][s][k]["aepo"] == summary["variants"]["aepo"][
                f"{k}_{s}"]["mean"]


def test_training_logs_the_reward_components(smoke):
    out, _, _ = smoke
    for variant in VARIANTS:
        for seed in (0, 1):
            recs = _grpo(out, f"{variant}_s{seed}")
            assert [r["step"] for r in recs] == [1, 2]
            for r in recs:
                for k in ("format", "n_points", "first_hit", "hit_any", "collinear"):
                    assert np.isfinite(r[f"reward_{k}"]), (variant, k)
                assert r["reward_first_hit"] == pytest.approx(r["accuracy"])
                if variant == "naive":  # the binary reward is the first-point hit
                    assert r["reward"] == pytest.approx(r["accuracy"])
                else:  # AER lies in [-1, 2]
                    assert -1.0 <= r["reward"] <= 2.0
    assert (out / "checkpoints" / "sft").is_dir()  # the one SFT start of every run


def test_plots_show_the_data(smoke):
    out, summary, figures = smoke
    for name in ("accuracy.png", "reward.png", "n_points.png"):
        assert (out / name).stat().st_size > 1000
    ax, = figures["accuracy.png"]["axes"]
    assert ax["xticklabels"] == list(SPLITS)
    for v in VARIANTS:
        np.testing.assert_allclose(ax["bars"][v], [summary["variants"][v][f"acc_{s}"]["mean"]
                                                   for s in SPLITS])
    np.testing.assert_allclose(ax["bars"]["SFT (multi)"],
                               [summary["sft"]["multi"][f"acc_{s}"] for s in SPLITS])
    for name, key in (("reward.png", "reward"), ("n_points.png", "reward_n_points")):
        ax, = figures[name]["axes"]
        lines = {line["label"]: line["y"] for line in ax["lines"]}
        for v in VARIANTS:  # the median over seeds (2 steps: unsmoothed)
            seeds = [[r[key] for r in _grpo(out, f"{v}_s{s}")] for s in (0, 1)]
            np.testing.assert_allclose(lines[v], np.median(seeds, axis=0), err_msg=(name, v))


def test_resume_reuses_results(smoke, tmp_path, capsys):
    out, summary, _ = smoke
    again = tmp_path / "again"
    shutil.copytree(out, again)
    capsys.readouterr()
    assert main(["run", "aepo_grounding", *SMOKE, "--out", str(again), "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "aepo_s0: done before" in printed and "naive_s1: done before" in printed
    resumed = json.loads((again / "summary.json").read_text())
    assert resumed["resumed"] is True
    assert resumed["variants"] == summary["variants"] and resumed["sft"] == summary["sft"]
    assert resumed["claims"] == summary["claims"]


def _stats(acc: dict[str, dict[str, list[float]]], n=(2.0, 1.0), hit=(0.8, 0.5)) -> dict:
    """Synthetic aggregate stats: acc[variant][split] per-seed accuracies."""
    out = {}
    for i, v in enumerate(("aepo", "naive")):
        out[v] = {f"acc_{s}": seed_stats(acc[v][s]) for s in SPLITS}
        for s in SPLITS:
            out[v].update({f"mean_n_{s}": seed_stats([n[i]]), f"hit_any_{s}": seed_stats([hit[i]]),
                           f"first_hit_{s}": seed_stats([0.3]), f"format_{s}": seed_stats([1.0])})
    return out


@pytest.mark.parametrize("aepo, naive, verdict, largest", [
    ({"seen": [0.52], "unseen": [0.44]}, {"seen": [0.5], "unseen": [0.4]}, "reproduced", "unseen"),
    ({"seen": [0.56], "unseen": [0.41]}, {"seen": [0.5], "unseen": [0.4]}, "partly reproduced",
     "seen"),  # better on both, but most on the seen split
    ({"seen": [0.45], "unseen": [0.42]}, {"seen": [0.5], "unseen": [0.4]}, "partly reproduced",
     "unseen"),
    ({"seen": [0.5], "unseen": [0.3]}, {"seen": [0.5], "unseen": [0.4]}, "not reproduced",
     "seen"),
])
def test_claim_verdicts(aepo, naive, verdict, largest):
    claims = _claims(_stats({"aepo": aepo, "naive": naive}))
    c = claims["relative_improvement"]
    assert c["verdict"] == verdict and c["largest_on"] == largest
    assert c["splits"]["unseen"]["relative"] == pytest.approx(
        (aepo["unseen"][0] - naive["unseen"][0]) / naive["unseen"][0])
    assert claims["exploration"]["aepo_explores_more"]
    less = _claims(_stats({"aepo": aepo, "naive": naive}, n=(1.0, 1.0)))
    assert less["exploration"]["verdict"] == "not reproduced"


def test_claims_need_both_variants():
    stats = _stats({v: {"seen": [0.5], "unseen": [0.4]} for v in ("aepo", "naive")})
    assert _claims({"aepo": stats["aepo"]}) is None
    zero = _stats({"aepo": {"seen": [0.1], "unseen": [0.1]},
                   "naive": {"seen": [0.0], "unseen": [0.0]}})
    c = _claims(zero)["relative_improvement"]  # naive at 0: no relative number, still better
    assert c["splits"]["seen"]["relative"] is None and c["improves_on"] == list(SPLITS)


@pytest.mark.parametrize("override, message", [
    ("task.prompt_len=100", "task.prompt_len is 100 but the gui section's prompts take up to"),
    ("task.name=countdown", "task.name must be 'gui_grounding'"),
    ("gui.min_elements=9", "config field 'gui.min_elements' must be in [3, 8], got 9"),
    ("variants.names=[aepo,bogus]", "config section 'variants': names must be distinct"),
    ("grpo.max_new_tokens=20", "'grpo.max_new_tokens'"),
])
def test_bad_config_is_one_line_exit_2(override, message, tmp_path, capsys):
    assert main(["run", "aepo_grounding", *SMOKE, "--set", override, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err

"""The siren_entropy experiment (issue 5) through the CLI at smoke size."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from jaxrl_suite.cli import main
from jaxrl_suite.core.config import load_config
from jaxrl_suite.core.metrics import read_metrics
from jaxrl_suite_experiments.siren_entropy import VARIANTS, Config, variant_config

SMOKE = ["--smoke", "--no-progress"]
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "siren_entropy.yaml"


def _records(out, run):
    return [r for r in read_metrics(out / "runs" / run / "metrics.jsonl") if r["stage"] == "grpo"]


def test_variant_configs_differ_only_in_entropy_control():
    cfg = load_config(Config, CONFIG)
    by_name = {v: variant_config(cfg, v) for v in VARIANTS}
    assert by_name["plain"] == cfg.grpo
    assert (by_name["naive"].entropy_reg, by_name["naive"].entropy_coef) == (
        "naive", cfg.variants.naive_coef)
    assert by_name["high_entropy"].high_entropy_quantile == cfg.variants.high_entropy_quantile
    assert by_name["high_entropy"].entropy_reg == "none"
    assert (by_name["siren"].entropy_reg, by_name["siren"].entropy_coef) == (
        "siren", cfg.variants.siren_coef)
    for g in by_name.values():  # everything else is shared
        assert (g.lr, g.steps, g.group_size, g.max_new_tokens) == (
            cfg.grpo.lr, cfg.grpo.steps, cfg.grpo.group_size, cfg.grpo.max_new_tokens)


def test_smoke_run_writes_results(tmp_path, capsys, figures):
    assert main(["run", "siren_entropy", *SMOKE, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[siren_entropy] SFT:" in out and "| siren |" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary["variants"]) == list(VARIANTS)
    for variant, stats in summary["variants"].items():
        for key in ("greedy_accuracy", "sampled_accuracy", "pass@1", "pass@4", "maj@1", "maj@4",
                    "length"):
            assert len(stats[key]["per_seed"]) == 2, (variant, key)
            assert 0.0 <= stats[key]["mean"] <= (1.0 if key != "length" else 28.0)
        assert stats["pass@4"]["mean"] >= stats["pass@1"]["mean"]  # pass@k grows with k
    claims = summary["claims"]
    assert set(claims["entropy"]) == set(VARIANTS)
    for m, best in claims["best_variant"].items():  # the variants tied for the top mean
        means = {v: s[m]["mean"] for v, s in summary["variants"].items()}
        assert best == [v for v in VARIANTS if means[v] == max(means.values())], m
    for name in ("entropy.png", "length.png", "accuracy.png"):
        assert (tmp_path / name).stat().st_size > 1000
        key = name.removesuffix(".png")
        ax, = figures[name]["axes"]
        lines = {line["label"]: line["y"] for line in ax["lines"]}
        for v in VARIANTS:  # the median over seeds of each variant's curve (2 steps: unsmoothed)
            seeds = [[r[key] for r in _records(tmp_path, f"{v}_s{s}")] for s in (0, 1)]
            np.testing.assert_allclose(lines[v], np.median(seeds, axis=0), err_msg=(name, v))
    hline = [line for line in figures["entropy.png"]["axes"][0]["lines"]
             if line["label"] not in VARIANTS]
    assert hline and hline[0]["y"][0] == pytest.approx(claims["sft_entropy"])
    table = (tmp_path / "table.md").read_text().splitlines()
    assert len(table) == 3 + len(VARIANTS) and table[2].startswith("| SFT (start) |")
    assert table[0].startswith("| model | greedy_accuracy | sampled_accuracy | pass@1 |")
    assert 0.0 <= summary["sft"]["sampled_accuracy"] <= 1.0

    # Each variant logs its own metrics; every run has grpo.steps records.
    for variant in VARIANTS:
        for seed in (0, 1):
            recs = _records(tmp_path, f"{variant}_s{seed}")
            assert [r["step"] for r in recs] == [1, 2]
            assert all(np.isfinite(r["entropy"]) for r in recs)
    assert _records(tmp_path, "naive_s0")[0]["entropy_reg"] < 0  # -coef * H
    siren = _records(tmp_path, "siren_s0")[0]
    for key in ("top_p_entropy", "siren_entropy", "masked_fraction", "anchor", "entropy_reg"):
        assert np.isfinite(siren[key]), key
    assert siren["entropy_reg"] >= 0  # coef * (H_bar - anchor)^2
    result = json.loads((tmp_path / "runs" / "siren_s0" / "result.json").read_text())
    assert result["anchor"] == pytest.approx(siren["anchor"])
    assert 0 < _records(tmp_path, "high_entropy_s0")[0]["pg_token_frac"] < 1
    assert "pg_token_frac" not in _records(tmp_path, "plain_s0")[0]

    # Every run starts from the same SFT policy: step 1 samples with the seed's key from the
    # same params, so its rollout entropy is the same for every variant of a seed.
    for seed in (0, 1):
        first = [_records(tmp_path, f"{v}_s{seed}")[0]["entropy"] for v in VARIANTS]
        np.testing.assert_allclose(first, first[0], rtol=1e-6)


def test_resume_after_kill_matches_straight_run(tmp_path):
    sets = ["--set", "variants.names=[plain,siren]", "--set", "run.seeds=[0]",
            "--set", "grpo.steps=4", "--set", "run.checkpoint_every=2"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert main(["run", "siren_entropy", *SMOKE, *sets, "--out", str(straight)]) == 0
    assert main(["run", "siren_entropy", *SMOKE, *sets, "--out", str(killed)]) == 0
    # Kill siren_s0 after step 3: its step-4 checkpoint and result are gone (step 4 is logged).
    shutil.rmtree(killed / "checkpoints" / "siren_s0" / "4")
    (killed / "runs" / "siren_s0" / "result.json").unlink()
    (killed / "summary.json").unlink()
    plain_before = (killed / "runs" / "plain_s0" / "result.json").read_text()
    assert main(["run", "siren_entropy", *SMOKE, *sets, "--out", str(killed), "--resume"]) == 0

    assert (killed / "runs" / "plain_s0" / "result.json").read_text() == plain_before
    a, b = _records(straight, "siren_s0"), _records(killed, "siren_s0")
    assert [r["step"] for r in b] == [1, 2, 3, 4]  # each step once
    for key in ("reward", "entropy", "anchor", "entropy_reg"):
        np.testing.assert_allclose([r[key] for r in a], [r[key] for r in b], rtol=1e-5,
                                   err_msg=key)
    ra = json.loads((straight / "runs" / "siren_s0" / "result.json").read_text())
    rb = json.loads((killed / "runs" / "siren_s0" / "result.json").read_text())
    for key in ("greedy_accuracy", "pass@1", "pass@4", "maj@4", "length", "anchor"):
        assert ra[key] == pytest.approx(rb[key]), key
    sa = json.loads((straight / "summary.json").read_text())["variants"]
    sb = json.loads((killed / "summary.json").read_text())["variants"]
    assert sa["siren"]["pass@4"]["per_seed"] == pytest.approx(sb["siren"]["pass@4"]["per_seed"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("variants.names=[plain,bogus]", "config section 'variants': names must be distinct"),
        ("variants.names=[plain,plain]", "config section 'variants': names must be distinct"),
        ("eval.ks=[1,8]", "config section 'eval': eval.ks=[1, 8] must lie in 1..eval.samples=4"),
        ("grpo.entropy_reg=siren", "use the variants.* fields instead"),
        ("grpo.high_entropy_quantile=0.5", "use the variants.* fields instead"),
        ("task.name=sorting", "unknown task 'sorting'"),
        ("run.seeds=[]", "config section 'run': run.seeds must be distinct and non-empty"),
        ("variants.siren_coeff=1", "unknown config key 'variants.siren_coeff'"),
        ("grpo.max_new_tokens=12", "'grpo.max_new_tokens'"),
    ],
)
def test_bad_config_is_one_line_exit_2(override, message, tmp_path, capsys):
    assert main(["run", "siren_entropy", *SMOKE, "--set", override,
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err

"""The gencls_strategies experiment (issue 23) through the CLI at smoke size: one run, several
checks of its outputs (table, claims and their verdicts, plots, logs), a resume, bad input."""

import json
from pathlib import Path

import numpy as np
import pytest

from jaxrl_suite.algorithms.gencls import STRATEGIES, StrategiesConfig
from jaxrl_suite.cli import main
from jaxrl_suite.core.config import load_config
from jaxrl_suite.core.metrics import read_metrics
from jaxrl_suite_experiments.gencls_strategies import Config

SMOKE = ["--smoke", "--no-progress"]
NAMES = ["base", "ppl", "reasoning"]  # the smoke config's strategies
CONFIG = Path(__file__).resolve().parents[2] / "experiments" / "configs" / \
    "gencls_strategies.yaml"


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, module_figures):
    out = tmp_path_factory.mktemp("gencls")
    assert main(["run", "gencls_strategies", *SMOKE, "--out", str(out)]) == 0
    return out, json.loads((out / "summary.json").read_text()), module_figures


def test_config_lists_every_strategy_and_twins():
    cfg = load_config(Config, CONFIG)
    assert list(cfg.strategies.names) == list(STRATEGIES)  # the full run has all of them
    assert cfg.strategies.twin("ppl") == "base"
    assert all(cfg.strategies.twin(v) == v for v in STRATEGIES if v != "ppl")
    assert cfg.strategies.strategy("ppl").training == cfg.strategies.strategy("base")
    with pytest.raises(ValueError, match="'base', which must be listed before it"):
        StrategiesConfig(names=("ppl", "base"))
    with pytest.raises(ValueError, match="strategies.names"):
        StrategiesConfig(names=("base", "chain_of_thought"))


def test_table_and_results(smoke):
    out, summary, _ = smoke
    stats = summary["strategies"]
    assert list(stats) == NAMES
    for v in NAMES:
        r = json.loads((out / "runs" / f"{v}_s0" / "result.json").read_text())
        assert r["gain"] == pytest.approx(r["rl_accuracy"] - r["sft_accuracy"])
        for k in ("sft_accuracy", "rl_accuracy", "rl_uncertain", "rl_invalid"):
            assert 0.0 <= stats[v][k]["mean"] <= 1.0 and stats[v][k]["per_seed"] == [r[k]]
        # beside each greedy accuracy, pass@1 sampled at the training temperature; "ppl"
        # decodes by perplexity and samples nothing
        for k in ("sft_sampled_accuracy", "rl_sampled_accuracy"):
            if v == "ppl":
                assert k not in r and k not in stats[v]
            else:
                assert 0.0 <= r[k] <= 1.0 and stats[v][k]["per_seed"] == [r[k]]
    # "ppl" trains nothing: it decodes base's checkpoints, and always names a label
    assert not (out / "checkpoints" / "ppl_s0").exists()
    assert (out / "checkpoints" / "base_s0" / "grpo").is_dir()
    assert stats["ppl"]["rl_invalid"]["mean"] == 0.0 == stats["ppl"]["sft_invalid"]["mean"]
    lengths = summary["lengths"]
    assert set(lengths) == {"base", "reasoning"}
    assert lengths["reasoning"]["max_new_tokens"] > lengths["base"]["max_new_tokens"]
    assert all(n % 8 == 0 for v in lengths.values() for n in v.values())
    kw = summary["keyword_baseline_accuracy"]
    assert 0.0 <= kw <= 1.0
    table = (out / "table.md").read_text().splitlines()
    assert table[0].startswith("| strategy | SFT | SFT sampled | SFT+RL | SFT+RL sampled | "
                               "RL gain |")
    assert table[2].startswith(f"| keyword matcher | {kw:.3f} | - |")
    assert table[3 + NAMES.index("ppl")].split(" | ")[2] == "-"  # ppl: no sampled accuracy
    assert [row.split(" | ")[0] for row in table[3:]] == [f"| {v}" for v in NAMES]


def test_claims_are_computed_from_the_numbers(smoke):
    _, summary, _ = smoke
    stats, claims = summary["strategies"], summary["claims"]
    gains = np.array([stats[v]["gain"]["per_seed"] for v in NAMES])
    a = claims["rl_over_sft"]
    assert a["mean_gain"] == pytest.approx(gains.mean())
    assert a["mean_gain_points"] == pytest.approx(100 * gains.mean())
    assert a["gain_per_strategy"] == {v: stats[v]["gain"]["mean"] for v in NAMES}
    assert a["verdict"] == ("reproduced" if gains.mean(0).min() > 0 else "mixed"
                            if gains.mean() > 0 else "not reproduced")
    b = claims["no_reasoning_better"]
    diff = stats["base"]["rl_accuracy"]["mean"] - stats["reasoning"]["rl_accuracy"]["mean"]
    assert b["difference"] == pytest.approx(diff)
    assert b["verdict"] == ("reproduced" if diff > 0 else "not reproduced")  # one seed


def test_plots_and_logs(smoke):
    out, summary, figures = smoke
    ax, = figures["accuracy.png"]["axes"]
    assert ax["xticklabels"] == NAMES
    for series, key in (("SFT", "sft_accuracy"), ("SFT+RL", "rl_accuracy")):
        np.testing.assert_allclose(ax["bars"][series],
                                   [summary["strategies"][v][key]["mean"] for v in NAMES])
    hline = [line for line in ax["lines"] if list(line["x"]) == [0.0, 1.0]]  # axhline
    assert hline and hline[0]["y"][0] == pytest.approx(summary["keyword_baseline_accuracy"])
    curves = {line["label"]: line["y"] for line in figures["reward.png"]["axes"][0]["lines"]}
    assert set(curves) >= {"base", "reasoning"}
    for v in ("base", "reasoning"):  # SFT steps, then GRPO steps, then the final evaluation
        recs = read_metrics(out / "runs" / f"{v}_s0" / "metrics.jsonl")
        assert [r["stage"] for r in recs] == ["sft"] * 3 + ["grpo"] * 2 + ["final"]
        assert [r["step"] for r in recs] == [1, 2, 3, 4, 5, 5]
        np.testing.assert_allclose(curves[v], [r["reward"] for r in recs[3:5]])
        assert recs[-1]["eval_accuracy"] == summary["strategies"][v]["rl_accuracy"]["mean"]
        assert "outcome_entropy" in recs[3]  # the predicted classes are logged


def test_resume_reuses_the_results(smoke, capsys):
    out, summary, _ = smoke
    assert main(["run", "gencls_strategies", *SMOKE, "--out", str(out), "--resume"]) == 0
    assert "base_s0: done before" in capsys.readouterr().out
    again = json.loads((out / "summary.json").read_text())
    assert again["strategies"] == summary["strategies"] and again["resumed"]


@pytest.mark.parametrize("setting, message", [
    ("strategies.names=[ppl]", "'base', which must be listed before it"),
    ("topics.ambiguous=1.5", "config field 'topics.ambiguous' must be in [0, 1), got 1.5"),
    ("task.prompt_len=40", "'task.prompt_len' is 40 but strategy 'base' needs"),
])
def test_bad_input_is_one_line_exit_2(setting, message, tmp_path, capsys):
    assert main(["run", "gencls_strategies", *SMOKE, "--out", str(tmp_path), "--set",
                 setting]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err

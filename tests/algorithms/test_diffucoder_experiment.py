"""The diffucoder_coupled_grpo experiment (issue 22) through the CLI at smoke size, then resumed
after a simulated kill; and its config's one-line errors."""

import json

import pytest

from jaxrl_suite.algorithms.diffusion import DiffusionConfig
from jaxrl_suite.cli import main
from jaxrl_suite.core.metrics import read_metrics
from jaxrl_suite_experiments.diffucoder_coupled_grpo import Config, VarianceConfig

RUNS = ["coupled", "single", "full", "ar_grpo"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("diffucoder")
    assert main(["run", "diffucoder_coupled_grpo", "--smoke", "--no-progress", "--out",
                 str(out)]) == 0
    return out, json.loads((out / "summary.json").read_text())


def test_smoke_run_writes_every_run_and_figure(smoke):
    out, summary = smoke
    assert list(summary["variants"]) == RUNS
    for name in ("table.md", "pass1.png", "variance.png", "arness.png", "reward.png"):
        assert (out / name).is_file(), name
    table = (out / "table.md").read_text()
    for row in ("SFT (diffusion start)", "SFT continued", "SFT (autoregressive)", *RUNS):
        assert f"| {row} |" in table, row
    for run in RUNS:
        s = summary["variants"][run]
        assert 0.0 <= s["greedy_accuracy"]["mean"] <= 1.0 and 0.0 <= s["pass@1"]["mean"] <= 1.0
    for run in RUNS[:3]:  # AR-ness after RL, both decodings, in [0, 1]
        for key in ("local@1_greedy", "global@1_greedy", "local@2_sampled"):
            assert 0.0 <= summary["variants"][run][key]["mean"] <= 1.0, (run, key)
    sft = summary["sft"]
    assert set(sft["variance"]["3"]) == {"coupled", "single", "full"}
    assert sft["variance"]["3"]["full"]["variance"] == 0.0  # deterministic estimator
    assert sft["variance"]["3"]["coupled"]["variance"] > 0.0
    assert set(sft["arness_by_temperature"]) == {"1.0"}
    claims = summary["claims"]
    assert claims["coupled_over_single_variance"] == pytest.approx(
        sft["variance"]["3"]["coupled"]["variance"] / sft["variance"]["3"]["single"]["variance"])


def test_each_run_logs_its_stage_once_per_step(smoke):
    out, _ = smoke
    assert [r["stage"] for r in read_metrics(out / "metrics.jsonl")] == ["sft"] * 2
    assert [r["stage"] for r in read_metrics(out / "runs" / "ar_sft" / "metrics.jsonl")] == \
        ["sft"] * 2
    # the continued-SFT control resumes the SFT at its last step for grpo.steps more
    more = read_metrics(out / "runs" / "sft_more" / "metrics.jsonl")
    assert [(r["stage"], r["step"]) for r in more] == [("sft_more", 3), ("sft_more", 4)]
    for run in RUNS:
        recs = read_metrics(out / "runs" / f"{run}_s0" / "metrics.jsonl")
        assert [r["step"] for r in recs] == [1, 2], run
        assert all(r["stage"] == "grpo" for r in recs)
    # the diffusion runs' KL to the SFT start is finite and starts near zero (same params)
    first = read_metrics(out / "runs" / "coupled_s0" / "metrics.jsonl")[0]
    assert 0.0 <= first["kl"] < 1e-2


def test_resume_after_a_kill_redoes_only_the_missing_run(smoke):
    out, summary = smoke
    (out / "runs" / "single_s0" / "result.json").unlink()  # killed before the result
    (out / "summary.json").unlink()
    assert main(["run", "diffucoder_coupled_grpo", "--smoke", "--no-progress", "--resume",
                 "--out", str(out)]) == 0
    again = json.loads((out / "summary.json").read_text())
    for run in RUNS:  # the restored final checkpoint evaluates to the same numbers
        for key in ("greedy_accuracy", "pass@1", "local@1_greedy"):
            if key in summary["variants"][run]:
                assert again["variants"][run][key]["per_seed"] == pytest.approx(
                    summary["variants"][run][key]["per_seed"]), (run, key)
    recs = read_metrics(out / "runs" / "single_s0" / "metrics.jsonl")
    assert [r["step"] for r in recs] == [1, 2]  # nothing logged twice


def test_config_names_the_field_at_fault(capsys, tmp_path):
    with pytest.raises(ValueError, match="estimators"):
        Config(estimators=("coupled", "bogus"))
    with pytest.raises(ValueError, match="variance"):
        Config(variance=VarianceConfig(passes=(4,)))
    with pytest.raises(ValueError, match="diffusion.order"):
        Config(diffusion=DiffusionConfig(order="left"))
    # blocks of 5 do not tile the 24 completion positions: refused before any training
    assert main(["run", "diffucoder_coupled_grpo", "--smoke", "--set", "diffusion.block_size=5",
                 "--out", str(tmp_path)]) == 2
    assert "config section 'diffusion'" in capsys.readouterr().err

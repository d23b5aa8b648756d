"""The exit_self_improve experiment end to end through the CLI at --smoke size."""

import json

import numpy as np
import pytest

from jaxrl_suite.cli import main

SMOKE = ["run", "exit_self_improve", "--smoke", "--no-progress"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, module_figures):
    out = tmp_path_factory.mktemp("exit") / "run"
    assert main([*SMOKE, "--out", str(out)]) == 0
    return out, module_figures


def test_smoke_writes_scores_by_step_compute_and_plot(smoke_run):
    smoke_run, figures = smoke_run
    summary = json.loads((smoke_run / "summary.json").read_text())
    assert set(summary["variants"]) == {"grpo", "naive", "exit"}
    assert len(summary["sft_scores"]) == 3  # eval.steps in the smoke config
    assert 0.0 <= summary["sft_sampled_score"] <= 1.0  # step 1, one sample at grpo.temperature
    for v, s in summary["variants"].items():
        per_seed = np.array(s["scores"]["per_seed"])
        assert per_seed.shape == (2, 3) and ((0 <= per_seed) & (per_seed <= 1)).all()
        sampled = np.array(s["sampled_score"]["per_seed"])
        assert sampled.shape == (2,) and ((0 <= sampled) & (sampled <= 1)).all()
        np.testing.assert_allclose(s["scores"]["mean"], per_seed.mean(0))
        assert summary["claim"][v]["gain_total"] == pytest.approx(
            s["scores"]["mean"][-1] - s["scores"]["mean"][0])
    tokens = {v: s["train_tokens"]["mean"] for v, s in summary["variants"].items()}
    assert tokens["naive"] > 2 * tokens["grpo"]  # three turns of generation per episode
    assert (smoke_run / "iterations.png").stat().st_size > 1000
    ax, = figures["iterations.png"]["axes"]  # SFT's scores and each variant's mean by step
    lines = {line["label"]: line["y"] for line in ax["lines"]}
    np.testing.assert_allclose(lines["SFT (start)"], summary["sft_scores"])
    for v, s in summary["variants"].items():
        np.testing.assert_allclose(lines[v], s["scores"]["mean"])
    table = (smoke_run / "table.md").read_text()
    assert "| exit |" in table
    assert table.startswith("| model | score @ 1 | sampled score @ 1 | score @ 3 | training")
    records = [json.loads(x) for x in (smoke_run / "runs/exit_s0/metrics.jsonl").read_text()
               .splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[-1]["exit/size"] > 0 and "from_buffer_frac" in records[-1]


def test_resume_reruns_only_the_missing_run(smoke_run, capsys):
    smoke_run, _ = smoke_run
    before = json.loads((smoke_run / "runs/exit_s1/result.json").read_text())
    (smoke_run / "runs/exit_s1/result.json").unlink()
    capsys.readouterr()
    assert main([*SMOKE, "--out", str(smoke_run), "--resume"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("done before") == 5
    after = json.loads((smoke_run / "runs/exit_s1/result.json").read_text())
    # restored from its final checkpoint (train state and buffer): the same evaluation
    assert after["scores"] == before["scores"]
    assert after["sampled_score"] == before["sampled_score"]  # a fixed key: deterministic


@pytest.mark.parametrize("override, message", [
    ("variants.names=[exit,ppo]", "variants.names must be distinct entries"),
    ("task.name=chess", "unknown task 'chess'"),
    ("exit.p_select=2.0", "config field 'exit.p_select' must be in [0, 1], got 2.0"),
])
def test_bad_config_is_one_line_exit_2(override, message, tmp_path, capsys):
    assert main([*SMOKE, "--set", override, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err

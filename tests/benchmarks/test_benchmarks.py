"""Each benchmark runs end to end at its --smoke size and writes its JSON figures."""

import json
import runpy
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize(
    "name, unit",
    [("bench_sampler", "tok"), ("bench_grpo", "tok"), ("bench_ppo", "env-steps/s"),
     ("bench_lru_kernel", "reference"), ("bench_logprob_memory", "compiler estimates")],
)
def test_benchmark_smoke(name, unit, tmp_path, monkeypatch, capsys):
    out = tmp_path / f"{name}.json"
    monkeypatch.setattr(sys, "argv", [name, "--smoke", "--out", str(out)])
    runpy.run_path(str(BENCH / f"{name}.py"), run_name="__main__")
    figures = json.loads(out.read_text())
    assert figures, name
    printed = capsys.readouterr().out
    assert unit in printed  # the throughput figures are printed

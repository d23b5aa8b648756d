"""Each benchmark runs end to end at its --smoke size and writes its JSON figures."""

import json
import runpy
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize("name", ["bench_sampler", "bench_grpo"])
def test_benchmark_smoke(name, tmp_path, monkeypatch, capsys):
    out = tmp_path / f"{name}.json"
    monkeypatch.setattr(sys, "argv", [name, "--smoke", "--out", str(out)])
    runpy.run_path(str(BENCH / f"{name}.py"), run_name="__main__")
    figures = json.loads(out.read_text())
    assert figures, name
    printed = capsys.readouterr().out
    assert "tok" in printed  # the tokens/s figures are printed

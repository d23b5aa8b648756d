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
     ("bench_lru_kernel", "reference"), ("bench_logprob_memory", "compiler estimates"),
     ("bench_rollout", "identical"), ("bench_sandbox", "programs/s"), ("bench_agent", "traj/s"),
     ("bench_hostile", "vs ordinary"), ("bench_ondevice_grpo", "host loop / vmapped program"),
     ("bench_video", "all / k")],
)
def test_benchmark_smoke(name, unit, tmp_path, monkeypatch, capsys):
    out = tmp_path / f"{name}.json"
    monkeypatch.setattr(sys, "argv", [name, "--smoke", "--out", str(out)])
    runpy.run_path(str(BENCH / f"{name}.py"), run_name="__main__")
    figures = json.loads(out.read_text())
    assert figures, name
    printed = capsys.readouterr().out
    assert unit in printed  # the throughput figures are printed
    if name == "bench_rollout":  # every engine reproduced the static sampler's completions
        assert [r["identical"] for r in figures["engines"]] == [True] * 6
    if name == "bench_grpo":  # the roofline: compiler FLOPs of the update, a measured rate
        roof = figures["roofline"]
        assert roof["update_gflop"] > 0 and roof["matmul"]["gflops_per_s"] > 0
        assert roof["update_fraction"] > 0 and "roofline" in printed
    if name == "bench_ondevice_grpo":  # seed 0 ran the same GRPO both ways; a ratio per round
        assert figures["seed0_reward_max_abs_diff"] < 1e-6
        assert len(figures["ratios"]["vmap"]) == 1 and figures["median"]["vmap"] > 0
    if name == "bench_video":  # 32 frames of 9 + 2 tokens against 4, the same question text
        tokens = figures["prompt_tokens_per_video"]
        assert tokens["all"] - tokens["k"] == pytest.approx((32 - 4) * 11)
    if name == "bench_sandbox":  # the pools agreed with the serial loop on every status
        assert figures["statuses"] == {"error": 2, "failed": 4, "ok": 2}  # syntax error: error
        assert all(r["programs_per_s"] > 0 for r in figures["pools"])
    if name == "bench_hostile":  # every case ran, each hostile input checked its own result
        assert [r["case"] for r in figures["cases"]] == [
            "calculator", "countdown", "composite", "aepo", "tasks", "verifiers", "gui",
            "facts search"]
        assert len(figures["cases"][0]["inputs"]) == 19 and figures["checked"] is True


def test_bench_scale_smoke(tmp_path):
    """bench_scale compiles the update and sampler on 64 fake devices (its own process: the
    device count is fixed when JAX starts) and writes per-device compiler estimates; the tiny
    VLM too, one image per row in the batch and the sampler."""
    import os
    import subprocess

    out = tmp_path / "bench_scale.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, str(BENCH / "bench_scale.py"), "--smoke", "--out",
                           str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "compiler estimates" in proc.stdout
    figures = json.loads(out.read_text())
    assert figures["devices"] == 64
    done = [r for r in figures["rows"] if "update" in r and r["model"] == "tiny"]
    assert {(r["mesh"], r["option"]) for r in done} == {
        (m, o) for m in ("data8", "fsdp8-tp2") for o in ("f32", "lora16-bf16-block-chunk-mb8")}
    for r in done:
        u = r["update"]
        assert 0 < u["argument"] and 0 < u["peak"], r
    by = {(r["mesh"], r["option"]): r["update"]["argument"] for r in done}
    # the state split over fsdp 8 x tensor 2 holds less per device than a replicated one
    assert by[("fsdp8-tp2", "f32")] < by[("data8", "f32")]
    # LoRA: no Adam moments for the frozen base, so fewer argument bytes than full training
    assert by[("data8", "lora16-bf16-block-chunk-mb8")] < by[("data8", "f32")]
    vl = [r for r in figures["rows"] if r["model"] == "tiny-vl"]
    assert [(r["mesh"], r["option"]) for r in vl] == [("fsdp8-tp2", "bf16-block-chunk-mb8")]
    assert vl[0]["image"] == {"pixels": 16, "tokens": 4}  # (16 / 4)^2 patches, 2 x 2 merged
    for part in ("update", "sampler"):
        assert vl[0][part]["argument"] > 0 and vl[0][part]["temp"] > 0, vl[0]

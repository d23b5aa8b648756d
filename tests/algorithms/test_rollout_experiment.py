"""The rollout_efficiency experiment (issue 18) through the CLI at smoke size, and the
grpo.rollout options."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from lm_helpers import killed_and_resumed

from jaxrl_suite.algorithms.grpo_config import GRPOConfig
from jaxrl_suite.cli import main
from jaxrl_suite.core.config import from_dict, load_config
from jaxrl_suite.core.metrics import read_metrics
from jaxrl_suite_experiments.rollout_efficiency import VARIANTS, Config, variant_config

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "rollout_efficiency.yaml"


def _untimed(record: dict) -> dict:
    return {k: v for k, v in record.items() if not re.search("time|per_s", k)}


def _records(out, run):
    return [r for r in read_metrics(out / "runs" / run / "metrics.jsonl") if r["stage"] == "grpo"]


def test_variant_configs_differ_only_in_the_engine():
    cfg = load_config(Config, CONFIG)
    by_name = {v: variant_config(cfg, v) for v in VARIANTS}
    assert by_name["static"] == cfg.grpo
    assert (by_name["continuous"].rollout.engine, by_name["continuous"].rollout.slots) == (
        "continuous", cfg.engines.slots)
    assert by_name["speculative"].rollout.drafter_steps == cfg.engines.drafter_steps > 0
    assert by_name["speculative_frozen"].rollout.drafter_steps == 0
    for g in by_name.values():
        assert g.memory == cfg.grpo.memory
        assert (g.lr, g.steps, g.group_size, g.max_new_tokens, g.temperature) == (
            cfg.grpo.lr, cfg.grpo.steps, cfg.grpo.group_size, cfg.grpo.max_new_tokens,
            cfg.grpo.temperature)


CONTINUOUS = {"engine": "continuous", "slots": 8}


@pytest.mark.parametrize("section, error", [
    ({"rollout": {"engine": "vllm"}}, "grpo.rollout.engine must be one of"),
    ({"rollout": {"slots": 8}},
     "grpo.rollout.slots applies to grpo.rollout.engine='continuous' only"),
    ({"rollout": {"engine": "continuous"}}, "needs grpo.rollout.slots > 0"),
    ({"rollout": CONTINUOUS, "memory": {"rollout_micro_batch": 8}},
     "grpo.memory.rollout_micro_batch does not"),
    ({"rollout": {**CONTINUOUS, "schedule": "random"}}, "grpo.rollout.schedule must be one of"),
    ({"rollout": {"engine": "speculative", "draft_k": 3}}, "grpo.rollout.draft_k must be null"),
    ({"rollout": {**CONTINUOUS, "draft_k": 2}}, "grpo.rollout.draft_k applies to"),
    ({"rollout": {"drafter_steps": 4}},
     "grpo.rollout.drafter_steps applies to grpo.rollout.engine='speculative'"),
])
def test_bad_engine_options_are_one_line_errors(section, error):
    with pytest.raises(ValueError, match=error) as e:  # as the YAML's grpo section
        from_dict(GRPOConfig, section, prefix="grpo.")
    assert "\n" not in str(e.value)


def test_smoke_run_writes_results(tmp_path, capsys):
    assert main(["run", "rollout_efficiency", "--smoke", "--no-progress",
                 "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary["variants"]) == list(VARIANTS)
    # held-out: greedy accuracy and pass@1 sampled at the training temperature, start and runs
    for stats in (summary["sft"], *summary["variants"].values()):
        for k in ("greedy_accuracy", "sampled_accuracy"):
            value = stats[k]["mean"] if isinstance(stats[k], dict) else stats[k]
            assert 0.0 <= value <= 1.0, k
    table = (tmp_path / "table.md").read_text().splitlines()
    assert table[0].startswith("| model | greedy_accuracy | sampled_accuracy |")
    assert [row.split(" | ")[0] for row in table[2:]] == [
        "| SFT (start)", *(f"| {v}" for v in VARIANTS)]
    claims = summary["claims"]
    for seed in (0,):
        static = _records(tmp_path, f"static_s{seed}")
        cont = _records(tmp_path, f"continuous_s{seed}")
        # the same keys and params: the continuous engine's rollouts are the static one's at
        # every step (docs/rollout.md: "identical at every step of every seed")
        assert len(cont) == len(static) == 2  # smoke: grpo.steps = 2
        assert [r["step"] for r in cont] == [r["step"] for r in static]
        assert [r["reward"] for r in cont] == [r["reward"] for r in static]
        assert [r["tokens"] for r in cont] == [r["tokens"] for r in static]
        assert cont[0]["rollout_decode_steps"] > 0
        for v in ("speculative", "speculative_frozen"):
            recs = _records(tmp_path, f"{v}_s{seed}")
            assert all(0.0 <= r["rollout_acceptance"] <= 1.0 for r in recs)
            assert ("drafter_kd" in recs[0]) == (v == "speculative")  # frozen: no KD
            assert 0.0 < recs[0]["drafter_alpha"] <= 1.0  # measured for both drafters
            assert recs[0]["drafter_time"] > 0
            assert recs[0]["drafter_draft_k"] in (0, 1, 2, 4, 8)
    # max over seeds and steps of |continuous reward - static reward|: exactly 0
    assert claims["continuous"]["max_step_reward_diff"] == 0.0
    for v in ("speculative", "speculative_frozen"):
        assert 0.0 < claims[v]["alpha_first"] <= 1.0 and claims[v]["draft_k_mean"] >= 0
    for v in ("continuous", "speculative", "speculative_frozen"):
        assert np.isfinite(claims[v]["step_time_vs_static"])
    # the continuous engine decodes in engines.slots rows: less memory than all rows at once
    assert summary["variants"]["continuous"]["memory_peak_mb"]["mean"] < \
        summary["variants"]["static"]["memory_peak_mb"]["mean"]
    for name in ("reward.png", "acceptance.png"):
        assert (tmp_path / name).stat().st_size > 1000


def test_a_killed_run_resumes_exactly(tmp_path):
    """What the engines learn (the continuous engine's length table, the speculative drafter,
    its Adam state and the controller's estimate) is checkpointed with the train state: a run
    killed after step 2 of 4 and resumed logs the uninterrupted run's steps 3 and 4 exactly."""
    sets = ["--set", "engines.names=[continuous,speculative]", "--set", "grpo.steps=4",
            "--set", "run.checkpoint_every=2"]
    straight, killed = killed_and_resumed("rollout_efficiency", sets, tmp_path,
                                          ["continuous_s0", "speculative_s0"], killed_at=2)
    for run in ("continuous_s0", "speculative_s0"):
        a, b = _records(straight, run), _records(killed, run)
        assert [r["step"] for r in b] == [1, 2, 3, 4]  # each step once
        # every logged number but the timings: reward, loss, the rollout engine's stats (the
        # length table's predictions, the drafter's KD loss and acceptance, the draft length)
        assert [_untimed(r) for r in a] == [_untimed(r) for r in b], run
        assert "rollout_predicted_length" in a[0] or "drafter_kd" in a[0]
        ra = json.loads((straight / "runs" / run / "result.json").read_text())
        rb = json.loads((killed / "runs" / run / "result.json").read_text())
        for key in ("greedy_accuracy", "sampled_accuracy"):
            assert ra[key] == rb[key], (run, key)
    # the length table had learned something by step 3: a fresh one would predict N / 2 = 20
    assert _records(killed, "continuous_s0")[2]["rollout_predicted_length"] != 20.0

"""The r1zero_spatial experiment (issue 46) through the CLI at smoke size: one run shared by
the output checks (structure, finite numbers, the claims' keys, the analysis rates in [0, 1]),
the start rule and its gate on the verdicts, and one-line config errors."""

import json
import math

import pytest

from jaxrl_suite.cli import main
from jaxrl_suite.core.metrics import read_metrics
from jaxrl_suite.core.study import START_FAILS
from jaxrl_suite_experiments.r1zero_spatial import (
    EXPERIMENT,
    KEYS,
    NAME,
    TRACE,
    VARIANTS,
    PretrainConfig,
)

SMOKE = ["--smoke", "--no-progress"]
CLAIMS = {"cvbench_gain", "length_dip_then_grow", "aha", "instruct_trivial",
          "length_reward_ineffective"}
RATES = ("greedy_accuracy", "sampled_accuracy", *TRACE, *(k for k in KEYS if "_" in k
                                                            and k.split("_")[0] in ("acc",
                                                                                    "sampled")))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, run_smoke):
    return run_smoke(EXPERIMENT, tmp_path_factory.mktemp("r1zero"))


def _rate_ok(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x)) or 0.0 <= x <= 1.0


def test_summary_structure_and_numbers(smoke):
    out, s = smoke
    assert set(s["variants"]) == set(VARIANTS)
    for variant, stats in s["variants"].items():
        assert set(stats) == set(KEYS), variant
        for k in RATES:
            assert all(_rate_ok(x) for x in stats[k]["per_seed"]), (variant, k)
        for k in ("greedy_accuracy", "sampled_accuracy", "length", "trivial_rate"):
            assert math.isfinite(stats[k]["mean"]), (variant, k)
        assert 0 < stats["length"]["mean"] <= 192  # grpo.max_new_tokens
    start = s["start_check"]
    assert start["pretrain_steps"] == 2  # smoke: pretrain.steps, the rule never passes
    for k in ("sampled_accuracy", "mean_reward", "nondegenerate_share"):
        assert _rate_ok(start[k]) and math.isfinite(start[k]), k
    for style in ("base_think", "base_direct", "instruct_think"):
        assert all(_rate_ok(start[style][k]) for k in RATES), style
        assert start[style]["examples"][0]["prompt"].startswith("<image>User: ")
    assert start["base_think"]["examples"][0]["prompt"].endswith("Assistant: <think>")
    assert s["per_seed"].keys() == {f"{v}_s0" for v in VARIANTS}
    for f in ("accuracy.png", "categories.png", "length_curve.png", "table.md",
              "start_check.json"):
        assert (out / f).stat().st_size > 0, f


def test_claims_have_their_keys_and_a_verdict(smoke):
    _, s = smoke
    claims = s["claims"]
    assert set(claims) == CLAIMS
    assert s["start_check"]["start_passes"] is False  # smoke: 2 pretraining steps
    for name, c in claims.items():
        assert c["verdict"] == START_FAILS, name  # the numbers stay, the verdict is gated
        assert c["paper"], name
    assert len(claims["length_dip_then_grow"]["per_seed"]) == 1
    assert claims["cvbench_gain"]["greedy"]["r1zero"] == \
        s["variants"]["r1zero"]["greedy_accuracy"]["per_seed"]


def test_start_rule_passes_on_hand_made_checks():
    rule = PretrainConfig(stop_accuracy=0.3, min_nondegenerate=0.5)
    check = lambda acc, nondeg: {"sampled_accuracy": acc, "nondegenerate_share": nondeg}
    assert rule.passes(check(0.3, 0.5)) and rule.passes(check(0.9, 1.0))
    assert not rule.passes(check(0.29, 0.9)) and not rule.passes(check(0.6, 0.49))
    no_band = PretrainConfig(stop_accuracy=None, min_nondegenerate=0.5)  # accuracy unchecked
    assert no_band.passes(check(0.0, 0.5)) and not no_band.passes(check(1.0, 0.4))


def test_answers_tool_reproduces_the_rules_accuracy_and_sorts_every_answer(smoke, capsys):
    from jaxrl_suite_experiments.r1zero_answers import kind_of, main

    out, s = smoke
    assert main([str(out), "--smoke"]) == 0
    got = json.loads((out / "answers_2.json").read_text())  # the latest checkpoint: step 2
    assert got["step"] == 2 and len(got["rows"]) == 2 * 4  # check_examples x G (smoke)
    # the checkpoint reloaded and sampled again gives the rule's own figure at that step
    assert got["accuracy"] == pytest.approx(s["start_check"]["sampled_accuracy"])
    assert all(r["kind"] == kind_of(r["answer"], r["options"]) for r in got["rows"])
    assert "pretraining step 2" in capsys.readouterr().out
    for argv, named in (([str(out), "--smoke", "--step", "7"], "no step 7"),
                        ([str(out / "nowhere"), "--smoke"], "no checkpoint in")):
        assert main(argv) == 2  # a missing step or run: one line naming it, no traceback
        err = capsys.readouterr().err.strip()
        assert err.startswith("r1zero_answers: ") and named in err and "\n" not in err, err
    options = ("2", "left", "red circle")
    assert [kind_of(a, options) for a in (None, "left", "7", "below", "red", "circle",
                                         "blue square", "blue dog", "2")] == [
        "no answer", "option", "number", "direction", "colour", "shape", "object name", "other",
        "option"]


def test_logs_hold_the_stages(smoke):
    out, _ = smoke
    pre = read_metrics(out / "runs" / "pretrain" / "metrics.jsonl")
    assert [r["step"] for r in pre if "nondegenerate_share" in r] == [1, 2]  # check_every 1
    grpo = read_metrics(out / "runs" / "r1zero_s0" / "metrics.jsonl")
    assert [r["step"] for r in grpo] == [1, 2]
    assert all(math.isfinite(r["loss"]) and "reward_format" in r for r in grpo)
    length = read_metrics(out / "runs" / "length_s0" / "metrics.jsonl")
    for r in length:  # the designed reward: accuracy + format + 0.001 x bytes
        assert r["reward"] == pytest.approx(r["reward_accuracy"] + r["reward_format"]
                                            + 0.001 * r["reward_length"], abs=1e-5)
        assert r["reward_length"] > 0


@pytest.mark.parametrize("override, message", [
    ("variants.names=[r1zero,bogus]", "variants.names"),
    ("pretrain.check_every=0", "pretrain.check_every"),
    ("task.name=countdown", "task.name must be 'spatial_qa'"),
    ("grpo.max_new_tokens=64", "'grpo.max_new_tokens'"),
])
def test_bad_config_is_one_line_exit_2(override, message, tmp_path, capsys, smoke):
    # `smoke` registers the experiment where the installed entry points predate it
    assert main(["run", NAME, *SMOKE, "--set", override, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err

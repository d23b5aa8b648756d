"""The spatialtree_autothink experiment (issue 46) through the CLI at smoke size: one run shared
by the output checks (structure; per-level numbers, Δs, drops and correlations recomputed from
the stored per-seed numbers; the designed rewards in the GRPO logs; the plots), the verdicts on
synthetic numbers (every rung of the ladder, and the start gate), and one-line config errors."""

import json
import math

import numpy as np
import pytest

from jaxrl_suite.cli import main
from jaxrl_suite.core.metrics import read_metrics
from jaxrl_suite.core.study import NOT_REPRODUCED, PARTLY, REPRODUCED, seed_stats
from jaxrl_suite.envs.vision import LEVEL_OF
from jaxrl_suite_experiments.spatialtree_autothink import (
    ACC,
    COLS,
    EXPERIMENT,
    KEYS,
    L1,
    L34,
    MIXES,
    NAME,
    NOT_TESTED,
    START_RULE,
    UNDEFINED,
    VARIANTS,
    deltas,
    verdicts,
)

SMOKE = ["--smoke", "--no-progress"]
LADDER = (REPRODUCED, PARTLY, NOT_REPRODUCED, NOT_TESTED, UNDEFINED)
E1_CLAIMS = {"negative_transfer_within_l1", "cross_level_transfer", "blend_synergy",
             "l1_orthogonal_higher_correlated"}
E2_CLAIMS = {"think_everywhere_tradeoff", "auto_think_improves_all", "no_think_control"}
PNGS = ("transfer_delta.png", "rl_delta_levels.png", "think_rate.png", "length_curve.png",
        "reward_curve.png")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, run_smoke):
    return run_smoke(EXPERIMENT, tmp_path_factory.mktemp("spatialtree"))


def test_summary_structure(smoke):
    out, s = smoke
    assert s["parts"] == ["transfer", "rl"]
    assert set(s["transfer"]["variants"]) == set(MIXES)
    assert set(s["rl"]["variants"]) == set(VARIANTS)
    assert s["per_seed"].keys() == {f"{v}_s0" for v in (*MIXES, *VARIANTS)}
    for part in ("transfer", "rl"):
        for v, stats in s[part]["variants"].items():
            assert set(stats) == set(KEYS), v
            assert len(stats["greedy_accuracy"]["per_seed"]) == 1  # smoke: one seed
    for run in s["per_seed"].values():
        for k in KEYS:
            assert (0.0 <= run[k] <= 1.0) if not k.startswith("length") else run[k] > 0, k
    start = json.loads((out / "start_check.json").read_text())
    assert start == s["start_check"]
    r = start["training"]
    assert start["start_passes"] == (r["nondegenerate_share"] >= START_RULE["min_nondegenerate"]
                                     and 0.05 <= r["sampled_accuracy"] <= 0.95)
    assert set(KEYS) <= set(start) and len(start["examples"]) == len(COLS)
    assert set(s["rl"]["curves"]) == {"reward", "accuracy", "length"}
    for f in (*PNGS, "table.md"):
        assert (out / f).stat().st_size > 0, f


def test_levels_and_averages_are_the_means_of_their_columns(smoke):
    _, s = smoke
    for name, run in [*s["per_seed"].items(), ("start", s["start_check"])]:
        for m, avg in (("acc", "greedy_accuracy"), ("sampled", "sampled_accuracy")):
            assert run[avg] == pytest.approx(np.mean([run[f"{m}_{c}"] for c in COLS])), name
            for lv in (1, 2, 3, 4):
                want = np.mean([run[f"{m}_{c}"] for c in COLS if LEVEL_OF[c] == lv])
                assert run[f"{m}_L{lv}"] == pytest.approx(want), (name, m, lv)


def test_deltas_and_drops_are_differences_of_the_stored_accuracies(smoke):
    _, s = smoke
    runs, start = s["per_seed"], s["start_check"]
    for part, ref in (("transfer", lambda k: runs["general_s0"][k]), ("rl", lambda k: start[k])):
        for v, d in s[part]["delta"].items():
            diffs = {k: runs[f"{v}_s0"][k] - ref(k) for k in ACC}
            for k in ACC:
                assert d[k]["per_seed"] == pytest.approx([diffs[k]]), (v, k)
                assert d[k]["mean"] == pytest.approx(diffs[k]), (v, k)
            assert d["drops"] == [sum(diffs[f"acc_{c}"] < 0 for c in COLS)], v


def test_correlations_are_numpys(smoke):
    _, s = smoke
    x = np.array([[s["per_seed"][f"{m}_s0"][f"acc_{c}"] for c in COLS] for m in MIXES])
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.corrcoef(x, rowvar=False)
    flat = x.max(0) == x.min(0)
    corr = s["transfer"]["correlation"]
    assert corr["runs"] == len(MIXES)
    for name, cols in (("l1", L1), ("l34", L34)):
        i = [COLS.index(c) for c in cols]
        pairs = [r[a, b] for n, a in enumerate(i) for b in i[n + 1:]
                 if not (flat[a] or flat[b])]
        assert corr[f"pairs_{name}"] == len(pairs)
        np.testing.assert_allclose(corr[f"mean_{name}"], np.mean(pairs) if pairs else np.nan)


def test_verdicts_are_from_the_ladder(smoke):
    _, s = smoke
    assert set(s["claims"]) == E1_CLAIMS | E2_CLAIMS
    for name, c in s["claims"].items():
        assert c["verdict"] in LADDER and c["paper"], name
        if name in E2_CLAIMS and not s["start_check"]["start_passes"]:
            assert c["verdict"] == NOT_TESTED, name
    corr = s["transfer"]["correlation"]
    if not (math.isfinite(corr["mean_l1"]) and math.isfinite(corr["mean_l34"])):
        assert s["claims"]["l1_orthogonal_higher_correlated"]["verdict"] == UNDEFINED


def test_logs_hold_the_stages_and_the_designed_rewards(smoke):
    out, _ = smoke
    for mix in MIXES:
        assert [r["step"] for r in read_metrics(out / "runs" / f"{mix}_s0" / "metrics.jsonl")
                if r["stage"] == "sft"] == [1, 2]
    for v, mode_cost in (("no_think", lambda t: t), ("think_everywhere", lambda t: 1 - t)):
        recs = read_metrics(out / "runs" / f"{v}_s0" / "metrics.jsonl")
        assert [r["step"] for r in recs] == [1, 2]
        for r in recs:  # r = correct - 0.5 x (the wrong mode) on every level
            assert r["reward"] == pytest.approx(
                r["accuracy"] - 0.5 * mode_cost(r["reward_thinking"]), abs=1e-5)


def _run(cols: dict[str, float]) -> dict[str, float]:
    """One run's accuracy keys from its column accuracies."""
    out = {f"acc_{c}": cols[c] for c in COLS}
    out["greedy_accuracy"] = float(np.mean(list(cols.values())))
    for lv in (1, 2, 3, 4):
        out[f"acc_L{lv}"] = float(np.mean([cols[c] for c in COLS if LEVEL_OF[c] == lv]))
    return out


def _stats(per_seed: list[dict[str, float]]) -> dict:
    return {k: seed_stats([_run(cols)[k] for cols in per_seed]) for k in ACC}


def _cols(base: float, **changes: float) -> dict[str, float]:
    out = dict.fromkeys(COLS, base)
    for group, value in changes.items():
        out.update(dict.fromkeys({"l1": L1, "l34": L34}.get(group, (group,)), value))
    return out


def _summary(e1: dict, e2: dict, passes: bool = True, corr=(0.1, 0.6)) -> dict:
    start = {**_run(_cols(0.5)), "start_passes": passes}
    s1 = {m: _stats(v) for m, v in e1.items()}
    s2 = {m: _stats(v) for m, v in e2.items()}
    return {"start_check": start, "transfer": {"variants": s1, "correlation": {
        "mean_l1": corr[0], "mean_l34": corr[1]}}, "rl": {"variants": s2,
                                                           "delta": deltas(s2, start)}}


E1 = {"general": [_cols(0.5)] * 3,  # the targets lower the other L1 columns, raise L3/L4
      "localisation": [_cols(0.5, l1=0.4, localisation=0.9, l34=0.6)] * 3,
      "relation": [_cols(0.5, l1=0.45, relation=0.9, l34=0.55)] * 3,
      "blend": [_cols(0.5, l34=0.7)] * 3}
E2 = {"think_everywhere": [_cols(0.5, l1=0.4, l34=0.7)] * 3,
      "auto_level": [_cols(0.6)] * 3, "no_think": [_cols(0.55)] * 3}


def test_verdicts_on_synthetic_numbers():
    v = {k: c["verdict"] for k, c in verdicts(_summary(E1, E2)).items()}
    assert v == dict.fromkeys(E1_CLAIMS | E2_CLAIMS, REPRODUCED)
    # one seed against: the claims hold on average only (partly)
    worse = {**E1, "localisation": E1["localisation"][:2] + [_cols(0.5, l1=0.6, l34=0.4)]}
    worse2 = {**E2, "auto_level": E2["auto_level"][:2] + [_cols(0.45)]}
    v = {k: c["verdict"] for k, c in verdicts(_summary(worse, worse2, corr=(0.6, 0.3))).items()}
    assert v["negative_transfer_within_l1"] == v["cross_level_transfer"] == PARTLY
    assert v["blend_synergy"] == REPRODUCED  # the blend still beats both on every seed
    assert v["auto_think_improves_all"] == PARTLY  # gain 0.05 on average, not every seed
    assert v["l1_orthogonal_higher_correlated"] == NOT_REPRODUCED
    # no_think gains as much as auto_level: the control says it is RL, not thinking
    c = verdicts(_summary(E1, {**E2, "no_think": [_cols(0.6)] * 3}))["no_think_control"]
    assert c["verdict"] == NOT_REPRODUCED and c["no_think_as_large"]
    # a start that fails its rule: every E2 verdict is "not tested", E1's are unchanged
    v = {k: c["verdict"] for k, c in verdicts(_summary(E1, E2, passes=False)).items()}
    assert v == {**dict.fromkeys(E1_CLAIMS, REPRODUCED), **dict.fromkeys(E2_CLAIMS, NOT_TESTED)}
    v = verdicts(_summary(E1, E2, corr=(float("nan"), 0.5)))
    assert v["l1_orthogonal_higher_correlated"]["verdict"] == UNDEFINED


@pytest.mark.parametrize("override, message", [
    ("parts=[transfer,bogus]", "parts"),
    ("variants.names=[auto_level,think]", "variants.names"),
    ("transfer.mixes=[general,geometry]", "transfer.mixes"),
    ("transfer.target_share=0.1", "mix_abilities"),
    ("task.name=countdown", "task.name must be 'spatial_tree'"),
    ("eval.num_examples=12", "multiples of 11"),
    ("grpo.max_new_tokens=64", "'grpo.max_new_tokens'"),
])
def test_bad_config_is_one_line_exit_2(override, message, tmp_path, capsys, smoke):
    # `smoke` registers the experiment where the installed entry points predate it
    assert main(["run", NAME, *SMOKE, "--set", override, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err

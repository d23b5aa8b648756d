"""The Study runner: variants x seeds, resumable runs, aggregation against numpy."""

import json

import numpy as np
import pytest

from jaxrl_suite.core.checkpoint import Checkpointer
from jaxrl_suite.core.experiment import RunOptions
from jaxrl_suite.core.metrics import read_metrics, record_figures
from jaxrl_suite.core.study import (
    Study,
    check_seeds,
    check_variants,
    compare_seeds,
    group_correlations,
    open_run_log,
    seed_deltas,
    seed_stats,
    verdict,
)


def _study(tmp_path, resume=False):
    return Study("probe", RunOptions(out_dir=tmp_path, resume=resume), variants=("a", "b"),
                 seeds=(0, 3))


def _train(calls):
    def train(variant, seed, start):
        calls.append((variant, seed))
        return {"score": start + seed + (10.0 if variant == "b" else 0.0),
                "curve": [float(seed), 2.0 * seed]}
    return train


def test_run_every_variant_and_seed_and_resume_keeps_finished_runs(tmp_path):
    calls = []
    results = _study(tmp_path).run(_train(calls), start=1.0)
    assert calls == [("a", 0), ("a", 3), ("b", 0), ("b", 3)]
    assert results["b_s3"] == {"variant": "b", "seed": 3, "score": 14.0, "curve": [3.0, 6.0]}
    saved = json.loads((tmp_path / "runs" / "a_s3" / "result.json").read_text())
    assert saved == results["a_s3"]
    (tmp_path / "runs" / "b_s0" / "result.json").unlink()  # as if killed during run b_s0
    calls.clear()
    resumed = _study(tmp_path, resume=True).run(_train(calls), start=1.0)
    assert calls == [("b", 0)] and resumed == results


def test_per_seed_starts(tmp_path):
    calls = []
    results = _study(tmp_path).run(_train(calls), start={0: 100.0, 3: 200.0},
                                   per_seed_start=True)
    assert results["a_s0"]["score"] == 100.0 and results["a_s3"]["score"] == 203.0


def test_aggregate_table_and_best_against_numpy(tmp_path):
    study = _study(tmp_path)
    results = study.run(_train([]), start=0.5)
    stats = study.aggregate(results, ["score", "curve"])
    a = np.array([0.5, 3.5])
    assert stats["a"]["score"]["mean"] == pytest.approx(a.mean())
    assert stats["a"]["score"]["std"] == pytest.approx(a.std())
    assert stats["a"]["score"]["per_seed"] == [0.5, 3.5]
    np.testing.assert_allclose(stats["b"]["curve"]["mean"], [1.5, 3.0])  # elementwise
    np.testing.assert_allclose(stats["b"]["curve"]["std"], [1.5, 3.0])
    table = study.table(stats, ["score"], first={"start": {"score": 0.5}, "other": {}})
    assert table.splitlines() == ["| model | score |", "|---|---|", "| start | 0.500 |",
                                  "| other | - |",  # a key a first row lacks
                                  "| a | 2.000 ± 1.500 |", "| b | 12.000 ± 1.500 |"]
    assert Study.best(stats, ["score"]) == {"score": ["b"]}
    tied = {"x": {"m": {"mean": 1.0}}, "y": {"m": {"mean": 1.0}}, "z": {"m": {"mean": 0.0}}}
    assert Study.best(tied, ["m"]) == {"m": ["x", "y"]}


def test_curves_and_curve_stats_read_the_run_logs(tmp_path):
    study = _study(tmp_path)
    rng = np.random.default_rng(0)
    want = {}
    for v in study.variants:
        for s in study.seeds:
            ys = rng.uniform(1, 2, 5)
            want[v, s] = ys
            log_dir = study.run_dir(v, s)
            log_dir.mkdir(parents=True)
            recs = [{"step": i + 1, "stage": "rl", "entropy": float(y)} for i, y in enumerate(ys)]
            recs.insert(0, {"step": 0, "stage": "sft", "entropy": 99.0})  # other stages ignored
            (log_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    curves = study.curves(["entropy"], stage="rl")
    x = np.stack([want["a", 0], want["a", 3]])
    np.testing.assert_allclose(curves["a"]["entropy"], x)
    got = Study.curve_stats(curves, "entropy", window=2)["a"]
    end = x[:, -2:].mean(1)
    assert got["start"] == pytest.approx(x[:, 0].mean()) and got["end"] == pytest.approx(end.mean())
    assert got["end_over_start"] == pytest.approx((end / x[:, 0]).mean())
    assert got["min"] == pytest.approx(x.min()) and got["max"] == pytest.approx(x.max())


def test_open_run_log_drops_records_after_the_last_stages_checkpoint(tmp_path):
    first, second = tmp_path / "ck" / "sft", tmp_path / "ck" / "grpo"
    log = open_run_log(tmp_path, [(first, 0), (second, 3)], resume=False)
    for step in range(1, 7):
        log.log({"step": step, "stage": "sft" if step <= 3 else "grpo"})
    log.close()
    ckpt = Checkpointer(first)
    ckpt.save(3, {"w": np.zeros(2)}, force=True)
    ckpt.close()
    resumed = open_run_log(tmp_path, [(first, 0), (second, 3)], resume=True)  # SFT done only
    resumed.close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    ckpt = Checkpointer(second)
    ckpt.save(1, {"w": np.zeros(2)}, force=True)
    ckpt.close()
    log = open_run_log(tmp_path, [(first, 0), (second, 3)], resume=True)
    log.log({"step": 5, "stage": "grpo"})
    log.close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 5]
    open_run_log(tmp_path, [(first, 0)], resume=False).close()  # a fresh run starts empty
    assert read_metrics(tmp_path / "metrics.jsonl") == []


def test_seed_and_variant_checks():
    with pytest.raises(ValueError, match="run.seeds must be distinct and non-empty"):
        check_seeds((1, 1))
    with pytest.raises(ValueError, match="run.seeds"):
        check_seeds(())
    with pytest.raises(ValueError, match=r"variants.names must be distinct entries of \['x'"):
        check_variants(("y",), ["x"])


def _units(tmp_path, resume=False):
    return Study("probe", RunOptions(out_dir=tmp_path, resume=resume), variants=("a", "b"),
                 seeds=(0, 3))


def test_run_units_saves_one_result_per_unit_and_resume_reads_it_back(tmp_path):
    calls = []

    def train(unit):
        calls.append(unit)
        return {"score": [1.0, 3.0] if unit == "d/a" else [2.0, 6.0], "curve": [[1, 2], [3, 6]]}

    results = _units(tmp_path).run_units(["d/a", "d/b"], train)
    assert calls == ["d/a", "d/b"]
    saved = json.loads((tmp_path / "runs" / "d" / "b" / "result.json").read_text())
    assert saved == results["d/b"] == {"unit": "d/b", "seeds": [0, 3], "score": [2.0, 6.0],
                                       "curve": [[1, 2], [3, 6]]}
    (tmp_path / "runs" / "d" / "a" / "result.json").unlink()  # as if killed during unit d/a
    calls.clear()
    assert _units(tmp_path, resume=True).run_units(["d/a", "d/b"], train) == results
    assert calls == ["d/a"]
    stats = Study.unit_stats(results, ["score", "curve", "missing"])
    assert set(stats["d/a"]) == {"score", "curve"}
    x = np.array([2.0, 6.0])
    q25, med, q75 = np.percentile(x, [25, 50, 75])
    got = stats["d/b"]["score"]
    assert (got["mean"], got["std"]) == pytest.approx((x.mean(), x.std()))
    assert (got["q25"], got["median"], got["q75"]) == pytest.approx((q25, med, q75))
    np.testing.assert_allclose(stats["d/a"]["curve"]["mean"], [2.0, 4.0])  # elementwise
    table = _units(tmp_path).table(stats, {"score": "score (higher is better)", "other": "o"},
                                   cell="median", label="unit", formats={"score": ".1f"})
    assert table.splitlines() == ["| unit | score (higher is better) | o |", "|---|---|---|",
                                  "| d/a | 2.0 [1.5, 2.5] | - |", "| d/b | 4.0 [3.0, 5.0] | - |"]


def test_unit_log_drops_what_follows_the_units_checkpoint(tmp_path):
    study = _units(tmp_path)
    log = study.unit_log("a")
    for step in (1, 2, 3):
        log.log({"step": step})
    log.close()
    ckpt = Checkpointer(study.checkpoint_dir("a"))
    ckpt.save(2, {"w": np.zeros(2)}, force=True)  # steps 1, 2 saved; 3 was lost with the kill
    ckpt.close()
    _units(tmp_path, resume=True).unit_log("a").close()
    assert [r["step"] for r in read_metrics(tmp_path / "runs" / "a" / "metrics.jsonl")] == [1, 2]


def test_log_seed_means_logs_every_kth_step_of_each_stage(tmp_path):
    study = _units(tmp_path)
    # two seeds x 4 steps, then 2 steps
    study.log_seed_means("u", {"fit": {"loss": [[1.0, 2.0, 3.0, 4.0], [3.0, 4.0, 5.0, 8.0]]},
                               "more": {"loss": [[10.0, 20.0], [30.0, 40.0]]}}, every=2)
    records = read_metrics(tmp_path / "runs" / "u" / "metrics.jsonl")
    assert [(r["step"], r["stage"], r["train_step"], r["loss"]) for r in records] == [
        (1, "fit", 2, 3.0), (2, "fit", 4, 6.0), (3, "more", 2, 30.0)]


def test_plot_bars_and_curves_show_the_data(tmp_path):
    study = _units(tmp_path)
    groups = {"g1": {"a": [1.0, 3.0], "b": [2.0, 2.0]}, "g2": {"a": [0.0, 4.0], "b": [5.0, 7.0]}}
    curves = {"a": {"y": np.array([[1.0, 2.0, 3.0], [3.0, 4.0, 9.0]])}}
    with record_figures() as figs:
        study.plot_bars(groups, tmp_path / "bars.png", ylabel="return", hline=0.0)
        study.plot_curves(curves, "y", tmp_path / "curves.png", x=[10, 20, 30])
    (ax,) = figs["bars.png"]["axes"]
    assert ax["xticklabels"] == ["g1", "g2"] and ax["legend"] == ["a", "b"]
    np.testing.assert_allclose(ax["bars"]["a"], [2.0, 2.0])
    np.testing.assert_allclose(ax["bars"]["b"], [2.0, 6.0])
    dots = np.concatenate([pts[:, 1] for pts in ax["scatter"]])
    np.testing.assert_allclose(dots, [1, 3, 0, 4, 2, 2, 5, 7])
    (line,) = [ln for ln in figs["curves.png"]["axes"][0]["lines"] if ln["label"] == "a"]
    np.testing.assert_array_equal(line["x"], [10, 20, 30])
    np.testing.assert_allclose(line["y"], [2.0, 3.0, 6.0])  # the median of 2 seeds


def test_a_finished_run_whose_checkpoint_does_not_read_runs_again(tmp_path, capsys):
    calls = []
    results = _study(tmp_path).run(_train(calls), start=1.0)
    for name in ("a_s0", "b_s3"):  # each run's checkpoints: two steps of one stage
        ck = Checkpointer(tmp_path / "checkpoints" / name / "grpo")
        for s in (1, 2):
            ck.save(s, {"w": np.arange(300.0) * s}, force=True)
        ck.close()
    for f in (tmp_path / "checkpoints" / "b_s3" / "grpo" / "2").rglob("*"):
        if f.is_file() and f.parent.name == "d":  # the array data, cut short
            f.write_bytes(f.read_bytes()[:10])
    calls.clear()
    resumed = _study(tmp_path, resume=True).run(_train(calls), start=1.0)
    assert calls == [("b", 3)] and resumed == results  # a_s0 trusted, b_s3 run again
    run = tmp_path / "runs" / "b_s3"
    assert (run / "result.json").is_file() and (run / "result.json.untrusted").is_file()
    assert "b_s3: its result is not trusted" in capsys.readouterr().out


def test_compare_seeds_is_welchs_test_and_the_per_seed_differences():
    """Against Welch's formula written out: t = (ma - mb) / sqrt(va/na + vb/nb) (sample
    variances), Welch-Satterthwaite degrees of freedom, two-sided p from Student's t."""
    from scipy.stats import t as student_t

    a, b = [0.30, 0.42, 0.35, 0.50], [0.20, 0.25, 0.33, 0.21]
    va, vb = np.var(a, ddof=1) / 4, np.var(b, ddof=1) / 4
    t = (np.mean(a) - np.mean(b)) / np.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / 3 + vb**2 / 3)
    c = compare_seeds(a, b)
    assert c["p_welch"] == pytest.approx(2 * student_t.sf(abs(t), df), rel=1e-9)
    assert c["difference"] == pytest.approx(np.mean(a) - np.mean(b))
    assert c["per_seed_difference"] == pytest.approx([0.10, 0.17, 0.02, 0.29])
    assert c["seeds_better"] == 4
    assert compare_seeds(b, a)["seeds_better"] == 0
    # one seed, or both arms constant and equal: no p-value; unequal seed counts: no per-seed
    # differences
    assert compare_seeds([0.5], [0.4])["p_welch"] is None
    assert compare_seeds([0.5, 0.5], [0.5, 0.5])["p_welch"] is None
    assert "seeds_better" not in compare_seeds(a, b[:3])
    stats = {"x": {"k": seed_stats(a)}, "y": {"k": seed_stats(b)}}
    assert Study.compare(stats, "x", "y", "k") == c


def test_seed_deltas_against_a_variant_and_a_single_value():
    stats = {"a": {"k": seed_stats([0.5, 0.7, 0.2])}, "b": {"k": seed_stats([0.4, 0.9, 0.2])}}
    d = seed_deltas(stats, stats["b"], ["k"])  # seed by seed
    assert d["a"]["k"]["per_seed"] == pytest.approx([0.1, -0.2, 0.0])
    assert d["a"]["k"]["mean"] == pytest.approx(-0.1 / 3)
    assert d["b"]["k"] == {"per_seed": [0.0, 0.0, 0.0], "mean": 0.0}
    one = seed_deltas(stats, {"k": 0.5}, ["k"])  # a start's single value
    assert one["b"]["k"]["per_seed"] == pytest.approx([-0.1, 0.4, -0.3])


def test_group_correlations_against_a_loop_of_pearsons_r():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 5))
    x[:, 4] = 0.3  # a constant column: its pairs have no correlation

    def pearson(a, b):
        a, b = a - a.mean(), b - b.mean()
        return (a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum())

    got = group_correlations(x, {"first": [0, 1, 2], "rest": [2, 3, 4], "flat": [4]})
    want = np.mean([pearson(x[:, i], x[:, j]) for i, j in ((0, 1), (0, 2), (1, 2))])
    assert got["first"] == {"mean": pytest.approx(want), "pairs": 3}
    assert got["rest"] == {"mean": pytest.approx(pearson(x[:, 2], x[:, 3])), "pairs": 1}
    assert np.isnan(got["flat"]["mean"]) and got["flat"]["pairs"] == 0
    with pytest.raises(ValueError, match="runs, columns"):
        group_correlations(x[0], {"a": [0, 1]})


def test_verdict_ladder():
    assert verdict(True) == verdict(True, True) == "reproduced"
    assert verdict(False, True) == "partly reproduced"
    assert verdict(False, True, partly_label="mixed") == "mixed"
    assert verdict(False) == verdict(False, False, partly_label="mixed") == "not reproduced"
    assert Study.verdict(False, True) == "partly reproduced"

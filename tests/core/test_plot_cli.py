"""`jaxrl-suite plot`: curves of several runs' metrics.jsonl, the median and IQR over seeds.

Synthetic run dirs only (no training): the seed bands are checked against numpy by hand.
"""

import json

import numpy as np
import pytest

from jaxrl_suite.cli import main
from jaxrl_suite.core.metrics import (
    aggregate_runs,
    default_plot_keys,
    plot_runs,
    seed_series,
    trailing_mean,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_run(run_dir, records):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


def _two_stage_run(run_dir, reward, loss_sft=(5.0, 4.0), *, steps_sft=2):
    """A run like grpo_arithmetic's: SFT steps, then GRPO steps (the step count continues), then
    a 'final' record at the last step."""
    recs = [{"step": s + 1, "stage": "sft", "loss": loss_sft[s]} for s in range(steps_sft)]
    recs += [{"step": steps_sft + i + 1, "stage": "grpo", "reward": r, "loss": -r}
             for i, r in enumerate(reward)]
    recs.append({"step": steps_sft + len(reward), "stage": "final", "eval_accuracy": 0.5})
    return _write_run(run_dir, recs)


def _assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 1000


def test_aggregate_runs_matches_numpy_by_hand():
    # Three seeds; seed c did not log step 3 (left out there, not counted as 0).
    series = [
        (np.array([1, 2, 3]), np.array([0.0, 1.0, 2.0])),
        (np.array([1, 2, 3]), np.array([1.0, 3.0, 4.0])),
        (np.array([1, 2]), np.array([2.0, 8.0])),
    ]
    b = aggregate_runs(series)
    assert b.seeds == 3
    np.testing.assert_array_equal(b.x, [1, 2, 3])
    np.testing.assert_allclose(b.median, [1.0, 3.0, 3.0])
    np.testing.assert_allclose(b.q25, [np.percentile([0, 1, 2], 25), np.percentile([1, 3, 8], 25),
                                       np.percentile([2, 4], 25)])
    np.testing.assert_allclose(b.q25, [0.5, 2.0, 2.5])
    np.testing.assert_allclose(b.q75, [1.5, 5.5, 3.5])
    # Smoothing is per seed, before aligning: a trailing mean over the seed's own points.
    # Smoothed: [0, .5, 1.5], [1, 2, 3.5], [2, 5]; per step medians of [0 1 2], [.5 2 5], [1.5 3.5].
    s = aggregate_runs(series, smooth=2)
    np.testing.assert_allclose(s.median, [1.0, 2.0, 2.5])
    np.testing.assert_allclose(s.q75, [1.5, 3.5, 3.0])
    np.testing.assert_allclose(trailing_mean([1.0, 3.0, 5.0, 7.0], 3), [1.0, 2.0, 3.0, 5.0])
    with pytest.raises(ValueError):
        aggregate_runs([])


def test_seed_series_reads_list_values_and_a_seed_field():
    # One value per seed in each record (a vmapped run) ...
    vmapped = [{"step": s, "return": [s, 10 * s, float("nan")]} for s in (1, 2)]
    curves = seed_series(vmapped, "return")
    assert len(curves) == 2  # the third seed logged only NaN: no curve
    np.testing.assert_allclose(curves[1][1], [10.0, 20.0])
    # ... or one record per seed and step.
    split = [{"step": s, "seed": k, "reward": k + s} for s in (1, 2) for k in (0, 1)]
    curves = seed_series(split, "reward")
    assert [c[1].tolist() for c in curves] == [[1.0, 2.0], [2.0, 3.0]]


def test_stage_default_is_the_last_stage_that_logs_the_key(tmp_path):
    run = _two_stage_run(tmp_path / "r", [0.1, 0.2])
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    (x, y), = seed_series(records, "loss")  # the GRPO loss, not joined to the SFT loss
    assert x.tolist() == [3, 4] and y.tolist() == [-0.1, -0.2]
    (x, y), = seed_series(records, "loss", stage="sft")
    assert x.tolist() == [1, 2]
    (x, y), = seed_series(records, "loss", stage="all")
    assert x.tolist() == [1, 2, 3, 4] and y.tolist() == [5.0, 4.0, -0.1, -0.2]
    assert default_plot_keys([records]) == ["reward", "loss"]


def test_plot_runs_pools_the_seeds_of_a_label(tmp_path):
    rewards = np.array([[0.0, 0.2, 0.4], [0.2, 0.4, 0.8], [0.1, 0.6, 0.9]])
    runs = {"grpo": [[{"step": s + 1, "reward": float(r[s])} for s in range(3)] for r in rewards],
            "single": [[{"step": s + 1, "reward": 0.5} for s in range(3)]]}
    bands = plot_runs(runs, ["reward"], tmp_path / "p.png")
    _assert_png(tmp_path / "p.png")
    b = bands["reward"]["grpo"]
    assert b.seeds == 3
    q25, med, q75 = np.percentile(rewards, [25, 50, 75], axis=0)
    np.testing.assert_allclose(b.median, med)
    np.testing.assert_allclose(b.q25, q25)
    np.testing.assert_allclose(b.q75, q75)
    assert bands["reward"]["single"].seeds == 1


def test_cli_plot_labels_and_globs_group_run_dirs(tmp_path, capsys):
    seeds = np.array([[0.1, 0.3, 0.5], [0.2, 0.5, 0.6], [0.0, 0.1, 0.9], [0.4, 0.4, 0.4]])
    for k, r in enumerate(seeds):
        _two_stage_run(tmp_path / f"grpo-s{k}", r.tolist())
    _two_stage_run(tmp_path / "base", [0.0, 0.0, 0.1])
    out = tmp_path / "figs" / "cmp.png"
    # Same --label: one curve over the dirs; a quoted glob: one curve over the dirs it matches.
    argv = ["plot", str(tmp_path / "grpo-s0"), str(tmp_path / "grpo-s1"), str(tmp_path / "base"),
            "--label", "grpo", "grpo", "base", "--out", str(out)]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == str(out)
    _assert_png(out)
    out2 = tmp_path / "glob.png"
    argv = ["plot", str(tmp_path / "grpo-s*"), str(tmp_path / "base"), "--keys", "reward",
            "eval_accuracy", "loss", "--stage", "all", "--smooth", "2", "--out", str(out2)]
    assert main(argv) == 0
    _assert_png(out2)
    # The same bands through the library: all four seeds in one curve.
    runs = {"g": [[{"step": s + 3, "reward": float(r[s])} for s in range(3)] for r in seeds]}
    b = plot_runs(runs, ["reward"], tmp_path / "lib.png")["reward"]["g"]
    np.testing.assert_allclose(b.median, np.median(seeds, axis=0))
    assert b.seeds == 4


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--keys", "rewrd"], "unknown key 'rewrd' in {run}"),
        (["--keys", "reward", "--stage", "sft"], "unknown key 'reward' in stage 'sft' of {run}"),
        (["--stage", "rl"], "no stage 'rl' in {run}"),
        (["--label", "a", "b"], "2 --label values for 1 RUN_DIRs"),
        (["--smooth", "0"], "--smooth 0 must be >= 1"),
    ],
)
def test_cli_plot_bad_input_is_one_line_and_exit_2(tmp_path, capsys, extra, needle):
    run = _two_stage_run(tmp_path / "run", [0.1, 0.2])
    assert main(["plot", str(run), "--out", str(tmp_path / "x.png"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxrl-suite: error: plot: ") and err.count("\n") == 1, err
    assert needle.format(run=run) in err
    assert not (tmp_path / "x.png").exists()


def test_cli_plot_missing_metrics_names_the_dir(tmp_path, capsys):
    good = _two_stage_run(tmp_path / "good", [0.1])
    empty = tmp_path / "empty"
    empty.mkdir()
    for bad, needle in [(empty, f"no metrics.jsonl in {empty}"),
                        (tmp_path / "absent", f"no metrics.jsonl in {tmp_path / 'absent'}"),
                        (str(tmp_path / "nomatch*"), "no run directory matches")]:
        assert main(["plot", str(good), str(bad), "--out", str(tmp_path / "x.png")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, err
    (empty / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "rew')
    assert main(["plot", str(empty)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(empty / "metrics.jsonl") in err, err

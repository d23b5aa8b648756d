"""The main job with `run.vmap_seeds` (its GRPO stage of every seed as one program,
`LMStudy.fit_seeds`) at smoke size, two seeds: the same per-seed outputs as the host loop (logs,
results, evaluations), and a run killed after a chunk resumes to the straight run's figures."""

import json
import shutil

import numpy as np
import pytest

from jaxrl_suite.cli import main
from jaxrl_suite.core.metrics import read_metrics

SETS = ["--smoke", "--no-progress", "--set", "grpo.steps=4", "--set", "run.checkpoint_every=2",
        "--set", "run.seeds=[0,1]", "--set", "eval.every=2"]
VMAP = ["--set", "run.vmap_seeds=true"]


def grpo_records(out, seed):
    return [r for r in read_metrics(out / "runs" / f"grpo_s{seed}" / "metrics.jsonl")
            if r["stage"] == "grpo"]


def test_same_outputs_as_the_host_loop_and_a_killed_run_resumes(tmp_path):
    """The host loop and run.vmap_seeds give the same outputs, and a killed vmapped run
    resumes to them (one test, so that two workers do not make the same runs twice)."""
    host, vmapped = tmp_path / "host", tmp_path / "vmapped"
    assert main(["run", "grpo_arithmetic", *SETS, "--out", str(host)]) == 0
    assert main(["run", "grpo_arithmetic", *SETS, *VMAP, "--out", str(vmapped)]) == 0
    assert (vmapped / "checkpoints" / "grpo_seeds" / "4").is_dir()
    assert not (vmapped / "checkpoints" / "grpo_s0" / "grpo").exists()
    for seed in (0, 1):
        a, b = grpo_records(host, seed), grpo_records(vmapped, seed)
        assert [r["step"] for r in b] == [r["step"] for r in a] == [4, 5, 6, 7]
        for key in ("reward", "accuracy", "length", "loss", "draws", "kept_frac"):
            np.testing.assert_allclose([r[key] for r in b], [r[key] for r in a], rtol=1e-4,
                                       atol=1e-6, err_msg=key)
        # the periodic evaluation at GRPO step 2, and the final one
        assert [r["step"] for r in b if "eval_accuracy" in r] == [5]
        assert [r["eval_accuracy"] for r in b if "eval_accuracy" in r] == pytest.approx(
            [r["eval_accuracy"] for r in a if "eval_accuracy" in r])
        ra = json.loads((host / "runs" / f"grpo_s{seed}" / "result.json").read_text())
        rb = json.loads((vmapped / "runs" / f"grpo_s{seed}" / "result.json").read_text())
        for key in ("sft_accuracy", "grpo_accuracy", "grpo_sampled", "sft_more_accuracy"):
            assert rb[key] == pytest.approx(ra[key]), key
    assert (vmapped / "summary.json").is_file() and (vmapped / "table.md").is_file()

    killed = tmp_path / "killed"
    shutil.copytree(vmapped, killed)
    shutil.rmtree(killed / "checkpoints" / "grpo_seeds" / "4")  # killed after the first chunk
    for seed in (0, 1):
        (killed / "runs" / f"grpo_s{seed}" / "result.json").unlink()
    (killed / "summary.json").unlink()
    assert main(["run", "grpo_arithmetic", *SETS, *VMAP, "--resume", "--out", str(killed)]) == 0
    for seed in (0, 1):
        a, b = grpo_records(vmapped, seed), grpo_records(killed, seed)
        assert [r["step"] for r in b] == [4, 5, 6, 7]  # every step once
        np.testing.assert_allclose([r["reward"] for r in b], [r["reward"] for r in a])
        np.testing.assert_allclose([r["loss"] for r in b], [r["loss"] for r in a], rtol=1e-6)
    # killed again after seed 0 had finished and seed 1 had not: the GRPO stage of both is
    # restored from its final checkpoint, and seed 1 ends as before
    (killed / "runs" / "grpo_s1" / "result.json").unlink()
    (killed / "summary.json").unlink()
    assert main(["run", "grpo_arithmetic", *SETS, *VMAP, "--resume", "--out", str(killed)]) == 0
    ra = json.loads((vmapped / "runs" / "grpo_s1" / "result.json").read_text())
    rb = json.loads((killed / "runs" / "grpo_s1" / "result.json").read_text())
    assert rb["grpo_accuracy"] == ra["grpo_accuracy"] and rb["gain"] == ra["gain"]
    assert [r["step"] for r in grpo_records(killed, 1)] == [4, 5, 6, 7]


def test_refused_where_it_cannot_run(tmp_path, capsys):
    assert main(["run", "grpo_arithmetic", "--smoke", *VMAP, "--set", "grpo.tis=true",
                 "--out", str(tmp_path / "a")]) == 2
    assert "config field 'run.vmap_seeds': grpo.tis=True" in capsys.readouterr().err
    assert main(["run", "grpo_arithmetic", "--smoke", *VMAP, "--set", "grpo.beta=0.1",
                 "--out", str(tmp_path / "c")]) == 2
    assert "each seed's own reference model" in capsys.readouterr().err
    assert main(["run", "rollout_efficiency", "--smoke", *VMAP,
                 "--out", str(tmp_path / "b")]) == 2
    assert "runs its seeds in the host loop" in capsys.readouterr().err

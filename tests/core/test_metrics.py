import json
import math

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.core.metrics import (
    MetricsLogger,
    median_iqr,
    plot_curves,
    plot_iqr_bands,
    read_metrics,
)


def test_logger_writes_jsonl_and_resume_drops_later_steps(tmp_path):
    with MetricsLogger(tmp_path) as log:
        for s in range(1, 6):
            log.log({"step": s, "loss": jnp.float32(s * 0.5), "n": np.int64(s)})
    recs = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5]
    assert recs[2] == {"step": 3, "loss": 1.5, "n": 3}
    # A run restored from the checkpoint after step 3 continues at step 4.
    with MetricsLogger(tmp_path, resume_step=4) as log:
        log.log({"step": 4, "loss": 9.0})
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert read_metrics(tmp_path / "metrics.jsonl")[-1]["loss"] == 9.0


def test_tensorboard_and_plot(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=True) as log:
        log.log({"step": 1, "stage": "grpo", "reward": 0.5})
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    recs = [{"step": i, "reward": math.sin(i), "accuracy": float("nan")} for i in range(30)]
    plot_curves(recs, ["reward", "accuracy"], tmp_path / "p.png", smooth=5)
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_median_iqr_hand_case_ignores_nan():
    x = np.array([[1.0, 10.0], [2.0, np.nan], [3.0, 30.0], [4.0, 40.0], [5.0, 50.0]])
    s = median_iqr(x, axis=0)
    np.testing.assert_allclose(s["median"], [3.0, 35.0])
    np.testing.assert_allclose(s["q25"], [2.0, 25.0])  # linear interpolation, numpy's default
    np.testing.assert_allclose(s["q75"], [4.0, 42.5])


def test_plot_iqr_bands_writes_png_and_checks_the_scale(tmp_path):
    x = np.arange(5)
    curves = {"a": np.exp(np.stack([x, x + 1.0])), "b": np.ones((2, 5))}
    plot_iqr_bands(x, curves, tmp_path / "bands.png", hline=1.0, yscale="log")
    assert (tmp_path / "bands.png").stat().st_size > 1000
    with pytest.raises(ValueError):
        plot_iqr_bands(x, curves, tmp_path / "bad.png", yscale="nonsense")

import json
import math

import jax.numpy as jnp
import numpy as np

from jaxrl_suite.core.metrics import MetricsLogger, plot_curves, read_metrics


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

import json
import math
import struct

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


def read_tensorboard_scalars(event_dir) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} of the TensorBoard event files in `event_dir`: TFRecord framing
    (u64 length, u32 CRC, an `Event` proto, u32 CRC) parsed by hand, the protos tensorboardX's."""
    from tensorboardX.proto.event_pb2 import Event

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(event_dir.glob("events.out.tfevents.*")):
        data, i = path.read_bytes(), 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i : i + 8])
            event = Event.FromString(data[i + 12 : i + 12 + n])
            i += 12 + n + 4
            for v in event.summary.value:
                scalars.setdefault(v.tag, []).append((event.step, v.simple_value))
    return scalars


def test_tensorboard_events_hold_the_logged_scalars(tmp_path):
    with MetricsLogger(tmp_path / "tb", tensorboard=True) as log:
        for s in (1, 2):
            log.log({"step": s, "stage": "sft", "loss": 3.0 - s, "note": "text", "ok": True})
        log.log({"step": 3, "stage": "grpo", "reward": jnp.float32(0.25), "n": np.int64(7),
                 "per_seed": [1.0, 2.0]})
        log.log({"step": 4, "reward": 0.5})  # no stage: the bare key
    scalars = read_tensorboard_scalars(tmp_path / "tb" / "tensorboard")
    # Numbers only (strings, bools and lists stay in metrics.jsonl), tagged stage/key.
    assert scalars == {"sft/loss": [(1, 2.0), (2, 1.0)], "grpo/reward": [(3, 0.25)],
                       "grpo/n": [(3, 7.0)], "reward": [(4, 0.5)]}
    # Without the flag: no tensorboard dir.
    with MetricsLogger(tmp_path / "plain") as log:
        log.log({"step": 1, "loss": 1.0})
    assert not (tmp_path / "plain" / "tensorboard").exists()


def test_plot_curves(tmp_path):
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

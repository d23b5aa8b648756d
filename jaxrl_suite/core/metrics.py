"""Run logging: `metrics.jsonl` (one JSON object per step), optional TensorBoard, PNG curves.

Everything here runs on the host, outside jitted code (STYLE habit 6).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np


def to_python(value: Any) -> Any:
    """Arrays and numpy scalars -> plain floats/ints/lists, so they serialise as JSON."""
    if isinstance(value, Mapping):
        return {k: to_python(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_python(v) for v in value]
    if hasattr(value, "shape") or isinstance(value, np.generic):
        arr = np.asarray(value)
        if arr.ndim == 0:
            item = arr.item()
            return item
        return arr.tolist()
    return value


def read_metrics(path: str | Path) -> list[dict]:
    """All records of a metrics.jsonl file (an absent file gives [])."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class MetricsLogger:
    """Appends one JSON object per step to `<out_dir>/metrics.jsonl`.

    On resume, pass `resume_step`: records with `step >= resume_step` (written after the restored
    checkpoint by the run that died) are dropped first, so every step appears exactly once.
    In a multi-process run only process 0 writes; `log` still returns the record elsewhere.
    """

    def __init__(
        self, out_dir: str | Path, *, resume_step: int | None = None, tensorboard: bool = False
    ):
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / "metrics.jsonl"
        self._file = self._tb = None
        if jax.process_index() != 0:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        else:
            kept = [r for r in read_metrics(self.path) if r.get("step", -1) < resume_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        self._file = self.path.open("a")
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.out_dir / "tensorboard"))

    def log(self, record: Mapping[str, Any]) -> dict:
        """Write one record (must hold an integer `step`); returns its JSON-ready form."""
        rec = to_python(dict(record))
        if "step" not in rec:
            raise ValueError("a metrics record needs a 'step' field")
        if self._file is None:
            return rec
        self._file.write(json.dumps(rec, allow_nan=True) + "\n")
        self._file.flush()
        if self._tb is not None:
            prefix = f"{rec['stage']}/" if "stage" in rec else ""
            for k, v in rec.items():
                if isinstance(v, int | float) and not isinstance(v, bool) and k != "step":
                    self._tb.add_scalar(prefix + k, v, rec["step"])
            self._tb.flush()
        return rec

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_json(path: str | Path, data: Mapping[str, Any]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(to_python(dict(data)), indent=2) + "\n")


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (plots are written to files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path, *, tight: bool = True, **savefig_kwargs) -> None:
    """Lay out (`tight_layout` unless `tight=False`), write `path` (parents created) at 110 dpi
    and close `fig`."""
    if tight:
        fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, **savefig_kwargs)
    pyplot().close(fig)


def plot_curves(
    records: Sequence[Mapping[str, Any]],
    keys: Sequence[str],
    path: str | Path,
    *,
    title: str = "",
    smooth: int = 1,
) -> None:
    """One panel per key of `records` against `step`; a trailing moving average if `smooth > 1`."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.4), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        pts = [
            (r["step"], r[key])
            for r in records
            if isinstance(r.get(key), int | float) and math.isfinite(r[key])
        ]
        if pts:
            x, y = map(np.asarray, zip(*pts, strict=True))
            ax.plot(x, y, alpha=0.35 if smooth > 1 else 1.0, lw=1)
            if smooth > 1 and len(y) >= smooth:
                ys = np.convolve(y, np.ones(smooth) / smooth, mode="valid")
                ax.plot(x[smooth - 1 :], ys, lw=2)
        ax.set_xlabel("step")
        ax.set_title(key)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    save_figure(fig, path)


def median_iqr(x, axis: int = 0) -> dict[str, Any]:
    """Median and interquartile range (25th, 75th percentiles) along `axis`, NaNs ignored."""
    x = np.asarray(x, np.float64)
    q25, med, q75 = np.nanpercentile(x, [25, 50, 75], axis=axis)
    return {"median": med, "q25": q25, "q75": q75}


def plot_iqr_bands(
    x,
    curves: Mapping[str, Any],
    path: str | Path,
    *,
    xlabel: str = "step",
    ylabel: str = "",
    title: str = "",
    hline: float | None = None,
    yscale: str = "linear",
) -> None:
    """One line per entry of `curves` ([seeds, len(x)] arrays): the median with an IQR band.

    `hline` draws a dashed reference level; `yscale` is matplotlib's ("linear", "log", ...)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    x = np.asarray(x)
    for name, ys in curves.items():
        s = median_iqr(ys, axis=0)
        (line,) = ax.plot(x, s["median"], lw=2, label=name)
        ax.fill_between(x, s["q25"], s["q75"], color=line.get_color(), alpha=0.2)
    if hline is not None:
        ax.axhline(hline, color="k", ls="--", lw=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.set_yscale(yscale)
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)

"""Run logging: `metrics.jsonl` (one JSON object per step), optional TensorBoard and Weights &
Biases, PNG curves.

Everything here runs on the host, outside jitted code (STYLE habit 6).

Comparing runs (`jaxrl-suite plot`): `seed_series` reads one run's curves of a key, one per seed,
`aggregate_runs` aligns the seeds of one curve on their steps and takes the median and IQR, and
`plot_runs` draws one panel per key with one median line and IQR band per label.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxrl_suite.core.config import ConfigError


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


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def read_metrics(path: str | Path) -> list[dict]:
    """All records of a metrics.jsonl file (an absent file gives [])."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


WANDB_MODES = ("online", "offline", "disabled")
# The W&B run of a log dir (its id, project and entity), so that `--resume` continues that run
WANDB_RUN_FILE = "wandb_run.json"
WANDB_MISSING = "--wandb needs the wandb package: pip install 'jaxrl_suite[wandb]'"


def _check_wandb_mode(mode: str | None, name: str) -> None:
    if mode is not None and mode not in WANDB_MODES:
        raise ConfigError(f"{name} {mode!r} must be one of {', '.join(WANDB_MODES)}")


@dataclasses.dataclass(frozen=True)
class WandbOptions:
    """`--wandb`: also log every metrics record to Weights & Biases (`MetricsLogger`).

    Each metrics.jsonl is one W&B run (a Study's units are runs of one group). None leaves a field
    to W&B's own settings: the `WANDB_PROJECT`, `WANDB_ENTITY` and `WANDB_MODE` environment
    variables or `wandb login`'s defaults (project `jaxrl_suite` if none is set)."""

    project: str | None = None
    entity: str | None = None
    mode: str | None = None  # "online", "offline" (files only, `wandb sync` later) or "disabled"
    group: str | None = None  # the launch the run belongs to (the CLI: the --out folder's name)
    job_type: str | None = None  # the CLI: the experiment's name
    config: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        _check_wandb_mode(self.mode, "wandb mode")


@dataclasses.dataclass(frozen=True)
class WandbConfig:
    """`run.wandb` of an experiment's config: `enabled: true` logs to W&B as `--wandb` does,
    with these settings (None: W&B's own, see `WandbOptions`). The `--wandb-*` flags override
    them; a resume may change them."""

    enabled: bool = False
    project: str | None = None
    entity: str | None = None
    mode: str | None = None  # "online", "offline" or "disabled"

    def __post_init__(self):
        _check_wandb_mode(self.mode, "'run.wandb.mode'")


def wandb_options(configured: WandbConfig | None, *, enabled: bool = False,
                  group: str | None = None, job_type: str | None = None,
                  config: Mapping[str, Any] | None = None, **given: str | None
                  ) -> WandbOptions | None:
    """The W&B options of a run: on when `enabled` (`--wandb`) or `configured.enabled`
    (`run.wandb`); each of project, entity, mode from `given` (the flags) where not None, else
    from `configured`. None when off; on without the wandb package is a one-line ConfigError
    (checked on process 0, the one that logs)."""
    configured = configured or WandbConfig()
    if not (enabled or configured.enabled):
        return None
    if jax.process_index() == 0:
        import_wandb()
    fields = {k: given.get(k) if given.get(k) is not None else getattr(configured, k)
              for k in ("project", "entity", "mode")}
    return WandbOptions(**fields, group=group, job_type=job_type, config=config)


def import_wandb():
    """The `wandb` module; a missing package is a one-line `ConfigError` naming the extra."""
    try:
        import wandb
    except ImportError:
        raise ConfigError(WANDB_MISSING) from None
    return wandb


def _scalars(rec: Mapping[str, Any]) -> dict[str, int | float]:
    """The numbers of a record but `step`, tagged `stage/key` when it has a stage (what
    TensorBoard and W&B are given)."""
    prefix = f"{rec['stage']}/" if "stage" in rec else ""
    return {prefix + k: v for k, v in rec.items() if _is_number(v) and k != "step"}


def _start_wandb(log_dir: Path, opts: WandbOptions, *, resume: bool):
    """A W&B run for the log in `log_dir`: resumed (`resume`), the run recorded in
    `log_dir/wandb_run.json` goes on (same id, `resume="allow"`); otherwise a new one, recorded
    there. Its local files go under `log_dir/wandb/` unless `WANDB_DIR` is set."""
    wandb = import_wandb()
    record = log_dir / WANDB_RUN_FILE
    stored: dict[str, Any] = {}
    if resume and record.is_file():
        try:
            stored = json.loads(record.read_text())
        except ValueError:
            stored = {}
    # W&B reads its environment once per process; read here, a later change applies too
    env = os.environ.get
    project = opts.project or stored.get("project") or env("WANDB_PROJECT") or "jaxrl_suite"
    entity = opts.entity or stored.get("entity") or env("WANDB_ENTITY")
    name = log_dir.name if opts.group in (None, log_dir.name) else f"{opts.group}/{log_dir.name}"
    try:
        run = wandb.init(
            project=project, entity=entity, mode=opts.mode or env("WANDB_MODE"),
            group=opts.group, job_type=opts.job_type, name=name,
            config=dict(opts.config) if opts.config is not None else None,
            dir=env("WANDB_DIR") or str(log_dir),
            id=stored.get("id"), resume="allow" if stored.get("id") else None,
            reinit="create_new",  # one run per log, several open at once (wandb >= 0.19.10)
        )
    except wandb.errors.Error as e:  # e.g. no API key: `wandb login`, or --wandb-mode offline
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"--wandb: W&B could not start a run for {log_dir}: {first} (log in "
                          "with `wandb login`, or log locally with --wandb-mode offline)") from None
    run.define_metric("*", step_metric="step")  # the run's own step axis, as in metrics.jsonl
    record.write_text(json.dumps({"id": run.id, "project": project, "entity": entity}) + "\n")
    return run


class MetricsLogger:
    """Appends one JSON object per step to `<out_dir>/metrics.jsonl`.

    On resume, pass `resume_step`: records with `step >= resume_step` (written after the restored
    checkpoint by the run that died) are dropped first, so every step appears exactly once.
    In a multi-process run only process 0 writes; `log` still returns the record elsewhere.

    `tensorboard` also writes event files under `<out_dir>/tensorboard`, and `wandb` (a
    `WandbOptions`) logs to a W&B run: both get each record's numbers, tagged `stage/key`, at its
    `step` (W&B: as the metric `step`, every other metric's x axis). Resumed, the W&B run of
    `<out_dir>/wandb_run.json` continues; the steps the resumed run logs again then appear twice
    in its history (W&B history is append-only), with the same values when the run is
    deterministic.
    """

    def __init__(
        self, out_dir: str | Path, *, resume_step: int | None = None, tensorboard: bool = False,
        wandb: WandbOptions | None = None,
    ):
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / "metrics.jsonl"
        self._file = self._tb = self._wandb = None
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
        if wandb is not None:
            try:
                self._wandb = _start_wandb(self.out_dir, wandb, resume=resume_step is not None)
            except BaseException:
                self.close()
                raise

    @property
    def wandb_run(self):
        """The W&B run this logger writes to (None without `wandb`, or off process 0)."""
        return self._wandb

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
            for k, v in _scalars(rec).items():
                self._tb.add_scalar(k, v, rec["step"])
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({"step": rec["step"], **_scalars(rec)})
        return rec

    def close(self, *, failed: bool = False) -> None:
        """Close the files; the W&B run finishes (marked failed with `failed`)."""
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish(exit_code=1 if failed else 0)
            self._wandb = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        self.close(failed=exc_type is not None)


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
    and close `fig`. Inside `record_figures()`, also records `figure_data(fig)`."""
    if tight:
        fig.tight_layout()
    for recorded in _FIGURE_RECORDERS:
        recorded[Path(path).name] = figure_data(fig)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, **savefig_kwargs)
    pyplot().close(fig)


_FIGURE_RECORDERS: list[dict[str, dict]] = []


@contextlib.contextmanager
def record_figures():
    """Within the block, every `save_figure` also records what its figure shows: yields a dict
    {file name: `figure_data(fig)`}, so a test checks a plot's axes and series, not its bytes."""
    recorded: dict[str, dict] = {}
    _FIGURE_RECORDERS.append(recorded)
    try:
        yield recorded
    finally:
        _FIGURE_RECORDERS.remove(recorded)


def figure_data(fig) -> dict[str, Any]:
    """What a matplotlib figure shows, as plain data: {"suptitle", "axes": [one dict per axes,
    colorbars included]}. Each axes: "title", "xlabel", "ylabel", "xscale", "yscale",
    "xticklabels", "yticklabels", "legend" (entry texts), "lines" (label, x, y of each line,
    reference lines included), "bars" {label: heights}, "scatter" (offsets [n, 2] of each
    scatter), "bands" (filled areas), "images" (arrays) and "patches" (count)."""
    from matplotlib.collections import PathCollection, PolyCollection
    from matplotlib.container import BarContainer

    axes = []
    for ax in fig.axes:
        legend = ax.get_legend()
        axes.append({
            "title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
            "xscale": ax.get_xscale(), "yscale": ax.get_yscale(),
            "xticklabels": [t.get_text() for t in ax.get_xticklabels()],
            "yticklabels": [t.get_text() for t in ax.get_yticklabels()],
            "legend": [t.get_text() for t in legend.get_texts()] if legend else [],
            "lines": [{"label": line.get_label(),
                       "x": np.asarray(line.get_xdata(), np.float64),
                       "y": np.asarray(line.get_ydata(), np.float64)} for line in ax.get_lines()],
            "bars": {c.get_label(): np.array([b.get_height() for b in c.patches])
                     for c in ax.containers if isinstance(c, BarContainer)},
            "scatter": [np.asarray(c.get_offsets(), np.float64) for c in ax.collections
                        if isinstance(c, PathCollection)],
            "bands": sum(isinstance(c, PolyCollection) for c in ax.collections),
            "images": [np.asarray(im.get_array()) for im in ax.get_images()],
            "patches": len(ax.patches),
        })
    suptitle = fig._suptitle.get_text() if fig._suptitle is not None else ""
    return {"suptitle": suptitle, "axes": axes}


def trailing_mean(y, n: int) -> np.ndarray:
    """Moving average over the last `n` points (fewer at the start), same length as `y`."""
    y = np.asarray(y, np.float64)
    if n <= 1 or y.size == 0:
        return y
    c = np.cumsum(np.concatenate([[0.0], y]))
    i = np.arange(1, y.size + 1)
    lo = np.maximum(i - n, 0)
    return (c[i] - c[lo]) / (i - lo)


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
            if smooth > 1:
                ax.plot(x, trailing_mean(y, smooth), lw=2)
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
        _draw_band(ax, x, s["median"], s["q25"], s["q75"], label=name)
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


def _draw_band(ax, x, median, q25=None, q75=None, *, label: str = "") -> None:
    """The median line, and the IQR band when `q25`/`q75` are given (one point: a marker)."""
    (line,) = ax.plot(x, median, lw=2, label=label, marker="o" if len(x) == 1 else None)
    if q25 is not None:
        ax.fill_between(x, q25, q75, color=line.get_color(), alpha=0.2)


ALL_STAGES = "all"
# `jaxrl-suite plot`'s default panels: those of these every run logs (else the first common keys)
DEFAULT_PLOT_KEYS = ("reward", "accuracy", "return", "episode_return", "train_return", "success",
                     "score_mean", "loss")
MAX_DEFAULT_PANELS = 4
_NOT_METRICS = frozenset({"step", "seed"})


def _metric_values(v: Any) -> list[float] | None:
    """A record's value of a metric as one float per seed (a number, or a list of numbers)."""
    if _is_number(v):
        return [float(v)]
    if isinstance(v, list) and v and all(_is_number(e) or e is None for e in v):
        return [math.nan if e is None else float(e) for e in v]
    return None


def numeric_keys(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The metric keys of `records` (numbers or per-seed lists of numbers), in first-seen order;
    `step` and `seed` are not metrics."""
    keys: dict[str, None] = {}
    for r in records:
        for k, v in r.items():
            if k not in _NOT_METRICS and k not in keys and _metric_values(v) is not None:
                keys[k] = None
    return list(keys)


def default_plot_keys(runs: Sequence[Sequence[Mapping[str, Any]]]) -> list[str]:
    """The panels `jaxrl-suite plot` draws without `--keys`: those of `DEFAULT_PLOT_KEYS` that
    every run logs, else the first `MAX_DEFAULT_PANELS` metric keys common to all runs."""
    common = numeric_keys(runs[0]) if runs else []
    for records in runs[1:]:
        theirs = set(numeric_keys(records))
        common = [k for k in common if k in theirs]
    preferred = [k for k in DEFAULT_PLOT_KEYS if k in common]
    return (preferred or common)[:MAX_DEFAULT_PANELS]


def stages(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The `stage` values of `records` in first-seen order (empty if they have none)."""
    return list(dict.fromkeys(r["stage"] for r in records if "stage" in r))


def stage_records(
    records: Sequence[Mapping[str, Any]], key: str, stage: str | None = None
) -> list[Mapping[str, Any]]:
    """The records a curve of `key` is drawn from: those of `stage`; all of them for
    `stage="all"`; by default (None) those of the last stage (in record order) that logs `key`,
    so that e.g. an SFT loss and a later GRPO loss are not joined into one curve."""
    if stage == ALL_STAGES:
        return list(records)
    if stage is None:
        holding = [r for r in records if _metric_values(r.get(key)) is not None]
        if not holding:
            return []
        stage = holding[-1].get("stage")
    return [r for r in records if r.get("stage") == stage]


def seed_series(
    records: Sequence[Mapping[str, Any]], key: str, *, stage: str | None = None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """One run's curves of `key` against `step`, one `(steps, values)` pair per seed.

    Seeds come from list values (one value per seed: the i-th entries form seed i) and from a
    `seed` field (records split by it); a plain number is one seed. Non-finite values are
    dropped; a step logged twice for a seed keeps its last value. See `stage_records` for
    `stage`."""
    per_seed: dict[tuple, dict[int, float]] = {}
    for r in stage_records(records, key, stage):
        values = _metric_values(r.get(key))
        if values is None or "step" not in r:
            continue
        for i, v in enumerate(values):
            if math.isfinite(v):
                per_seed.setdefault((r.get("seed"), i), {})[int(r["step"])] = v
    out = []
    for points in per_seed.values():
        x = np.array(sorted(points))
        out.append((x, np.array([points[s] for s in x], np.float64)))
    return out


@dataclasses.dataclass(frozen=True)
class Band:
    """One curve over seeds: at each step of `x` the median and the 25th/75th percentiles of the
    seeds that logged that step (numpy's linear interpolation); `seeds` curves in all."""

    x: np.ndarray
    median: np.ndarray
    q25: np.ndarray
    q75: np.ndarray
    seeds: int


def aggregate_runs(series: Sequence[tuple[Any, Any]], *, smooth: int = 1) -> Band:
    """Median and IQR over seed curves `(steps, values)` that may log different steps: each is
    smoothed first (`trailing_mean` over `smooth` points), then they are aligned on the union of
    their steps, a seed that did not log a step being left out there."""
    if not series:
        raise ValueError("aggregate_runs needs at least one curve")
    x = np.unique(np.concatenate([np.asarray(s, np.int64) for s, _ in series]))
    table = np.full((len(series), x.size), np.nan)
    for row, (steps, values) in zip(table, series, strict=True):
        row[np.searchsorted(x, np.asarray(steps, np.int64))] = trailing_mean(values, smooth)
    s = median_iqr(table, axis=0)
    return Band(x, s["median"], s["q25"], s["q75"], len(series))


def plot_runs(
    runs: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]],
    keys: Sequence[str],
    path: str | Path,
    *,
    stage: str | None = None,
    smooth: int = 1,
    title: str = "",
) -> dict[str, dict[str, Band]]:
    """One panel per key; in each, one curve per label of `runs` (label -> the records of each of
    its runs): the median over all the label's seeds (see `seed_series`) with its IQR band when
    there are two seeds or more, else the plain line. Returns {key: {label: Band}}; a label
    with no data for a key is left out of that panel."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    ncols = min(len(keys), 3)
    nrows = -(-len(keys) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.8 * ncols, 3.6 * nrows), squeeze=False)
    bands: dict[str, dict[str, Band]] = {}
    for ax, key in zip(axes.flat, keys, strict=False):  # a last row may have spare axes
        bands[key] = {}
        for label, run_records in runs.items():
            series = [c for records in run_records for c in seed_series(records, key, stage=stage)]
            if not series:
                continue
            b = bands[key][label] = aggregate_runs(series, smooth=smooth)
            name = f"{label} ({b.seeds} seeds)" if b.seeds > 1 else label
            if b.seeds > 1:
                _draw_band(ax, b.x, b.median, b.q25, b.q75, label=name)
            else:
                _draw_band(ax, b.x, b.median, label=name)
        shown = stage
        if stage is None:  # name the stage the default picked, when it is the same for all runs
            picked = {r.get("stage") for rs in runs.values() for records in rs
                      for r in stage_records(records, key)[:1]}
            shown = picked.pop() if len(picked) == 1 else None
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(key if shown in (None, ALL_STAGES) else f"{key} ({shown})")
        ax.grid(alpha=0.3)
        if bands[key]:
            ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    save_figure(fig, path)
    return bands

"""The `Study` runner: variants x seeds from one shared start, each run resumable on its own.

An experiment that compares methods is a config, a dict of variants and a result table. The
study owns the rest:

    study = Study(NAME, opts, variants=("plain", "siren"), seeds=(0, 1, 2))
    start = study.start(lambda seed: make_sft_checkpoint(seed))  # built once (or once per seed)
    results = study.run(lambda variant, seed, start: train_and_evaluate(variant, seed, start),
                        start=start)
    stats = study.aggregate(results, ["accuracy", "pass@4"])     # mean, std and per-seed values

Layout under `opts.out_dir`: `runs/VARIANT_sSEED/` holds a run's `metrics.jsonl` and, once it
has finished, its `result.json`; `checkpoints/VARIANT_sSEED/` its checkpoints. With
`opts.resume`, a run whose `result.json` exists is not run again, and the others continue from
their latest checkpoint (`algorithms.loop.fit_resumable`). Aggregation reads only those files,
so a resumed study reports the same table as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import jax
import numpy as np

from jaxrl_suite.core.config import to_dict
from jaxrl_suite.core.experiment import RunOptions
from jaxrl_suite.core.metrics import (
    plot_iqr_bands,
    pyplot,
    read_metrics,
    save_figure,
    to_python,
    trailing_mean,
    write_json,
)
from jaxrl_suite.core.parallel import print0

S = TypeVar("S")


def check_seeds(seeds: Sequence[int], field: str = "run.seeds") -> None:
    """Seeds are a non-empty tuple of distinct ints (one meaning everywhere)."""
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"{field} must be distinct and non-empty, got {list(seeds)}")


def check_variants(names: Sequence[str], known: Iterable[str], field: str = "variants.names"):
    """`names` are distinct entries of `known`."""
    known = list(known)
    if not names or len(set(names)) != len(names) or any(n not in known for n in names):
        raise ValueError(f"{field} must be distinct entries of {known}, got {list(names)}")


@dataclasses.dataclass
class Study:
    """Runs `variants` x `seeds` under `opts.out_dir` (see the module docstring)."""

    name: str
    opts: RunOptions
    variants: Sequence[str]
    seeds: Sequence[int]

    def __post_init__(self):
        check_seeds(self.seeds)

    @property
    def out_dir(self) -> Path:
        return self.opts.out_dir

    @staticmethod
    def run_name(variant: str, seed: int) -> str:
        return f"{variant}_s{seed}"

    def run_dir(self, variant: str, seed: int) -> Path:
        return self.out_dir / "runs" / self.run_name(variant, seed)

    def checkpoint_dir(self, variant: str, seed: int) -> Path:
        return self.out_dir / "checkpoints" / self.run_name(variant, seed)

    def write_config(self, cfg) -> None:
        """config.json: what `jaxrl-suite eval RUN_DIR` rebuilds the study from."""
        if jax.process_index() == 0:
            write_json(self.out_dir / "config.json", {"experiment": self.name,
                                                      "config": to_dict(cfg)})

    def cached(self, path: Path, compute: Callable[[], dict]) -> dict:
        """`compute()`, saved to `path`; a resumed study reads the saved value instead."""
        if self.opts.resume and path.is_file():
            return json.loads(path.read_text())
        value = compute()
        if jax.process_index() == 0:
            write_json(path, value)
        return value

    def run(self, train: Callable[[str, int, S], Mapping[str, Any]], start: S | Mapping[int, S]
            = None, *, per_seed_start: bool = False,
            fmt: Callable[[Mapping], str] | None = None) -> dict[str, dict]:
        """`train(variant, seed, start)` for every variant and seed; returns {run name: result}.

        `start` is what every run starts from (e.g. SFT params); with `per_seed_start` it is a
        mapping seed -> start. A finished run's result (with "variant" and "seed" added) is saved
        to runs/NAME/result.json; with `opts.resume` a saved result is read back, not recomputed.
        `fmt(result)` is the one-line summary printed after each run (default: its numbers).
        """
        fmt = fmt or format_numbers
        results: dict[str, dict] = {}
        for variant in self.variants:
            for seed in self.seeds:
                name = self.run_name(variant, seed)
                path = self.run_dir(variant, seed) / "result.json"
                if self.opts.resume and path.is_file():
                    results[name] = json.loads(path.read_text())
                    print0(f"[{self.name}] {name}: done before ({fmt(results[name])})")
                    continue
                s = start[seed] if per_seed_start else start
                result = {"variant": variant, "seed": seed, **train(variant, seed, s)}
                if jax.process_index() == 0:
                    write_json(path, result)
                results[name] = to_python(result)  # what a resumed study reads back
                print0(f"[{self.name}] {name}: {fmt(result)}")
        return results

    def per_variant(self, results: Mapping[str, Mapping]) -> dict[str, list[Mapping]]:
        """{variant: [result of each seed, in `seeds` order]}."""
        return {v: [results[self.run_name(v, s)] for s in self.seeds] for v in self.variants}

    def aggregate(self, results: Mapping[str, Mapping], keys: Sequence[str]) -> dict:
        """Per variant and key: mean, std (ddof 0) and per-seed values. A key whose values are
        lists (e.g. a score per iteration step) is aggregated elementwise."""
        out = {}
        for variant, runs in self.per_variant(results).items():
            out[variant] = {}
            for k in keys:
                x = np.asarray([r[k] for r in runs], np.float64)  # [S] or [S, ...]
                out[variant][k] = {"mean": x.mean(0).tolist(), "std": x.std(0).tolist(),
                                   "per_seed": x.tolist()}
        return out

    def curves(self, keys: Sequence[str], stage: str) -> dict[str, dict[str, np.ndarray]]:
        """Per variant and key, the [seeds, steps] training curve of `stage` from each run's
        metrics.jsonl."""
        out: dict[str, dict[str, np.ndarray]] = {}
        for variant in self.variants:
            recs = [[r for r in read_metrics(self.run_dir(variant, s) / "metrics.jsonl")
                     if r.get("stage") == stage] for s in self.seeds]
            out[variant] = {k: np.array([[r[k] for r in rs] for rs in recs], np.float64)
                            for k in keys}
        return out

    @staticmethod
    def curve_stats(curves: Mapping[str, Mapping[str, np.ndarray]], key: str,
                    window: int) -> dict[str, dict]:
        """Per variant, how curve `key` moved: "start" (step 1, mean over seeds), "end" (mean of
        the last `window` steps), "end_over_start" (mean over seeds, and per seed), min, max."""
        out = {}
        for variant, c in curves.items():
            x = c[key]  # [S, steps]
            start, end = x[:, 0], x[:, -window:].mean(axis=1)
            out[variant] = {"start": float(start.mean()), "end": float(end.mean()),
                            "end_over_start": float((end / start).mean()),
                            "end_over_start_per_seed": (end / start).tolist(),
                            "min": float(x.min()), "max": float(x.max())}
        return out

    @staticmethod
    def best(stats: Mapping[str, Mapping], keys: Sequence[str]) -> dict[str, list[str]]:
        """Per key, every variant that ties for the highest mean."""
        out = {}
        for k in keys:
            top = max(s[k]["mean"] for s in stats.values())
            out[k] = [v for v, s in stats.items() if s[k]["mean"] == top]
        return out

    def plot_curves(self, curves: Mapping[str, Mapping[str, np.ndarray]], key: str, path: Path,
                    *, smooth: int = 1, xlabel: str = "step", ylabel: str = "",
                    hline: float | None = None, yscale: str = "linear", title: str = "") -> None:
        """Median and IQR band over seeds of `key`, one line per variant (trailing mean over
        `smooth` steps per seed first)."""
        ys = {v: np.stack([trailing_mean(row, smooth) for row in c[key]]) for v, c in
              curves.items()}
        steps = np.arange(1, next(iter(ys.values())).shape[1] + 1)
        plot_iqr_bands(steps, ys, path, xlabel=xlabel, ylabel=ylabel or key, hline=hline,
                       yscale=yscale, title=title or f"{self.name}: median and IQR over "
                       f"{len(self.seeds)} seeds")

    def plot_means(self, x, stats: Mapping[str, Mapping], key: str, path: Path, *,
                   reference: tuple[str, Sequence[float]] | None = None,
                   vline: float | None = None, xlabel: str = "", ylabel: str = "",
                   title: str = "") -> None:
        """Mean ± std band over seeds of a list-valued result `key` (from `aggregate`) against
        `x`, one line per variant; `reference` = (label, values) adds a dashed black line (e.g.
        the shared start), `vline` a dotted vertical line. Process 0 only."""
        if jax.process_index() != 0:
            return
        fig, ax = pyplot().subplots(figsize=(6, 4))
        if reference is not None:
            ax.plot(x, reference[1], "k--", label=reference[0])
        for v, s in stats.items():
            mean, std = np.array(s[key]["mean"]), np.array(s[key]["std"])
            ax.plot(x, mean, marker="o", label=v)
            ax.fill_between(x, mean - std, mean + std, alpha=0.2)
        if vline is not None:
            ax.axvline(vline, color="gray", lw=0.8, ls=":")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel or key)
        ax.set_title(title or f"{self.name}: mean ± std over {len(self.seeds)} seeds")
        ax.legend()
        save_figure(fig, path)

    def table(self, stats: Mapping[str, Mapping], keys: Sequence[str], *,
              first: Mapping[str, Mapping[str, float]] | None = None,
              formats: Mapping[str, str] | None = None) -> str:
        """Markdown table: one row per variant of mean ± std over seeds; `first` adds rows of
        single values above them (e.g. the shared SFT start; NaN shows as "-"). Numbers use
        format ".3f" unless `formats[key]` says otherwise."""
        f = lambda k, x: "-" if x != x else format(x, (formats or {}).get(k, ".3f"))
        head = ["| model | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
        rows = [f"| {name} | " + " | ".join(f(k, vals[k]) for k in keys) + " |"
                for name, vals in (first or {}).items()]
        for v, s in stats.items():
            cells = [f"{f(k, s[k]['mean'])} ± {f(k, s[k]['std'])}" for k in keys]
            rows.append(f"| {v} | " + " | ".join(cells) + " |")
        return "\n".join(head + rows) + "\n"

    def finish(self, summary: Mapping[str, Any], table: str | None = None) -> dict:
        """Write summary.json (and table.md), print the table; returns the summary."""
        summary = dict(summary)
        if jax.process_index() == 0:
            if table is not None:
                (self.out_dir / "table.md").write_text(table)
            write_json(self.out_dir / "summary.json", summary)
        if table is not None:
            print0(table)
        return summary


def format_numbers(result: Mapping) -> str:
    """The float fields of a result, e.g. "greedy_accuracy 0.812, pass@4 0.930"."""
    return ", ".join(f"{k} {v:.3f}" for k, v in result.items()
                     if isinstance(v, float) and k != "wall_time_s")


__all__ = ["Study", "check_seeds", "check_variants", "format_numbers"]

"""The `Study` runner: variants x seeds from one shared start, each run resumable on its own.

An experiment that compares methods is a config, a dict of variants and a result table. The
study owns the rest:

    study = Study(NAME, opts, variants=("plain", "siren"), seeds=(0, 1, 2))
    start = make_sft_checkpoint(study.seeds[0])                  # one start for every run
    results = study.run(lambda variant, seed, start: train_and_evaluate(variant, seed, start),
                        start=start)       # or {seed: start} with per_seed_start=True
    stats = study.aggregate(results, ["accuracy", "pass@4"])     # mean, std and per-seed values
    study.compare(stats, "siren", "plain", "accuracy")            # per-seed differences, Welch p

Layout under `opts.out_dir`: `runs/VARIANT_sSEED/` holds a run's `metrics.jsonl` and, once it
has finished, its `result.json`; `checkpoints/VARIANT_sSEED/` its checkpoints. With
`opts.resume`, a run whose `result.json` exists is not run again, and the others continue from
their latest checkpoint (`algorithms.loop.fit_resumable`). A finished run's result is trusted
only if its checkpoints read (`core.checkpoint.verify_tree`); if they do not, its result.json is
kept as result.json.untrusted and the run continues from its latest intact checkpoint.
Aggregation reads only those files, so a resumed study reports the same table as an
uninterrupted one.

Where the seeds of a variant run together, in one `jit(vmap(train))` program (the classic-control
experiments), the unit of work is the variant, not a (variant, seed) pair:

    results = study.run_units(["default", "visible"], lambda unit: train_all_seeds(unit))
    stats = study.unit_stats(results, ["held_out"])  # each result["held_out"] is per-seed

Each unit has `runs/UNIT/` (its `metrics.jsonl` via `unit_log`, its `result.json`) and
`checkpoints/UNIT/`; a unit may be a path such as "medium-replay/oppo".
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import jax
import numpy as np

from jaxrl_suite.core.checkpoint import Checkpointer, verify_tree
from jaxrl_suite.core.config import to_dict
from jaxrl_suite.core.experiment import RunOptions
from jaxrl_suite.core.metrics import (
    MetricsLogger,
    WandbOptions,
    median_iqr,
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


def seed_stats(values) -> dict[str, Any]:
    """Statistics over seeds (axis 0) of per-seed values ([S] or [S, ...], elementwise then):
    mean and std (ddof 0), median, q25 and q75 (NaNs ignored), and the per-seed values."""
    x = np.asarray(values, np.float64)
    return {"mean": x.mean(0).tolist(), "std": x.std(0).tolist(),
            **{k: np.asarray(v).tolist() for k, v in median_iqr(x).items()},
            "per_seed": x.tolist()}


def compare_seeds(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """Arm `a` against arm `b` from their per-seed values: `difference` = mean(a) - mean(b);
    `p_welch`, the two-sided p-value of Welch's t-test (unequal variances; None with fewer than
    2 seeds in an arm, or where it is undefined: both arms constant and equal); and, when both
    arms ran the same seeds (equal lengths, in seed order), `per_seed_difference` a_i - b_i and
    `seeds_better`, the count of seeds with a_i > b_i."""
    from scipy import stats as scipy_stats  # scipy is slow to import; only claims need it

    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    p = None
    if len(x) > 1 and len(y) > 1:
        p = float(scipy_stats.ttest_ind(x, y, equal_var=False).pvalue)
        p = p if np.isfinite(p) else None
    out: dict[str, Any] = {"difference": float(x.mean() - y.mean()), "p_welch": p}
    if len(x) == len(y):
        d = x - y
        out.update(per_seed_difference=d.tolist(), seeds_better=int((d > 0).sum()))
    return out


def seed_deltas(stats: Mapping[str, Mapping], ref: Mapping[str, Any],
                keys: Sequence[str]) -> dict[str, dict]:
    """Per variant of `stats` (`Study.aggregate`'s) and key, Δ = the variant's per-seed values
    minus the reference's: `ref[key]` is either statistics over the same seeds (e.g. another
    variant's entry of `stats`: seed by seed) or one number (e.g. a shared start's value).
    Returns {variant: {key: {"per_seed": [Δ of each seed], "mean": their mean}}}."""
    out: dict[str, dict] = {}
    for variant, s in stats.items():
        out[variant] = {}
        for k in keys:
            r = ref[k]["per_seed"] if isinstance(ref[k], Mapping) else ref[k]
            d = np.asarray(s[k]["per_seed"], np.float64) - np.asarray(r, np.float64)
            out[variant][k] = {"per_seed": d.tolist(), "mean": float(d.mean())}
    return out


def group_correlations(x, groups: Mapping[str, Sequence[int]]) -> dict[str, dict]:
    """The mean pairwise Pearson correlation between the columns of `x` [runs, columns] within
    each group of column indices: {group: {"mean": mean over its pairs, "pairs": how many}}. A
    pair with a constant column has no correlation and is left out (mean NaN if none is left)."""
    x = np.asarray(x, np.float64)
    if x.ndim != 2:
        raise ValueError(f"group_correlations: x must be [runs, columns], got {x.shape}")
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.corrcoef(x, rowvar=False).reshape(x.shape[1], x.shape[1])
    flat = np.ptp(x, axis=0) == 0  # constant columns (rounding would give them a spurious r)
    r[flat, :] = r[:, flat] = np.nan
    out = {}
    for name, cols in groups.items():
        pairs = [r[a, b] for n, a in enumerate(cols) for b in cols[n + 1:]
                 if np.isfinite(r[a, b])]
        out[name] = {"mean": float(np.mean(pairs)) if pairs else float("nan"),
                     "pairs": len(pairs)}
    return out


REPRODUCED, PARTLY, NOT_REPRODUCED = "reproduced", "partly reproduced", "not reproduced"
# an RL claim's verdict where its start fails the rule written down before any RL run (a start
# that cannot learn the task makes every RL comparison noise; the numbers are still reported)
START_FAILS = "not tested: the start fails its rule"


def verdict(holds: bool, partly: bool = False, *, partly_label: str = PARTLY) -> str:
    """The verdict ladder of a paper's claim: "reproduced" when the claim `holds` at our scale,
    `partly_label` ("partly reproduced") when only a weaker form of it does (`partly`: e.g. some
    of its splits, or the mean but not every seed), else "not reproduced". The experiments'
    claims compute `holds` and `partly` from their numbers and say what each means."""
    return REPRODUCED if holds else partly_label if partly else NOT_REPRODUCED


def open_run_log(log_dir, stages: Sequence[tuple], *, resume: bool,
                 tensorboard: bool = False, wandb: WandbOptions | None = None) -> MetricsLogger:
    """The metrics log (`log_dir/metrics.jsonl`) of a run made of resumable stages.

    `stages` lists each stage's (checkpoint dir, step offset) in order. Fresh (not `resume`), the
    log starts empty. Resumed, it keeps the records up to the latest checkpoint of the last stage
    that has one (offset + its step) and drops those the stopped run wrote after it, since the
    resumed run writes them again; with no checkpoint at all it starts empty. `tensorboard` and
    `wandb` go to `MetricsLogger` (resumed, the log's W&B run continues).
    """
    resume_step = None
    if resume:
        resume_step = 1
        for directory, offset in stages:
            if not Path(directory).is_dir():
                continue
            ckpt = Checkpointer(directory)
            latest = ckpt.latest_intact_step()  # the step the resumed stage restores
            ckpt.close()
            if latest is not None:
                resume_step = offset + latest + 1
    return MetricsLogger(log_dir, resume_step=resume_step, tensorboard=tensorboard,
                         wandb=wandb)


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

    def _name(self, variant: str, seed: int | None) -> str:
        return variant if seed is None else self.run_name(variant, seed)

    def run_dir(self, variant: str, seed: int | None = None) -> Path:
        """runs/VARIANT_sSEED, or runs/UNIT without a seed (a unit of vmapped seeds)."""
        return self.out_dir / "runs" / self._name(variant, seed)

    def checkpoint_dir(self, variant: str, seed: int | None = None) -> Path:
        return self.out_dir / "checkpoints" / self._name(variant, seed)

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

    def _finished(self, result: Path, checkpoints: Path) -> bool:
        """Whether a resumed study may read `result` back: it exists and the run's checkpoints
        read. An untrusted result is reported and renamed result.json.untrusted (kept)."""
        if not (self.opts.resume and result.is_file()):
            return False
        problem = verify_tree(checkpoints)
        if problem is None:
            return True
        if jax.process_index() == 0:
            result.rename(result.with_name(result.name + ".untrusted"))
        print0(f"[{self.name}] {result.parent.name}: its result is not trusted, since its "
               f"checkpoint {problem}; running it again from its latest intact checkpoint")
        return False

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
                if self._finished(path, self.checkpoint_dir(variant, seed)):
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

    def run_units(self, units: Sequence[str], train: Callable[[str], Mapping[str, Any]], *,
                  fmt: Callable[[Mapping], str] | None = None) -> dict[str, dict]:
        """`train(unit)` for every unit whose seeds run together; returns {unit: result}.

        A result holds per-seed values (lists over `seeds`); it is saved, with "unit" and
        "seeds" added, to runs/UNIT/result.json, and with `opts.resume` a saved one is read back,
        not recomputed. A unit that checkpoints its own progress to `checkpoint_dir(unit)`
        (e.g. `ppo.train_seeds`) continues from there. `fmt(result)` is the line printed after
        each unit (default: its float fields).
        """
        fmt = fmt or format_numbers
        results: dict[str, dict] = {}
        for unit in units:
            path = self.run_dir(unit) / "result.json"
            if self._finished(path, self.checkpoint_dir(unit)):
                results[unit] = json.loads(path.read_text())
                print0(f"[{self.name}] {unit}: done before ({fmt(results[unit])})")
                continue
            result = {"unit": unit, "seeds": list(self.seeds), **train(unit)}
            results[unit] = to_python(result)
            if jax.process_index() == 0:
                write_json(path, results[unit])
            print0(f"[{self.name}] {unit}: {fmt(results[unit])}")
        return results

    def unit_log(self, unit: str) -> MetricsLogger:
        """runs/UNIT/metrics.jsonl of a unit that logs step k and then saves checkpoint k to
        `checkpoint_dir(unit)` (as `ppo.train_seeds` does per chunk); resumed, the records after
        the latest checkpoint are dropped (the unit writes them again)."""
        return open_run_log(self.run_dir(unit), [(self.checkpoint_dir(unit), 0)],
                            resume=self.opts.resume, tensorboard=self.opts.tensorboard,
                            wandb=self.opts.wandb)

    def log_seed_means(self, unit: str, stages: Mapping[str, Mapping], every: int) -> None:
        """runs/UNIT/metrics.jsonl of a unit whose seeds trained together (vmapped): per stage
        in order, every `every` training steps, the mean over seeds of each metric (`stages`:
        {stage: {metric: [S, steps]}}), one record per step with `stage` and `train_step`."""
        logger = self.unit_log(unit)
        step = 0
        for stage, metrics in stages.items():
            m = {k: np.asarray(v, np.float64) for k, v in metrics.items()}
            n = next(iter(m.values())).shape[-1]
            for i in range(every - 1, n, every):
                step += 1
                logger.log({"step": step, "stage": stage, "train_step": i + 1,
                            **{k: float(v[..., i].mean()) for k, v in m.items()}})
        logger.close()

    @staticmethod
    def unit_stats(results: Mapping[str, Mapping], keys: Sequence[str]) -> dict[str, dict]:
        """Per unit and key, `seed_stats` of the unit's per-seed values (keys it lacks are
        skipped)."""
        return {u: {k: seed_stats(r[k]) for k in keys if k in r} for u, r in results.items()}

    def per_variant(self, results: Mapping[str, Mapping]) -> dict[str, list[Mapping]]:
        """{variant: [result of each seed, in `seeds` order]}."""
        return {v: [results[self.run_name(v, s)] for s in self.seeds] for v in self.variants}

    def aggregate(self, results: Mapping[str, Mapping], keys: Sequence[str]) -> dict:
        """Per variant and key, `seed_stats` over the seeds' runs (mean, std, median, IQR and
        per-seed values). A key whose values are lists (e.g. a score per iteration step) is
        aggregated elementwise."""
        return {variant: {k: seed_stats([r[k] for r in runs]) for k in keys}
                for variant, runs in self.per_variant(results).items()}

    def curves(self, keys: Sequence[str], stage: str, variants: Sequence[str] | None = None
               ) -> dict[str, dict[str, np.ndarray]]:
        """Per variant (`variants`, default all; e.g. only those that log `keys`) and key, the
        [seeds, steps] training curve of `stage` from each run's metrics.jsonl."""
        out: dict[str, dict[str, np.ndarray]] = {}
        for variant in self.variants if variants is None else variants:
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
    def compare(stats: Mapping[str, Mapping], a: str, b: str, key: str) -> dict[str, Any]:
        """`compare_seeds` of variants `a` and `b` in `stats` (`aggregate`'s) on `key`."""
        return compare_seeds(stats[a][key]["per_seed"], stats[b][key]["per_seed"])

    verdict = staticmethod(verdict)

    @staticmethod
    def best(stats: Mapping[str, Mapping], keys: Sequence[str]) -> dict[str, list[str]]:
        """Per key, every variant that ties for the highest mean."""
        out = {}
        for k in keys:
            top = max(s[k]["mean"] for s in stats.values())
            out[k] = [v for v, s in stats.items() if s[k]["mean"] == top]
        return out

    def plot_curves(self, curves: Mapping[str, Mapping[str, np.ndarray]], key: str, path: Path,
                    *, x=None, smooth: int = 1, xlabel: str = "step", ylabel: str = "",
                    hline: float | None = None, yscale: str = "linear", title: str = "") -> None:
        """Median and IQR band over seeds of `key` ([seeds, points] per variant) against `x`
        (default 1, 2, ...), one line per variant (trailing mean over `smooth` points per seed
        first)."""
        ys = {v: np.stack([trailing_mean(row, smooth) for row in np.asarray(c[key])]) for v, c in
              curves.items()}
        if x is None:
            x = np.arange(1, next(iter(ys.values())).shape[1] + 1)
        plot_iqr_bands(x, ys, path, xlabel=xlabel, ylabel=ylabel or key, hline=hline,
                       yscale=yscale, title=title or f"{self.name}: median and IQR over "
                       f"{len(self.seeds)} seeds")

    def plot_means(self, x, stats: Mapping[str, Mapping], key: str, path: Path, *,
                   reference: tuple[str, Sequence[float]] | None = None,
                   vline: float | None = None, xlabel: str = "", ylabel: str = "",
                   xscale: str = "linear", yscale: str = "linear", title: str = "") -> None:
        """Mean ± std band over seeds of a list-valued result `key` (from `aggregate` or
        `unit_stats`) against `x`, one line per variant; `reference` = (label, values) adds a
        dashed black line (e.g. the shared start or a chance level), `vline` a dotted vertical
        line. Process 0 only."""
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
        ax.set_xscale(xscale)
        ax.set_yscale(yscale)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel or key)
        ax.set_title(title or f"{self.name}: mean ± std over {len(self.seeds)} seeds")
        ax.legend()
        ax.grid(alpha=0.3)
        save_figure(fig, path)

    def plot_bars(self, groups: Mapping[str, Mapping[str, Sequence[float]]], path: Path, *,
                  ylabel: str = "", hline: float | None = None, ylim=None,
                  title: str = "") -> None:
        """Grouped bars: {group: {series: per-seed values}} -> per group one bar per series, its
        height the mean over seeds, a ± std error bar and a dot per seed. Process 0 only."""
        if jax.process_index() != 0:
            return
        names = list(groups)
        series = list(dict.fromkeys(s for g in groups.values() for s in g))
        fig, ax = pyplot().subplots(figsize=(max(6.4, 1.6 + 1.9 * len(names)), 4.0))
        width = 0.8 / len(series)
        for j, s in enumerate(series):
            x = np.arange(len(names)) + (j - (len(series) - 1) / 2) * width
            vals = [np.asarray(groups[g].get(s, [np.nan]), np.float64) for g in names]
            ax.bar(x, [v.mean() for v in vals], width, yerr=[v.std() for v in vals], capsize=3,
                   label=s)
            for xi, v in zip(x, vals, strict=True):
                ax.scatter(np.full(len(v), xi), v, s=6, c="k", zorder=3)
        ax.set_xticks(range(len(names)), names)
        if hline is not None:
            ax.axhline(hline, color="gray", lw=0.8, ls="--")
        if ylim is not None:
            ax.set_ylim(*ylim)
        ax.set_ylabel(ylabel)
        ax.set_title(title or f"{self.name}: mean ± std over {len(self.seeds)} seeds (dots: "
                     "seeds)")
        ax.legend(fontsize=8, ncol=len(series))
        ax.grid(alpha=0.3, axis="y")
        save_figure(fig, path)

    def table(self, stats: Mapping[str, Mapping], keys: Sequence[str] | Mapping[str, str], *,
              first: Mapping[str, Mapping[str, float]] | None = None,
              formats: Mapping[str, str] | None = None, cell: str = "mean",
              label: str = "model") -> str:
        """Markdown table: one row per variant (or unit) of its statistics over seeds, one column
        per key (`keys` may map key -> column header). `cell` "mean" shows mean ± std, "median"
        median [q25, q75]; an entry that is a plain number or string instead of statistics shows
        as it is, and a key a row lacks as "-". `first` adds rows of single values above them
        (e.g. the shared SFT start; NaN shows as "-"). Numbers use format ".3f" unless
        `formats[key]` says otherwise."""
        if cell not in ("mean", "median"):
            raise ValueError(f"table: cell must be 'mean' or 'median', got {cell!r}")
        heads = dict(keys) if isinstance(keys, Mapping) else {k: k for k in keys}
        f = lambda k, x: "-" if x != x else format(x, (formats or {}).get(k, ".3f"))

        def show(k, s):
            if s is None:
                return "-"
            if isinstance(s, str):
                return s
            if not isinstance(s, Mapping):
                return f(k, s)
            if cell == "mean":
                return f"{f(k, s['mean'])} ± {f(k, s['std'])}"
            return f"{f(k, s['median'])} [{f(k, s['q25'])}, {f(k, s['q75'])}]"

        head = [f"| {label} | " + " | ".join(heads.values()) + " |",
                "|---" * (len(heads) + 1) + "|"]
        rows = [f"| {name} | " + " | ".join(f(k, vals.get(k, float("nan"))) for k in heads) + " |"
                for name, vals in (first or {}).items()]
        for v, s in stats.items():
            rows.append(f"| {v} | " + " | ".join(show(k, s.get(k)) for k in heads) + " |")
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


__all__ = ["Study", "check_seeds", "check_variants", "format_numbers", "group_correlations",
           "open_run_log", "seed_deltas", "seed_stats"]

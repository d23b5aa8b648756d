"""`jaxrl-suite` command line: `run NAME [--config F] [--set k=v]... [--smoke] [--out DIR]
[--resume | --overwrite] [--tensorboard] [--wandb [--wandb-project P] [--wandb-entity E]
[--wandb-mode M]] [--no-progress] [--distributed]`, `eval RUN_DIR [--stage S]
[--samples N] [--ks K...]`, `plot RUN_DIR... [--out PNG] [--keys K...] [--stage S]
[--label L...] [--smooth N]` and `list`.

Bad input (an unknown experiment, config key or value, a missing checkpoint or metrics file)
prints one line to stderr and exits with status 2, without a traceback. A config key given by
its old name (a saved run's, say) is read with a one-line warning naming the new key.

`--smoke` runs a tiny size that checks the plumbing (that everything runs, logs, checkpoints and
resumes), not the method: it says in one line that its numbers are meaningless by design.

No run deletes data: `run` into an --out folder that holds an earlier run's work (a checkpoint,
a logged metric, a result or summary) refuses unless it is told how to go on:
`--resume` continues the earlier run, `--overwrite` moves it aside to a timestamped sibling
folder (OUT.old-YYYYmmdd-HHMMSS) and starts afresh.

Ctrl-C ends with one line, exit 130: where the last checkpoints are and the command that
resumes. SIGTERM (a scheduler's) lets the step in progress finish, checkpoints it, and ends the
same way with exit 143 (`core.signals`).

In a multi-process job (`--distributed`), a process that fails exits at once, skipping JAX's
shutdown barrier, so that the other processes abort (see `core.parallel.init_distributed`)
instead of waiting for it forever in their next collective.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import signal
import sys
import traceback
import warnings
from pathlib import Path
from typing import NoReturn

import jax

from jaxrl_suite.core.checkpoint import CheckpointNotFoundError
from jaxrl_suite.core.config import ConfigError, MovedKeyWarning, from_dict, load_config, to_dict
from jaxrl_suite.core.experiment import EvalOptions, RunOptions, load_experiments
from jaxrl_suite.core.metrics import WANDB_MODES, WandbOptions, wandb_options, write_json
from jaxrl_suite.core.parallel import init_distributed
from jaxrl_suite.core.registry import UnknownNameError
from jaxrl_suite.core.rundir import earlier_run, log_resume_changes, move_aside, resume_changes
from jaxrl_suite.core.signals import Terminated, stop_on_sigterm
from jaxrl_suite.core.train import NonFiniteError

EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jaxrl-suite", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an experiment")
    run.add_argument("name", help="experiment name (see `jaxrl-suite list`)")
    run.add_argument("--config", type=Path,
                     help="YAML config (default: the one the experiment ships)")
    run.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override one config field, e.g. --set grpo.lr=1e-5 (repeatable)",
    )
    run.add_argument("--smoke", action="store_true",
                     help="tiny size for tests (seconds): it checks the plumbing, not the "
                     "method, so its numbers are meaningless by design")
    run.add_argument("--out", type=Path, help="output dir (default: results/NAME[-smoke])")
    run.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    run.add_argument("--overwrite", action="store_true",
                     help="start afresh in an --out folder that holds an earlier run, after "
                     "moving that run aside to OUT.old-<time> (nothing is deleted)")
    run.add_argument("--tensorboard", action="store_true", help="also write TensorBoard events")
    run.add_argument("--wandb", action="store_true",
                     help="also log the metrics to Weights & Biases (the wandb extra); --resume "
                     "continues the same W&B runs")
    run.add_argument("--wandb-project", metavar="P",
                     help="W&B project (default: $WANDB_PROJECT, else jaxrl_suite)")
    run.add_argument("--wandb-entity", metavar="E",
                     help="W&B entity, a user or team (default: $WANDB_ENTITY, else W&B's)")
    run.add_argument("--wandb-mode", choices=WANDB_MODES,
                     help="online, offline (local files; `wandb sync` uploads them later) or "
                     "disabled (default: $WANDB_MODE, else online)")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    run.add_argument(
        "--distributed", action="store_true",
        help="join a multi-process job first (run the same command on every host; see "
        "jaxrl_suite.core.parallel.init_distributed for the environment variables)",
    )
    sub.add_parser("list", help="list the experiments")
    ev = sub.add_parser("eval", help="sampled pass@k / maj@k of a run's checkpoint")
    ev.add_argument("run_dir", type=Path, help="a run's output dir (results/NAME)")
    ev.add_argument("--stage", default="grpo", help="checkpoint series (default: grpo)")
    ev.add_argument("--samples", type=int, default=8, help="completions per prompt (n)")
    ev.add_argument("--ks", type=int, nargs="+", default=[1, 4, 8], help="k of pass@k, maj@k")
    ev.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    ev.add_argument("--examples", type=int, default=64, help="held-out prompts")
    ev.add_argument("--seed", type=int, help="which seed's run of the study (default: the first)")
    pl = sub.add_parser("plot", help="overlay runs' metrics.jsonl curves (median, IQR over seeds)")
    pl.add_argument(
        "run_dirs", nargs="+", type=str, metavar="RUN_DIR",
        help="run output dirs, one curve each; a quoted glob ('results/grpo-s*') is one curve over "
        "the dirs it matches",
    )
    pl.add_argument("--out", type=Path, default=Path("plot.png"), help="PNG (default: plot.png)")
    pl.add_argument(
        "--keys", nargs="+", metavar="KEY",
        help="metrics, one panel each (default: reward, accuracy, return, ... as logged by all)",
    )
    pl.add_argument(
        "--stage",
        help="only this stage's records; 'all': every stage on the run's step axis (default: per "
        "key, the last stage that logs it)",
    )
    pl.add_argument(
        "--label", nargs="+", metavar="LABEL",
        help="one per RUN_DIR (default: RUN_DIR as given); dirs with the same label form one "
        "curve over all their seeds",
    )
    pl.add_argument("--smooth", type=int, default=1, metavar="N",
                    help="trailing mean over N logged steps, per seed (default 1: none)")
    pl.add_argument("--title", default="", help="figure title")
    return p


SMOKE_NOTE = ("jaxrl-suite: --smoke: a tiny run that checks the plumbing, not the method; its "
              "numbers are meaningless by design")


def _wandb_options(args: argparse.Namespace, cfg, out_dir: Path,
                   config: dict) -> WandbOptions | None:
    """The run's W&B options: on with `--wandb` or the config's `run.wandb.enabled`, the
    --wandb-* flags over `run.wandb`'s fields (None when off). A --wandb-* flag while W&B is
    off, or a missing wandb package, is a one-line ConfigError."""
    configured = getattr(getattr(cfg, "run", None), "wandb", None)
    if not args.wandb and not (configured and configured.enabled):
        given = [f for f in ("project", "entity", "mode") if getattr(args, f"wandb_{f}")]
        if given:
            raise ConfigError(f"--wandb-{given[0]} needs --wandb (or run.wandb.enabled)")
    return wandb_options(configured, enabled=args.wandb, project=args.wandb_project,
                         entity=args.wandb_entity, mode=args.wandb_mode, group=out_dir.name,
                         job_type=args.name, config=config)


def _run(args: argparse.Namespace) -> int:
    exp = load_experiments(args.name).get(args.name)
    config_path = args.config or exp.default_config()
    cfg = load_config(exp.config_cls, config_path, args.overrides, smoke=args.smoke)
    out_dir = args.out or Path("results") / (args.name + ("-smoke" if args.smoke else ""))
    out_dir = out_dir.absolute()
    config = {"experiment": args.name, "config": to_dict(cfg)}
    wandb = _wandb_options(args, cfg, out_dir, config)  # checked before anything is moved
    ckpt_dir = out_dir / "checkpoints"
    if args.resume and args.overwrite:
        raise ConfigError("--resume continues the run in --out and --overwrite replaces it: "
                          "give one of them")
    if args.resume:
        done = (out_dir / "runs").glob("**/result.json")  # finished units of a Study
        if not any(ckpt_dir.rglob("*") if ckpt_dir.is_dir() else ()) and not any(done):
            raise CheckpointNotFoundError(f"--resume: no checkpoint found in {ckpt_dir} and no "
                                          f"finished run in {out_dir / 'runs'}")
    elif earlier_run(out_dir):  # a fresh run must not mix with, nor delete, an earlier one
        if not args.overwrite:
            raise ConfigError(f"--out {out_dir} holds an earlier run: continue it with --resume, "
                              f"or start afresh with --overwrite (the earlier run is moved to "
                              f"{out_dir.name}.old-<time>, not deleted)")
        if jax.process_index() == 0:
            print(f"jaxrl-suite: moved the earlier run to {move_aside(out_dir)}",
                  file=sys.stderr)
    changed = resume_changes(out_dir, config, config_cls=exp.config_cls) if args.resume else {}
    if jax.process_index() == 0:
        try:  # also the start-up check that --out is writable, before any compilation
            write_json(out_dir / "config.json", config)
        except OSError as e:
            raise ConfigError(f"--out {out_dir} is not writable ({e.strerror or e})") from None
        if changed:
            log_resume_changes(out_dir, changed)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("jaxrl_suite: output dir ready")
    options = RunOptions(
        out_dir=out_dir, resume=args.resume, tensorboard=args.tensorboard,
        progress=not args.no_progress, wandb=wandb,
    )
    exp.run(cfg, options)
    if args.smoke and jax.process_index() == 0:  # below the results it qualifies
        print(SMOKE_NOTE)
    return 0


def _eval(args: argparse.Namespace) -> int:
    run_dir = args.run_dir.absolute()
    config_file = run_dir / "config.json"
    if not config_file.is_file():
        raise CheckpointNotFoundError(f"eval: no config.json in {run_dir} (not a run directory)")
    saved = json.loads(config_file.read_text())
    exp = load_experiments(saved["experiment"]).get(saved["experiment"])
    if exp.evaluate is None:
        raise ConfigError(f"eval: experiment {exp.name!r} has no checkpoint evaluation")
    bad = [k for k in args.ks if not 1 <= k <= args.samples]
    if bad:
        raise ConfigError(f"eval: --ks {bad} must lie in 1..--samples={args.samples}")
    cfg = from_dict(exp.config_cls, saved["config"])
    options = EvalOptions(run_dir=run_dir, stage=args.stage, samples=args.samples,
                          ks=tuple(args.ks), temperature=args.temperature,
                          num_examples=args.examples, seed=args.seed)
    result = exp.evaluate(cfg, options)
    print(json.dumps(result, indent=2))
    return 0


def _run_dirs(arg: str) -> list[Path]:
    """A RUN_DIR argument: the dir itself, or the dirs a glob pattern matches."""
    if Path(arg).is_dir() or glob.escape(arg) == arg:  # escape() changes only a pattern
        return [Path(arg)]
    dirs = [Path(d) for d in sorted(glob.glob(arg)) if Path(d).is_dir()]
    if not dirs:
        raise ConfigError(f"plot: no run directory matches {arg!r}")
    return dirs


def _plot(args: argparse.Namespace) -> int:
    from jaxrl_suite.core import metrics

    labels = args.label or [arg.rstrip("/") or arg for arg in args.run_dirs]
    if len(labels) != len(args.run_dirs):
        raise ConfigError(f"plot: {len(labels)} --label values for {len(args.run_dirs)} RUN_DIRs")
    if args.smooth < 1:
        raise ConfigError(f"plot: --smooth {args.smooth} must be >= 1")
    runs: dict[str, list[list[dict]]] = {}
    loaded: list[tuple[Path, list[dict]]] = []
    for arg, label in zip(args.run_dirs, labels, strict=True):
        for run_dir in _run_dirs(arg):
            path = run_dir / "metrics.jsonl"
            if not path.is_file():
                raise ConfigError(f"plot: no metrics.jsonl in {run_dir}")
            try:
                records = metrics.read_metrics(path)
            except ValueError as e:  # e.g. a line cut short by a killed run
                raise ConfigError(f"plot: {path}: {e}") from None
            if not records:
                raise ConfigError(f"plot: {path} holds no records")
            if args.stage not in (None, metrics.ALL_STAGES) and \
                    args.stage not in metrics.stages(records):
                known = ", ".join(metrics.stages(records)) or "none"
                raise ConfigError(f"plot: no stage {args.stage!r} in {run_dir} (stages: {known})")
            runs.setdefault(label, []).append(records)
            loaded.append((run_dir, records))
    keys = args.keys or metrics.default_plot_keys([r for _, r in loaded])
    if not keys:
        raise ConfigError("plot: the runs share no numeric metric; name some with --keys")
    for key in keys:
        for run_dir, records in loaded:
            if not metrics.seed_series(records, key, stage=args.stage):
                one_stage = args.stage not in (None, metrics.ALL_STAGES)
                where = f"stage {args.stage!r} of " if one_stage else ""
                known = metrics.numeric_keys(
                    [r for r in records if not one_stage or r.get("stage") == args.stage])
                raise ConfigError(f"plot: unknown key {key!r} in {where}{run_dir} "
                                  f"(keys: {', '.join(known) or 'none'})")
    metrics.plot_runs(runs, keys, args.out, stage=args.stage, smooth=args.smooth,
                      title=args.title)
    print(args.out)
    return 0


def _usage_errors() -> tuple[type[Exception], ...]:
    """The errors reported in one line with status 2. (`envs.contextual` imports gymnax, which runs
    JAX code on import, so it is imported late: `--distributed` must join before that.)"""
    from jaxrl_suite.envs.contextual import ContextError

    return ConfigError, CheckpointNotFoundError, UnknownNameError, ContextError


def _dispatch(args: argparse.Namespace) -> int:
    try:
        if args.command == "plot":
            return _plot(args)
        if args.command == "run" and args.distributed:
            init_distributed()  # before any JAX computation, and importing gymnax computes
        if args.command == "list":
            experiments = load_experiments()
            for name in experiments.names():
                print(f"{name:24s} {experiments.get(name).description}")
            return 0
        if args.command == "eval":
            return _eval(args)
        return _run(args)
    except _usage_errors() as e:
        print(f"jaxrl-suite: error: {e}", file=sys.stderr)
        return EXIT_USAGE


def _one_line_warnings(show):
    """`warnings.showwarning` that prints a moved config key's warning in one line, as the
    errors are, and passes every other warning to `show`."""

    def show_warning(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, MovedKeyWarning):
            print(f"jaxrl-suite: warning: {message}", file=sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)

    return show_warning


def _multi_process() -> bool:
    return jax.distributed.is_initialized() and jax.process_count() > 1


def _abandon(status: int) -> NoReturn:
    """Exit at once, skipping JAX's shutdown barrier: a process that failed alone would otherwise
    wait there while the others block in their next collective, and the job would hang."""
    print(f"jaxrl-suite: process {jax.process_index()} of {jax.process_count()} failed; exiting "
          "now so that the other processes abort too", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _interrupted(args: argparse.Namespace, argv: list[str], e: KeyboardInterrupt) -> str:
    """The one line for Ctrl-C or SIGTERM: what was saved and the command that goes on."""
    if args.command != "run":
        return "jaxrl-suite: interrupted"
    out_dir = (args.out or Path("results") / (args.name + ("-smoke" if args.smoke else "")))
    ckpts = out_dir.absolute() / "checkpoints"
    saved = ckpts.is_dir() and any(p.name.isdigit() for p in ckpts.rglob("*"))
    if not saved and not any((out_dir / "runs").glob("**/result.json")):
        again = [a for a in argv if a not in ("--resume", "--overwrite")] + ["--overwrite"]
        return (f"jaxrl-suite: interrupted before the first checkpoint; start again with: "
                f"jaxrl-suite {shlex.join(again)}")
    again = [a for a in argv if a != "--overwrite"] + ([] if args.resume else ["--resume"])
    what = (f"stopped by SIGTERM: {e}" if isinstance(e, Terminated) else
            f"interrupted; the last checkpoints are under {ckpts}")
    return f"jaxrl-suite: {what}; resume with: jaxrl-suite {shlex.join(again)}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    try:
        # SIGTERM handled for single-process runs (a multi-process job keeps the default)
        with stop_on_sigterm(enabled=not getattr(args, "distributed", False)), \
                warnings.catch_warnings():
            warnings.showwarning = _one_line_warnings(warnings.showwarning)
            status = _dispatch(args)
    except NonFiniteError as e:  # the metrics are global: every process stops at the same step
        print(f"jaxrl-suite: stopped: {e}", file=sys.stderr)
        return 1
    except (Exception, KeyboardInterrupt) as e:
        if not _multi_process():
            if not isinstance(e, KeyboardInterrupt):
                raise
            print(_interrupted(args, argv, e), file=sys.stderr)
            return 128 + (signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)
        traceback.print_exc()
        _abandon(130 if isinstance(e, KeyboardInterrupt) else 1)
    if status and _multi_process():
        _abandon(status)
    return status


if __name__ == "__main__":
    sys.exit(main())

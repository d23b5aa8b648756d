"""`jaxrl-suite` command line: `run NAME [--config F] [--set k=v]... [--smoke] [--out DIR]
[--resume] [--tensorboard]`, `eval RUN_DIR [--stage S] [--samples N] [--ks K...]` and `list`.

Bad input (an unknown experiment, config key or value, a missing checkpoint) prints one line to
stderr and exits with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import jax

from jaxrl_suite.core.checkpoint import CheckpointNotFoundError
from jaxrl_suite.core.config import ConfigError, from_dict, load_config
from jaxrl_suite.core.experiment import EXPERIMENTS, EvalOptions, RunOptions
from jaxrl_suite.core.registry import UnknownNameError
from jaxrl_suite.core.train import NonFiniteError
from jaxrl_suite.envs.contextual import ContextError

EXIT_USAGE = 2


def _load_experiments() -> Path:
    """Import the `experiments` package (it registers every experiment); returns the configs dir."""
    import experiments

    return Path(experiments.__file__).resolve().parent.parent / "configs"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jaxrl-suite", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an experiment")
    run.add_argument("name", help="experiment name (see `jaxrl-suite list`)")
    run.add_argument("--config", type=Path, help="YAML config (default: configs/NAME.yaml)")
    run.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override one config field, e.g. --set grpo.lr=1e-5 (repeatable)",
    )
    run.add_argument("--smoke", action="store_true", help="tiny size for tests (seconds)")
    run.add_argument("--out", type=Path, help="output dir (default: results/NAME[-smoke])")
    run.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    run.add_argument("--tensorboard", action="store_true", help="also write TensorBoard events")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    run.add_argument(
        "--distributed", action="store_true",
        help="call jax.distributed.initialize() first (multi-host; run the same command on all)",
    )
    sub.add_parser("list", help="list the experiments")
    ev = sub.add_parser("eval", help="sampled pass@k / maj@k of a run's checkpoint")
    ev.add_argument("run_dir", type=Path, help="a run's output dir (results/NAME)")
    ev.add_argument("--stage", default="grpo", help="checkpoint series (default: grpo)")
    ev.add_argument("--samples", type=int, default=8, help="completions per prompt (n)")
    ev.add_argument("--ks", type=int, nargs="+", default=[1, 4, 8], help="k of pass@k, maj@k")
    ev.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    ev.add_argument("--examples", type=int, default=64, help="held-out prompts")
    return p


def _run(args: argparse.Namespace, configs_dir: Path) -> int:
    if args.distributed:
        jax.distributed.initialize()
    exp = EXPERIMENTS.get(args.name)
    config_path = args.config
    if config_path is None and (configs_dir / f"{args.name}.yaml").is_file():
        config_path = configs_dir / f"{args.name}.yaml"
    cfg = load_config(exp.config_cls, config_path, args.overrides, smoke=args.smoke)
    out_dir = args.out or Path("results") / (args.name + ("-smoke" if args.smoke else ""))
    out_dir = out_dir.absolute()
    ckpt_dir = out_dir / "checkpoints"
    if args.resume:
        if not ckpt_dir.is_dir() or not any(ckpt_dir.rglob("*")):
            raise CheckpointNotFoundError(f"--resume: no checkpoint found in {ckpt_dir}")
    elif ckpt_dir.exists() and jax.process_index() == 0:
        shutil.rmtree(ckpt_dir)  # a fresh run must not mix with an old run's checkpoints
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("jaxrl_suite: output dir ready")
    options = RunOptions(
        out_dir=out_dir, resume=args.resume, tensorboard=args.tensorboard,
        progress=not args.no_progress,
    )
    exp.run(cfg, options)
    return 0


def _eval(args: argparse.Namespace) -> int:
    run_dir = args.run_dir.absolute()
    config_file = run_dir / "config.json"
    if not config_file.is_file():
        raise CheckpointNotFoundError(f"eval: no config.json in {run_dir} (not a run directory)")
    saved = json.loads(config_file.read_text())
    exp = EXPERIMENTS.get(saved["experiment"])
    if exp.evaluate is None:
        raise ConfigError(f"eval: experiment {exp.name!r} has no checkpoint evaluation")
    bad = [k for k in args.ks if not 1 <= k <= args.samples]
    if bad:
        raise ConfigError(f"eval: --ks {bad} must lie in 1..--samples={args.samples}")
    cfg = from_dict(exp.config_cls, saved["config"])
    options = EvalOptions(run_dir=run_dir, stage=args.stage, samples=args.samples,
                          ks=tuple(args.ks), temperature=args.temperature,
                          num_examples=args.examples)
    result = exp.evaluate(cfg, options)
    print(json.dumps(result, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        configs_dir = _load_experiments()
        if args.command == "list":
            for name in EXPERIMENTS.names():
                print(f"{name:24s} {EXPERIMENTS.get(name).description}")
            return 0
        if args.command == "eval":
            return _eval(args)
        return _run(args, configs_dir)
    except (ConfigError, CheckpointNotFoundError, UnknownNameError, ContextError) as e:
        print(f"jaxrl-suite: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except NonFiniteError as e:
        print(f"jaxrl-suite: stopped: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""The experiment registry the CLI looks names up in.

An experiment is a config dataclass plus `run(config, options) -> summary dict`, and optionally
`evaluate(config, eval_options) -> dict` for `jaxrl-suite eval RUN_DIR`. The thin
scripts under `experiments/` register themselves in `experiments/__init__.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jaxrl_suite.core.registry import Registry


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """Options of one launch that are not part of the experiment's config."""

    out_dir: Path  # where metrics.jsonl, summary.json, plots and checkpoints go
    resume: bool = False  # continue from the latest checkpoint in out_dir
    tensorboard: bool = False  # also write TensorBoard event files under out_dir/tensorboard
    progress: bool = True  # show a tqdm progress bar


@dataclasses.dataclass(frozen=True)
class EvalOptions:
    """`jaxrl-suite eval`: sampled evaluation of a finished or stopped run's checkpoint."""

    run_dir: Path  # the run's output dir (holds config.json and checkpoints/)
    stage: str = "grpo"  # which checkpoint series to evaluate
    samples: int = 8  # n sampled completions per held-out prompt
    ks: tuple[int, ...] = (1, 4, 8)  # pass@k and maj@k for these k
    temperature: float = 1.0
    num_examples: int = 64  # the first held-out prompts


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str
    config_cls: type
    run: Callable[[Any, RunOptions], dict]
    description: str = ""
    evaluate: Callable[[Any, EvalOptions], dict] | None = None  # `jaxrl-suite eval` support


EXPERIMENTS: Registry[Experiment] = Registry("experiment")

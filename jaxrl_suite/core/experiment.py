"""The experiment registry the CLI looks names up in.

An experiment is a config dataclass plus `run(config, out_dir, options) -> summary dict`. The thin
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
class Experiment:
    name: str
    config_cls: type
    run: Callable[[Any, RunOptions], dict]
    description: str = ""


EXPERIMENTS: Registry[Experiment] = Registry("experiment")

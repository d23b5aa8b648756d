"""The experiment registry the CLI looks names up in.

An experiment is a config dataclass plus `run(config, options) -> summary dict`, optionally
`evaluate(config, eval_options) -> dict` for `jaxrl-suite eval RUN_DIR`, and its default YAML
config, shipped with its code. Experiments are found through the package entry-point group
`jaxrl_suite.experiments` (each entry point names an `Experiment` object), so any installed
package can add its own without touching this one:

    # pyproject.toml of your package
    [project.entry-points."jaxrl_suite.experiments"]
    my_study = "my_pkg.my_study:EXPERIMENT"

The library never imports the `experiments` package itself.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jaxrl_suite.core.config import ConfigError
from jaxrl_suite.core.metrics import WandbOptions
from jaxrl_suite.core.registry import Registry

ENTRY_POINT_GROUP = "jaxrl_suite.experiments"


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """Options of one launch that are not part of the experiment's config."""

    out_dir: Path  # where metrics.jsonl, summary.json, plots and checkpoints go
    resume: bool = False  # continue from the latest checkpoint in out_dir
    tensorboard: bool = False  # also write TensorBoard event files under out_dir/tensorboard
    progress: bool = True  # show a tqdm progress bar
    wandb: WandbOptions | None = None  # also log the metrics to Weights & Biases (`--wandb`)


@dataclasses.dataclass(frozen=True)
class EvalOptions:
    """`jaxrl-suite eval`: sampled evaluation of a finished or stopped run's checkpoint."""

    run_dir: Path  # the run's output dir (holds config.json and checkpoints/)
    stage: str = "grpo"  # which checkpoint series to evaluate
    samples: int = 8  # n sampled completions per held-out prompt
    ks: tuple[int, ...] = (1, 4, 8)  # pass@k and maj@k for these k
    temperature: float = 1.0
    num_examples: int = 64  # the first held-out prompts
    seed: int | None = None  # which seed's run of a multi-seed study (None: the first)


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str
    config_cls: type
    run: Callable[[Any, RunOptions], dict]
    description: str = ""
    evaluate: Callable[[Any, EvalOptions], dict] | None = None  # `jaxrl-suite eval` support
    # The default YAML config, shipped beside the code as package data (e.g.
    # `importlib.resources.files("my_pkg") / "configs" / "my_study.yaml"`); None: there is none.
    config: Path | Any | None = None

    def default_config(self):
        """The default YAML config (a path); a missing one is a one-line `ConfigError`."""
        if self.config is None or not self.config.is_file():
            raise ConfigError(
                f"experiment {self.name!r}: its default config {self.config} is missing (it ships "
                "as package data beside the experiment's code); pass --config FILE")
        return self.config


EXPERIMENTS: Registry[Experiment] = Registry("experiment")


def load_experiments(name: str | None = None) -> Registry[Experiment]:
    """Register the experiments of the `jaxrl_suite.experiments` entry-point group (only `name`'s
    when given, so one broken plug-in does not stop the others) and return the registry. An
    entry point that fails to load is a one-line `ConfigError`."""
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in EXPERIMENTS or (name is not None and ep.name != name):
            continue
        try:
            exp = ep.load()
        except Exception as e:  # noqa: BLE001 - any import error of a plug-in is reported alike
            raise ConfigError(f"experiment entry point {ep.name!r} = {ep.value!r} failed to "
                              f"load: {type(e).__name__}: {e}") from None
        if not isinstance(exp, Experiment) or exp.name != ep.name:
            raise ConfigError(f"experiment entry point {ep.name!r} = {ep.value!r} must name an "
                              f"Experiment called {ep.name!r}")
        EXPERIMENTS.register(ep.name, exp)
    if name is not None and name not in EXPERIMENTS:
        load_experiments()  # the error lists every known name
    return EXPERIMENTS

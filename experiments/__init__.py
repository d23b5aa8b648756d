"""Experiment scripts, one per paper. Each module defines `EXPERIMENT`; pyproject.toml lists them
in the `jaxrl_suite.experiments` entry-point group, which is how `jaxrl-suite` finds them. Their
default YAML configs ship beside them, in `experiments/configs/` (package data)."""

from importlib.resources import files

CONFIGS = files(__name__) / "configs"  # the default YAML configs, NAME.yaml each

"""Experiment scripts, one per paper; each registers itself in `EXPERIMENTS` here."""

from experiments import grpo_arithmetic
from jaxrl_suite.core.experiment import EXPERIMENTS

EXPERIMENTS.register(grpo_arithmetic.EXPERIMENT.name, grpo_arithmetic.EXPERIMENT)

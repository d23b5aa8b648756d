"""Experiment scripts, one per paper; each registers itself in `EXPERIMENTS` here."""

from experiments import (
    carl_generalization,
    elmur_popgym,
    elmur_tmaze,
    exit_self_improve,
    grpo_arithmetic,
    oppo_offline_pref,
    siren_entropy,
    space_curriculum,
)
from jaxrl_suite.core.experiment import EXPERIMENTS

for _module in (grpo_arithmetic, carl_generalization, space_curriculum, elmur_tmaze,
                elmur_popgym, siren_entropy, oppo_offline_pref, exit_self_improve):
    EXPERIMENTS.register(_module.EXPERIMENT.name, _module.EXPERIMENT)

"""Curricula over environment contexts as pure `init / sample / update / metrics` functions.

Every curriculum is a frozen dataclass of static config and constant arrays; its state is a
fixed-shape pytree, so it runs inside `jax.jit(jax.vmap(train))` (see `base.py` for the loop).

* `RoundRobin`, `RandomCurriculum`: non-adaptive baselines over a fixed instance set.
* `SPaCE`: self-paced context evaluation, a growing instance set ranked by critic values
  (Eimer et al., ICML 2021).
* `SPDRL`: self-paced deep RL, a Gaussian context distribution moved toward a target under a KL
  trust region (Klink, D'Eramo, Peters, Pajarinen, NeurIPS 2020).
"""

from __future__ import annotations

from typing import Any

from jaxrl_suite.curricula.base import (
    Curriculum,
    RandomCurriculum,
    RandomState,
    RoundRobin,
    RoundRobinState,
    ValueFn,
)
from jaxrl_suite.curricula.space import SPaCE, SPaCEState
from jaxrl_suite.curricula.spdrl import SPDRL, SPDRLState, gaussian_kl, gaussian_log_pdf

CURRICULA: dict[str, type] = {
    "round_robin": RoundRobin,
    "random": RandomCurriculum,
    "space": SPaCE,
    "spdrl": SPDRL,
}


def make_curriculum(name: str, instances: Any, **kwargs: Any) -> Curriculum:
    """Builds the curriculum called `name` over `instances` ([N, F]) with constructor `kwargs`.

    Valid names: "round_robin", "random", "space", "spdrl". An unknown name raises a ValueError
    that names it and lists the valid ones.
    """
    if name not in CURRICULA:
        raise ValueError(f"unknown curriculum {name!r}; valid names: {', '.join(CURRICULA)}")
    return CURRICULA[name](instances, **kwargs)


__all__ = [
    "CURRICULA",
    "Curriculum",
    "RandomCurriculum",
    "RandomState",
    "RoundRobin",
    "RoundRobinState",
    "SPDRL",
    "SPDRLState",
    "SPaCE",
    "SPaCEState",
    "ValueFn",
    "gaussian_kl",
    "gaussian_log_pdf",
    "make_curriculum",
]

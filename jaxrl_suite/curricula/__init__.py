"""Curricula over environment contexts as pure `init / sample / update / metrics` functions.

Every curriculum is a frozen dataclass of static config and constant arrays; its state is a
fixed-shape pytree, so it runs inside `jax.jit(jax.vmap(train))` (see `base.py` for the loop).

* `RoundRobin`, `RandomCurriculum`: non-adaptive baselines over a fixed instance set.
* `SPaCE`: self-paced context evaluation, a growing instance set ranked by critic values
  (Eimer et al., ICML 2021).
* `SPDRL`: self-paced deep RL, a Gaussian context distribution moved toward a target under a KL
  trust region (Klink, D'Eramo, Peters, Pajarinen, NeurIPS 2020).

Each is registered in `CURRICULA` ("round_robin", "random", "space", "spdrl") and built by name
with `make_curriculum`. (The ExIt task buffer, `curricula.exit`, has its own protocol.)

* `curricula.rest`: ReST-GRPO's data filter (ReST-RL, Zhoubian et al. 2025, arXiv 2508.19576),
  host-side numpy functions that keep the problems whose sampled rewards vary and add
  partial-solution prompts; not in `CURRICULA`.
"""

from __future__ import annotations

from jaxrl_suite.curricula.base import (
    CURRICULA,
    Curriculum,
    RandomCurriculum,
    RandomState,
    RoundRobin,
    RoundRobinState,
    ValueFn,
    make_curriculum,
)
from jaxrl_suite.curricula.space import SPaCE, SPaCEState
from jaxrl_suite.curricula.spdrl import SPDRL, SPDRLState, gaussian_kl, gaussian_log_pdf

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

"""SPaCE: Self-Paced Context Evaluation (Eimer, Biedenkapp, Hutter, Lindauer, ICML 2021).

Paper: "Self-Paced Context Evaluation for Contextual Reinforcement Learning", arXiv 2106.05110.
Written from the paper's description and from reading the authors' experiment code
(github.com/automl/SPaCE, `src/baselines_spl.py` and `src/point_mass_wrapper.py`) and their later
re-implementation (github.com/automl/Mighty, `mighty/mighty_meta/space.py`); no code is copied.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_suite.core.registry import Registry
from jaxrl_suite.curricula.base import CURRICULA, ValueFn, as_instances

INITIAL_SETS = ("first", "random")
_TINY = 1e-8

# ordering -> d_t(c) from (V_t(c), V_{t-1}(c)), both [N] (see `SPaCE`).
ORDERINGS: Registry[Callable[[jax.Array, jax.Array], jax.Array]] = Registry("SPaCE ordering")
ORDERINGS.register("improvement", lambda values, prev: values - prev)
ORDERINGS.register("relative_improvement",
                   lambda values, prev: (values - prev) / jnp.maximum(jnp.abs(prev), _TINY))
ORDERINGS.register("absolute", lambda values, prev: values)


class SPaCEState(NamedTuple):
    order: jax.Array  # [N] int32 instance ranking; the current set is order[:set_size]
    set_size: jax.Array  # int32 scalar in [1, N]
    last_values: jax.Array  # [N] float32 V(s0 | c_i) at the last check (0 before the first)
    last_mean: jax.Array  # float32: mean value over the set at the last check
    num_updates: jax.Array  # int32: number of checks so far


@dataclasses.dataclass(frozen=True, eq=False)
class SPaCE:
    """Self-Paced Context Evaluation: a growing instance set ranked by the critic's values.

    Eimer et al., "Self-Paced Context Evaluation for Contextual Reinforcement Learning",
    ICML 2021 (arXiv 2106.05110). Let V_t(c) = V(s0 | c) be the critic after training iteration t,
    evaluated for every instance c in one `value_fn` call over all N instances, and C_t the
    current instance set with |C_t| = K_t. After each iteration:

        m_t      = mean_{c in C_t} V_t(c)                     (mean over the set just trained on)
        grow     = t > 1  and  |m_t - m_{t-1}| / max(|m_{t-1}|, 1e-8) <= eta      (stagnation)
        K_{t+1}  = min(K_t + kappa, N)  if grow  else  K_t
        d_t(c)   = V_t(c) - V_{t-1}(c)                       ordering="improvement"
                 = (V_t(c) - V_{t-1}(c)) / max(|V_{t-1}(c)|, 1e-8)     "relative_improvement"
                 = V_t(c)                                    "absolute"
        C_{t+1}  = the K_{t+1} instances with the largest d_t(c)       (rerank=True, default)

    At the first check there is no previous evaluation, so the set never grows there and every
    ordering ranks by V_1(c) itself (the authors' code starts from V_0 = 0, which gives the same
    ranking for the two improvement orderings). `sample` draws uniformly from C_t.

    Details taken from the authors' code (github.com/automl/SPaCE, src/baselines_spl.py):

    * Re-ranking: after every training iteration (not only when the set grows) the *whole*
      instance list is re-sorted by d_t and the set becomes its top K_{t+1} entries, so instances
      can also leave the set. This is `rerank=True`. `rerank=False` instead keeps every current
      member and, on growth, adds the kappa non-members with the largest d_t.
    * Initial set: the ICML code starts from the first instance of the instance file; Mighty (the
      authors' later library) starts from k randomly drawn instances. Here the initial set has
      `kappa` instances: `initial="first"` (default) takes instances[0:kappa] in the given order,
      `initial="random"` a uniformly random subset of size kappa drawn with the `init` key.
    * Stagnation test: relative change of the set mean between consecutive checks, threshold eta
      (the ICML code divides by the current rather than the previous mean; we follow the paper's
      description and divide by the previous one, guarded against 0).
    * Ties in d_t are broken by the lower instance index (stable sort); NaN values rank last.

    Deviation: the ICML code sorts `absolute` ascending (lowest value first) while the two
    improvement orderings are sorted descending. We rank all three descending, so `absolute`
    prefers the instances the critic already rates highest, i.e. the easiest ones, as self-paced
    learning prescribes.

    Metrics: {"set_size", "mean_value"} (mean_value = m_t of the last check, 0 before it).
    """

    instances: jax.Array
    eta: float = 0.1
    kappa: int = 1
    ordering: str = "improvement"
    rerank: bool = True
    initial: str = "first"

    def __post_init__(self) -> None:
        object.__setattr__(self, "instances", as_instances(self.instances))
        if self.ordering not in ORDERINGS:
            raise ValueError(f"ordering must be one of {ORDERINGS.names()}, got {self.ordering!r}")
        if self.initial not in INITIAL_SETS:
            raise ValueError(f"initial must be one of {INITIAL_SETS}, got {self.initial!r}")
        if int(self.kappa) < 1:
            raise ValueError(f"kappa must be >= 1, got {self.kappa}")
        if not float(self.eta) >= 0.0:
            raise ValueError(f"eta must be >= 0, got {self.eta}")
        object.__setattr__(self, "kappa", int(self.kappa))
        object.__setattr__(self, "eta", float(self.eta))
        object.__setattr__(self, "rerank", bool(self.rerank))

    @property
    def num_instances(self) -> int:
        return self.instances.shape[0]

    def init(self, key: jax.Array) -> SPaCEState:
        n = self.num_instances
        if self.initial == "random":
            order = jax.random.permutation(key, n).astype(jnp.int32)
        else:
            order = jnp.arange(n, dtype=jnp.int32)
        return SPaCEState(
            order=order,
            set_size=jnp.asarray(min(self.kappa, n), jnp.int32),
            last_values=jnp.zeros((n,), jnp.float32),
            last_mean=jnp.zeros((), jnp.float32),
            num_updates=jnp.zeros((), jnp.int32),
        )

    def in_set(self, state: SPaCEState) -> jax.Array:
        """Boolean membership mask `[N]` of the current instance set."""
        n = self.num_instances
        member_by_rank = jnp.arange(n) < state.set_size
        return jnp.zeros((n,), bool).at[state.order].set(member_by_rank)

    def sample(self, state: SPaCEState, key: jax.Array, n: int) -> jax.Array:
        slot = jax.random.randint(key, (n,), 0, state.set_size)
        return self.instances[state.order[slot]]

    def _scores(self, values: jax.Array, state: SPaCEState) -> jax.Array:
        score = ORDERINGS.get(self.ordering)(values, state.last_values)
        score = jnp.where(state.num_updates > 0, score, values)
        return jnp.where(jnp.isnan(score), -jnp.inf, score)

    def update(self, state: SPaCEState, key: jax.Array, value_fn: ValueFn) -> SPaCEState:
        del key
        n = self.num_instances
        values = jnp.asarray(value_fn(self.instances), jnp.float32)
        if values.size != n:
            raise ValueError(f"value_fn must return {n} values, got shape {values.shape}")
        values = values.reshape(n)

        mask = self.in_set(state)
        mean_now = jnp.sum(jnp.where(mask, values, 0.0)) / state.set_size
        rel_change = jnp.abs(mean_now - state.last_mean) / jnp.maximum(
            jnp.abs(state.last_mean), _TINY
        )
        grow = (state.num_updates > 0) & (rel_change <= self.eta)
        new_size = jnp.where(grow, jnp.minimum(state.set_size + self.kappa, n), state.set_size)

        neg_score = -self._scores(values, state)
        if self.rerank:
            order = jnp.argsort(neg_score, stable=True)
        else:
            # current members first (any order among them), then non-members by score
            order = jnp.lexsort((neg_score, (~mask).astype(jnp.int32)))
        return SPaCEState(
            order=order.astype(jnp.int32),
            set_size=new_size.astype(jnp.int32),
            last_values=values,
            last_mean=mean_now,
            num_updates=state.num_updates + 1,
        )

    def metrics(self, state: SPaCEState) -> dict[str, jax.Array]:
        return {"set_size": state.set_size, "mean_value": state.last_mean}


CURRICULA.register("space", SPaCE)

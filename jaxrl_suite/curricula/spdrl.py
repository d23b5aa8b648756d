"""SPDRL: Self-Paced Deep Reinforcement Learning (Klink, D'Eramo, Peters, Pajarinen, 2020).

Paper: "Self-Paced Deep Reinforcement Learning" (SPDL), NeurIPS 2020, arXiv 2004.11812, by Pascal
Klink, Carlo D'Eramo, Jan Peters and Joni Pajarinen. Written from the paper and from reading the
authors' code (github.com/psclklnk/spdl:
`deep_sprl/teachers/spl/self_paced_teacher.py`, `alpha_functions.py`,
`deep_sprl/util/conjugate_gradient.py`, `deep_sprl/experiments/point_mass_experiment.py`); no code
is copied.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_suite.curricula.base import CURRICULA, ValueFn, as_instances


def solve_triangular(chol: jax.Array, b: jax.Array, lower: bool = True) -> jax.Array:
    """L^{-1} b by forward substitution for a small, static F (plain jnp ops, no LAPACK).

    XLA:CPU runs batched LAPACK kernels (here: under `vmap` over seeds) on its own small thread
    pool, and two of them running concurrently can deadlock it on a 2-core machine; F is tiny
    (the number of context features), so an unrolled substitution costs nothing.
    """
    assert lower, "only lower-triangular factors are used"
    vec = b.ndim == 1
    b = b[:, None] if vec else b
    rows = []
    for i in range(chol.shape[0]):
        acc = b[i]
        for j, row in enumerate(rows):
            acc = acc - chol[i, j] * row
        rows.append(acc / chol[i, i])
    x = jnp.stack(rows)
    return x[:, 0] if vec else x


def gaussian_log_pdf(x: jax.Array, mean: jax.Array, chol: jax.Array) -> jax.Array:
    """log N(x | mean, L L^T) for x `[..., F]`, with `chol` = L lower-triangular, positive diagonal.

    log p(x) = -1/2 ||L^{-1}(x - mean)||^2 - sum_i log L_ii - F/2 log(2 pi)
    """
    f = mean.shape[-1]
    diff = (x - mean).reshape(-1, f)
    white = solve_triangular(chol, diff.T, lower=True)  # [F, M]
    quad = jnp.sum(white**2, axis=0)
    logp = -0.5 * quad - jnp.sum(jnp.log(jnp.diag(chol))) - 0.5 * f * math.log(2.0 * math.pi)
    return logp.reshape(x.shape[:-1])


def gaussian_kl(
    mean0: jax.Array, chol0: jax.Array, mean1: jax.Array, chol1: jax.Array
) -> jax.Array:
    """KL(N(mean0, L0 L0^T) || N(mean1, L1 L1^T)) in closed form, from Cholesky factors.

    KL = 1/2 [ ||L1^{-1} L0||_F^2 + ||L1^{-1}(mean1 - mean0)||^2 - F
               + 2 sum_i log L1_ii - 2 sum_i log L0_ii ]
    """
    f = mean0.shape[-1]
    trace_term = jnp.sum(solve_triangular(chol1, chol0, lower=True) ** 2)
    maha = jnp.sum(solve_triangular(chol1, mean1 - mean0, lower=True) ** 2)
    logdet = 2.0 * (jnp.sum(jnp.log(jnp.diag(chol1))) - jnp.sum(jnp.log(jnp.diag(chol0))))
    return 0.5 * (trace_term + maha - f + logdet)


class SPDRLState(NamedTuple):
    mean: jax.Array  # [F] mean of p_nu in normalised coordinates z = (c - center) / scale
    chol: jax.Array  # [F, F] lower Cholesky factor of p_nu's covariance (normalised coordinates)
    alpha: jax.Array  # float32: alpha used by the last update
    mean_value: jax.Array  # float32: mean critic value of the last update's samples
    kl_step: jax.Array  # float32: KL(p_new || p_old) of the last update
    num_updates: jax.Array  # int32


def _to_params(mean: jax.Array, chol: jax.Array) -> dict[str, jax.Array]:
    return {"mean": mean, "log_diag": jnp.log(jnp.diag(chol)), "lower": jnp.tril(chol, -1)}


def _to_dist(params: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    chol = jnp.tril(params["lower"], -1) + jnp.diag(jnp.exp(params["log_diag"]))
    return params["mean"], chol


def _features(x: Any, f: int, name: str) -> jax.Array:
    """A scalar or length-F value as a float32 [F] array."""
    if np.ndim(x) > 1 or np.size(x) not in (1, f):
        raise ValueError(f"{name} must be a scalar or have shape [{f}], got {np.shape(x)}")
    return jnp.broadcast_to(jnp.asarray(x, jnp.float32).reshape(-1), (f,))


@dataclasses.dataclass(frozen=True, eq=False)
class SPDRL:
    """Self-paced deep RL: a Gaussian context distribution p_nu pulled toward a target mu.

    Klink, D'Eramo, Peters, Pajarinen, "Self-Paced Deep Reinforcement Learning", NeurIPS 2020
    (arXiv 2004.11812; the paper calls the method SPDL). p_nu = N(m, L L^T) with full covariance
    (Cholesky factor L, log-diagonal parameterisation as in the authors' code). Each update solves

        max_nu   1/M sum_k  p_nu(c_k) / p_old(c_k) * V(c_k)  -  alpha_i KL(p_nu || mu)
        s.t.     KL(p_nu || p_old) <= epsilon,                c_k ~ p_old, k = 1..M

    with V(c_k) = value_fn(clip(c_k, lower, upper)), the critic's estimate of V(s0 | c) for the
    contexts the environment would actually see. The penalty weight follows the authors'
    `PercentageAlphaFunction`:

        alpha_i = 0                                                  for the first alpha_offset
                                                                     updates (i < alpha_offset)
        alpha_i = clip(zeta * mean_k V(c_k) / max(KL(p_old || mu), 1e-10), 0, max_alpha)   after

    (computed with p_old, before the step). `mean_k V` is the critic's mean over the samples; the
    authors' experiments optionally use the mean episode return instead, which `value_fn` alone
    cannot provide. Their code only clamps alpha from above; we also clamp it at 0 so that a
    negative value scale cannot push p_nu away from the target.

    Solver (fixed cost, jit/vmap friendly): `num_opt_steps` Adam steps (optax, `learning_rate`)
    on the objective above, inside `lax.scan`. After every step the iterate is pulled back into
    the trust region along the segment to the old parameters, theta <- theta_old + t (theta -
    theta_old), with the largest feasible t found by `num_bisection_steps` bisection steps (t = 0
    is always feasible, so KL(p_new || p_old) <= epsilon holds exactly up to float rounding). The
    result is accepted only if it does not decrease the objective, otherwise p_old is kept (as in
    the authors' line search). The authors instead take one natural-gradient step (conjugate
    gradient on the Fisher matrix) with a backtracking line search that accepts up to 1.5
    epsilon, and their code constrains KL(p_old || p_new); we constrain KL(p_new || p_old) <=
    epsilon, strictly.

    Variance reduction (`baseline=True`, default; a deviation from the authors' code): the
    importance-weighted term uses V(c_k) - mean_k V(c_k). Since E_old[p_nu / p_old] = 1 this
    changes the estimated objective only by a zero-mean term, but it removes the noise that the
    constant part of V otherwise injects (with V = const the estimate would still move p_nu at
    random). `baseline=False` gives the plain estimator.

    Coordinates: everything is optimised in z = (c - target_mean) / target_std, so mu = N(0, I)
    and all features have unit scale; KL divergences are invariant to this map, so all reported
    KLs are those of the physical-unit distributions.

    Defaults:
    * Target mu: if `target_mean` / `target_std` are not given they are fitted to `instances`
      (per-feature mean and standard deviation, diagonal covariance). Each std is floored at
      `min_target_std * max(|mean|, 1)` so a feature that is constant over the instances stays a
      proper (narrow) Gaussian.
    * Initial p_nu: the paper starts from a hand-chosen "easy" distribution per environment. With
      no domain knowledge we start narrow at the centre of the target: mean = target mean,
      std = `init_std_scale` (0.1) * target std; pass `init_mean` / `init_std` (physical units,
      scalar or [F]) to start from known easy contexts (e.g. short poles).
    * zeta = 1.6 is the authors' point-mass value (there with an alpha offset of 70 TRPO
      iterations and max KL 0.05); alpha_offset defaults to 10 updates here because our PPO runs
      are short, and epsilon to 0.25.

    `sample` draws from p_nu and clips feature-wise to [lower, upper] when given.
    Metrics: {"kl_to_target", "alpha", "mean_value", "kl_step", "mean_0".."mean_{F-1}",
    "std_0".."std_{F-1}"} (means and standard deviations in physical units).
    """

    instances: Any = None
    init_mean: Any = None
    init_std: Any = None
    target_mean: Any = None
    target_std: Any = None
    epsilon: float = 0.25
    alpha_offset: int = 10
    zeta: float = 1.6
    num_samples: int = 256
    lower: Any = None
    upper: Any = None
    num_opt_steps: int = 100
    learning_rate: float = 0.02
    num_bisection_steps: int = 20
    init_std_scale: float = 0.1
    min_target_std: float = 1e-3
    max_alpha: float = 1e5
    baseline: bool = True

    def __post_init__(self) -> None:
        def set_(name: str, value: Any) -> None:  # frozen dataclass
            object.__setattr__(self, name, value)

        if self.instances is not None:
            inst = as_instances(self.instances)
            set_("instances", inst)
            f = inst.shape[1]
        elif self.target_mean is not None and self.target_std is not None:
            f = int(np.size(self.target_mean))
        else:
            raise ValueError("SPDRL needs `instances` or both `target_mean` and `target_std`")
        if f < 1:
            raise ValueError("contexts must have at least one feature")

        tmean = (
            _features(self.target_mean, f, "target_mean")
            if self.target_mean is not None
            else jnp.mean(self.instances, axis=0)
        )
        tstd = (
            _features(self.target_std, f, "target_std")
            if self.target_std is not None
            else jnp.std(self.instances, axis=0)
        )
        tstd = jnp.maximum(tstd, self.min_target_std * jnp.maximum(jnp.abs(tmean), 1.0))
        set_("target_mean", tmean)
        set_("target_std", tstd)
        imean = tmean if self.init_mean is None else _features(self.init_mean, f, "init_mean")
        istd = (
            self.init_std_scale * tstd
            if self.init_std is None
            else _features(self.init_std, f, "init_std")
        )
        set_("init_mean", imean)
        set_("init_std", istd)
        for name in ("lower", "upper"):
            value = getattr(self, name)
            if value is not None:
                set_(name, _features(value, f, name))

        if not float(self.epsilon) > 0:
            raise ValueError(f"epsilon must be > 0, got {self.epsilon}")
        for name in ("num_samples", "num_opt_steps"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        set_("epsilon", float(self.epsilon))
        set_("alpha_offset", int(self.alpha_offset))
        set_("zeta", float(self.zeta))
        set_("num_samples", int(self.num_samples))
        set_("num_opt_steps", int(self.num_opt_steps))
        set_("num_bisection_steps", int(self.num_bisection_steps))

    # ------------------------------------------------------------------ coordinates

    @property
    def num_features(self) -> int:
        return self.target_mean.shape[0]

    def _to_physical(self, z: jax.Array) -> jax.Array:
        return self.target_mean + self.target_std * z

    def _to_normalised(self, c: jax.Array) -> jax.Array:
        return (c - self.target_mean) / self.target_std

    def _clip(self, c: jax.Array) -> jax.Array:
        if self.lower is not None:
            c = jnp.maximum(c, self.lower)
        if self.upper is not None:
            c = jnp.minimum(c, self.upper)
        return c

    def _target(self) -> tuple[jax.Array, jax.Array]:
        f = self.num_features
        return jnp.zeros((f,), jnp.float32), jnp.eye(f, dtype=jnp.float32)

    def kl_to_target(self, state: SPDRLState) -> jax.Array:
        """KL(p_nu || mu) of the current context distribution."""
        return gaussian_kl(state.mean, state.chol, *self._target())

    # ------------------------------------------------------------------ protocol

    def init(self, key: jax.Array) -> SPDRLState:
        del key
        return SPDRLState(
            mean=self._to_normalised(self.init_mean),
            chol=jnp.diag(self.init_std / self.target_std),
            alpha=jnp.zeros((), jnp.float32),
            mean_value=jnp.zeros((), jnp.float32),
            kl_step=jnp.zeros((), jnp.float32),
            num_updates=jnp.zeros((), jnp.int32),
        )

    def _sample_z(self, state: SPDRLState, key: jax.Array, n: int) -> jax.Array:
        eps = jax.random.normal(key, (n, self.num_features), jnp.float32)
        return state.mean + eps @ state.chol.T

    def sample(self, state: SPDRLState, key: jax.Array, n: int) -> jax.Array:
        return self._clip(self._to_physical(self._sample_z(state, key, n))).astype(jnp.float32)

    def update(self, state: SPDRLState, key: jax.Array, value_fn: ValueFn) -> SPDRLState:
        m = self.num_samples
        z = self._sample_z(state, key, m)
        values = jnp.asarray(value_fn(self._clip(self._to_physical(z))), jnp.float32)
        if values.size != m:
            raise ValueError(f"value_fn must return {m} values, got shape {values.shape}")
        values = values.reshape(m)
        old_mean, old_chol = state.mean, state.chol
        logp_old = gaussian_log_pdf(z, old_mean, old_chol)
        target = self._target()

        mean_value = jnp.mean(values)
        kl_old_target = gaussian_kl(old_mean, old_chol, *target)
        alpha = jnp.clip(
            self.zeta * mean_value / jnp.maximum(kl_old_target, 1e-10), 0.0, self.max_alpha
        )
        alpha = jnp.where(state.num_updates < self.alpha_offset, 0.0, alpha)

        centred = values - mean_value if self.baseline else values

        def objective(params):
            mean, chol = _to_dist(params)
            ratio = jnp.exp(gaussian_log_pdf(z, mean, chol) - logp_old)
            return jnp.mean(ratio * centred) - alpha * gaussian_kl(mean, chol, *target)

        def kl_to_old(params):
            return gaussian_kl(*_to_dist(params), old_mean, old_chol)

        params_old = _to_params(old_mean, old_chol)

        def restore(params):
            """Largest step toward `params` from params_old with KL(p || p_old) <= epsilon."""
            delta = jax.tree.map(jnp.subtract, params, params_old)
            at = lambda t: jax.tree.map(lambda p, d: p + t * d, params_old, delta)

            def bisect(_, bounds):
                lo, hi = bounds
                mid = 0.5 * (lo + hi)
                ok = kl_to_old(at(mid)) <= self.epsilon
                return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

            lo, _ = jax.lax.fori_loop(
                0, self.num_bisection_steps, bisect, (jnp.float32(0.0), jnp.float32(1.0))
            )
            t = jnp.where(kl_to_old(params) <= self.epsilon, 1.0, lo)
            return at(t)

        opt = optax.adam(self.learning_rate)

        def step(carry, _):
            params, opt_state = carry
            grads = jax.grad(lambda p: -objective(p))(params)
            updates, opt_state = opt.update(grads, opt_state, params)
            params = restore(optax.apply_updates(params, updates))
            return (params, opt_state), None

        (params, _), _ = jax.lax.scan(
            step, (params_old, opt.init(params_old)), None, length=self.num_opt_steps
        )
        new_obj = objective(params)
        accept = jnp.isfinite(new_obj) & (new_obj >= objective(params_old))
        params = jax.tree.map(lambda a, b: jnp.where(accept, a, b), params, params_old)
        new_mean, new_chol = _to_dist(params)
        return SPDRLState(
            mean=new_mean,
            chol=new_chol,
            alpha=alpha.astype(jnp.float32),
            mean_value=mean_value,
            kl_step=gaussian_kl(new_mean, new_chol, old_mean, old_chol),
            num_updates=state.num_updates + 1,
        )

    def physical_mean_std(self, state: SPDRLState) -> tuple[jax.Array, jax.Array]:
        """Mean and per-feature standard deviation of p_nu in physical units (before clipping)."""
        std_z = jnp.sqrt(jnp.sum(state.chol**2, axis=1))
        return self._to_physical(state.mean), self.target_std * std_z

    def metrics(self, state: SPDRLState) -> dict[str, jax.Array]:
        out = {
            "kl_to_target": self.kl_to_target(state),
            "alpha": state.alpha,
            "mean_value": state.mean_value,
            "kl_step": state.kl_step,
        }
        mean, std = self.physical_mean_std(state)
        for i in range(self.num_features):
            out[f"mean_{i}"] = mean[i]
        for i in range(self.num_features):
            out[f"std_{i}"] = std[i]
        return out


CURRICULA.register("spdrl", SPDRL)

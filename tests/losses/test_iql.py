"""IQL losses against numpy and hand cases."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.losses.iql import awr_policy_loss, expectile_loss, iql_q_loss, iql_value_loss


def test_expectile_hand_case_and_numpy():
    assert float(expectile_loss(jnp.array([2.0, -2.0]), 0.7)) == pytest.approx(
        (0.7 * 4 + 0.3 * 4) / 2)
    u = np.random.default_rng(0).normal(size=50)
    want = np.mean(np.where(u < 0, 0.2, 0.8) * u**2)
    assert float(expectile_loss(jnp.asarray(u), 0.8)) == pytest.approx(want, rel=1e-5)
    with pytest.raises(ValueError, match="tau must be in"):
        expectile_loss(jnp.zeros(2), 1.0)


def _np_expectile(q, tau):
    """The tau-expectile by bisection: e with sum |tau - 1(q < e)| (q - e) = 0."""
    lo, hi = q.min(), q.max()
    for _ in range(100):
        e = (lo + hi) / 2
        if np.sum(np.where(q < e, 1 - tau, tau) * (q - e)) > 0:
            lo = e
        else:
            hi = e
    return e


def test_value_loss_is_minimised_at_the_expectile():
    """L_V over a constant V has zero gradient at the tau-expectile of Q (tau = 0.5: the mean)."""
    q = np.array([0.0, 1.0, 2.0, 10.0])
    grad = jax.jit(jax.grad(lambda v, t: iql_value_loss(jnp.asarray(q), jnp.full(4, v), t)),
                   static_argnums=1)
    assert _np_expectile(q, 0.5) == pytest.approx(q.mean())
    for tau in (0.5, 0.9):
        e = _np_expectile(q, tau)
        assert float(grad(e, tau)) == pytest.approx(0.0, abs=1e-5)
        assert float(grad(e - 0.1, tau)) < 0 < float(grad(e + 0.1, tau))
    assert _np_expectile(q, 0.9) > q.mean()


def test_q_loss_and_awr_match_numpy_and_stop_gradients():
    rng = np.random.default_rng(1)
    q, r, nv, v, logp = (rng.normal(size=6) for _ in range(5))
    done = np.array([0, 1, 0, 0, 1, 0], bool)
    want = np.mean((r + 0.9 * (1 - done) * nv - q) ** 2)
    assert float(iql_q_loss(q, r, jnp.asarray(done), nv, 0.9)) == pytest.approx(want, rel=1e-5)
    assert float(jax.grad(lambda x: iql_q_loss(q, r, jnp.asarray(done), x, 0.9))(
        jnp.asarray(nv)).sum()) == 0.0
    loss, m = awr_policy_loss(jnp.asarray(logp), jnp.asarray(q), jnp.asarray(v), beta=2.0,
                              max_weight=3.0)
    w = np.minimum(np.exp(2.0 * (q - v)), 3.0)
    assert float(loss) == pytest.approx(-np.mean(w * logp), rel=1e-5)
    assert float(m["awr_weight"]) == pytest.approx(w.mean(), rel=1e-5)
    g = jax.grad(lambda qq: awr_policy_loss(jnp.asarray(logp), qq, jnp.asarray(v))[0])(
        jnp.asarray(q))
    assert float(jnp.abs(g).sum()) == 0.0

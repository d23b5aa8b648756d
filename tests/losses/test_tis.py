"""Truncated importance sampling: `tis_weight` against numpy, and `pg_weights` in the loss."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.losses import grpo_loss
from jaxrl_suite.losses.policy import tis_weight


def test_tis_weight_matches_numpy():
    r = np.random.RandomState(0)
    train = -1.0 + r.randn(4, 6).astype(np.float32)
    sampler = train + 0.8 * r.randn(4, 6).astype(np.float32)
    mask = (r.rand(4, 6) < 0.7).astype(np.float32)
    sampler[mask == 0] = -np.inf  # padding may hold anything
    w, m = tis_weight(train, sampler, mask, cap=1.5)
    raw = np.exp(train - sampler)
    expect = np.where(mask > 0, np.minimum(raw, 1.5), 1.0)
    np.testing.assert_allclose(w, expect, rtol=1e-6)
    valid = mask > 0
    np.testing.assert_allclose(m["tis_weight"], expect[valid].mean(), rtol=1e-6)
    np.testing.assert_allclose(m["tis_capped_frac"], (raw[valid] > 1.5).mean(), rtol=1e-6)
    same, m1 = tis_weight(train, train, mask, cap=1.5)
    assert np.all(np.asarray(same) == 1.0) and float(m1["tis_capped_frac"]) == 0.0


def test_pg_weights_scale_the_token_gradients_outside_the_normaliser():
    # dapo: loss = sum_t u_t pg_t m_t / sum_t m_t, so u = 2 everywhere doubles the pg gradient,
    # and u = 1 is the unweighted loss exactly.
    r = np.random.RandomState(1)
    logp = jnp.asarray(-1.0 + 0.1 * r.randn(3, 5), jnp.float32)
    old = logp + 0.05
    adv = jnp.asarray(r.randn(3), jnp.float32)
    mask = jnp.ones((3, 5))

    def grad(u):
        return jax.grad(lambda lp: grpo_loss(lp, old, None, adv, mask, loss_type="dapo",
                                             pg_weights=u)[0])(logp)

    np.testing.assert_array_equal(grad(jnp.ones((3, 5))), grad(None))
    np.testing.assert_allclose(grad(2.0 * jnp.ones((3, 5))), 2.0 * grad(None), rtol=1e-6)

"""Behaviour-cloning loss against numpy and against AWR with unit weights."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.losses.bc import bc_loss
from jaxrl_suite.losses.iql import awr_policy_loss


def test_bc_is_negative_mean_log_likelihood_over_the_mask():
    logp = np.array([-0.5, -2.0, -1.0, -4.0], np.float32)
    loss, m = bc_loss(jnp.asarray(logp))
    assert float(loss) == pytest.approx(-logp.mean())
    assert float(m["bc_logp"]) == pytest.approx(logp.mean())
    mask = np.array([1, 0, 1, 0], np.float32)
    assert float(bc_loss(jnp.asarray(logp), jnp.asarray(mask))[0]) == pytest.approx(0.75)


def test_bc_equals_awr_with_beta_zero():
    rng = np.random.default_rng(0)
    logp, q, v = (jnp.asarray(rng.normal(size=16)) for _ in range(3))
    awr, aux = awr_policy_loss(logp, q, v, beta=0.0)
    assert float(aux["awr_weight"]) == pytest.approx(1.0)
    assert float(bc_loss(logp)[0]) == pytest.approx(float(awr), rel=1e-6)

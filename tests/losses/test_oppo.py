"""OPPO's triplet / norm / reconstruction losses and the Bradley-Terry loss against numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.losses.oppo import (
    action_mse,
    bradley_terry_loss,
    oppo_loss,
    oppo_preference_loss,
    phi_norm_loss,
    triplet_margin_loss,
)


def np_triplet(a, p, n, margin):
    """torch.nn.TripletMarginLoss(margin, p=2) per row: d(x, y) = ||x - y + 1e-6||."""
    d = lambda x, y: np.linalg.norm(x - y + 1e-6, axis=-1)
    return np.maximum(d(a, p) - d(a, n) + margin, 0.0)


def test_triplet_matches_numpy_and_weights_drop_rows():
    rng = np.random.default_rng(0)
    a, p, n = (rng.normal(size=(6, 4)).astype(np.float32) for _ in range(3))
    w = np.array([1, 1, 0, 1, 0, 1], np.float32)
    got = triplet_margin_loss(a, p, n, w, margin=0.7)
    want = np_triplet(a, p, n, 0.7)[w > 0].mean()
    assert float(got) == pytest.approx(want, rel=1e-5)
    assert float(triplet_margin_loss(a, p, n, np.zeros(6), margin=0.7)) == 0.0


def test_triplet_hand_case():
    z = jnp.zeros(2)
    pos, neg = jnp.array([[3.0, 4.0]]), jnp.array([[0.0, 1.0]])  # d = 5 and 1
    assert float(triplet_margin_loss(z, pos, neg, jnp.ones(1), margin=1.0)) == pytest.approx(
        5.0, abs=1e-4)
    assert float(triplet_margin_loss(z, neg, pos, jnp.ones(1), margin=1.0)) == 0.0


def test_preference_loss_orients_by_label_and_skips_ties():
    rng = np.random.default_rng(1)
    z = rng.normal(size=3).astype(np.float32)
    pa, pb = (rng.normal(size=(5, 3)).astype(np.float32) for _ in range(2))
    label = np.array([1.0, 0.0, 0.5, 1.0, 0.0], np.float32)
    loss, m = oppo_preference_loss(z, pa, pb, label)
    pos = np.where(label[:, None] > 0.5, pa, pb)
    neg = np.where(label[:, None] > 0.5, pb, pa)
    used = label != 0.5
    assert float(loss) == pytest.approx(np_triplet(z, pos, neg, 1.0)[used].mean(), rel=1e-5)
    assert float(m["pref_used_frac"]) == pytest.approx(0.8)
    d = lambda x: np.linalg.norm(z - x + 1e-6, axis=-1)
    assert float(m["pref_acc"]) == pytest.approx((d(pos) < d(neg))[used].mean())


def test_gradient_step_on_z_star_moves_it_towards_the_preferred_segments():
    pa = jnp.array([[2.0, 0.0], [2.0, 0.2]])
    pb = jnp.array([[-2.0, 0.0], [-2.0, -0.2]])
    label = jnp.array([1.0, 1.0])
    loss = lambda z: oppo_preference_loss(z, pa, pb, label)[0]
    z = jnp.zeros(2)
    for _ in range(20):
        z = z - 0.1 * jax.grad(loss)(z)
    assert float(z[0]) > 0.5 and float(loss(z)) < float(loss(jnp.zeros(2)))


def test_norm_recon_and_total():
    phi = jnp.array([[3.0, 4.0], [0.0, 1.0], [0.6, 0.8]])
    assert float(phi_norm_loss(phi)) == pytest.approx((16 + 0 + 0) / 3, rel=1e-6)
    pred = jnp.array([[[1.0, 2.0], [0.0, 0.0], [5.0, 5.0]]])
    target = jnp.array([[[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]])
    mask = jnp.array([[1.0, 1.0, 0.0]])
    assert float(action_mse(pred, target, mask)) == pytest.approx((2.0 + 1.0) / 2)
    assert float(oppo_loss(1.0, 2.0, 3.0, lambda_pref=0.1, lambda_norm=0.5)) == pytest.approx(2.7)


def test_bradley_terry_matches_numpy():
    rng = np.random.default_rng(2)
    ra, rb = rng.normal(size=8), rng.normal(size=8)
    y = np.array([1, 0, 0.5, 1, 1, 0, 0.3, 1.0])
    loss, m = bradley_terry_loss(jnp.asarray(ra), jnp.asarray(rb), jnp.asarray(y))
    sig = lambda x: 1 / (1 + np.exp(-x))
    want = -np.mean(y * np.log(sig(ra - rb)) + (1 - y) * np.log(sig(rb - ra)))
    assert float(loss) == pytest.approx(want, rel=1e-5)
    strict = y != 0.5
    assert float(m["bt_acc"]) == pytest.approx(((ra - rb > 0) == (y > 0.5))[strict].mean())

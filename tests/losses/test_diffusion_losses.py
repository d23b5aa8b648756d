"""Masked-diffusion objective: the loss against numpy, the forward process, the EOS tail."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.losses.diffusion import fill_after_eos, mask_completion, masked_diffusion_loss

B, N, V = 4, 7, 11
MASK_ID = 383
# One compiled program per function and shape, shared by the tests (eps is traced).
_loss = jax.jit(masked_diffusion_loss)
_mask = jax.jit(mask_completion, static_argnums=2)


def _np_loss(logits, targets, masked, t, valid):
    """The loss and metrics by a plain double loop with a hand-written log-softmax (float64)."""
    logits = logits.astype(np.float64)
    rows, total_nll, n_scored = [], 0.0, 0.0
    for b in range(logits.shape[0]):
        acc = 0.0
        for i in range(logits.shape[1]):
            z = logits[b, i]
            lse = z.max() + np.log(np.sum(np.exp(z - z.max())))
            nll = lse - z[targets[b, i]]
            w = valid[b, i] * float(masked[b, i])
            acc += w * nll
            total_nll += w * nll
            n_scored += w
        rows.append(acc / t[b] / max(valid[b].sum(), 1.0))
    metrics = {"masked_nll": total_nll / max(n_scored, 1.0),
               "masked_frac": n_scored / max(valid.sum(), 1.0)}
    return np.mean(rows), metrics


@pytest.fixture(scope="module")
def batch():
    r = np.random.RandomState(0)
    logits = (2.0 * r.randn(B, N, V)).astype(np.float32)
    targets = r.randint(0, V, (B, N)).astype(np.int32)
    masked = r.rand(B, N) < 0.5
    masked[0] = True  # a fully masked row
    t = r.uniform(0.05, 1.0, B).astype(np.float32)
    valid = (r.rand(B, N) < 0.8).astype(np.float32)
    valid[1, 5:] = 0.0  # a padded tail
    return logits, targets, masked, t, valid


def test_masked_diffusion_loss_matches_numpy_double_loop(batch):
    logits, targets, masked, t, valid = batch
    loss, metrics = _loss(logits, targets, masked, t, valid)
    ref, ref_m = _np_loss(logits, targets, masked, t, valid)
    np.testing.assert_allclose(loss, ref, rtol=1e-5)
    np.testing.assert_allclose(metrics["masked_nll"], ref_m["masked_nll"], rtol=1e-5)
    np.testing.assert_allclose(metrics["masked_frac"], ref_m["masked_frac"], rtol=1e-6)


def test_masked_diffusion_loss_default_valid_is_all_ones(batch):
    logits, targets, masked, t, _ = batch
    loss, metrics = _loss(logits, targets, masked, t)
    ref, ref_m = _np_loss(logits, targets, masked, t, np.ones((B, N)))
    np.testing.assert_allclose(loss, ref, rtol=1e-5)
    np.testing.assert_allclose(metrics["masked_frac"], masked.mean(), rtol=1e-6)


def test_masked_diffusion_loss_weights_rows_by_inverse_t():
    # Every token masked, uniform logits: nll = log V per token, row b's loss = log V / t_b.
    t = np.array([0.25, 0.5, 1.0, 0.1], np.float32)
    loss, m = _loss(np.zeros((B, N, V), np.float32), np.zeros((B, N), np.int32),
                    np.ones((B, N), bool), t, np.ones((B, N), np.float32))
    np.testing.assert_allclose(loss, np.log(V) * (4 + 2 + 1 + 10) / 4, rtol=1e-6)
    np.testing.assert_allclose(m["masked_nll"], np.log(V), rtol=1e-6)
    assert float(m["masked_frac"]) == 1.0


def test_rows_without_valid_tokens_give_no_nan(batch):
    logits, targets, masked, t, valid = batch
    valid = valid.copy()
    valid[2] = 0.0
    loss, metrics = _loss(logits, targets, masked, t, valid)
    ref, _ = _np_loss(logits, targets, masked, t, valid)
    assert np.isfinite(float(loss)) and all(np.isfinite(float(v)) for v in metrics.values())
    np.testing.assert_allclose(loss, ref, rtol=1e-5)  # that row contributes 0 to the mean
    loss0, m0 = _loss(logits, targets, masked, t, np.zeros((B, N), np.float32))
    assert float(loss0) == 0.0 and float(m0["masked_nll"]) == 0.0
    assert float(m0["masked_frac"]) == 0.0
    g = jax.jit(jax.grad(lambda z: _loss(z, targets, masked, t, valid)[0]))(logits)
    assert np.all(np.isfinite(g)) and np.all(np.asarray(g)[2] == 0.0)


def test_mask_completion_masks_with_mask_id_and_keeps_the_rest():
    targets = jnp.asarray(np.random.RandomState(1).randint(3, 259, (64, 32)), jnp.int32)
    noisy, masked, t = _mask(jax.random.key(0), targets, MASK_ID, eps=1e-3)
    noisy, masked, t = np.asarray(noisy), np.asarray(masked), np.asarray(t)
    assert noisy.shape == (64, 32) and noisy.dtype == np.int32 and masked.dtype == bool
    assert t.shape == (64,)
    np.testing.assert_array_equal(noisy[masked], MASK_ID)
    np.testing.assert_array_equal(noisy[~masked], np.asarray(targets)[~masked])
    assert 0 < masked.sum() < masked.size


@pytest.fixture(scope="module")
def big_targets():
    return jnp.full((4000, 256), 7, jnp.int32)


def test_mask_completion_t_lies_in_eps_one(big_targets):
    for eps in (0.5, 1e-3):
        _, _, t = _mask(jax.random.key(2), big_targets, MASK_ID, eps=eps)
        t = np.asarray(t)
        assert t.min() >= eps and t.max() <= 1.0
        assert t.min() < eps + 0.01 and t.max() > 0.99  # it spans the range


def test_mask_completion_masked_fraction_tracks_t(big_targets):
    # Each position is masked independently with probability t_b: with n = 256 the per-row
    # fraction has std <= 0.5 / 16 around t_b.
    _, masked, t = _mask(jax.random.key(3), big_targets, MASK_ID, eps=1e-3)
    frac, t = np.asarray(masked).mean(axis=1), np.asarray(t)
    assert np.mean(np.abs(frac - t)) < 0.03
    assert np.corrcoef(frac, t)[0, 1] > 0.98
    assert abs(frac.mean() - 0.5) < 0.02  # E[t] = 1/2 (up to eps)


def test_mask_completion_same_key_same_output():
    targets = jnp.asarray(np.random.RandomState(4).randint(3, 259, (64, 32)), jnp.int32)
    a = _mask(jax.random.key(5), targets, MASK_ID, eps=1e-3)
    b = _mask(jax.random.key(5), targets, MASK_ID, eps=1e-3)
    c = _mask(jax.random.key(6), targets, MASK_ID, eps=1e-3)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[1], c[1])


def test_fill_after_eos_hand_case():
    completion = jnp.array([[5, 6, 1, 9, 9], [7, 8, 9, 4, 3], [2, 0, 0, 0, 0]], jnp.int32)
    mask = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], jnp.float32)
    out = fill_after_eos(completion, mask, eos_id=1)
    assert out.dtype == jnp.int32
    np.testing.assert_array_equal(out, [[5, 6, 1, 1, 1], [7, 8, 9, 4, 3], [1, 1, 1, 1, 1]])


@pytest.mark.parametrize("arg", ["logits", "targets", "masked", "t", "valid"])
def test_masked_diffusion_loss_shape_errors_name_the_argument(batch, arg):
    args = dict(zip(("logits", "targets", "masked", "t", "valid"), batch, strict=True))
    args[arg] = args[arg][..., :-1] if arg != "logits" else args[arg][0]
    with pytest.raises(ValueError, match=rf"^{arg} must have ") as e:
        masked_diffusion_loss(**args)
    assert "\n" not in str(e.value)


def test_mask_completion_rank_error():
    with pytest.raises(ValueError, match=r"^targets must have rank 2") as e:
        mask_completion(jax.random.key(0), jnp.zeros((4,), jnp.int32), MASK_ID)
    assert "\n" not in str(e.value)

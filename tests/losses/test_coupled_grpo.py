"""Coupled-GRPO log-prob estimators: formulas, the registry's masks, and the variance claim."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.losses.coupled_grpo import (
    ESTIMATORS,
    T_MAX,
    T_MIN,
    coupled_logprobs,
    single_mask_logprobs,
)

B, N = 3, 16
MASK_ID = 383


@pytest.fixture(scope="module")
def completion():
    return jnp.asarray(np.random.RandomState(0).randint(3, 259, (B, N)), jnp.int32)


@pytest.fixture(scope="module")
def logps():
    r = np.random.RandomState(1)
    return tuple(-r.exponential(1.0, (B, N)).astype(np.float32) for _ in range(3))


def test_coupled_logprobs_matches_formula(logps):
    full, first, second = logps
    in_first = np.random.RandomState(2).rand(B, N) < 0.4
    t = np.float32(0.3)
    got = coupled_logprobs(full, first, second, in_first, t)
    expect = 0.5 * (full.astype(np.float64)
                    + np.where(in_first, first / 0.3, second / 0.7))
    np.testing.assert_allclose(got, expect, rtol=1e-6)
    # hand case: full -1, first -0.6 (in_first) or second -1.4, t = 0.3
    one = coupled_logprobs(jnp.full((1, 2), -1.0), jnp.full((1, 2), -0.6),
                           jnp.full((1, 2), -1.4), jnp.array([[True, False]]), 0.3)
    np.testing.assert_allclose(one, [[0.5 * (-1 - 2.0), 0.5 * (-1 - 2.0)]], rtol=1e-6)


def test_coupled_logprobs_shape_error_names_the_argument(logps):
    full, first, second = logps
    with pytest.raises(ValueError, match=r"^in_first must have shape") as e:
        coupled_logprobs(full, first, second, np.ones((B, N - 1), bool), 0.5)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"^logp_full must have rank 2"):
        coupled_logprobs(full[0], first, second, np.ones((B, N), bool), 0.5)


def test_registry_passes_and_stochasticity():
    assert {"coupled", "single", "full"} <= set(ESTIMATORS.names())
    assert ESTIMATORS.get("coupled").passes == 3 and ESTIMATORS.get("coupled").stochastic
    assert ESTIMATORS.get("single").passes == 1 and ESTIMATORS.get("single").stochastic
    assert ESTIMATORS.get("full").passes == 1 and not ESTIMATORS.get("full").stochastic


@functools.cache
def _noise(name):
    """One jitted noise function per estimator (mask_id static)."""
    return jax.jit(lambda key, c: ESTIMATORS.get(name).noise(key, c, MASK_ID))


def test_coupled_noise_passes(completion):
    noisy, (in_first, t) = _noise("coupled")(jax.random.key(0), completion)
    noisy, in_first, c = np.asarray(noisy), np.asarray(in_first), np.asarray(completion)
    assert noisy.shape == (3, B, N) and noisy.dtype == np.int32
    assert np.all(noisy[0] == MASK_ID)  # pass 0 fully masked
    m1, m2 = noisy[1] == MASK_ID, noisy[2] == MASK_ID
    np.testing.assert_array_equal(m1, in_first)
    np.testing.assert_array_equal(m1 ^ m2, True)  # each position masked in exactly one pass
    np.testing.assert_array_equal(noisy[1][~m1], c[~m1])
    np.testing.assert_array_equal(noisy[2][~m2], c[~m2])
    assert 0 < m1.sum() < m1.size
    assert T_MIN <= float(t) <= T_MAX


def test_coupled_noise_t_range_over_keys(completion):
    ts = np.array([float(_noise("coupled")(jax.random.key(s), completion)[1][1])
                   for s in range(200)])  # the compiled program of one shape, 200 keys
    assert ts.min() >= T_MIN and ts.max() <= T_MAX
    assert ts.min() < T_MIN + 0.03 and ts.max() > T_MAX - 0.03


def test_noise_same_key_same_masks_different_key_different(completion):
    for name in ("coupled", "single"):
        a, _ = _noise(name)(jax.random.key(7), completion)
        b, _ = _noise(name)(jax.random.key(7), completion)
        c, _ = _noise(name)(jax.random.key(8), completion)
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c), name
    f1, _ = _noise("full")(jax.random.key(7), completion)
    f2, _ = _noise("full")(jax.random.key(8), completion)
    assert f1.shape == (1, B, N) and np.all(np.asarray(f1) == MASK_ID)
    np.testing.assert_array_equal(f1, f2)


def test_registry_combine_matches_the_formulas(completion, logps):
    full, first, second = logps
    lp = jnp.stack([full, first, second])
    _, aux = _noise("coupled")(jax.random.key(3), completion)
    np.testing.assert_allclose(ESTIMATORS.get("coupled").combine(lp, aux),
                               coupled_logprobs(full, first, second, *aux), rtol=1e-6)
    np.testing.assert_array_equal(ESTIMATORS.get("full").combine(lp[:1], None), full)
    noisy, (masked, t) = _noise("single")(jax.random.key(3), completion)
    assert noisy.shape == (1, B, N)
    np.testing.assert_array_equal(np.asarray(noisy[0]) == MASK_ID, masked)
    assert T_MIN <= float(t) <= T_MAX
    got = np.asarray(ESTIMATORS.get("single").combine(lp[:1], (masked, t)))
    np.testing.assert_allclose(got, np.where(masked, full / float(t), 0.0), rtol=1e-6)


def test_single_mask_logprobs_zero_where_unmasked(logps):
    lp = logps[0]
    masked = np.random.RandomState(3).rand(B, N) < 0.5
    got = np.asarray(single_mask_logprobs(lp, masked, 0.25))
    np.testing.assert_array_equal(got[~masked], 0.0)
    np.testing.assert_allclose(got[masked], lp[masked] / 0.25, rtol=1e-6)
    with pytest.raises(ValueError, match=r"^masked must have shape"):
        single_mask_logprobs(lp, masked[:, :-1], 0.25)


def test_coupled_has_lower_variance_than_three_single_masks():
    # A model-free, context-dependent "model": the log-prob of token i in a noisy copy is
    # base_i - c * (fraction of the copy that is masked). Per draw, the sequence estimate is
    # sum_i estimate_i; coupled spends 3 passes, and so does the mean of 3 single-mask draws.
    n, c, draws = 32, 1.0, 2000
    base = jnp.asarray(-np.random.RandomState(4).uniform(0.5, 3.0, (1, n)), jnp.float32)
    completion = jnp.asarray(np.random.RandomState(5).randint(3, 259, (1, n)), jnp.int32)
    coupled, single = ESTIMATORS.get("coupled"), ESTIMATORS.get("single")

    def lp_fn(noisy):  # [P, 1, n] -> [P, 1, n]
        frac = jnp.mean(noisy == MASK_ID, axis=-1, keepdims=True)
        return base - c * frac

    def draw(key):
        noisy, aux = coupled.noise(key, completion, MASK_ID)
        seq_coupled = jnp.sum(coupled.combine(lp_fn(noisy), aux))
        seq_single = []
        for k in jax.random.split(jax.random.fold_in(key, 1), 3):
            noisy1, aux1 = single.noise(k, completion, MASK_ID)
            seq_single.append(jnp.sum(single.combine(lp_fn(noisy1), aux1)))
        return seq_coupled, jnp.mean(jnp.stack(seq_single))

    keys = jax.random.split(jax.random.key(6), draws)
    est_c, est_s = (np.asarray(x, np.float64) for x in jax.jit(jax.vmap(draw))(keys))
    assert np.isfinite(est_c.mean()) and np.isfinite(est_s.mean())
    assert np.all(np.isfinite(est_c)) and np.all(np.isfinite(est_s))
    assert est_c.var() < est_s.var(), (est_c.var(), est_s.var())

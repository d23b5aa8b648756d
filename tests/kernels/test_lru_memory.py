"""The Pallas LRU memory update (interpret mode on CPU) against its jnp reference and numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.kernels.lru_memory import lru_memory_update, lru_memory_update_reference

B, M, D = 3, 4, 2


def numpy_lru(vec, pos, cand, anchor, alpha):
    """Independent per-row loop over the rule in the ELMUR paper/code."""
    vec, pos = vec.copy(), pos.copy()
    for b in range(vec.shape[0]):
        empty = [i for i in range(pos.shape[1]) if pos[b, i] < 0]
        if empty:
            j = empty[0]
            vec[b, j] = cand[b, j]
        else:
            j = int(np.argmin(pos[b]))  # first minimum
            vec[b, j] = alpha * cand[b, j] + (1 - alpha) * vec[b, j]
        pos[b, j] = anchor[b]
    return vec, pos


CASES = {
    "all_empty": [[-1, -1, -1, -1]] * 3,
    "partly_full": [[3, -1, 5, -1], [-1, 2, 2, 2], [0, 1, 2, -1]],
    "full": [[7, 2, 4, 9], [5, 6, 7, 1], [9, 9, 3, 4]],
    "ties": [[2, 2, 2, 2], [8, 1, 1, 5], [3, 3, 0, 0]],
}


@pytest.mark.parametrize("case", list(CASES))
def test_kernel_equals_reference_and_numpy(case):
    rng = np.random.default_rng(len(case))
    vec = rng.normal(size=(B, M, D)).astype(np.float32)
    cand = rng.normal(size=(B, M, D)).astype(np.float32)
    pos = np.array(CASES[case], np.int32)
    anchor = np.array([10, 11, 12], np.int32)
    kv, kp = lru_memory_update(vec, pos, cand, anchor, alpha=0.7)
    rv, rp = lru_memory_update_reference(vec, pos, cand, anchor, alpha=0.7)
    nv, npos = numpy_lru(vec, pos, cand, anchor, 0.7)
    np.testing.assert_array_equal(kp, npos)
    np.testing.assert_array_equal(rp, npos)
    np.testing.assert_allclose(kv, nv, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(rv, nv, rtol=1e-6, atol=1e-6)


def test_gradient_of_kernel_equals_central_finite_differences():
    """The kernel's backward (`jax.custom_vjp`, built from the reference) against central finite
    differences of the kernel's own forward, in float64, for every entry of the inputs that have
    gradients (vec and cand; pos and anchor are integers). The slot choice depends only on pos,
    so the loss is a quadratic in (vec, cand) and central differences are exact up to rounding.
    Rows: the first empty slot (the old value is overwritten: no gradient to it), a full row
    (blend: alpha to cand, 1 - alpha to the old value) and a row with one empty slot."""
    alpha, eps = 0.9, 1e-4
    pos = np.array([CASES["partly_full"][0], CASES["full"][0], CASES["partly_full"][2]], np.int32)
    rng = np.random.default_rng(0)
    vec0, cand0, w = (rng.normal(size=(B, M, D)) for _ in range(3))
    with jax.enable_x64(True):
        @jax.jit
        def loss(v, c):
            out = lru_memory_update(v, jnp.asarray(pos), c, jnp.int32(20), alpha=alpha)[0]
            return jnp.sum(jnp.asarray(w) * out**2)

        args = (jnp.asarray(vec0, jnp.float64), jnp.asarray(cand0, jnp.float64))
        grads = [np.asarray(g) for g in jax.grad(loss, argnums=(0, 1))(*args)]
        for which, (arg, grad) in enumerate(zip(args, grads, strict=True)):
            assert arg.dtype == grad.dtype == np.float64
            numeric = np.zeros(arg.shape)
            for idx in np.ndindex(*arg.shape):
                step = jnp.zeros(arg.shape, jnp.float64).at[idx].set(eps)
                plus, minus = list(args), list(args)
                plus[which], minus[which] = arg + step, arg - step
                numeric[idx] = (float(loss(*plus)) - float(loss(*minus))) / (2 * eps)
            np.testing.assert_allclose(grad, numeric, rtol=1e-7, atol=1e-9, err_msg=str(which))
    # the written slots by hand: row 0 slot 1 (first empty), row 1 slot 1 (pos 2, the oldest),
    # row 2 slot 3 (first empty); d/dvec is 0 where the old value is overwritten
    g_vec, g_cand = grads
    assert np.flatnonzero(np.abs(g_cand).sum(-1).ravel()).tolist() == [1, 5, 11]
    assert np.all(g_vec[0, 1] == 0) and np.all(g_vec[2, 3] == 0)
    np.testing.assert_allclose(g_vec[1, 1], 2 * w[1, 1] * (1 - alpha) * (
        alpha * cand0[1, 1] + (1 - alpha) * vec0[1, 1]), rtol=1e-12)


def test_environment_flag_forces_the_reference(monkeypatch):
    calls = []
    import jaxrl_suite.kernels.lru_memory as mod

    real = mod.lru_memory_update_reference
    monkeypatch.setattr(mod, "lru_memory_update_reference",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setenv("JAXRL_LRU_REFERENCE", "1")
    pos = jnp.full((B, M), -1, jnp.int32)
    mod.lru_memory_update(jnp.zeros((B, M, D)), pos, jnp.ones((B, M, D)), 0)
    assert calls == [1]


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match="pos"):
        lru_memory_update(jnp.zeros((B, M, D)), jnp.zeros((B, M + 1), jnp.int32),
                          jnp.zeros((B, M, D)), 0)

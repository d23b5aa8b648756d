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


def test_gradient_of_kernel_equals_gradient_of_reference():
    rng = np.random.default_rng(0)
    vec = jnp.asarray(rng.normal(size=(B, M, D)), jnp.float32)
    cand = jnp.asarray(rng.normal(size=(B, M, D)), jnp.float32)
    pos = jnp.array(CASES["partly_full"][:2] + CASES["full"][:1], jnp.int32)
    w = jnp.asarray(rng.normal(size=(B, M, D)), jnp.float32)

    def loss(fn, v, c):
        return jnp.sum(w * fn(v, pos, c, jnp.int32(20), alpha=0.9)[0] ** 2)

    gk = jax.grad(lambda v, c: loss(lru_memory_update, v, c), argnums=(0, 1))(vec, cand)
    gr = jax.grad(lambda v, c: loss(lru_memory_update_reference, v, c), argnums=(0, 1))(vec, cand)
    for a, b in zip(gk, gr, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # The blended slot of the full row passes (1 - alpha) of the old value's gradient on.
    assert float(jnp.abs(gk[0]).sum()) > 0 and float(jnp.abs(gk[1]).sum()) > 0


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

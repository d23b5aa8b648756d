"""core.train: `apply_gradients` against hand-computed optax updates, its non-finite guard (in a
host step, inside `lax.scan` and under `vmap`), and `make_train_step` built on it."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl_suite.core.train import (
    ParamState,
    apply_gradients,
    init_param_state,
    init_train_state,
    make_train_step,
)

PARAMS = {"w": jnp.array([[1.0, -2.0], [0.5, 3.0]]), "b": jnp.array([0.25, -1.0])}
GRADS = {"w": jnp.array([[0.3, -0.4], [1.2, 0.0]]), "b": jnp.array([-2.0, 0.5])}


def _np(tree):
    return {k: np.asarray(v, np.float64) for k, v in tree.items()}


def _norm(tree):
    return np.sqrt(sum((v**2).sum() for v in tree.values()))


def test_first_adam_step_matches_the_hand_computed_update():
    """Adam's first step: m = (1 - b1) g, v = (1 - b2) g^2, bias-corrected to g and g^2, so
    update = -lr * g / (|g| + eps)."""
    lr, eps = 0.1, 1e-8
    state = init_param_state(PARAMS, optax.adam(lr, eps=eps))
    new, m = jax.jit(lambda s, g: apply_gradients(s, g, optax.adam(lr, eps=eps)))(state, GRADS)
    p, g = _np(PARAMS), _np(GRADS)
    upd = {k: -lr * g[k] / (np.abs(g[k]) + eps) for k in g}
    for k in p:
        np.testing.assert_allclose(new.params[k], p[k] + upd[k], rtol=1e-5)  # float32 Adam
    assert int(new.step) == 1 and int(new.opt_state[0].count) == 1
    np.testing.assert_allclose(new.opt_state[0].mu["b"], 0.1 * g["b"], rtol=1e-6)
    assert bool(m["finite"])
    np.testing.assert_allclose(m["grad_norm"], _norm(g), rtol=1e-6)
    np.testing.assert_allclose(m["update_norm"], _norm(upd), rtol=1e-5)
    np.testing.assert_allclose(m["param_norm"], _norm({k: p[k] + upd[k] for k in p}), rtol=1e-5)


def test_clipped_sgd_two_steps_match_numpy():
    """chain(clip_by_global_norm(c), sgd(lr)): p <- p - lr * g * min(1, c / ||g||)."""
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.5))
    state = init_param_state(PARAMS, tx)
    p, g = _np(PARAMS), _np(GRADS)
    scale = min(1.0, 1.0 / _norm(g))
    for _ in range(2):
        state, m = apply_gradients(state, GRADS, tx)
        p = {k: p[k] - 0.5 * g[k] * scale for k in p}
    for k in p:
        np.testing.assert_allclose(state.params[k], p[k], rtol=1e-6)
    np.testing.assert_allclose(m["update_norm"], 0.5 * _norm(g) * scale, rtol=1e-6)
    assert int(state.step) == 2


def _with_nan(tree):
    return {**tree, "b": tree["b"].at[1].set(jnp.nan)}


def test_a_nan_gradient_leaves_the_whole_state_unchanged():
    tx = optax.adam(0.1)
    state, _ = apply_gradients(init_param_state(PARAMS, tx), GRADS, tx)  # one real step first
    new, m = jax.jit(lambda s, g: apply_gradients(s, g, tx))(state, _with_nan(GRADS))
    assert not bool(m["finite"]) and not np.isfinite(float(m["grad_norm"]))
    jax.tree.map(np.testing.assert_array_equal, new, state)  # step, params and Adam state
    assert int(new.step) == 1


def test_a_nan_loss_alone_is_refused_too():
    tx = optax.sgd(0.1)
    state = init_param_state(PARAMS, tx)
    new, m = apply_gradients(state, GRADS, tx, loss=jnp.float32(jnp.inf))
    assert not bool(m["finite"])
    jax.tree.map(np.testing.assert_array_equal, new, state)
    _, m = apply_gradients(state, GRADS, tx, loss=jnp.float32(1.0))
    assert bool(m["finite"])


def test_keep_params_keeps_only_the_parameters():
    tx = optax.adam(0.1)
    state = init_param_state(PARAMS, tx)
    new, m = apply_gradients(state, _with_nan(GRADS), tx, keep="params")
    assert not bool(m["finite"])
    jax.tree.map(np.testing.assert_array_equal, new.params, state.params)
    assert int(new.step) == 1 and int(new.opt_state[0].count) == 1  # the counters advance
    assert np.isnan(np.asarray(new.opt_state[0].mu["b"][1]))  # the moments are not rolled back
    with pytest.raises(ValueError, match="keep must be one of"):
        apply_gradients(state, GRADS, tx, keep="none")


def test_norms_false_gives_the_same_update_and_guards_on_the_update_alone():
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(0.1))
    state = init_param_state(PARAMS, tx)
    full, m_full = apply_gradients(state, GRADS, tx, keep="params")
    lean, m = apply_gradients(state, GRADS, tx, keep="params", norms=False)
    jax.tree.map(np.testing.assert_array_equal, lean, full)
    assert set(m) == {"update_norm", "finite"} and bool(m["finite"])
    assert float(m["update_norm"]) == float(m_full["update_norm"])
    # A NaN or an infinite gradient becomes a non-finite update through clipping and Adam.
    inf_grads = {**GRADS, "w": GRADS["w"].at[0, 0].set(jnp.inf)}
    for bad in (_with_nan(GRADS), inf_grads):
        new, m = apply_gradients(state, bad, tx, keep="params", norms=False)
        assert not bool(m["finite"])
        jax.tree.map(np.testing.assert_array_equal, new.params, state.params)


def _scan_run(keep: str, nan_at: int, steps: int = 6):
    """SGD on 0.5 * ||p - 1||^2 inside `lax.scan`; the gradient is NaN at step `nan_at`."""
    tx = optax.adam(0.1)

    def body(state, t):
        grads = jax.tree.map(lambda p: p - 1.0, state.params)
        grads = jax.tree.map(lambda g: jnp.where(t == nan_at, jnp.nan, g), grads)
        state, m = apply_gradients(state, grads, tx, keep=keep)
        return state, (state.params["w"], ~m["finite"])

    state = init_param_state({"w": jnp.zeros(3)}, tx)
    return jax.jit(lambda s: jax.lax.scan(body, s, jnp.arange(steps)))(state)


def test_in_a_scan_keep_state_skips_the_step_and_keep_params_halts():
    state, (w, refused) = _scan_run("state", nan_at=2)
    np.testing.assert_array_equal(np.asarray(refused), [0, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(w[2], w[1])  # skipped ...
    assert float(w[5, 0]) > float(w[3, 0]) > float(w[1, 0])  # ... and training goes on
    assert int(state.step) == 5
    assert np.isfinite(np.asarray(w)).all()

    state, (w, refused) = _scan_run("params", nan_at=2)
    np.testing.assert_array_equal(np.asarray(refused), [0, 0, 1, 1, 1, 1])  # NaN moments
    np.testing.assert_array_equal(np.asarray(w[2:]), np.broadcast_to(w[1], (4, 3)))  # halted
    assert int(state.step) == 6


def test_under_vmap_the_guard_is_per_row():
    tx = optax.sgd(1.0)
    states = jax.vmap(lambda p: init_param_state(p, tx))({"w": jnp.ones((2, 3))})
    grads = {"w": jnp.array([[1.0, 1.0, 1.0], [1.0, jnp.nan, 1.0]])}
    new, m = jax.jit(jax.vmap(lambda s, g: apply_gradients(s, g, tx)))(states, grads)
    np.testing.assert_array_equal(np.asarray(m["finite"]), [True, False])
    np.testing.assert_array_equal(np.asarray(new.params["w"]), [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    np.testing.assert_array_equal(np.asarray(new.step), [1, 0])


def test_make_train_step_is_the_plain_optax_update_with_loss_and_norm_metrics():
    """The generic step's numbers are those of value_and_grad -> tx.update -> apply_updates."""
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2))

    def loss_fn(p, b):
        err = b["x"] @ p["w"] + p["b"] - b["y"]
        return jnp.mean(err**2), {"mse": jnp.mean(err**2)}

    rng = np.random.default_rng(0)
    batches = [{"x": jnp.asarray(rng.normal(size=(8, 2)), jnp.float32),
                "y": jnp.asarray(rng.normal(size=(8, 2)), jnp.float32)} for _ in range(3)]
    state = init_train_state(PARAMS, tx, jax.random.key(0))
    assert isinstance(state.rng, jax.Array) and state.rng.dtype == jnp.uint32
    step = jax.jit(make_train_step(loss_fn, tx))

    @jax.jit
    def reference(params, opt_state, b):
        (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, b)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params, opt_state = PARAMS, state.opt_state
    for b in batches:
        state, m = step(state, b)
        params, opt_state, loss = reference(params, opt_state, b)
        jax.tree.map(np.testing.assert_array_equal, state.params, params)
        np.testing.assert_array_equal(m["loss"], loss)
    assert set(m) == {"mse", "loss", "grad_norm", "param_norm", "update_norm", "finite"}
    assert int(state.step) == 3
    # a NaN batch is refused: the same state comes back
    bad = dict(batches[0], x=batches[0]["x"].at[0, 0].set(jnp.nan))
    again, m = step(state, bad)
    assert not bool(m["finite"])
    jax.tree.map(np.testing.assert_array_equal, again, state)


def test_param_state_is_a_pytree_for_scan_carries():
    s = ParamState(jnp.zeros((), jnp.int32), PARAMS, ())
    leaves = jax.tree.leaves(s)
    assert len(leaves) == 3  # step, w, b

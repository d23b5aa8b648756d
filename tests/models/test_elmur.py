"""ELMUR layer memory: segment recurrence, LRU writes, causality, ablations, detaching."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.models.elmur import ELMUR, ELMURConfig, init_memory, scan_segments

CFG = ELMURConfig(d_model=16, n_layers=2, n_heads=2, d_ff=32, mem_slots=3, segment_len=4,
                  max_rel_dist=64)
B = 2


def setup(cfg=CFG, t=12, seed=0):
    model = ELMUR(cfg)
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(k1, (B, t, cfg.d_model))
    mems = init_memory(cfg, k2, B)
    params = model.init(k3, x[:, : cfg.segment_len], mems, 0)
    return model, params, x, mems


def test_scan_equals_a_python_loop_over_segments_and_writes_one_slot_per_segment():
    model, params, x, mems = setup()
    out, final = jax.jit(lambda p, x, m: scan_segments(model, p, x, m))(params, x, mems)
    m, outs = mems, []
    for s in range(3):
        o, m = model.apply(params, x[:, 4 * s: 4 * s + 4], m, 4 * s)
        outs.append(o)
    np.testing.assert_allclose(out, jnp.concatenate(outs, 1), rtol=1e-5, atol=1e-5)
    for layer_mem, ref in zip(final, m, strict=True):
        np.testing.assert_array_equal(layer_mem.pos, ref.pos)
        # 3 segments into 3 empty slots: slots written in order at times 0, 4, 8
        np.testing.assert_array_equal(layer_mem.pos, [[0, 4, 8]] * B)


def test_full_memory_blends_the_least_recently_written_slot():
    model, params, x, mems = setup(t=16)
    _, final = scan_segments(model, params, x, mems)
    # 4th segment (t=12) finds all 3 slots full and overwrites the oldest (time 0, slot 0)
    np.testing.assert_array_equal(final[0].pos, [[12, 4, 8]] * B)


def test_tokens_are_causal_within_a_segment():
    model, params, x, mems = setup()
    seg = x[:, :4]
    out, _ = model.apply(params, seg, mems, 0)
    out2, _ = model.apply(params, seg.at[:, 3].add(5.0), mems, 0)
    np.testing.assert_allclose(out[:, :3], out2[:, :3], rtol=1e-5, atol=1e-5)
    assert not np.allclose(out[:, 3], out2[:, 3])


@pytest.mark.parametrize("flag", [None, "use_read", "use_write"])
def test_memory_carries_the_first_segment_into_the_last(flag):
    cfg = CFG if flag is None else dataclasses.replace(CFG, **{flag: False})
    model, params, x, mems = setup(cfg)
    out, _ = scan_segments(model, params, x, mems)
    out2, _ = scan_segments(model, params, x.at[:, 0].add(3.0), mems)
    changed = not np.allclose(out[:, -4:], out2[:, -4:], atol=1e-6)
    assert changed == (flag is None), flag


def test_replace_all_policy_rewrites_every_slot_and_keeps_pos():
    cfg = dataclasses.replace(CFG, use_lru=False)
    model, params, x, mems = setup(cfg)
    _, new = model.apply(params, x[:, :4], mems, 0)
    np.testing.assert_array_equal(new[0].pos, mems[0].pos)
    assert np.all(np.any(np.asarray(new[0].vec != mems[0].vec), axis=-1))


def test_kernel_and_reference_paths_agree():
    model, params, x, mems = setup(t=16)
    ref_model = ELMUR(dataclasses.replace(CFG, use_kernel=False))
    a, ma = scan_segments(model, params, x, mems)
    b, mb = scan_segments(ref_model, params, x, mems)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ma[1].vec, mb[1].vec, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("detach", [True, False])
def test_detached_memory_blocks_gradients_across_segments(detach):
    cfg = dataclasses.replace(CFG, detach_memory=detach)
    model, params, x, mems = setup(cfg, t=8)

    def last_segment_loss(x):
        out, _ = scan_segments(model, params, x, mems)
        return jnp.sum(out[:, 4:] ** 2)

    g = jax.grad(last_segment_loss)(x)
    crosses = float(jnp.abs(g[:, :4]).max()) > 0
    assert crosses == (not detach)


def test_sequence_length_must_fill_whole_segments():
    model, params, x, mems = setup()
    with pytest.raises(ValueError, match="segment_len"):
        scan_segments(model, params, x[:, :10], mems)


def test_step_by_step_inference_equals_segment_scan():
    from jaxrl_suite.models.elmur import StepState, inference_step

    model, params, x, mems = setup(t=12)
    ref, ref_mems = scan_segments(model, params, x, mems)
    state = StepState(mems, jnp.zeros((B, CFG.segment_len, CFG.d_model)), jnp.int32(0))

    def step(state, x_t):
        h, state = inference_step(model, params, state, x_t)
        return state, h

    state, hs = jax.lax.scan(step, state, jnp.moveaxis(x, 1, 0))
    np.testing.assert_allclose(jnp.moveaxis(hs, 0, 1), ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(state.memories[1].pos, ref_mems[1].pos)
    assert int(state.t) == 12


def test_post_norm_keeps_every_memory_slot_within_the_layernorm_norm():
    # pre_norm=False: u = LN(.) has norm sqrt(D) (LayerNorm scale 1, bias 0 at init), and the LRU
    # blend alpha u + (1 - alpha) old of two such vectors cannot exceed it, however many segments.
    cfg = dataclasses.replace(CFG, pre_norm=False, alpha=0.79)
    model, params, x, mems = setup(cfg, t=4 * 40)
    _, final = jax.jit(lambda p, x, m: scan_segments(model, p, 10.0 * x, m))(params, x, mems)
    for mem in final:
        norms = np.linalg.norm(np.asarray(mem.vec), axis=-1)
        assert norms.max() <= np.sqrt(cfg.d_model) * (1 + 1e-4), norms.max()
        assert norms.min() > 0.5 * np.sqrt(cfg.d_model)  # every slot was written (not init noise)
    pre_model, pre_params, _, _ = setup(CFG, t=4 * 40)
    out_pre = pre_model.apply(pre_params, x[:, :4], mems, 0)[0]
    out_post = model.apply(params, x[:, :4], mems, 0)[0]
    assert float(jnp.abs(out_pre - out_post).max()) > 1e-3  # the switch changes the computation

"""Scaling options of the causal LM: attention through jax.nn.dot_product_attention (against a
numpy reference), param_dtype, remat policies, scanned layers (and their KV cache, sampler and HF
layout). One small GQA config (4 query heads on 2 kv heads, q/k/v biases, untied head); compiled
functions are shared by module-scoped fixtures at one set of shapes."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from jaxrl_suite.core.parallel import MESH_AXES, make_mesh
from jaxrl_suite.models import CausalLM, LMConfig, init_cache, stack_layers, unstack_layers
from jaxrl_suite.models.hf import num_params, params_from_hf, params_to_hf
from jaxrl_suite.models.lm import Attention, rope_cos_sin
from jaxrl_suite.models.sharding import partition_spec, path_str, tree_shardings
from jaxrl_suite.sampling import KVCacheSampler

CFG = LMConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
               max_len=64, qkv_bias=True, tie_embeddings=False, scan_layers=False)
SCANNED = dataclasses.replace(CFG, scan_layers=True)
B, T = 2, 64  # the gradient / memory shapes


@pytest.fixture(scope="module")
def params():
    """Random unrolled params, every leaf perturbed, embeddings scaled up (peaked logits)."""

    @jax.jit
    def init(rng):
        flat, unravel = ravel_pytree(CausalLM(CFG).init(rng, jnp.zeros((1, 4), jnp.int32)))
        out = unravel(flat + 0.1 * jax.random.normal(jax.random.fold_in(rng, 1), flat.shape))
        out["params"]["embed"]["embedding"] *= 5.0
        return out

    return init(jax.random.key(0))


# --------------------------------------------------------------------------------------------
# attention against numpy


def _np_rope(x, positions, theta):
    """Rotate each pair (x_i, x_{i+D/2}) by pos * theta^(-2i/D). x [B, T, H, D], float64."""
    d = x.shape[-1]
    out = np.empty_like(x)
    for i in range(d // 2):
        angle = positions[:, :, None] * theta ** (-2.0 * i / d)
        a, b = x[..., i], x[..., i + d // 2]
        out[..., i] = a * np.cos(angle) - b * np.sin(angle)
        out[..., i + d // 2] = b * np.cos(angle) + a * np.sin(angle)
    return out


def _np_attention(p, cfg, x, positions, mask):
    """GQA attention in float64: x [B, S, D] at slots 0..S-1, positions [B, S], mask [B, S, S]
    (query slot, key slot). Query head n reads kv head n // (N / K); a query with every key
    masked averages all values (uniform softmax). Returns [B, S, D]."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
    x = np.asarray(x, np.float64)
    nh, nk, hd = cfg.n_heads, cfg.n_kv_heads, cfg.resolved_head_dim
    b, s, _ = x.shape
    proj = lambda name, n: (x @ p[name]["kernel"] + p[name]["bias"]).reshape(b, s, n, hd)
    q = _np_rope(proj("q", nh), positions, cfg.rope_theta)
    k = _np_rope(proj("k", nk), positions, cfg.rope_theta)
    v = proj("v", nk)
    out = np.zeros((b, s, nh, hd))
    for n in range(nh):
        g = n // (nh // nk)
        scores = np.einsum("bqd,bkd->bqk", q[:, :, n], k[:, :, g]) / np.sqrt(hd)
        scores = np.where(mask, scores, -np.inf)
        top = np.max(scores, axis=-1, keepdims=True)
        w = np.where(mask, np.exp(scores - np.where(np.isfinite(top), top, 0.0)), 0.0)
        w = np.where(mask.any(-1, keepdims=True), w, 1.0)  # fully masked: uniform
        out[:, :, n] = np.einsum("bqk,bkd->bqd", w / w.sum(-1, keepdims=True), v[:, :, g])
    return out.reshape(b, s, nh * hd) @ p["o"]["kernel"]


_ATTN = Attention(CFG)
_attend = jax.jit(_ATTN.apply)


def _attn_case(params, offsets):
    """Inputs of one layer's attention over S = 12 slots: row b's tokens start at slot
    offsets[b] (slots before are stale or padding, masked); positions count from there."""
    s = 12
    p = params["params"]["layer_0"]["attn"]
    x = jax.random.normal(jax.random.key(1), (B, s, CFG.d_model))
    slots = np.arange(s)
    key_mask = slots[None, :] >= np.asarray(offsets)[:, None]  # [B, S]
    positions = np.maximum(slots[None, :] - np.asarray(offsets)[:, None], 0)
    causal = slots[None, :, None] >= slots[None, None, :]
    mask = causal & key_mask[:, None, :]  # [B, S(q), S(k)]
    return p, x, positions, key_mask, mask, _np_attention(p, CFG, x, positions, mask)


def _call(p, x, positions, mask4, kv=None, index=None):
    cos, sin = rope_cos_sin(jnp.asarray(positions), CFG.resolved_head_dim, CFG.rope_theta)
    return _attend({"params": p}, x, cos, sin, jnp.asarray(mask4), kv, index)


def test_full_forward_attention_with_padding_matches_numpy(params):
    p, x, positions, key_mask, mask, ref = _attn_case(params, [0, 5])  # row 1 left-padded by 5
    out, kv = _call(p, x, positions, mask[:, None])
    assert kv is None and np.all(np.isfinite(out))  # padding queries too
    real = key_mask  # queries that matter: the non-padding ones
    np.testing.assert_allclose(np.asarray(out)[real], ref[real], atol=1e-5)
    np.testing.assert_allclose(out, ref, atol=1e-5)  # padding queries: uniform, as numpy


@pytest.mark.parametrize("per_row", [False, True], ids=["shared_index", "per_row_index"])
def test_prefill_and_cached_decode_attention_match_numpy(params, per_row):
    """Prefill slots 0..3 of a stale cache, then decode one slot per call; with per-row
    indices row b's tokens sit at slots offsets[b].. and its earlier slots hold stale values."""
    offsets = [0, 3] if per_row else [0, 0]
    p, x, positions, key_mask, mask, ref = _attn_case(params, offsets)
    s, hd, nk = x.shape[1], CFG.resolved_head_dim, CFG.n_kv_heads
    stale = tuple(jax.random.normal(jax.random.key(i), (B, nk, s, hd)) for i in (2, 3))
    off = np.asarray(offsets, np.int32)
    index = (lambda i: jnp.asarray(off + i)) if per_row else (lambda i: jnp.int32(i))
    first, kv = 4, stale
    # each row's own tokens: row b's token j sits at slot offsets[b] + j
    rows = np.arange(B)[:, None]
    xr = np.asarray(x)
    take = lambda a, j0, j1: a[rows, off[:, None] + np.arange(j0, j1)]
    out, kv = _call(p, take(xr, 0, first), take(positions, 0, first),
                    take(mask, 0, first)[:, None], kv, index(0))
    np.testing.assert_allclose(out, take(ref, 0, first), atol=1e-5)
    for j in range(first, s - max(offsets)):
        out, kv = _call(p, take(xr, j, j + 1), take(positions, j, j + 1),
                        take(mask, j, j + 1)[:, None], kv, index(j))
        np.testing.assert_allclose(out, take(ref, j, j + 1), atol=1e-5)
    if per_row:  # row 1's slots before its offset keep their stale values
        np.testing.assert_array_equal(kv[0][1, :, :3], stale[0][1, :, :3])
    assert _attend._cache_size() <= 5  # no cache; (prefill, decode) x (scalar, per-row index)


# --------------------------------------------------------------------------------------------
# param_dtype


def test_param_dtype_bfloat16_creates_every_param_in_it_and_hf_loads_into_it(params):
    cfg = dataclasses.replace(CFG, param_dtype="bfloat16", dtype="bfloat16")
    tokens = jnp.ones((1, 4), jnp.int32)
    init = jax.eval_shape(lambda: CausalLM(cfg).init(jax.random.key(0), tokens))
    assert {x.dtype for x in jax.tree.leaves(init)} == {jnp.dtype(jnp.bfloat16)}
    loaded = params_from_hf(params_to_hf(params, CFG), cfg)
    assert jax.tree.structure(loaded) == jax.tree.structure(init)
    assert {x.dtype for x in jax.tree.leaves(loaded)} == {jnp.dtype(jnp.bfloat16)}
    logits, _ = jax.jit(CausalLM(cfg).apply)(loaded, tokens)
    assert logits.dtype == jnp.float32 and np.all(np.isfinite(logits))
    # float32 masters with bfloat16 compute: the default param_dtype keeps float32 leaves
    mixed = jax.eval_shape(lambda: CausalLM(dataclasses.replace(CFG, dtype="bfloat16")).init(
        jax.random.key(0), tokens))
    assert {x.dtype for x in jax.tree.leaves(mixed)} == {jnp.dtype(jnp.float32)}


# --------------------------------------------------------------------------------------------
# remat and scan: one compiled gradient per (layout, remat) at the same shapes


@pytest.fixture(scope="module")
def grads(params):
    """(scanned, remat) -> (gradient in the unrolled layout, compiled temp bytes)."""
    tokens = jax.random.randint(jax.random.key(5), (B, T), 0, CFG.vocab_size)
    key_mask = jnp.arange(T)[None, :] >= jnp.array([[0], [7]])  # row 1 left-padded
    positions = jnp.maximum(jnp.cumsum(key_mask, 1) - 1, 0)
    out = {}
    for scanned in (False, True):
        for remat in ("none", "block", "full"):
            cfg = dataclasses.replace(CFG, remat=remat, scan_layers=scanned)
            p = stack_layers(params, CFG.n_layers) if scanned else params

            def loss(p, cfg=cfg):
                logits, _ = CausalLM(cfg).apply(p, tokens, positions, key_mask)
                return jnp.sum(jax.nn.log_softmax(logits)[..., 3] * key_mask) / T

            compiled = jax.jit(jax.grad(loss)).lower(p).compile()
            g = compiled(p)
            g = unstack_layers(g, CFG.n_layers) if scanned else g
            out[scanned, remat] = (g, compiled.memory_analysis().temp_size_in_bytes)
    return out


def _assert_trees_close(a, b, **tol):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b),
                            strict=True):
        np.testing.assert_allclose(x, y, err_msg=path_str(path), **tol)


@pytest.mark.parametrize("scanned", [False, True], ids=["unrolled", "scanned"])
def test_remat_gradients_equal_no_remat(grads, scanned):
    for remat in ("block", "full"):
        _assert_trees_close(grads[scanned, remat][0], grads[scanned, "none"][0],
                            rtol=1e-5, atol=1e-6)


def test_scanned_gradients_equal_unrolled(grads):
    _assert_trees_close(grads[True, "none"][0], grads[False, "none"][0], rtol=1e-5, atol=1e-6)


def test_remat_temp_memory_decreases_none_block_full(grads):
    """Compiler-estimated temp bytes of the gradient. Scanned: each layer's activations are
    recomputed inside the backward loop, so none > block > full, by large factors. Unrolled on
    XLA:CPU the scheduler may run the recomputation early, so only <= is asserted there."""
    none, block, full = (grads[True, r][1] for r in ("none", "block", "full"))
    assert none > 1.5 * block and block > full, (none, block, full)
    none, block, full = (grads[False, r][1] for r in ("none", "block", "full"))
    assert none >= block and none >= full, (none, block, full)


def test_scanned_logits_equal_unrolled_and_params_have_a_layers_axis(params):
    stacked = stack_layers(params, CFG.n_layers)
    q = stacked["params"]["layers"]["attn"]["q"]["kernel"]
    assert q.shape == (CFG.n_layers, CFG.d_model, CFG.n_heads * CFG.resolved_head_dim)
    assert "layer_0" not in stacked["params"]
    init = jax.eval_shape(lambda: CausalLM(SCANNED).init(jax.random.key(0),
                                                         jnp.zeros((1, 4), jnp.int32)))
    assert jax.tree.structure(init) == jax.tree.structure(stacked)
    _assert_trees_close(unstack_layers(stacked, CFG.n_layers), params, rtol=0, atol=0)
    tokens = jax.random.randint(jax.random.key(6), (B, 9), 0, CFG.vocab_size)
    a, _ = jax.jit(CausalLM(CFG).apply)(params, tokens)
    b, _ = jax.jit(CausalLM(SCANNED).apply)(stacked, tokens)
    np.testing.assert_allclose(b, a, atol=1e-5)


def test_scanned_cache_layout_and_sampler_greedy_tokens(params):
    cache = init_cache(SCANNED, 3, 20)
    shape = (CFG.n_layers, 3, CFG.n_kv_heads, 20, CFG.resolved_head_dim)
    assert cache.k.shape == shape and cache.v.shape == shape and cache.cache_len == 20
    assert init_cache(CFG, 3, 20).cache_len == 20
    prompt = jax.random.randint(jax.random.key(7), (3, 6), 2, CFG.vocab_size)
    mask = jnp.arange(6)[None, :] >= jnp.array([[0], [2], [5]])
    prompt = jnp.where(mask, prompt, 0)
    outs = [KVCacheSampler(CausalLM(cfg), max_new_tokens=10, eos_id=-1, pad_id=0, greedy=True)(
        p, prompt, mask, jax.random.key(0))
        for cfg, p in ((CFG, params), (SCANNED, stack_layers(params, CFG.n_layers)))]
    np.testing.assert_array_equal(outs[1].tokens, outs[0].tokens)
    np.testing.assert_allclose(outs[1].logprobs, outs[0].logprobs, atol=1e-5)
    assert len(set(np.asarray(outs[0].tokens).ravel().tolist())) > 1


def test_scanned_cache_with_per_row_index_equals_unrolled(params):
    """Prefill at per-row offsets into a stale cache, then one decode step: the scanned model's
    logits and stacked cache equal the unrolled model's."""
    offsets, s = jnp.array([0, 3, 5], jnp.int32), 12
    tokens = jax.random.randint(jax.random.key(8), (3, 5), 2, CFG.vocab_size)
    key_mask = jnp.arange(s)[None, :] >= offsets[:, None]
    pos = jnp.broadcast_to(jnp.arange(5), (3, 5))
    stale = init_cache(CFG, 3, s)
    keys = jax.random.split(jax.random.key(9), 2 * CFG.n_layers)
    stale = stale._replace(k=tuple(jax.random.normal(k, x.shape) for k, x in zip(
        keys[::2], stale.k, strict=True)), v=tuple(jax.random.normal(k, x.shape) for k, x in zip(
        keys[1::2], stale.v, strict=True)))
    runs = []
    for cfg, p, cache in ((CFG, params, stale), (SCANNED, stack_layers(params, CFG.n_layers),
                                                 stale._replace(k=jnp.stack(stale.k),
                                                                v=jnp.stack(stale.v)))):
        apply = jax.jit(CausalLM(cfg).apply)
        first, cache = apply(p, tokens[:, :4], pos[:, :4], key_mask, cache, offsets)
        last, cache = apply(p, tokens[:, 4:], pos[:, 4:], key_mask, cache, offsets + 4)
        runs.append((jnp.concatenate([first, last], 1), cache))
    (a, cache_a), (b, cache_b) = runs
    np.testing.assert_allclose(b, a, atol=1e-5)
    np.testing.assert_allclose(cache_b.k, jnp.stack(cache_a.k), atol=1e-5)
    np.testing.assert_allclose(cache_b.v, jnp.stack(cache_a.v), atol=1e-5)
    np.testing.assert_array_equal(cache_b.k[:, 2, :, :5], jnp.stack(stale.k)[:, 2, :, :5])


def test_hf_round_trip_with_scanned_layers(params):
    tensors = params_to_hf(params, CFG)
    stacked = params_from_hf(tensors, SCANNED)
    assert stacked["params"]["layers"]["mlp"]["down"]["kernel"].shape == (2, 64, 32)
    _assert_trees_close(stacked, stack_layers(params, CFG.n_layers), rtol=0, atol=0)
    back = params_to_hf(stacked, SCANNED)
    assert back.keys() == tensors.keys()
    for name, x in tensors.items():
        np.testing.assert_array_equal(back[name], x, err_msg=name)
    assert num_params(SCANNED) == num_params(CFG) == sum(x.size for x in tensors.values())


def test_scanned_params_shard_by_the_table():
    mesh = AbstractMesh((2, 2, 2), MESH_AXES)
    assert partition_spec("params/layers/attn/q/kernel", (2, 32, 32), mesh) == P(
        None, "fsdp", "tensor")
    assert partition_spec("params/layers/mlp/down/kernel", (2, 64, 32), mesh) == P(
        None, "tensor", "fsdp")
    assert partition_spec("params/layers/attn_norm/scale", (2, 32), mesh) == P(None, None)
    abstract = jax.eval_shape(lambda: CausalLM(SCANNED).init(jax.random.key(0),
                                                             jnp.zeros((1, 4), jnp.int32)))
    shardings = tree_shardings(abstract, make_mesh())
    for s, x in zip(jax.tree.leaves(shardings), jax.tree.leaves(abstract), strict=True):
        assert len(s.spec) == x.ndim


def test_sixteen_scanned_layers_lower_to_one_loop():
    """The HLO of a 16-layer scanned model holds one layer's ops inside one while loop: as many
    matmuls as the 2-layer scanned model (compile time independent of depth)."""
    def hlo(n_layers):
        cfg = dataclasses.replace(SCANNED, n_layers=n_layers)
        tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
        p = jax.eval_shape(lambda: CausalLM(cfg).init(jax.random.key(0), jnp.zeros((1, 4),
                                                                                     jnp.int32)))
        return jax.jit(lambda p, t: CausalLM(cfg).apply(p, t)[0]).lower(p, tokens).as_text()

    deep, shallow = hlo(16), hlo(2)
    assert deep.count("stablehlo.while") == 1
    assert deep.count("stablehlo.dot_general") == shallow.count("stablehlo.dot_general")
    assert dataclasses.replace(CFG, n_layers=16, scan_layers=None).scanned
    assert not dataclasses.replace(CFG, n_layers=4, scan_layers=None).scanned


@pytest.mark.parametrize("field, value", [("param_dtype", "float16"), ("remat", "all"),
                                          ("scan_layers", "yes")])
def test_bad_scale_options_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"LMConfig.{field} must be"):
        dataclasses.replace(CFG, **{field: value})


def test_unstack_checks_the_layer_count(params):
    with pytest.raises(ValueError, match="n_layers=3"):
        unstack_layers(stack_layers(params, 2), 3)

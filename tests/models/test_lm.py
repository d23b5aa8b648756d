"""Tests for the causal LM: KV cache vs full forward, causality, padding, RoPE, RMSNorm, config."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from jaxrl_suite.models import CausalLM, LMConfig, apply_rope, init_cache, rms_norm, rope_cos_sin

TINY = LMConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=64)
CONFIGS = {
    "mha_tied": TINY,
    "gqa_untied_bias": dataclasses.replace(TINY, n_kv_heads=2, tie_embeddings=False, qkv_bias=True),
}


@functools.cache
def _params(cfg, seed=0):
    """Random params with embeddings scaled up so logits are far from uniform."""

    @jax.jit
    def init(rng):
        flat, unravel = ravel_pytree(CausalLM(cfg).init(rng, jnp.zeros((1, 4), jnp.int32)))
        # Perturb every leaf so norm scales and biases are non-trivial.
        params = unravel(flat + 0.1 * jax.random.normal(jax.random.fold_in(rng, 1), flat.shape))
        params["params"]["embed"]["embedding"] *= 5.0
        return params

    return init(jax.random.key(seed))


@functools.cache
def _apply(cfg):
    """Jitted CausalLM(cfg).apply, shared by the tests of one config."""
    return jax.jit(CausalLM(cfg).apply, static_argnames="return_hidden")


def _full(cfg, params, tokens, mask=None, **kw):
    """Full forward with explicit positions and key mask (one compile per config and shape)."""
    mask = jnp.ones(tokens.shape, bool) if mask is None else mask
    return _apply(cfg)(params, tokens, _positions(mask), mask, **kw)


def _positions(mask):
    """RoPE positions of left-padded rows: cumsum(mask) - 1, clipped at 0. [B, T] -> [B, T]."""
    return jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)


def _left_padded(rng, lengths, width, vocab):
    """Tokens and mask [B, width]; row b holds lengths[b] real tokens at the end."""
    tokens = np.asarray(jax.random.randint(rng, (len(lengths), width), 2, vocab))
    mask = np.arange(width)[None, :] >= width - np.asarray(lengths)[:, None]
    return jnp.asarray(np.where(mask, tokens, 0), jnp.int32), jnp.asarray(mask)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_cached_decoding_matches_full_forward(name):
    cfg = CONFIGS[name]
    params = _params(cfg)
    p, n = 7, 5
    prompt, prompt_mask = _left_padded(jax.random.key(3), [7, 5, 2], p, cfg.vocab_size)
    cont = jax.random.randint(jax.random.key(4), (3, n), 2, cfg.vocab_size)
    tokens = jnp.concatenate([prompt, cont], axis=1)  # [B, P+N]
    mask = jnp.concatenate([prompt_mask, jnp.ones((3, n), bool)], axis=1)
    full, none = _full(cfg, params, tokens, mask)
    assert none is None and full.shape == (3, p + n, cfg.vocab_size) and full.dtype == jnp.float32

    apply = jax.jit(CausalLM(cfg).apply)
    cache = init_cache(cfg, 3, p + n)
    pos = _positions(mask)
    logits, cache = apply(params, prompt, pos[:, :p], mask, cache, 0)
    real = np.asarray(prompt_mask)
    np.testing.assert_allclose(np.asarray(logits)[real], np.asarray(full[:, :p])[real], atol=1e-5)
    for i in range(n):
        slot = p + i
        logits, cache = apply(
            params,
            tokens[:, slot : slot + 1],
            pos[:, slot : slot + 1],
            mask,
            cache,
            jnp.int32(slot),
        )
        np.testing.assert_allclose(logits[:, 0], full[:, slot], atol=1e-5)
    assert apply._cache_size() == 2  # prefill and decode; the decode slot is traced


def test_return_hidden_and_cache_shapes():
    cfg = CONFIGS["gqa_untied_bias"]
    params = _params(cfg)
    tokens = jnp.ones((2, 10), jnp.int32)
    logits, _, hidden = _full(cfg, params, tokens, return_hidden=True)
    assert logits.shape == (2, 10, cfg.vocab_size) and hidden.shape == (2, 10, cfg.d_model)
    np.testing.assert_allclose(jnp.mean(hidden**2, -1), 1.0, rtol=0.3)  # RMS-normed (x scale)
    cache = init_cache(cfg, 2, 9)
    assert len(cache.k) == cfg.n_layers and cache.cache_len == 9
    assert cache.k[0].shape == (2, cfg.n_kv_heads, 9, cfg.resolved_head_dim)
    with pytest.raises(ValueError, match="max_len"):
        init_cache(cfg, 2, cfg.max_len + 1)


def test_param_tree_is_hf_mappable():
    cfg = CONFIGS["gqa_untied_bias"]
    p = _params(cfg)["params"]
    assert set(p) == {"embed", "layer_0", "layer_1", "final_norm", "lm_head"}
    layer = p["layer_0"]
    assert set(layer) == {"attn", "attn_norm", "mlp", "mlp_norm"}
    assert set(layer["attn"]) == {"q", "k", "v", "o"}
    assert set(layer["mlp"]) == {"gate", "up", "down"}
    hd = cfg.resolved_head_dim
    assert layer["attn"]["q"]["kernel"].shape == (cfg.d_model, cfg.n_heads * hd)
    assert layer["attn"]["k"]["bias"].shape == (cfg.n_kv_heads * hd,)
    assert "bias" not in layer["attn"]["o"]
    assert layer["mlp"]["down"]["kernel"].shape == (cfg.d_ff, cfg.d_model)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(p))


def test_causality():
    cfg = CONFIGS["gqa_untied_bias"]
    params = _params(cfg)
    tokens = jax.random.randint(jax.random.key(0), (2, 10), 2, cfg.vocab_size)
    changed = tokens.at[:, 6].set((tokens[:, 6] + 1) % cfg.vocab_size)
    a, _ = _full(cfg, params, tokens)
    b, _ = _full(cfg, params, changed)
    np.testing.assert_allclose(a[:, :6], b[:, :6], atol=1e-6)
    assert np.abs(np.asarray(a[:, 6:] - b[:, 6:])).max() > 1e-3


def test_left_padding_invariance():
    cfg = CONFIGS["mha_tied"]
    row = jax.random.randint(jax.random.key(1), (10,), 2, cfg.vocab_size)
    padded = jnp.concatenate([jnp.full((3,), 5, jnp.int32), row[:7]])  # pad token != 0
    mask = jnp.stack([jnp.ones(10, bool), jnp.arange(10) >= 3])
    logits, _ = _full(cfg, _params(cfg), jnp.stack([row, padded]), mask)
    np.testing.assert_allclose(logits[1, 3:], logits[0, :7], atol=1e-5)


def _rope_numpy(x, positions, theta):
    """Rotate each pair (x_i, x_{i+D/2}) by angle pos * theta^(-2i/D). x [B, T, H, D]."""
    d = x.shape[-1]
    out = np.empty_like(x)
    for i in range(d // 2):
        angle = positions[:, :, None] * theta ** (-2.0 * i / d)  # [B, T, 1]
        a, b = x[..., i], x[..., i + d // 2]
        out[..., i] = a * np.cos(angle) - b * np.sin(angle)
        out[..., i + d // 2] = b * np.cos(angle) + a * np.sin(angle)
    return out


def test_rope_matches_numpy_and_is_relative():
    x = np.asarray(jax.random.normal(jax.random.key(0), (2, 5, 3, 8)), np.float32)
    positions = np.array([[0, 1, 2, 3, 4], [7, 0, 0, 1, 30]])
    rope = jax.jit(lambda v, p: apply_rope(v, *rope_cos_sin(p, 8, 10000.0)))
    got = rope(jnp.asarray(x), jnp.asarray(positions))
    np.testing.assert_allclose(got, _rope_numpy(x, positions, 10000.0), atol=1e-5)
    # q.k after RoPE depends only on the position difference.
    q, k = x[:1, :1], x[:1, 1:2]
    dot = lambda pq, pk: np.sum(
        _rope_numpy(q, np.array([[pq]]), 1e4) * _rope_numpy(k, np.array([[pk]]), 1e4)
    )
    np.testing.assert_allclose(dot(10, 7), dot(3, 0), rtol=1e-4)
    assert abs(dot(10, 7) - dot(10, 6)) > 1e-3


def test_mrope_with_equal_axes_is_1d_rope_exactly():
    """Text tokens (t = h = w) under M-RoPE (`LMConfig.mrope_section`) get bit-identical rotary
    tables and logits to 1-D RoPE, whether their positions are given [B, T] or [B, T, 3]."""
    cfg = CONFIGS["gqa_untied_bias"]
    hd = cfg.resolved_head_dim  # 8: four frequencies
    positions = jnp.asarray(np.random.default_rng(0).integers(0, 60, (3, 7)), jnp.int32)
    both = jnp.repeat(positions[..., None], 3, axis=-1)  # [B, T, 3], t = h = w
    want = rope_cos_sin(positions, hd, cfg.rope_theta)
    tables = jax.jit(rope_cos_sin, static_argnums=(1, 2, 3))
    for section in ((1, 1, 2), (2, 1, 1)):
        for got in (rope_cos_sin(both, hd, cfg.rope_theta, section),
                    tables(both, hd, cfg.rope_theta, section)):
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
    mrope = dataclasses.replace(cfg, mrope_section=(1, 1, 2))
    tokens = jnp.asarray(np.random.default_rng(1).integers(2, 64, (3, 7)), jnp.int32)
    ref, _ = _apply(cfg)(_params(cfg), tokens, positions)
    for pos in (positions, both):
        got, _ = _apply(mrope)(_params(cfg), tokens, pos)
        np.testing.assert_array_equal(got, ref)
    with pytest.raises(ValueError, match="need LMConfig.mrope_section"):
        CausalLM(cfg).apply(_params(cfg), tokens, both)
    with pytest.raises(ValueError, match=r"mrope_section=\[1, 1, 1\] must be 3 parts .* = 4"):
        dataclasses.replace(cfg, mrope_section=(1, 1, 1))


def test_mrope_rotates_each_frequency_by_its_sections_axis():
    """Frequency i of M-RoPE turns by the axis (time, row, col) whose part of mrope_section
    holds i (HF `Qwen2VLRotaryEmbedding`), a loop over i."""
    hd, theta, section = 16, 100.0, (2, 3, 3)
    pos = np.array([[[5, 11, 17]]])
    cos, sin = rope_cos_sin(jnp.asarray(pos), hd, theta, section)
    axis = [0, 0, 1, 1, 1, 2, 2, 2]
    angles = np.array([pos[0, 0, axis[i]] * theta ** (-2 * i / hd) for i in range(hd // 2)] * 2)
    np.testing.assert_allclose(cos[0, 0], np.cos(angles), atol=1e-6)
    np.testing.assert_allclose(sin[0, 0], np.sin(angles), atol=1e-6)


def test_input_embeds_replace_the_token_embedding_where_masked():
    cfg = CONFIGS["gqa_untied_bias"]
    model, params = CausalLM(cfg), _params(cfg)
    tokens = jnp.asarray(np.random.default_rng(2).integers(2, 64, (2, 6)), jnp.int32)
    table = params["params"]["embed"]["embedding"]
    ref, _ = model.apply(params, tokens)
    none = jnp.zeros(tokens.shape, bool)
    got, _ = model.apply(params, tokens, input_embeds=jnp.ones((2, 6, 32)), embeds_mask=none)
    np.testing.assert_array_equal(got, ref)
    # token 7's embedding fed at (0, 2) and (1, 4) is token 7 there
    swapped = tokens.at[0, 2].set(7).at[1, 4].set(7)
    mask = none.at[0, 2].set(True).at[1, 4].set(True)
    got, _ = model.apply(params, tokens, input_embeds=jnp.broadcast_to(table[7], (2, 6, 32)),
                         embeds_mask=mask)
    np.testing.assert_allclose(got, model.apply(params, swapped)[0], atol=1e-6)


def test_rms_norm_matches_numpy():
    x = np.asarray(jax.random.normal(jax.random.key(0), (3, 7)), np.float32) * 3.0
    scale = np.linspace(0.5, 2.0, 7).astype(np.float32)
    expected = x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + 1e-6) * scale
    np.testing.assert_allclose(
        rms_norm(jnp.asarray(x), jnp.asarray(scale), 1e-6), expected, rtol=1e-5
    )


def test_bfloat16_compute_keeps_float32_params_and_logits():
    cfg = dataclasses.replace(TINY, dtype="bfloat16")
    params = _params(TINY)  # the parameter tree does not depend on the compute dtype
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
    tokens = jax.random.randint(jax.random.key(0), (2, 10), 2, cfg.vocab_size)
    logits, _ = _full(cfg, params, tokens)
    ref, _ = _full(TINY, params, tokens)
    assert logits.dtype == jnp.float32
    np.testing.assert_allclose(logits, ref, atol=0.5)


@pytest.mark.parametrize(
    "field, value",
    [
        ("n_kv_heads", 3),
        ("d_model", 0),
        ("n_layers", -1),
        ("vocab_size", 0),
        ("dtype", "float16"),
        ("head_dim", 5),
        ("norm_eps", 0.0),
        ("max_len", 0),
    ],
)
def test_bad_config_names_field(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(TINY, **{field: value})


def test_cache_requires_index():
    cfg = TINY
    params = _params(cfg)
    with pytest.raises(ValueError, match="cache_index"):
        CausalLM(cfg).apply(params, jnp.ones((1, 2), jnp.int32), cache=init_cache(cfg, 1, 4))


# Per-row cache positions: rows of one batch written and read at different slots.


def _stale_cache(cfg, batch, slots, seed=0):
    """A KVCache of random finite values: stale slots that the key mask and causality hide."""
    cache = init_cache(cfg, batch, slots)
    keys = jax.random.split(jax.random.key(seed), 2 * cfg.n_layers)
    fill = lambda bufs, ks: tuple(
        jax.random.normal(k, b.shape) for b, k in zip(bufs, ks, strict=True)
    )
    return cache._replace(k=fill(cache.k, keys[::2]), v=fill(cache.v, keys[1::2]))


def _assert_caches(a, b, equal):
    for x, y in zip((*a.k, *a.v), (*b.k, *b.v), strict=True):
        if equal:
            np.testing.assert_array_equal(x, y)
        else:
            np.testing.assert_allclose(x, y, atol=1e-5)


@pytest.mark.parametrize("t", [1, 3])
def test_per_row_equal_indices_are_bitwise_the_shared_scalar_index(t):
    cfg = CONFIGS["gqa_untied_bias"]
    params, apply = _params(cfg), _apply(cfg)
    b, p, s = 3, 5, 12
    prompt, prompt_mask = _left_padded(jax.random.key(5), [5, 3, 1], p, cfg.vocab_size)
    key_mask = jnp.concatenate([prompt_mask, jnp.ones((b, s - p), bool)], axis=1)  # [B, S]
    _, cache = apply(params, prompt, _positions(prompt_mask), key_mask,
                     _stale_cache(cfg, b, s), jnp.int32(0))
    new = jax.random.randint(jax.random.key(6), (b, t), 2, cfg.vocab_size)
    pos = prompt_mask.sum(1, keepdims=True) + jnp.arange(t)  # [B, T]
    for positions in (pos, None):  # explicit RoPE positions, and the default (the slots)
        scalar = apply(params, new, positions, key_mask, cache, jnp.int32(p))
        per_row = apply(params, new, positions, key_mask, cache, jnp.full((b,), p, jnp.int32))
        np.testing.assert_array_equal(per_row[0], scalar[0])
        _assert_caches(per_row[1], scalar[1], equal=True)


def _decode_rows(cfg, params, tokens, offsets, prompt_len, cache):
    """Prefill tokens[:, :prompt_len] at slots offsets[b]..., then feed the rest one token per
    call (per-row cache_index when `offsets` is a vector). Returns (logits [B, T, V], cache)."""
    apply, (b, t) = _apply(cfg), tokens.shape
    offsets = jnp.asarray(offsets, jnp.int32)
    slots = jnp.arange(cache.cache_len)
    key_mask = jnp.broadcast_to(slots >= offsets[..., None], (b, cache.cache_len))  # [B, S]
    pos = jnp.broadcast_to(jnp.arange(t), (b, t))  # RoPE positions count from each row's start
    logits, cache = apply(params, tokens[:, :prompt_len], pos[:, :prompt_len], key_mask, cache,
                          offsets)
    out = [logits]
    for i in range(prompt_len, t):
        logits, cache = apply(params, tokens[:, i : i + 1], pos[:, i : i + 1], key_mask, cache,
                              offsets + i)
        out.append(logits)
    return jnp.concatenate(out, axis=1), cache


def test_rows_at_different_offsets_equal_each_row_decoded_alone():
    cfg = CONFIGS["gqa_untied_bias"]
    params = _params(cfg)
    offsets, p, t, s = np.array([0, 3, 6]), 4, 7, 16
    tokens = jax.random.randint(jax.random.key(7), (3, t), 2, cfg.vocab_size)
    stale = _stale_cache(cfg, 3, s)
    logits, cache = _decode_rows(cfg, params, tokens, offsets, p, stale)
    for b, start in enumerate(offsets):
        alone, alone_cache = _decode_rows(cfg, params, tokens[b : b + 1], 0, p,
                                          init_cache(cfg, 1, s))
        np.testing.assert_allclose(logits[b], alone[0], atol=1e-5)
        written = slice(start, start + t)
        for buf, ref, old in zip((*cache.k, *cache.v), (*alone_cache.k, *alone_cache.v),
                                 (*stale.k, *stale.v), strict=True):
            np.testing.assert_allclose(buf[b, :, written], ref[0, :, :t], atol=1e-5)
            untouched = np.r_[0:start, start + t : s]  # the row's other slots keep their values
            np.testing.assert_array_equal(buf[b, :, untouched], old[b, :, untouched])
    assert not np.allclose(logits[0], logits[1], atol=1e-2)  # the rows really differ


@pytest.mark.parametrize("offsets", [0, np.array([0, 2, 5])], ids=["scalar", "per_row"])
def test_multi_token_cached_call_equals_single_token_calls(offsets):
    # A drafter's verification pass: k tokens in one cached call vs k one-token calls.
    cfg = CONFIGS["gqa_untied_bias"]
    params, apply = _params(cfg), _apply(cfg)
    p, k, s = 4, 3, 12
    tokens = jax.random.randint(jax.random.key(8), (3, p + k), 2, cfg.vocab_size)
    one_by_one, cache_a = _decode_rows(cfg, params, tokens, offsets, p, _stale_cache(cfg, 3, s))
    _, cache = _decode_rows(cfg, params, tokens[:, :p], offsets, p, _stale_cache(cfg, 3, s))
    idx = jnp.asarray(offsets, jnp.int32)
    key_mask = jnp.broadcast_to(jnp.arange(s) >= idx[..., None], (3, s))
    pos = jnp.broadcast_to(jnp.arange(p, p + k), (3, k))
    at_once, cache_b = apply(params, tokens[:, p:], pos, key_mask, cache, idx + p)
    # Not bitwise: the [B, k] and [B, 1] matmuls round differently on XLA:CPU.
    np.testing.assert_allclose(at_once, one_by_one[:, p:], atol=1e-5, rtol=0)
    _assert_caches(cache_b, cache_a, equal=False)


def test_bad_cache_index_shape_raises():
    cfg = TINY
    with pytest.raises(ValueError, match="cache_index"):
        CausalLM(cfg).apply(_params(cfg), jnp.ones((2, 1), jnp.int32), cache=init_cache(cfg, 2, 4),
                            cache_index=jnp.zeros((3,), jnp.int32))

"""Chunked log-probs and entropy: equal to the full-logits references, in value and gradient,
for both weight layouts, with less compiled temporary memory than the full [B, T, V] logits."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.losses.chunked import (
    chunked_logprobs_and_entropy,
    chunked_token_map,
    logprobs_and_entropy,
    project_logits,
)
from jaxrl_suite.losses.common import token_entropy, token_logprobs
from jaxrl_suite.models import CausalLM, LMConfig

B, T, D, V = 2, 24, 16, 50
LAYOUTS = [True, False]  # transpose_weight: tied table [V, D] / lm_head kernel [D, V]
CHUNKS = [8, 7, 64]  # divides T, leaves a remainder, larger than T


def _inputs(transpose_weight, seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), 5)
    hidden = jax.random.normal(k[0], (B, T, D))
    weight = jax.random.normal(k[1], (V, D) if transpose_weight else (D, V)) * 0.5
    targets = jax.random.randint(k[2], (B, T), 0, V)
    a = jax.random.normal(k[3], (B, T))
    b = jax.random.normal(k[4], (B, T))
    return hidden, weight, targets, a, b


def _full(hidden, weight, targets, *, transpose_weight, temperature=1.0, chunk=None):
    logits = project_logits(hidden, weight, transpose_weight=transpose_weight,
                            temperature=temperature)  # [B, T, V]
    return token_logprobs(logits, targets), token_entropy(logits)


def _loss(fn, hidden, weight, targets, a, b, temperature, *, chunk, transpose_weight):
    logp, ent = fn(hidden, weight, targets, chunk=chunk, transpose_weight=transpose_weight,
                   temperature=temperature)
    return jnp.sum(logp * a) + jnp.sum(ent * b)


STATIC = ("chunk", "transpose_weight")
chunked = jax.jit(chunked_logprobs_and_entropy, static_argnames=STATIC)
full = jax.jit(_full, static_argnames=STATIC)
chunked_grad = jax.jit(jax.grad(functools.partial(_loss, chunked_logprobs_and_entropy),
                                argnums=(0, 1)), static_argnames=STATIC)
full_grad = jax.jit(jax.grad(functools.partial(_loss, _full), argnums=(0, 1)),
                    static_argnames=STATIC)


@pytest.mark.parametrize("transpose_weight", LAYOUTS)
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_match_full_logits(transpose_weight, chunk, temperature):
    hidden, weight, targets, _, _ = _inputs(transpose_weight)
    logp, ent = chunked(hidden, weight, targets, chunk=chunk, transpose_weight=transpose_weight,
                        temperature=temperature)
    ref_logp, ref_ent = full(hidden, weight, targets, transpose_weight=transpose_weight,
                             temperature=temperature)
    assert logp.shape == ent.shape == (B, T) and logp.dtype == ent.dtype == jnp.float32
    np.testing.assert_allclose(logp, ref_logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, ref_ent, rtol=1e-5, atol=1e-5)
    assert float(jnp.std(ent)) > 0.01  # non-trivial: entropies differ between positions


def test_temperature_changes_the_values():
    hidden, weight, targets, _, _ = _inputs(True)
    hot = chunked(hidden, weight, targets, chunk=8, transpose_weight=True, temperature=2.0)
    cold = chunked(hidden, weight, targets, chunk=8, transpose_weight=True, temperature=0.5)
    assert float(jnp.mean(hot[1])) > float(jnp.mean(cold[1])) + 0.1  # hotter: higher entropy


@pytest.mark.parametrize("transpose_weight", LAYOUTS)
@pytest.mark.parametrize("chunk", [8, 7])
def test_gradients_match_full_logits(transpose_weight, chunk):
    args = _inputs(transpose_weight, seed=1)
    g_h, g_w = chunked_grad(*args, 0.8, chunk=chunk, transpose_weight=transpose_weight)
    r_h, r_w = full_grad(*args, 0.8, chunk=chunk, transpose_weight=transpose_weight)
    assert g_h.shape == (B, T, D) and g_w.shape == args[1].shape
    assert float(jnp.abs(r_h).max()) > 1e-3 and float(jnp.abs(r_w).max()) > 1e-3
    np.testing.assert_allclose(g_h, r_h, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(g_w, r_w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("tied", [True, False])
def test_matches_the_model_logits_in_bfloat16(tied):
    cfg = LMConfig(vocab_size=V, d_model=D, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32,
                   tie_embeddings=tied, dtype="bfloat16")
    model = CausalLM(cfg)
    tokens = jax.random.randint(jax.random.PRNGKey(2), (B, T), 0, V)
    params = jax.jit(model.init)(jax.random.PRNGKey(3), tokens)
    logits, _, hidden = jax.jit(functools.partial(model.apply, return_hidden=True))(params, tokens)
    p = params["params"]
    weight = p["embed"]["embedding"] if tied else p["lm_head"]["kernel"]
    assert hidden.dtype == jnp.bfloat16 and weight.dtype == jnp.float32
    np.testing.assert_allclose(project_logits(hidden, weight, transpose_weight=tied), logits,
                               rtol=1e-2, atol=1e-2)
    logp, ent = chunked(hidden, weight, tokens, chunk=7, transpose_weight=tied, temperature=1.0)
    np.testing.assert_allclose(logp, token_logprobs(logits, tokens), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, token_entropy(logits), rtol=1e-5, atol=1e-5)


def test_chunked_token_map_with_a_custom_callback():
    hidden, weight, targets, a, _ = _inputs(True)
    scale = a[..., None] * jnp.ones((B, T, 3))  # a float per-token input with a trailing axis

    def stats(logits, s):  # [B, c, V], [B, c, 3] -> {"max": [B, c], "top": [B, c, 3]}
        return {"max": logits.max(-1), "top": jax.lax.top_k(logits, 3)[0] * s}

    out = jax.jit(lambda h, w, s: chunked_token_map(stats, h, w, s, chunk=7,
                                                    transpose_weight=True))(hidden, weight, scale)
    ref = stats(project_logits(hidden, weight, transpose_weight=True), scale)
    assert out["max"].shape == (B, T) and out["top"].shape == (B, T, 3)
    np.testing.assert_allclose(out["max"], ref["max"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["top"], ref["top"], rtol=1e-5, atol=1e-5)


def test_block_callback_handles_masked_vocabulary():
    logits = jax.random.normal(jax.random.PRNGKey(4), (B, 3, V))
    logits = logits.at[..., :10].set(-jnp.inf)
    targets = jnp.full((B, 3), 12)
    logp, ent = jax.jit(logprobs_and_entropy)(logits, targets)
    np.testing.assert_allclose(logp, token_logprobs(logits, targets), rtol=1e-6)
    np.testing.assert_allclose(ent, token_entropy(logits), rtol=1e-6)
    g = jax.jit(jax.grad(lambda z: jnp.sum(logprobs_and_entropy(z, targets)[1])))(logits)
    assert bool(jnp.all(jnp.isfinite(g)))


def test_rejects_bad_shapes():
    hidden, weight, targets, _, _ = _inputs(True)
    with pytest.raises(ValueError, match="weight"):
        chunked_logprobs_and_entropy(hidden, weight.T, targets, chunk=8, transpose_weight=True)
    with pytest.raises(ValueError, match="targets"):
        chunked_logprobs_and_entropy(hidden, weight, targets[:, :5], chunk=8,
                                     transpose_weight=True)
    with pytest.raises(ValueError, match="chunk"):
        chunked_logprobs_and_entropy(hidden, weight, targets, chunk=0, transpose_weight=True)


def test_compiled_temp_memory_is_well_below_full_logits():
    b, t, d, v, chunk = 2, 256, 64, 32768, 32
    s = jax.ShapeDtypeStruct
    args = (s((b, t, d), jnp.float32), s((v, d), jnp.float32), s((b, t), jnp.int32),
            s((b, t), jnp.float32), s((b, t), jnp.float32), s((), jnp.float32))

    def temp_bytes(fn):
        loss = functools.partial(_loss, fn, chunk=chunk, transpose_weight=True)
        stats = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*args).compile().memory_analysis()
        if stats is None:
            pytest.skip("memory_analysis() is not available on this backend")
        return stats.temp_size_in_bytes

    chunked_bytes, full_bytes = temp_bytes(chunked_logprobs_and_entropy), temp_bytes(_full)
    one_logits = b * t * v * 4  # one [B, T, V] float32 tensor
    assert full_bytes >= one_logits  # the reference does hold the full logits
    assert chunked_bytes < full_bytes / 4
    assert chunked_bytes < one_logits

"""Tests for the KV-cache sampler: naive-loop equivalence, compile count, EOS, logprobs, filters."""

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from jaxrl_suite.models import CausalLM, LMConfig
from jaxrl_suite.sampling import generate, make_generate

gen = importlib.import_module("jaxrl_suite.sampling.generate")  # the package re-exports `generate`

CFG = LMConfig(vocab_size=48, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_len=32)
MODEL = CausalLM(CFG)
P, N = 6, 12


@jax.jit
def _init(rng):
    """Random params with embeddings scaled up so logits are far from uniform."""
    flat, unravel = ravel_pytree(MODEL.init(rng, jnp.zeros((1, 4), jnp.int32)))
    params = unravel(flat + 0.1 * jax.random.normal(jax.random.fold_in(rng, 1), flat.shape))
    params["params"]["embed"]["embedding"] *= 5.0
    return params


@functools.cache
def _params(seed=0):
    return _init(jax.random.key(seed))


def _prompts(lengths=(6, 4, 1, 5), seed=0, same=False):
    """Left-padded prompts [B, P] and mask [B, P]; `same` repeats one row's tokens."""
    tokens = np.asarray(jax.random.randint(jax.random.key(seed), (len(lengths), P), 2, 48))
    tokens = np.broadcast_to(tokens[:1], tokens.shape) if same else tokens
    mask = np.arange(P)[None, :] >= P - np.asarray(lengths)[:, None]
    return jnp.asarray(np.where(mask, tokens, 0), jnp.int32), jnp.asarray(mask)


@jax.jit
def _full_logits(params, tokens, mask):
    """Full forward over a fixed buffer [B, S]; mask marks the filled (non-pad) slots."""
    positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
    return MODEL.apply(params, tokens, positions, mask)[0]  # [B, S, V]


def _recompute_logits(params, prompt, prompt_mask, out):
    """Logits [B, N, V] that predicted each completion token, by one full forward."""
    tokens = jnp.concatenate([prompt, out.tokens], axis=1)
    mask = jnp.concatenate([prompt_mask, jnp.ones_like(out.tokens, bool)], axis=1)
    return _full_logits(params, tokens, mask)[:, P - 1 : -1]


def _check_logprobs(out, logits, temperature):
    """Reported logprobs equal log_softmax(logits / T) at the tokens on the mask, 0 off it."""
    expected = jnp.take_along_axis(
        jax.nn.log_softmax(logits / temperature, axis=-1), out.tokens[..., None], axis=-1
    )[..., 0]
    np.testing.assert_allclose(out.logprobs, expected * out.mask, atol=1e-5)
    np.testing.assert_array_equal(out.lengths, out.mask.sum(-1))


@functools.cache
def _sampler(**static):
    return make_generate(MODEL, max_new_tokens=N, **static)


def test_greedy_matches_naive_recompute_loop():
    params = _params()
    prompt, prompt_mask = _prompts()
    out = _sampler(greedy=True, eos_id=-1)(params, prompt, prompt_mask, jax.random.key(0))
    b = prompt.shape[0]
    buf = jnp.concatenate([prompt, jnp.zeros((b, N), jnp.int32)], axis=1)  # [B, P+N]
    filled = jnp.concatenate([prompt_mask, jnp.zeros((b, N), bool)], axis=1)
    for i in range(N):  # recompute the whole prefix at every step
        nxt = jnp.argmax(_full_logits(params, buf, filled)[:, P + i - 1], axis=-1)
        buf, filled = buf.at[:, P + i].set(nxt), filled.at[:, P + i].set(True)
    np.testing.assert_array_equal(out.tokens, buf[:, P:])
    np.testing.assert_array_equal(out.mask, 1.0)
    np.testing.assert_array_equal(out.lengths, N)
    assert len(set(np.asarray(out.tokens).ravel().tolist())) > 3  # not a degenerate model


def test_make_generate_traces_once(monkeypatch):
    traces = []
    real = gen.generate

    @functools.wraps(real)
    def counting(*args, **kwargs):
        traces.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(gen, "generate", counting)
    fn = gen.make_generate(MODEL, max_new_tokens=4, temperature=0.9)  # no top-k/top-p filter
    prompt, prompt_mask = _prompts()
    fn(_params(0), prompt, prompt_mask, jax.random.key(0))
    out = fn(_params(1), prompt + 1, prompt_mask, jax.random.key(1))
    assert len(traces) == 1 and fn._cache_size() == 1
    assert out.tokens.shape == (4, 4) and out.tokens.dtype == jnp.int32
    _check_logprobs(out, _recompute_logits(_params(1), prompt + 1, prompt_mask, out), 0.9)


def test_eos_stops_rows_and_pads():
    params = _params()
    prompt, prompt_mask = _prompts()
    ref = np.asarray(
        _sampler(greedy=True, eos_id=-1)(params, prompt, prompt_mask, jax.random.key(0)).tokens
    )
    eos = int(ref[0, 3])  # row 0 surely emits this token at step <= 3
    out = _sampler(greedy=True, eos_id=eos, pad_id=47)(
        params, prompt, prompt_mask, jax.random.key(0)
    )
    assert eos != 47
    for row, got_tok, got_mask, got_lp, length in zip(
        ref,
        np.asarray(out.tokens),
        np.asarray(out.mask),
        np.asarray(out.logprobs),
        np.asarray(out.lengths),
        strict=True,
    ):
        hits = np.flatnonzero(row == eos)
        n_live = hits[0] + 1 if hits.size else N
        assert length == n_live
        np.testing.assert_array_equal(got_tok[:n_live], row[:n_live])
        np.testing.assert_array_equal(got_tok[n_live:], 47)
        np.testing.assert_array_equal(got_mask, np.arange(N) < n_live)
        assert np.all(got_lp[n_live:] == 0.0) and np.all(got_lp[:n_live] < 0.0)
    assert out.lengths[0] <= 4


def test_all_rows_stop_at_first_token():
    params = _params()
    prompt, prompt_mask = _prompts(lengths=(6, 6, 6, 6), same=True)
    first = int(
        _sampler(greedy=True, eos_id=-1)(params, prompt, prompt_mask, jax.random.key(0)).tokens[
            0, 0
        ]
    )
    out = _sampler(greedy=True, eos_id=first)(params, prompt, prompt_mask, jax.random.key(0))
    np.testing.assert_array_equal(out.lengths, 1)
    np.testing.assert_array_equal(out.tokens[:, 1:], 0)


def test_logprobs_match_full_forward_recompute():
    params = _params()
    prompt, prompt_mask = _prompts()
    temperature, top_k = 0.7, 10
    out = _sampler(temperature=temperature, top_k=top_k, top_p=0.9, eos_id=3)(
        params, prompt, prompt_mask, jax.random.key(7)
    )
    logits = _recompute_logits(params, prompt, prompt_mask, out)
    _check_logprobs(out, logits, temperature)
    assert np.all(out.logprobs <= 0.0) and float(out.mask.sum()) > 4
    # Every live token is within the top-k of its logits.
    rank = jnp.sum(logits > jnp.take_along_axis(logits, out.tokens[..., None], -1), -1)
    assert np.all(np.asarray(rank)[np.asarray(out.mask) > 0] < top_k)


@pytest.mark.parametrize("filters", [dict(top_k=1), dict(top_p=1e-6)])
def test_degenerate_filters_equal_greedy(filters):
    params = _params()
    prompt, prompt_mask = _prompts()
    greedy = _sampler(greedy=True, eos_id=-1)(params, prompt, prompt_mask, jax.random.key(0))
    sampled = _sampler(temperature=1.5, eos_id=-1, **filters)(
        params, prompt, prompt_mask, jax.random.key(5)
    )
    np.testing.assert_array_equal(sampled.tokens, greedy.tokens)


def test_top_k_samples_stay_in_top_k_with_right_frequencies():
    params = _params()
    b, k = 512, 3
    prompt, prompt_mask = _prompts(lengths=(3,) * b, same=True)
    fn = make_generate(MODEL, max_new_tokens=1, top_k=k, temperature=2.0, eos_id=-1)
    out = fn(params, prompt, prompt_mask, jax.random.key(11))
    logits = _full_logits(params, prompt, prompt_mask)[0, -1] / 2.0  # [V]
    top = np.argsort(-np.asarray(logits))[:k]
    toks = np.asarray(out.tokens[:, 0])
    assert set(toks.tolist()) <= set(top.tolist()) and len(set(toks.tolist())) > 1
    probs = np.asarray(jax.nn.softmax(logits[top]))
    freqs = np.array([(toks == t).mean() for t in top])
    np.testing.assert_allclose(freqs, probs, atol=0.07)


def test_sample_draw_equals_jax_random_categorical():
    @jax.jit
    def both(logits, key):
        tok, logp = gen._sample(logits, key, temperature=0.8, top_k=7, top_p=0.8, greedy=False)
        filtered = gen._filter_logits(logits / 0.8, 7, 0.8)
        expected = jnp.take_along_axis(jax.nn.log_softmax(logits / 0.8), tok[:, None], -1)
        return tok, jax.random.categorical(key, filtered, axis=-1), logp, expected[:, 0]

    logits = jnp.asarray(np.random.default_rng(0).normal(size=(64, 48)) * 3.0, jnp.float32)
    tok, ref_tok, logp, ref_logp = both(logits, jax.random.key(2))
    np.testing.assert_array_equal(tok, ref_tok)
    np.testing.assert_allclose(logp, ref_logp, atol=1e-6)


def test_filter_logits_keeps_nucleus_and_top_k():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    keep = lambda **kw: np.isfinite(np.asarray(gen._filter_logits(logits, **kw)))[0].tolist()
    assert keep(top_k=0, top_p=0.7) == [True, True, False, False]
    assert keep(top_k=0, top_p=0.5) == [True, False, False, False]
    assert keep(top_k=0, top_p=0.81) == [True, True, True, False]
    assert keep(top_k=2, top_p=1.0) == [True, True, False, False]
    # The nucleus is taken over the renormalised top-3 ([.526, .316, .158]).
    assert keep(top_k=3, top_p=0.83) == [True, True, False, False]


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(max_new_tokens=0), ValueError),
        (dict(max_new_tokens=4, temperature=0.0), ValueError),
        (dict(max_new_tokens=4, top_p=0.0), ValueError),
        (dict(max_new_tokens=4, top_k=-1), ValueError),
        (dict(max_new_tokens=4, beam_width=2), TypeError),
        (dict(), TypeError),
    ],
)
def test_bad_options_raise(kwargs, error):
    with pytest.raises(error):
        make_generate(MODEL, **kwargs)


def test_too_long_for_max_len_raises():
    prompt, prompt_mask = _prompts()
    with pytest.raises(ValueError, match="max_len"):
        generate(MODEL, _params(), prompt, prompt_mask, jax.random.key(0), max_new_tokens=40)

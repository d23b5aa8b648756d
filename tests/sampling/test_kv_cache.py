"""KVCacheSampler: recompute-loop equivalence, compile count, EOS, logprobs, filters, options."""

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lm_helpers import peaked_params

from jaxrl_suite.models import CausalLM, LMConfig
from jaxrl_suite.sampling import GenerateOutput, KVCacheSampler

kv = importlib.import_module("jaxrl_suite.sampling.kv_cache")

CFG = LMConfig(vocab_size=48, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_len=32)
MODEL = CausalLM(CFG)
P, N = 6, 12


@jax.jit
def _init(rng):
    """Random params with embeddings scaled up so logits are far from uniform."""
    return peaked_params(MODEL, rng)


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


def _np_filter(scaled, top_k, top_p):
    """numpy top-k then nucleus filter of one row [V]: the smallest top set with mass >= top_p."""
    order = np.argsort(-scaled, kind="stable")
    keep = order[: top_k or scaled.size]
    if top_p < 1.0:
        vals = scaled[keep].astype(np.float64)
        probs = np.exp(vals - vals.max())
        probs /= probs.sum()
        before = np.cumsum(probs) - probs
        keep = keep[before < top_p]
    out = np.full_like(scaled, -np.inf)
    out[keep] = scaled[keep]
    return out


def _reference_sample(params, prompt, prompt_mask, rng, *, temperature, top_k, top_p, eos_id,
                      pad_id=0):
    """Straightforward decoding: a full forward over the whole prefix at every step, the numpy
    filter, token n of row b drawn by jax.random.categorical with key fold_in(fold_in(rng, b), n)
    (the per-sequence key scheme), EOS then pad."""
    b = prompt.shape[0]
    buf = jnp.concatenate([prompt, jnp.zeros((b, N), jnp.int32)], axis=1)  # [B, P+N]
    filled = jnp.concatenate([prompt_mask, jnp.zeros((b, N), bool)], axis=1)
    tokens = np.full((b, N), pad_id, np.int32)
    logprobs, mask = np.zeros((b, N), np.float32), np.zeros((b, N), np.float32)
    done = np.zeros(b, bool)
    for i in range(N):
        scaled = np.asarray(_full_logits(params, buf, filled)[:, P + i - 1]) / temperature
        filtered = np.stack([_np_filter(row, top_k, top_p) for row in scaled])
        tok = np.array([jax.random.categorical(
            jax.random.fold_in(jax.random.fold_in(rng, r), i), filtered[r]) for r in range(b)])
        logp = np.asarray(jax.nn.log_softmax(scaled, axis=-1))[np.arange(b), tok]
        tokens[:, i] = np.where(done, pad_id, tok)
        logprobs[:, i] = np.where(done, 0.0, logp)
        mask[:, i] = ~done
        done |= tok == eos_id
        buf, filled = buf.at[:, P + i].set(tok), filled.at[:, P + i].set(True)
    return tokens, logprobs, mask


# One sampler object per static setting, shared by the tests (one compile each).
GREEDY = KVCacheSampler(MODEL, max_new_tokens=N, eos_id=-1, pad_id=0, greedy=True)
SAMPLED = KVCacheSampler(MODEL, max_new_tokens=N, eos_id=-1, pad_id=0)
TOP_K = KVCacheSampler(MODEL, max_new_tokens=N, eos_id=42, pad_id=0, top_k=10)


def test_greedy_matches_naive_recompute_loop():
    params = _params()
    prompt, prompt_mask = _prompts()
    out = GREEDY(params, prompt, prompt_mask, jax.random.key(0))
    assert isinstance(out, GenerateOutput)
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


@pytest.mark.parametrize("sampler, temperature, top_p, seed", [
    ("SAMPLED", 1.0, 1.0, 7),  # the default settings of the object
    ("SAMPLED", 0.7, 0.9, 8),  # call-time overrides, same program
    ("SAMPLED", 1.6, 0.5, 9),
    ("TOP_K", 1.3, 0.8, 10),   # top-k, then the nucleus of the renormalised top-k; EOS = 42
])
def test_sampled_matches_reference_loop(sampler, temperature, top_p, seed):
    sampler = {"SAMPLED": SAMPLED, "TOP_K": TOP_K}[sampler]
    params, rng = _params(), jax.random.key(seed)
    prompt, prompt_mask = _prompts(lengths=(6, 4, 1, 5, 2, 6, 3, 5))
    overrides = {} if (temperature, top_p) == (1.0, 1.0) else dict(temperature=temperature,
                                                                  top_p=top_p)
    out = sampler(params, prompt, prompt_mask, rng, **overrides)
    tokens, logprobs, mask = _reference_sample(
        params, prompt, prompt_mask, rng, temperature=temperature, top_k=sampler.top_k,
        top_p=top_p, eos_id=sampler.eos_id)
    np.testing.assert_array_equal(out.tokens, tokens)  # same draws: same RNG path and filter
    np.testing.assert_array_equal(out.mask, mask)
    np.testing.assert_allclose(out.logprobs, logprobs, atol=1e-5)
    np.testing.assert_array_equal(out.lengths, mask.sum(-1))
    assert len(set(tokens.ravel().tolist())) > 5  # really sampled
    if sampler is TOP_K:
        assert 0 < mask.sum() < mask.size  # EOS stopped some rows early


def test_temperature_and_top_p_are_traced_one_compile(monkeypatch):
    traces = []
    real = kv.generate_tokens

    @functools.wraps(real)
    def counting(*args, **kwargs):
        traces.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(kv, "generate_tokens", counting)
    sampler = KVCacheSampler(MODEL, max_new_tokens=4, eos_id=-1, pad_id=0, top_k=5)
    prompt, prompt_mask = _prompts()
    outs = [sampler(_params(0), prompt, prompt_mask, jax.random.key(0))]
    for temperature, top_p in [(0.5, 0.9), (1.7, 1.0), (jnp.float32(0.9), jnp.float32(0.3))]:
        outs.append(sampler(_params(1), prompt + 1, prompt_mask, jax.random.key(0),
                            temperature=temperature, top_p=top_p))
    assert len(traces) == 1 and sampler._generate._cache_size() == 1
    assert outs[0].tokens.shape == (4, 4) and outs[0].tokens.dtype == jnp.int32
    # The settings reached the program: each call's logprobs are at its own temperature.
    _check_logprobs(outs[3], _recompute_logits(_params(1), prompt + 1, prompt_mask, outs[3]), 0.9)
    _check_logprobs(outs[1], _recompute_logits(_params(1), prompt + 1, prompt_mask, outs[1]), 0.5)


def test_eos_stops_rows_and_pads():
    params = _params()
    prompt, prompt_mask = _prompts()
    ref = np.asarray(GREEDY(params, prompt, prompt_mask, jax.random.key(0)).tokens)
    eos = int(ref[0, 3])  # row 0 surely emits this token at step <= 3
    sampler = KVCacheSampler(MODEL, max_new_tokens=N, eos_id=eos, pad_id=47, greedy=True)
    out = sampler(params, prompt, prompt_mask, jax.random.key(0))
    assert eos != 47
    for row, got_tok, got_mask, got_lp, length in zip(
        ref, np.asarray(out.tokens), np.asarray(out.mask), np.asarray(out.logprobs),
        np.asarray(out.lengths), strict=True,
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
    first = int(GREEDY(params, prompt, prompt_mask, jax.random.key(0)).tokens[0, 0])
    sampler = KVCacheSampler(MODEL, max_new_tokens=N, eos_id=first, pad_id=0, greedy=True)
    out = sampler(params, prompt, prompt_mask, jax.random.key(0))
    np.testing.assert_array_equal(out.lengths, 1)
    np.testing.assert_array_equal(out.tokens[:, 1:], 0)


def test_greedy_logprobs_are_at_the_temperature():
    params = _params()
    prompt, prompt_mask = _prompts()
    out = GREEDY(params, prompt, prompt_mask, jax.random.key(0), temperature=0.6)
    np.testing.assert_array_equal(
        out.tokens, GREEDY(params, prompt, prompt_mask, jax.random.key(3)).tokens)
    _check_logprobs(out, _recompute_logits(params, prompt, prompt_mask, out), 0.6)


def test_logprobs_match_full_forward_recompute():
    params = _params()
    prompt, prompt_mask = _prompts()
    out = TOP_K(params, prompt, prompt_mask, jax.random.key(7), temperature=0.7, top_p=0.9)
    logits = _recompute_logits(params, prompt, prompt_mask, out)
    _check_logprobs(out, logits, 0.7)
    assert np.all(out.logprobs <= 0.0) and float(out.mask.sum()) > 4
    # Every live token is within the top-k of its logits.
    rank = jnp.sum(logits > jnp.take_along_axis(logits, out.tokens[..., None], -1), -1)
    assert np.all(np.asarray(rank)[np.asarray(out.mask) > 0] < 10)


def test_degenerate_filters_equal_greedy():
    params = _params()
    prompt, prompt_mask = _prompts()
    greedy = GREEDY(params, prompt, prompt_mask, jax.random.key(0))
    top1 = KVCacheSampler(MODEL, max_new_tokens=N, eos_id=-1, pad_id=0, top_k=1)
    for sampled in (
        top1(params, prompt, prompt_mask, jax.random.key(5), temperature=1.5),
        SAMPLED(params, prompt, prompt_mask, jax.random.key(5), temperature=1.5, top_p=1e-6),
    ):
        np.testing.assert_array_equal(sampled.tokens, greedy.tokens)


def test_top_k_samples_stay_in_top_k_with_right_frequencies():
    params = _params()
    b, k = 512, 3
    prompt, prompt_mask = _prompts(lengths=(3,) * b, same=True)
    sampler = KVCacheSampler(MODEL, max_new_tokens=1, top_k=k, temperature=2.0, eos_id=-1,
                             pad_id=0)
    out = sampler(params, prompt, prompt_mask, jax.random.key(11))
    logits = _full_logits(params, prompt, prompt_mask)[0, -1] / 2.0  # [V]
    top = np.argsort(-np.asarray(logits))[:k]
    toks = np.asarray(out.tokens[:, 0])
    assert set(toks.tolist()) <= set(top.tolist()) and len(set(toks.tolist())) > 1
    probs = np.asarray(jax.nn.softmax(logits[top]))
    freqs = np.array([(toks == t).mean() for t in top])
    np.testing.assert_allclose(freqs, probs, atol=0.07)


def test_sample_draw_equals_jax_random_categorical():
    @jax.jit
    def both(logits, key, temperature, top_p):
        keys = jax.random.split(key, logits.shape[0])
        tok, logp = kv.sample_tokens(logits, keys, temperature, top_p, top_k=7, greedy=False)
        filtered = kv.filter_logits(logits / temperature, 7, top_p)
        expected = jnp.take_along_axis(jax.nn.log_softmax(logits / temperature), tok[:, None], -1)
        ref = jax.vmap(jax.random.categorical)(keys, filtered)  # row b drawn with keys[b]
        return tok, ref, logp, expected[:, 0]

    logits = jnp.asarray(np.random.default_rng(0).normal(size=(64, 48)) * 3.0, jnp.float32)
    tok, ref_tok, logp, ref_logp = both(logits, jax.random.key(2), 0.8, 0.8)
    np.testing.assert_array_equal(tok, ref_tok)
    np.testing.assert_allclose(logp, ref_logp, atol=1e-6)


@jax.jit
def _filter(logits, top_p):
    return kv.filter_logits(logits, 0, top_p)


def test_filter_logits_keeps_nucleus_and_top_k():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    keep = lambda x: np.isfinite(np.asarray(x))[0].tolist()
    assert keep(_filter(logits, 0.7)) == [True, True, False, False]  # traced top_p
    assert keep(_filter(logits, 0.5)) == [True, False, False, False]
    assert keep(_filter(logits, 0.81)) == [True, True, True, False]
    assert keep(kv.filter_logits(logits, 2, 1.0)) == [True, True, False, False]
    # The nucleus is taken over the renormalised top-3 ([.526, .316, .158]).
    assert keep(kv.filter_logits(logits, 3, 0.83)) == [True, True, False, False]


def test_filter_at_top_p_one_is_the_identity_or_plain_top_k():
    # A long tail of tiny probabilities: the float32 cumulative mass reaches 1 before the last
    # tokens, so a nucleus filter at top_p = 1 would drop them. top_p >= 1 must not filter.
    logits = jnp.asarray(np.concatenate([[30.0], np.linspace(-5, 0, 199)])[None], jnp.float32)
    np.testing.assert_array_equal(_filter(logits, jnp.float32(1.0)), logits)  # bitwise
    below_one = jnp.nextafter(jnp.float32(1.0), jnp.float32(0.0))
    assert np.isfinite(np.asarray(_filter(logits, below_one))).sum() < 200  # the nucleus would
    top5 = jax.jit(lambda x, p: kv.filter_logits(x, 5, p))(logits, 1.0)
    expected = np.where(np.asarray(logits) >= np.sort(np.asarray(logits))[0, -5], logits, -np.inf)
    np.testing.assert_array_equal(top5, expected)


@pytest.mark.parametrize("kwargs, error", [
    (dict(max_new_tokens=0), ValueError),
    (dict(max_new_tokens=4, temperature=0.0), ValueError),
    (dict(max_new_tokens=4, top_p=0.0), ValueError),
    (dict(max_new_tokens=4, top_p=1.5), ValueError),
    (dict(max_new_tokens=4, top_k=-1), ValueError),
    (dict(max_new_tokens=4, beam_width=2), TypeError),
    (dict(eos_id=1), TypeError),
])
def test_bad_options_raise_at_construction(kwargs, error):
    kwargs = {"eos_id": 1, "pad_id": 0, **kwargs}
    with pytest.raises(error):
        KVCacheSampler(MODEL, **kwargs)


@pytest.mark.parametrize("override", [dict(temperature=-1.0), dict(top_p=0.0),
                                      dict(top_p=2.0)])
def test_bad_call_settings_raise(override):
    prompt, prompt_mask = _prompts()
    with pytest.raises(ValueError, match=next(iter(override))):
        SAMPLED(_params(), prompt, prompt_mask, jax.random.key(0), **override)


def test_too_long_for_max_len_raises():
    prompt, prompt_mask = _prompts()
    sampler = KVCacheSampler(MODEL, max_new_tokens=40, eos_id=1, pad_id=0)
    with pytest.raises(ValueError, match="max_len"):
        sampler(_params(), prompt, prompt_mask, jax.random.key(0))


def test_keys_are_per_sequence_not_per_row():
    """A sequence's draws depend on (rng, seq_id) alone: a permuted batch with the same seq_ids,
    and a sub-batch, give the same completions row for row."""
    params, rng = _params(), jax.random.key(11)
    prompt, prompt_mask = _prompts(lengths=(6, 4, 1, 5, 2, 6, 3, 5))
    full = SAMPLED(params, prompt, prompt_mask, rng)
    perm = np.array([5, 2, 7, 0, 1, 6, 4, 3])
    shuffled = SAMPLED(params, prompt[perm], prompt_mask[perm], rng, seq_ids=perm)
    np.testing.assert_array_equal(shuffled.tokens, np.asarray(full.tokens)[perm])
    np.testing.assert_allclose(shuffled.logprobs, np.asarray(full.logprobs)[perm], atol=1e-5)
    half = SAMPLED(params, prompt[4:], prompt_mask[4:], rng, seq_ids=np.arange(4, 8))
    np.testing.assert_array_equal(half.tokens, np.asarray(full.tokens)[4:])
    other = SAMPLED(params, prompt, prompt_mask, rng, seq_ids=np.arange(8) + 100)
    assert not np.array_equal(other.tokens, full.tokens)  # the ids really key the draws
    with pytest.raises(ValueError, match=r"seq_ids must have shape \(B,\) = \(8,\)"):
        SAMPLED(params, prompt, prompt_mask, rng, seq_ids=np.arange(3))

"""Jitted batched sampling from `CausalLM` with a KV cache.

The prompt [B, P] (left-padded) is prefilled in one call into a cache of S = P + N slots, then
tokens are decoded one at a time in a `lax.while_loop` that stops as soon as every row has
emitted EOS. Per step n the key is fold_in(rng, n); the token is drawn from
softmax(filter(logits / temperature)) with optional top-k and nucleus (top-p, arXiv:1904.09751)
filters, and its log-probability is reported under the UNFILTERED log_softmax(logits /
temperature), so it equals a later full-forward recompute at the same temperature.
"""

from __future__ import annotations

import functools
import inspect
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxrl_suite.models.lm import CausalLM, init_cache


class GenerateOutput(NamedTuple):
    """Completions of `generate`; N = max_new_tokens."""

    tokens: jax.Array  # [B, N] int32 completion tokens; pad_id after EOS
    logprobs: jax.Array  # [B, N] float32 log softmax(logits / T)[token], unfiltered; 0 off-mask
    mask: jax.Array  # [B, N] float32 1 for tokens up to and including the first EOS, else 0
    lengths: jax.Array  # [B] int32 = mask.sum(-1)


def _filter_logits(scaled: jax.Array, top_k: int, top_p: float) -> jax.Array:
    """Set logits outside the top-k / nucleus (top-p) set to -inf. [B, V] -> [B, V].

    top_k = 0 and top_p = 1.0 switch the filters off. The nucleus is the smallest set of most
    likely tokens (after top-k) whose probability reaches top_p; the top token is always kept.
    """
    vocab = scaled.shape[-1]
    k = top_k if 0 < top_k < vocab else 0
    if k == 0 and top_p >= 1.0:
        return scaled
    if top_p < 1.0:
        vals = lax.top_k(scaled, k or vocab)[0]  # [B, k] descending
        probs = jax.nn.softmax(vals, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs  # exclusive cumsum; 0 for the top token
        keep = mass_before < top_p
        threshold = jnp.min(jnp.where(keep, vals, jnp.inf), axis=-1, keepdims=True)  # [B, 1]
    else:
        threshold = lax.top_k(scaled, k)[0][:, -1:]  # [B, 1] k-th largest
    return jnp.where(scaled < threshold, -jnp.inf, scaled)


def _argmax(x: jax.Array) -> jax.Array:
    """First index of the maximum over the last axis, [B, V] -> [B] int32, as `jnp.argmax`.

    Written as two plain reductions (max, then min index where equal), which XLA:CPU vectorises;
    the variadic (value, index) reduce behind `jnp.argmax` runs as a scalar loop.
    """
    top = jnp.max(x, axis=-1, keepdims=True)
    index = jnp.arange(x.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where(x == top, index, x.shape[-1]), axis=-1)


def _sample(logits, key, *, temperature, top_k, top_p, greedy):
    """Pick tokens from logits [B, V]; returns (tokens [B] int32, unfiltered logprobs [B])."""
    scaled = logits / temperature
    if greedy:
        tok = _argmax(logits)
    else:
        # Gumbel-max: the same draw as jax.random.categorical(key, filtered), with a faster argmax.
        filtered = _filter_logits(scaled, top_k, top_p)
        tok = _argmax(filtered + jax.random.gumbel(key, filtered.shape, filtered.dtype))
    logp = jax.nn.log_softmax(scaled, axis=-1)
    return tok, jnp.take_along_axis(logp, tok[:, None], axis=-1)[:, 0]


def _check_options(max_new_tokens, temperature, top_k, top_p):
    """Raise ValueError for sampling options outside their ranges."""
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
    if temperature <= 0:  # greedy too: its logprobs are reported at this temperature
        raise ValueError(f"temperature must be positive, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")


def generate(
    model: CausalLM,
    params,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    rng: jax.Array,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_id: int = 1,
    pad_id: int = 0,
    greedy: bool = False,
) -> GenerateOutput:
    """Sample max_new_tokens = N completion tokens for left-padded prompts [B, P].

    prompt_mask [B, P] is 1/True on real tokens; RoPE positions are cumsum(mask) - 1 per row.
    Traceable: jit it with everything after `rng` static (see `make_generate`).
    Returns a `GenerateOutput` of [B, N] tokens/logprobs/mask and [B] lengths.
    """
    _check_options(max_new_tokens, temperature, top_k, top_p)
    cfg = model.config
    b, p = prompt_tokens.shape
    if prompt_mask.shape != (b, p):
        raise ValueError(f"prompt_mask shape {prompt_mask.shape} != prompt_tokens shape {(b, p)}")
    n = max_new_tokens
    prompt_tokens = prompt_tokens.astype(jnp.int32)
    prompt_mask = prompt_mask.astype(bool)
    sample = functools.partial(
        _sample, temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy
    )

    key_mask = jnp.concatenate([prompt_mask, jnp.ones((b, n), bool)], axis=1)  # [B, S]
    positions = jnp.maximum(jnp.cumsum(prompt_mask, axis=1, dtype=jnp.int32) - 1, 0)  # [B, P]
    next_pos = jnp.sum(prompt_mask, axis=1, dtype=jnp.int32)  # [B] position of completion 0
    cache = init_cache(cfg, b, p + n, cfg.compute_dtype)
    logits, cache = model.apply(params, prompt_tokens, positions, key_mask, cache, 0)

    tok, logp = sample(logits[:, -1], jax.random.fold_in(rng, 0))
    done = tok == eos_id
    tokens = jnp.full((b, n), pad_id, jnp.int32).at[:, 0].set(tok)
    logprobs = jnp.zeros((b, n), jnp.float32).at[:, 0].set(logp)
    live = jnp.zeros((b, n), bool).at[:, 0].set(True)

    def cond(state):
        step, _, _, done, *_ = state
        return (step < n) & ~jnp.all(done)

    def body(state):
        step, cache, tok, done, tokens, logprobs, live = state
        # Feed completion token step-1 (slot P+step-1, position next_pos+step-1), sample `step`.
        logits, cache = model.apply(
            params, tok[:, None], (next_pos + step - 1)[:, None], key_mask, cache, p + step - 1
        )
        new, logp = sample(logits[:, 0], jax.random.fold_in(rng, step))
        new = jnp.where(done, pad_id, new)
        alive = ~done
        tokens = lax.dynamic_update_slice(tokens, new[:, None], (0, step))
        logp = jnp.where(alive, logp, 0.0)
        logprobs = lax.dynamic_update_slice(logprobs, logp[:, None], (0, step))
        live = lax.dynamic_update_slice(live, alive[:, None], (0, step))
        done = done | (new == eos_id)
        return step + 1, cache, new, done, tokens, logprobs, live

    state = (jnp.int32(1), cache, tok, done, tokens, logprobs, live)
    _, _, _, _, tokens, logprobs, live = lax.while_loop(cond, body, state)
    mask = live.astype(jnp.float32)
    return GenerateOutput(tokens, logprobs, mask, jnp.sum(live, axis=1, dtype=jnp.int32))


def make_generate(model: CausalLM, **static):
    """Return jit(fn)(params, prompt_tokens, prompt_mask, rng) -> GenerateOutput.

    `static` holds the keyword arguments of `generate` (max_new_tokens, temperature, top_k, top_p,
    eos_id, pad_id, greedy), baked in at trace time; the function compiles once per input shape.
    """
    # Fail here, not at the first call: unknown/missing options raise TypeError, bad values
    # ValueError.
    bound = inspect.signature(generate).bind(model, None, None, None, None, **static)
    bound.apply_defaults()
    _check_options(*(bound.arguments[k] for k in inspect.signature(_check_options).parameters))

    def fn(params, prompt_tokens, prompt_mask, rng):
        return generate(model, params, prompt_tokens, prompt_mask, rng, **static)

    return jax.jit(fn)


__all__ = ["GenerateOutput", "generate", "make_generate"]

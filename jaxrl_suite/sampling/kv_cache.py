"""The default `Sampler`: jitted batched sampling from `CausalLM` with a static KV cache.

The prompt [B, P] (left-padded) is prefilled in one call into a cache of S = P + N slots (in the
model's layout, `init_cache`: per-layer arrays, or one [L, ...] stack for scanned layers), then
tokens are decoded one at a time in a `lax.while_loop` that stops as soon as every row has
emitted EOS. Randomness is per sequence (`token_keys`): completion token j of the sequence with id
s (`seq_ids`, default the row index) is drawn with the key fold_in(fold_in(rng, s), j), whatever
the row, batch or decode step it is computed in, so every sampler of the suite (micro-groups,
continuous batching, `sampling/continuous.py`) draws the same completions from the same key. The
token is drawn from
softmax(filter(logits / temperature)) with optional top-k and nucleus (top-p, arXiv:1904.09751)
filters, and its log-probability is reported under the UNFILTERED log_softmax(logits /
temperature), so it equals a later full-forward recompute at the same temperature.

temperature and top_p are traced arguments of the compiled program (one program serves every
value); top_k (`lax.top_k` needs a static k), the sizes and greedy decoding are static.

A `models.vlm.VisionLM` also takes `images=` (the `Sampler` protocol's): the prefill runs the
image tower and scatters its tokens at the prompt's image tokens, with M-RoPE positions
(`models.vlm.vision_inputs`, on the host), and decoding continues at position
T_real + j + rope_delta on all three axes. Without images the program is the text one.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxrl_suite.core.parallel import jit_on_mesh
from jaxrl_suite.models.lm import CausalLM, init_cache
from jaxrl_suite.models.vlm import VisionInputs, VisionLM, vision_inputs
from jaxrl_suite.sampling.base import GenerateOutput, compiled_memory


def filter_logits(scaled: jax.Array, top_k: int, top_p: jax.Array | float) -> jax.Array:
    """Set logits outside the top-k / nucleus (top-p) set to -inf. [B, V] -> [B, V].

    top_k = 0 (static) and top_p >= 1 (traced) switch the filters off. The nucleus is the
    smallest set of most likely tokens (after top-k) whose probability reaches top_p; the top
    token is always kept. For top_p >= 1 a `lax.cond` takes the top-k-only branch, which
    returns `scaled` itself when top_k is off: the nucleus filter at top_p = 1 is not a no-op
    in floats (the cumulative sum can round to >= 1 early), and its full-vocabulary top_k is
    not paid.
    """
    vocab = scaled.shape[-1]
    k = top_k if 0 < top_k < vocab else 0

    def top_k_only(x):
        if k == 0:
            return x
        threshold = lax.top_k(x, k)[0][:, -1:]  # [B, 1] k-th largest
        return jnp.where(x < threshold, -jnp.inf, x)

    def nucleus(x):
        vals = lax.top_k(x, k or vocab)[0]  # [B, k] descending
        probs = jax.nn.softmax(vals, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs  # exclusive cumsum; 0 for the top token
        keep = mass_before < top_p
        threshold = jnp.min(jnp.where(keep, vals, jnp.inf), axis=-1, keepdims=True)  # [B, 1]
        return jnp.where(x < threshold, -jnp.inf, x)

    return lax.cond(top_p < 1.0, nucleus, top_k_only, scaled)


def first_argmax(x: jax.Array) -> jax.Array:
    """First index of the maximum over the last axis, [B, V] -> [B] int32, as `jnp.argmax`.

    Written as two plain reductions (max, then min index where equal), which XLA:CPU vectorises;
    the variadic (value, index) reduce behind `jnp.argmax` runs as a scalar loop.
    """
    top = jnp.max(x, axis=-1, keepdims=True)
    index = jnp.arange(x.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where(x == top, index, x.shape[-1]), axis=-1)


def sequence_keys(rng: jax.Array, seq_ids: jax.Array) -> jax.Array:
    """One key per sequence, [B]: fold_in(rng, seq_ids[b]). A trainer numbers the rows of a
    rollout prompt_index * G + sample_index, so a sequence's key depends on (rollout key, prompt
    index, sample index) only, never on the slot or batch that decodes it."""
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(rng, seq_ids.astype(jnp.int32))


def token_keys(seq_keys: jax.Array, positions: jax.Array) -> jax.Array:
    """The keys of completion tokens, [B]: fold_in(seq_keys[b], positions[b]) (position j =
    the j-th completion token of that sequence, 0-based)."""
    return jax.vmap(jax.random.fold_in)(seq_keys, positions.astype(jnp.int32))


def gumbel_rows(keys: jax.Array, shape: tuple[int, ...], dtype=jnp.float32) -> jax.Array:
    """Gumbel noise [B, *shape], row b drawn with keys[b] (what `jax.random.categorical(keys[b],
    logits[b])` adds to row b)."""
    return jax.vmap(lambda k: jax.random.gumbel(k, shape, dtype))(keys)


def sample_tokens(logits, keys, temperature, top_p, *, top_k: int, greedy: bool):
    """Pick tokens from logits [B, V] with one key per row (keys [B]); returns (tokens [B] int32,
    unfiltered logprobs [B])."""
    # logits * (1/T), the form XLA gives `logits / T` for a constant T: same bits as before.
    scaled = logits * (1.0 / temperature)
    if greedy:
        tok = first_argmax(logits)
    else:
        # Gumbel-max: row b is the draw of jax.random.categorical(keys[b], filtered[b]), with a
        # faster argmax.
        filtered = filter_logits(scaled, top_k, top_p)
        tok = first_argmax(filtered + gumbel_rows(keys, filtered.shape[-1:], filtered.dtype))
    logp = jax.nn.log_softmax(scaled, axis=-1)
    return tok, jnp.take_along_axis(logp, tok[:, None], axis=-1)[:, 0]


def default_seq_ids(prompt: jax.Array, seq_ids) -> jax.Array:
    """seq_ids as an int32 array [B] (None = arange(B)); a wrong shape is a one-line error."""
    b = prompt.shape[0]
    if seq_ids is None:
        return np.arange(b, dtype=np.int32)
    if tuple(np.shape(seq_ids)) != (b,):
        raise ValueError(f"seq_ids must have shape (B,) = ({b},), got {tuple(np.shape(seq_ids))}")
    return seq_ids


def check_sizes(max_new_tokens: int, top_k: int) -> None:
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")


def check_sampling(temperature, top_p) -> None:
    """Raise ValueError for a concrete temperature <= 0 or top_p outside (0, 1]; tracers pass."""
    if not isinstance(temperature, jax.core.Tracer) and not float(temperature) > 0:
        # greedy too: its logprobs are reported at this temperature
        raise ValueError(f"temperature must be positive, got {temperature}")
    if not isinstance(top_p, jax.core.Tracer) and not 0.0 < float(top_p) <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def f32_scalar(x):
    """A float32 scalar argument: always a numpy scalar (cheap to dispatch, and one argument
    signature, so one compiled program), unless x is a tracer of an enclosing jit."""
    return x.astype(jnp.float32) if isinstance(x, jax.core.Tracer) else np.float32(x)


def generate_tokens(model: CausalLM, params, prompt_tokens, prompt_mask, rng, seq_ids,
                    temperature, top_p, images: VisionInputs | None = None, *,
                    max_new_tokens: int, top_k: int, eos_id: int, pad_id: int,
                    greedy: bool, early_exit: bool = True) -> GenerateOutput:
    """Traceable body of `KVCacheSampler.__call__` (temperature and top_p are [] float32;
    images: a `VisionLM`'s `VisionInputs` of the prompts, or None). `early_exit=False` decodes
    all N steps (the same output: finished rows only add padding), so the loop's step stays
    one scalar under `jax.vmap` rather than one per mapped row, whose cache writes would
    become scatters."""
    cfg = model.config
    b, p = prompt_tokens.shape
    if prompt_mask.shape != (b, p):
        raise ValueError(f"prompt_mask shape {prompt_mask.shape} != prompt_tokens shape {(b, p)}")
    n = max_new_tokens
    prompt_tokens = prompt_tokens.astype(jnp.int32)
    prompt_mask = prompt_mask.astype(bool)
    sample = functools.partial(sample_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                               greedy=greedy)

    key_mask = jnp.concatenate([prompt_mask, jnp.ones((b, n), bool)], axis=1)  # [B, S]
    positions = jnp.maximum(jnp.cumsum(prompt_mask, axis=1, dtype=jnp.int32) - 1, 0)  # [B, P]
    next_pos = jnp.sum(prompt_mask, axis=1, dtype=jnp.int32)  # [B] position of completion 0
    cache = init_cache(cfg, b, p + n, cfg.compute_dtype)
    if images is None:
        logits, cache = model.apply(params, prompt_tokens, positions, key_mask, cache, 0)
    else:  # M-RoPE positions [B, P, 3]; decoding continues rope_delta further on
        logits, cache = model.apply(params, prompt_tokens, images.positions, key_mask, cache, 0,
                                    patches=images.patches,
                                    patch_positions=images.patch_positions)
        next_pos = next_pos + images.rope_delta
    seq_keys = sequence_keys(rng, seq_ids)
    at = lambda j: token_keys(seq_keys, jnp.full((b,), j, jnp.int32))  # keys of token j

    tok, logp = sample(logits[:, -1], at(0))
    done = tok == eos_id
    tokens = jnp.full((b, n), pad_id, jnp.int32).at[:, 0].set(tok)
    logprobs = jnp.zeros((b, n), jnp.float32).at[:, 0].set(logp)
    live = jnp.zeros((b, n), bool).at[:, 0].set(True)

    def cond(state):
        step, _, _, done, *_ = state
        return (step < n) & ~jnp.all(done) if early_exit else step < n

    def body(state):
        step, cache, tok, done, tokens, logprobs, live = state
        # Feed completion token step-1 (slot P+step-1, position next_pos+step-1), sample `step`.
        logits, cache = model.apply(
            params, tok[:, None], (next_pos + step - 1)[:, None], key_mask, cache, p + step - 1
        )
        new, logp = sample(logits[:, 0], at(step))
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


class KVCacheSampler:
    """The default `Sampler`: prefill, then a jitted decode loop over a static KV cache.

    sampler = KVCacheSampler(model, max_new_tokens=N, eos_id=1, pad_id=0, temperature=1.0)
    out = sampler(params, prompt [B, P], prompt_mask [B, P], rng)          # GenerateOutput
    out = sampler(params, prompt, prompt_mask, rng, temperature=0.6, top_p=0.9)  # same program

    max_new_tokens, top_k and greedy are static; temperature and top_p are the defaults of the
    traced arguments of the call. greedy=True takes the argmax token (rng is unused) and still
    reports log-probs at the temperature. The object owns its compiled program: it compiles
    once per input shape (and sharding), and reuses it for every temperature and top_p. Bad
    options raise ValueError here, not at the first call.
    """

    def __init__(self, model: CausalLM, *, max_new_tokens: int, eos_id: int, pad_id: int,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 greedy: bool = False):
        check_sizes(max_new_tokens, top_k)
        check_sampling(temperature, top_p)
        self.model = model
        self.max_new_tokens, self.top_k, self.greedy = max_new_tokens, top_k, greedy
        self.eos_id, self.pad_id = eos_id, pad_id
        self.temperature, self.top_p = float(temperature), float(top_p)
        # converted once, not per call
        self._settings = (f32_scalar(self.temperature), f32_scalar(self.top_p))
        self._body = functools.partial(
            generate_tokens, model, max_new_tokens=max_new_tokens, top_k=top_k, eos_id=eos_id,
            pad_id=pad_id, greedy=greedy,
        )
        self._generate = jit_on_mesh(self._body)

    def __call__(self, params, prompt: jax.Array, prompt_mask: jax.Array, rng: jax.Array, *,
                 temperature: float | jax.Array | None = None,
                 top_p: float | jax.Array | None = None,
                 seq_ids: jax.Array | None = None, images=None) -> GenerateOutput:
        """Sample N = max_new_tokens tokens for left-padded prompts [B, P] (see `Sampler`).

        prompt_mask [B, P] is 1/True on real tokens; RoPE positions are cumsum(mask) - 1 per
        row. seq_ids [B] int32 number the sequences for their keys (default arange(B)).
        images (a `VisionLM` only): the prompts' images, [N, H, W, C] or a list per row, in
        the order of their image-token runs, or their `VisionInputs` prepared (and placed on
        the mesh) by the caller (`models.vlm.vision_inputs`).
        Returns a `GenerateOutput` of [B, N] tokens/logprobs/mask and [B] lengths.
        """
        check_sampling(self.temperature if temperature is None else temperature,
                        self.top_p if top_p is None else top_p)
        vision = None
        if images is not None:
            if not isinstance(self.model, VisionLM):
                raise ValueError(f"KVCacheSampler: images= needs a VisionLM, the model is "
                                 f"{type(self.model).__name__}")
            vision = images if isinstance(images, VisionInputs) else vision_inputs(
                images, np.asarray(prompt), np.asarray(prompt_mask), self.model.config)
        return self._generate(params, prompt, prompt_mask, rng,
                              default_seq_ids(prompt, seq_ids),
                              self._settings[0] if temperature is None else f32_scalar(temperature),
                              self._settings[1] if top_p is None else f32_scalar(top_p), vision)

    def generate(self, params, prompt: jax.Array, prompt_mask: jax.Array, rng: jax.Array,
                 seq_ids: jax.Array, *, early_exit: bool = True) -> GenerateOutput:
        """The sampler's traceable body at its temperature and top_p, text prompts only: for
        a program that samples inside its own jit (`algorithms.grpo_ondevice`; `early_exit`
        as in `generate_tokens`). Same keys, same completions as a call."""
        return self._body(params, prompt, prompt_mask, rng, seq_ids, *self._settings,
                          early_exit=early_exit)

    def compiled_memory(self, params, prompt, prompt_mask) -> dict:
        """The compiler's memory estimate (bytes, `base.compiled_memory`) of decoding these
        prompts: one program over every row, its KV cache [B, ..., P + N]."""
        return compiled_memory(self._body, params, prompt, prompt_mask, jax.random.key(0),
                               default_seq_ids(prompt, None), *self._settings)

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={getattr(self, k)!r}" for k in (
            "max_new_tokens", "eos_id", "pad_id", "temperature", "top_k", "top_p", "greedy"))
        return f"KVCacheSampler({options})"


__all__ = ["KVCacheSampler", "gumbel_rows", "sequence_keys", "token_keys"]

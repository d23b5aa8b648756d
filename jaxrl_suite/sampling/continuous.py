"""Micro sampling groups and continuous batching (Infinite Sampling, Wang et al., arXiv
2506.22950): a `Sampler` that decodes the R rows of a rollout in M <= R slots.

The KV cache holds M rows (slots) of S = P + N positions instead of R rows, so the memory of
decoding a group of G completions no longer grows with G. Each slot has its own cache row,
position and step (the per-row `cache_index` of `CausalLM`). The whole rollout is one jitted
`lax.while_loop`; each iteration

  1. refills free slots from a queue of the rollout's rows: the row's prompt is prefilled into
     the slot's cache row (a one-row cached forward) and its first token drawn, while the other
     slots keep their state;
       refill="continuous"  a slot is refilled as soon as its sequence ends (EOS or N tokens);
       refill="rounds"      only when every slot is free: naive micro sampling groups, rounds
                            of M rows;
  2. decodes one token for every live slot (one M-row cached forward) and writes it to its row
     of the [R, N] outputs.

The queue order is fixed on the host before decoding (`sampling.schedule`): "fifo" (rollout
order), "sjf" (shortest predicted completion first) or "lpt" (longest first), from the sampler's
`LengthPredictor`, an EMA of each prompt's earlier completion lengths that every call updates.
What it has learned (`learning_state`, a `schedule.LengthTable` of arrays) is a
`base.LearningSampler`'s state: a trainer keeps it in its train state and checkpoints it.

Exactness: completion token j of row r is drawn with the key of (rng, seq_ids[r], j)
(`kv_cache.token_keys`), from the same logits as the static sampler up to float rounding, so
every schedule gives the static `KVCacheSampler`'s completions and log-probs (tested).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxrl_suite.core.parallel import host_local, jit_on_mesh
from jaxrl_suite.models.lm import CausalLM, KVCache, init_cache
from jaxrl_suite.sampling.base import GenerateOutput, compiled_memory, refuse_images
from jaxrl_suite.sampling.kv_cache import (
    check_sampling,
    check_sizes,
    default_seq_ids,
    f32_scalar,
    sample_tokens,
    sequence_keys,
    token_keys,
)
from jaxrl_suite.sampling.schedule import (
    ORDERS,
    REFILLS,
    LengthPredictor,
    LengthTable,
    prompt_ids,
    queue_order,
)


def _host(x) -> np.ndarray:
    """This process's rows of x on the host (x a jax.Array or anything numpy takes)."""
    return host_local(x) if isinstance(x, jax.Array) else np.asarray(x)


def _write_row(cache: KVCache, row: KVCache, slot) -> KVCache:
    """Cache `row` (batch 1) written over batch row `slot` of `cache` (either layout)."""

    def put(buf, new):
        start = [0] * buf.ndim
        start[buf.ndim - 4] = slot  # [.., B, K, S, Dh]: the batch axis is 4th from the end
        return lax.dynamic_update_slice(buf, new.astype(buf.dtype), tuple(start))

    return jax.tree.map(put, cache, row)


def _continuous_generate(model: CausalLM, params, prompt, prompt_mask, rng, seq_ids, queue,
                         temperature, top_p, *, slots: int, refill: str, max_new_tokens: int,
                         top_k: int, eos_id: int, pad_id: int, greedy: bool):
    """Traceable body of `ContinuousSampler.generate`: (GenerateOutput, decode steps, prefills)."""
    cfg = model.config
    r_rows, p = prompt.shape
    n, m = max_new_tokens, slots
    s_len = p + n
    prompt = prompt.astype(jnp.int32)
    prompt_mask = prompt_mask.astype(bool)
    sample = functools.partial(sample_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                               greedy=greedy)
    seq_keys = sequence_keys(rng, seq_ids)  # [R]
    positions = jnp.maximum(jnp.cumsum(prompt_mask, axis=1, dtype=jnp.int32) - 1, 0)  # [R, P]
    first_pos = jnp.sum(prompt_mask, axis=1, dtype=jnp.int32)  # [R] position of token 0
    key_masks = jnp.concatenate([prompt_mask, jnp.ones((r_rows, n), bool)], axis=1)  # [R, S]
    empty_row = init_cache(cfg, 1, s_len, cfg.compute_dtype)

    def refill_one(state):
        (cache, row, length, tok, live, ptr, tokens, logprobs, mask, steps, prefills) = state
        slot = jnp.argmin(live)  # the first free slot
        r = queue[ptr]
        logits, new_row = model.apply(params, prompt[r][None], positions[r][None],
                                      key_masks[r][None], empty_row, 0)
        t0, lp0 = sample(logits[:, -1], token_keys(seq_keys[r][None], jnp.zeros((1,), jnp.int32)))
        t0, lp0 = t0[0], lp0[0]
        tokens, logprobs = tokens.at[r, 0].set(t0), logprobs.at[r, 0].set(lp0)
        mask = mask.at[r, 0].set(True)
        alive = (t0 != eos_id) & (n > 1)
        return (_write_row(cache, new_row, slot), row.at[slot].set(r),
                length.at[slot].set(1), tok.at[slot].set(t0), live.at[slot].set(alive),
                ptr + 1, tokens, logprobs, mask, steps, prefills + 1)

    def decode(state):
        (cache, row, length, tok, live, ptr, tokens, logprobs, mask, steps, prefills) = state
        # Feed each slot's last token (completion token length-1) at its own slot and position.
        logits, cache = model.apply(params, tok[:, None], (first_pos[row] + length - 1)[:, None],
                                    key_masks[row], cache, p + length - 1)
        new, logp = sample(logits[:, 0], token_keys(seq_keys[row], length))
        dest = jnp.where(live, row, r_rows)  # out of range: dropped for free slots
        tokens = tokens.at[dest, length].set(new, mode="drop")
        logprobs = logprobs.at[dest, length].set(logp, mode="drop")
        mask = mask.at[dest, length].set(True, mode="drop")
        done = (new == eos_id) | (length + 1 >= n)
        length = jnp.where(live, length + 1, length)
        return (cache, row, length, jnp.where(live, new, tok), live & ~done, ptr, tokens,
                logprobs, mask, steps + 1, prefills)

    def can_refill(state):
        live, ptr = state[4], state[5]
        return (ptr < r_rows) & ~jnp.all(live)

    def body(state):
        if refill == "rounds":  # a new round only once every slot of the last one is done
            state = lax.cond(jnp.any(state[4]), lambda s: s,
                             lambda s: lax.while_loop(can_refill, refill_one, s), state)
        else:
            state = lax.while_loop(can_refill, refill_one, state)
        return lax.cond(jnp.any(state[4]), decode, lambda s: s, state)

    def cond(state):
        return (state[5] < r_rows) | jnp.any(state[4])

    state = (
        init_cache(cfg, m, s_len, cfg.compute_dtype),
        jnp.zeros((m,), jnp.int32),  # row of each slot
        jnp.ones((m,), jnp.int32),  # completion tokens so far (index of the next one)
        jnp.zeros((m,), jnp.int32),  # last token
        jnp.zeros((m,), bool),  # live
        jnp.int32(0),  # queue pointer
        jnp.full((r_rows, n), pad_id, jnp.int32),
        jnp.zeros((r_rows, n), jnp.float32),
        jnp.zeros((r_rows, n), bool),
        jnp.int32(0),  # decode steps
        jnp.int32(0),  # prefills
    )
    state = lax.while_loop(cond, body, state)
    tokens, logprobs, mask, steps, prefills = state[6:]
    out = GenerateOutput(tokens, logprobs, mask.astype(jnp.float32),
                         jnp.sum(mask, axis=1, dtype=jnp.int32))
    return out, steps, prefills


class ContinuousSampler:
    """A `Sampler` that decodes R rows in `slots` cache rows: micro sampling groups
    (refill="rounds") or continuous batching (refill="continuous"), rows queued in `order`
    ("fifo" | "sjf" | "lpt", see `sampling.schedule`).

    sampler = ContinuousSampler(model, slots=16, max_new_tokens=N, eos_id=1, pad_id=0)
    out = sampler(params, prompt [R, P], prompt_mask, rng, seq_ids=ids)    # GenerateOutput
    out, stats = sampler.generate(params, prompt, prompt_mask, rng)        # + decode_steps, ...

    Same contract, options and per-sequence keys as `KVCacheSampler`, whose completions it
    reproduces; `predictor` (a `LengthPredictor`) predicts each prompt's completion length for
    the order from `learning_state` (a `LengthTable`), which every call updates with its
    lengths: a `LearningSampler`, whose trainer sets `learning_state` from its train state
    before a rollout and keeps the new one (`init_learning_state()`: a fresh run's). One
    compiled program per input shape; R may be smaller than `slots` (then R slots are used).
    """

    def __init__(self, model: CausalLM, *, slots: int, max_new_tokens: int, eos_id: int,
                 pad_id: int, refill: str = "continuous", order: str = "sjf",
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 greedy: bool = False, predictor: LengthPredictor | None = None):
        check_sizes(max_new_tokens, top_k)
        check_sampling(temperature, top_p)
        if slots <= 0:
            raise ValueError(f"slots must be positive, got {slots}")
        if refill not in REFILLS:
            raise ValueError(f"refill must be one of {list(REFILLS)}, got {refill!r}")
        if order not in ORDERS:
            raise ValueError(f"order must be one of {list(ORDERS)}, got {order!r}")
        self.model, self.slots, self.refill, self.order = model, slots, refill, order
        self.max_new_tokens, self.top_k, self.greedy = max_new_tokens, top_k, greedy
        self.eos_id, self.pad_id = eos_id, pad_id
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.predictor = predictor or LengthPredictor(default=max_new_tokens / 2)
        self.learning_state: LengthTable = self.predictor.init()
        self._settings = (f32_scalar(self.temperature), f32_scalar(self.top_p))
        self._jitted = {}
        self.last_stats: dict = {}

    def init_learning_state(self) -> LengthTable:
        """A fresh run's learning state: nothing learned (predictions start at N / 2)."""
        return self.predictor.init()

    def _body(self, slots: int):
        return functools.partial(
            _continuous_generate, self.model, slots=slots, refill=self.refill,
            max_new_tokens=self.max_new_tokens, top_k=self.top_k, eos_id=self.eos_id,
            pad_id=self.pad_id, greedy=self.greedy)

    def _program(self, slots: int):
        if slots not in self._jitted:
            self._jitted[slots] = jit_on_mesh(self._body(slots))
        return self._jitted[slots]

    def compiled_memory(self, params, prompt, prompt_mask) -> dict:
        """The compiler's memory estimate (bytes, `base.compiled_memory`) of decoding these
        prompts in min(slots, rows) cache rows."""
        ids = default_seq_ids(prompt, None)
        return compiled_memory(self._body(min(self.slots, len(ids))), params, prompt,
                               prompt_mask, jax.random.key(0), ids, ids, *self._settings)

    def generate(self, params, prompt: jax.Array, prompt_mask: jax.Array, rng: jax.Array, *,
                 temperature=None, top_p=None, seq_ids=None) -> tuple[GenerateOutput, dict]:
        """Completions (a `GenerateOutput`) and stats: decode_steps (M-row forwards), prefills,
        slots, tokens (completion tokens), queue (the row order), and the predicted and actual
        mean lengths."""
        check_sampling(self.temperature if temperature is None else temperature,
                        self.top_p if top_p is None else top_p)
        ids = prompt_ids(_host(prompt), _host(prompt_mask))
        predicted = self.predictor.predict(self.learning_state, ids)
        queue = queue_order(predicted, self.order)
        slots = min(self.slots, len(ids))
        out, steps, prefills = self._program(slots)(
            params, prompt, prompt_mask, rng, default_seq_ids(prompt, seq_ids), queue,
            self._settings[0] if temperature is None else f32_scalar(temperature),
            self._settings[1] if top_p is None else f32_scalar(top_p))
        lengths = _host(out.lengths)
        self.learning_state = self.predictor.update(self.learning_state, ids, lengths)
        self.last_stats = {"decode_steps": int(steps), "prefills": int(prefills),
                           "slots": slots, "tokens": int(lengths.sum()), "queue": queue,
                           "predicted_length": float(np.mean(predicted)),
                           "length": float(lengths.mean())}
        return out, self.last_stats

    def __call__(self, params, prompt: jax.Array, prompt_mask: jax.Array, rng: jax.Array, *,
                 temperature=None, top_p=None, seq_ids=None, images=None) -> GenerateOutput:
        """`Sampler` call: the completions of `generate` (its stats in `last_stats`)."""
        refuse_images(images, "ContinuousSampler")
        return self.generate(params, prompt, prompt_mask, rng, temperature=temperature,
                             top_p=top_p, seq_ids=seq_ids)[0]

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={getattr(self, k)!r}" for k in (
            "slots", "refill", "order", "max_new_tokens", "eos_id", "pad_id", "temperature",
            "top_k", "top_p", "greedy"))
        return f"ContinuousSampler({options})"


__all__ = ["ContinuousSampler"]

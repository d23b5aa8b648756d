"""`SpeculativeSampler`: a small drafter LM proposes tokens, the policy verifies them in one pass.

Speculative sampling (Leviathan et al. 2023, arXiv:2211.17192; Chen et al. 2023,
arXiv:2302.01318). Each round, per row:

  1. the drafter proposes k tokens d_1..d_k autoregressively, d_i ~ q_i = softmax(filter(
     logits_q / T)) (top-k / top-p as the target's, `kv_cache.filter_logits`);
  2. the target scores [last token, d_1..d_k] in ONE cached (k+1)-token forward, giving
     p_0..p_k = softmax(filter(logits_p / T));
  3. d_i is accepted with probability min(1, p_{i-1}(d_i) / q_i(d_i)), left to right; at the
     first rejection a token is drawn from norm(max(0, p - q)) instead; if all k are accepted, a
     bonus token is drawn from p_k.

So a round emits between 1 and k + 1 tokens, and every token follows the (filtered) target
distribution exactly, whatever the drafter: the output has the law of `KVCacheSampler`'s
(not the same draws: the randomness is spent differently). Greedy decoding proposes argmax
tokens, accepts d_i iff it is the target's argmax and corrects with the target's argmax, so it
reproduces greedy plain decoding token for token. Reported log-probs are the TARGET's unfiltered
log softmax(logits_p / T)[token], read off the verification logits, so they equal a full-forward
recompute (the `Sampler` contract). k = 0 is plain decoding: exactly `KVCacheSampler`'s program.

Per-row state. Rows accept different numbers of tokens, so every row keeps its own length L
(completion tokens emitted so far; the first comes from the target's prefill logits) and both
KV caches are written at per-row slots (`CausalLM`'s per-row `cache_index`). Slot P + j holds
completion token j in both caches (S = P + N + k + 1 slots, so no write overflows), at RoPE
position (number of real prompt tokens) + j. At the start of a round:

  target: slots < P + L - 1 are valid (every emitted token but the last). The round writes
          [tok_{L-1}, d_1..d_k] at slots P + L - 1..P + L - 1 + k; after accepting n of them,
          the new last token is the correction, so the invariant holds with L' = L + n + 1.
  drafter: slots < P + L - 2 are valid. The round re-feeds tok_{L-2}, tok_{L-1} in one 2-token
          call at slots P + L - 2, P + L - 1 (tok_{-1} is the last prompt token), then feeds
          d_1..d_{k-1}; those cover every accepted token up to the correction's predecessor, and
          the invariant holds for L'. (The drafter never sees d_k or the correction in the
          round, which is why it may lag by 2 tokens; re-feeding an already cached token just
          rewrites the same keys and values.)

Slots above a query's own slot hold stale drafts of earlier rounds; the causal mask over slots
hides them, and they are overwritten before they become visible. A row stops at its first EOS or
once it has N tokens; tokens past N are dropped, tokens after EOS become pad (log-prob 0,
mask 0). Finished rows keep riding in the batch (static shapes) with their writes sent to a
scratch area.

Randomness is per sequence (`kv_cache.token_keys`): with key_j = fold_in(fold_in(rng, s), j) for
completion token j of sequence s, the first token is drawn with key_j itself (as
`KVCacheSampler`), and the draws of later positions with fold_in(key_j, tag): tag 1 the drafted
token, 2 its acceptance uniform, 3 the residual / bonus draw. For a given k a sequence's
completion therefore depends on (rng, s) alone, not on its row or batch.

Adaptive draft length (ReSpec, arXiv:2510.26475, first gap: speculative speed-ups shrink as the
rollout batch grows). `DraftLengthController` picks k in `k_choices` maximising expected tokens
per unit cost,

    E(k, a) = (1 - a^(k+1)) / (1 - a)    tokens per round (k + 1 when a = 1)
    cost(k, B) = k c_draft(B, 1) + c_target(B, k + 1),    c(B, T) = overhead + per_token B T

with a the EMA of the per-token acceptance rate (prior 0.5), measured by every call with k > 0
and, so that a drafter that improves while k = 0 is noticed, by every distillation batch (the
expected rate sum_v min(p_v, q_v) on the actor's own rollout). At a small batch a forward costs
about its overhead whatever its token count, so drafting is cheap and k grows with a; at a large
batch cost grows with B (k + 1) and k falls to 0. `measure_costs` fits (overhead, per_token) of a
model by timing its cached forward.

Drafter evolution (ReSpec's second and third gaps): `learn(params, seq, rewards)` distils the
drafter from the current actor on each fresh rollout (`losses.distill.kd_loss`, forward KL at
the sampling temperature), optionally weighting each rollout by `reward_weights(rewards,
reward_tau)`; `distill(params, seq, steps)` warm-starts it the same way.

What the sampler learns (the drafter's params, its Adam state, the controller's acceptance
estimate and measured costs) is its `learning_state`, a `DrafterState` of arrays: a
`base.LearningSampler`'s state, which a trainer keeps in its train state and checkpoints, so a
resumed run continues with the drafter it had.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from jaxrl_suite.core.parallel import jit_on_mesh, mesh_of, replicate
from jaxrl_suite.losses.distill import kd_loss, reward_weights
from jaxrl_suite.models.lm import CausalLM, init_cache
from jaxrl_suite.sampling import kv_cache
from jaxrl_suite.sampling.base import GenerateOutput, compiled_memory, refuse_images
from jaxrl_suite.sampling.kv_cache import (
    check_sampling,
    check_sizes,
    default_seq_ids,
    f32_scalar,
    filter_logits,
    first_argmax,
    gumbel_rows,
    sequence_keys,
    token_keys,
)

# fold_in tags of the draws of one completion position (see the module docstring)
DRAFT_TAG, ACCEPT_TAG, RESIDUAL_TAG = 1, 2, 3


def _draw_keys(seq_keys: jax.Array, positions: jax.Array, tag: int) -> jax.Array:
    """Keys [B] of the draw `tag` at completion positions [B]: fold_in(fold_in(seq_key, j), tag)."""
    return jax.vmap(lambda key: jax.random.fold_in(key, tag))(token_keys(seq_keys, positions))


def _rows_update(buf: jax.Array, update: jax.Array, start: jax.Array) -> jax.Array:
    """buf [B, M] with update [B, U] written at column start[b] of each row b."""
    return jax.vmap(lambda row, upd, i: lax.dynamic_update_slice(row, upd, (i,)))(
        buf, update.astype(buf.dtype), start)


def _speculative(model: CausalLM, drafter: CausalLM, params, drafter_params, prompt, prompt_mask,
                 rng, seq_ids, temperature, top_p, *, k: int, max_new_tokens: int, top_k: int,
                 eos_id: int, pad_id: int, greedy: bool):
    """Traceable speculative decoding with a static draft length k >= 1 (module docstring).

    Returns (GenerateOutput, stats) with stats int32 scalars: rounds (target verification calls),
    drafted and accepted (draft tokens of live rows), rejected (rounds of live rows that ended
    in a rejection), tokens (sum of lengths)."""
    b, p = prompt.shape
    if prompt_mask.shape != (b, p):
        raise ValueError(f"prompt_mask shape {prompt_mask.shape} != prompt shape {(b, p)}")
    n, vocab = max_new_tokens, model.config.vocab_size
    slots = p + n + k + 1
    prompt, prompt_mask = prompt.astype(jnp.int32), prompt_mask.astype(bool)
    inv_t = 1.0 / temperature
    key_mask = jnp.concatenate([prompt_mask, jnp.ones((b, slots - p), bool)], axis=1)  # [B, S]
    positions = jnp.maximum(jnp.cumsum(prompt_mask, axis=1, dtype=jnp.int32) - 1, 0)  # [B, P]
    next_pos = jnp.sum(prompt_mask, axis=1, dtype=jnp.int32)  # [B] position of completion 0
    seq_keys = sequence_keys(rng, seq_ids)
    rows = jnp.arange(b)

    cache_t = init_cache(model.config, b, slots, model.config.compute_dtype)
    logits, cache_t = model.apply(params, prompt, positions, key_mask, cache_t, 0)
    cache_d = init_cache(drafter.config, b, slots, drafter.config.compute_dtype)
    _, cache_d = drafter.apply(drafter_params, prompt, positions, key_mask, cache_d, 0)
    tok0, logp0 = kv_cache.sample_tokens(
        logits[:, -1], token_keys(seq_keys, jnp.zeros(b, jnp.int32)), temperature, top_p,
        top_k=top_k, greedy=greedy)

    # toks[:, 0] = the last prompt token (completion token -1), toks[:, 1 + j] = completion j;
    # the tail past N is where finished rows' writes go.
    toks = jnp.full((b, n + k + 2), pad_id, jnp.int32).at[:, 0].set(prompt[:, -1])
    toks = toks.at[:, 1].set(tok0)
    logps = jnp.zeros((b, n + k + 1), jnp.float32).at[:, 0].set(logp0)
    length = jnp.ones((b,), jnp.int32)
    done = (tok0 == eos_id) | (n <= 1)

    def propose(logits, pos):
        """The drafter's token for completion positions pos [B] from its logits [B, V], and its
        (filtered) distribution q [B, V] ([B, 1] zeros when greedy: unused)."""
        if greedy:
            return first_argmax(logits), jnp.zeros((b, 1), jnp.float32)
        filtered = filter_logits(logits * inv_t, top_k, top_p)
        noise = gumbel_rows(_draw_keys(seq_keys, pos, DRAFT_TAG), (vocab,), filtered.dtype)
        return first_argmax(filtered + noise), jax.nn.softmax(filtered, axis=-1)

    def body(state):
        cache_t, cache_d, toks, logps, length, done, stats = state
        active = ~done
        ln = jnp.minimum(length, n)  # [B] L, clamped so finished rows stay in bounds
        # Drafter: re-feed completion tokens L-2, L-1 (buffer columns L-1, L) at slots P+L-2,
        # P+L-1, then draft d_1..d_k (d_i is the candidate for completion token L+i-1).
        two = jnp.take_along_axis(toks, ln[:, None] + jnp.arange(-1, 1), axis=1)  # [B, 2]
        pos = jnp.maximum(next_pos[:, None] + ln[:, None] + jnp.arange(-2, 0), 0)
        dl, cache_d = drafter.apply(drafter_params, two, pos, key_mask, cache_d, p + ln - 2)
        d1, q1 = propose(dl[:, 1], ln)

        def draft_step(carry, i):  # feed d_i at slot P+L+i-1, propose d_{i+1}
            cache_d, prev = carry
            at = ln + i - 1
            dl, cache_d = drafter.apply(drafter_params, prev[:, None], (next_pos + at)[:, None],
                                        key_mask, cache_d, p + at)
            d, q = propose(dl[:, 0], ln + i)
            return (cache_d, d), (d, q)

        if k > 1:
            (cache_d, _), (ds, qs) = lax.scan(draft_step, (cache_d, d1),
                                              jnp.arange(1, k, dtype=jnp.int32))
            drafts = jnp.concatenate([d1[:, None], ds.T], axis=1)  # [B, k]
            q = jnp.concatenate([q1[:, None], jnp.moveaxis(qs, 0, 1)], axis=1)  # [B, k, V]
        else:
            drafts, q = d1[:, None], q1[:, None]

        # Target: score [tok_{L-1}, d_1..d_k] at slots P+L-1.. in one call; logits[:, i]
        # predict completion token L+i.
        verify = jnp.concatenate([toks[rows, ln][:, None], drafts], axis=1)  # [B, k+1]
        vpos = next_pos[:, None] + ln[:, None] - 1 + jnp.arange(k + 1)
        tl, cache_t = model.apply(params, verify, vpos, key_mask, cache_t, p + ln - 1)
        scaled = tl * inv_t  # [B, k+1, V]
        if greedy:
            best = first_argmax(tl.reshape(-1, vocab)).reshape(b, k + 1)
            accept = drafts == best[:, :k]
            n_acc = jnp.sum(jnp.cumprod(accept, axis=1), axis=1, dtype=jnp.int32)
            nxt = best[rows, n_acc]
        else:
            filtered = filter_logits(scaled.reshape(-1, vocab), top_k, top_p)
            pt = jax.nn.softmax(filtered, axis=-1).reshape(b, k + 1, vocab)
            p_d = jnp.take_along_axis(pt[:, :k], drafts[..., None], axis=-1)[..., 0]  # [B, k]
            q_d = jnp.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]
            ukeys = jax.vmap(lambda i: _draw_keys(seq_keys, ln + i, ACCEPT_TAG),
                             out_axes=1)(jnp.arange(k))  # [B, k]
            u = jax.vmap(jax.vmap(lambda key: jax.random.uniform(key, ())))(ukeys)
            accept = u * q_d < p_d  # u < p/q, also safe for a q that underflowed to 0
            n_acc = jnp.sum(jnp.cumprod(accept, axis=1), axis=1, dtype=jnp.int32)
            # The token at n_acc: from norm(max(0, p - q)) after a rejection, from p after k
            # accepts (q := 0 there). p == q leaves no residual mass (and no rejection): use p.
            p_sel = pt[rows, n_acc]  # [B, V]
            q_sel = jnp.concatenate([q, jnp.zeros_like(q[:, :1])], axis=1)[rows, n_acc]
            resid = jnp.maximum(p_sel - q_sel, 0.0)
            resid = jnp.where(jnp.sum(resid, axis=-1, keepdims=True) > 0, resid, p_sel)
            noise = gumbel_rows(_draw_keys(seq_keys, ln + n_acc, RESIDUAL_TAG), (vocab,))
            nxt = first_argmax(jnp.log(resid) + noise)

        i = jnp.arange(k + 1)
        kept = i <= n_acc[:, None]  # [B, k+1] the emitted tokens L..L+n_acc
        padded = jnp.concatenate([drafts, jnp.full((b, 1), pad_id, jnp.int32)], axis=1)
        new = jnp.where(i < n_acc[:, None], padded, jnp.where(kept, nxt[:, None], pad_id))
        new_lp = jnp.take_along_axis(jax.nn.log_softmax(scaled, axis=-1), new[..., None],
                                     axis=-1)[..., 0]
        new_lp = jnp.where(kept, new_lp, 0.0)
        start = jnp.where(active, ln, n)  # finished rows write to the scratch tail
        toks = _rows_update(toks, new, start + 1)
        logps = _rows_update(logps, new_lp, start)
        length = jnp.where(active, length + n_acc + 1, length)
        done = done | jnp.any(kept & (new == eos_id), axis=1) | (length >= n)
        live = active.astype(jnp.int32)
        stats = stats + jnp.stack([
            jnp.int32(1), k * jnp.sum(live), jnp.sum(n_acc * live),
            jnp.sum((n_acc < k) * live)]).astype(jnp.int32)
        return cache_t, cache_d, toks, logps, length, done, stats

    state = (cache_t, cache_d, toks, logps, length, done, jnp.zeros(4, jnp.int32))
    state = lax.while_loop(lambda s: ~jnp.all(s[5]), body, state)
    _, _, toks, logps, length, _, stats = state

    tokens, logprobs = toks[:, 1 : n + 1], logps[:, :n]
    is_eos = tokens == eos_id
    after_eos = (jnp.cumsum(is_eos, axis=1) - is_eos) > 0
    live = (jnp.arange(n) < length[:, None]) & ~after_eos
    tokens = jnp.where(live, tokens, pad_id)
    logprobs = jnp.where(live, logprobs, 0.0)
    lengths = jnp.sum(live, axis=1, dtype=jnp.int32)
    out = GenerateOutput(tokens, logprobs, live.astype(jnp.float32), lengths)
    names = ("rounds", "drafted", "accepted", "rejected")
    return out, {**dict(zip(names, stats, strict=True)), "tokens": jnp.sum(lengths)}


def _plain(model: CausalLM, params, drafter_params, prompt, prompt_mask, rng, seq_ids,
           temperature, top_p, **options):
    """k = 0: `KVCacheSampler`'s program (`kv_cache.generate_tokens`), with the stats of
    `_speculative` (rounds = decode calls after the prefill; nothing drafted)."""
    del drafter_params
    out = kv_cache.generate_tokens(model, params, prompt, prompt_mask, rng, seq_ids, temperature,
                             top_p, **options)
    zero = jnp.int32(0)
    rounds = jnp.maximum(jnp.max(out.lengths) - 1, 0).astype(jnp.int32)
    return out, {"rounds": rounds, "drafted": zero, "accepted": zero, "rejected": zero,
                 "tokens": jnp.sum(out.lengths)}


def _full_sequence(prompt, prompt_mask, completion, completion_mask):
    """(tokens, key_mask, positions) of prompt + completion without the last token, [B, P+N-1]
    (the layout of `models.sequence.completion_logits`)."""
    tokens = jnp.concatenate([prompt, completion], axis=1)[:, :-1].astype(jnp.int32)
    key_mask = jnp.concatenate([prompt_mask.astype(bool), completion_mask > 0], axis=1)[:, :-1]
    positions = jnp.maximum(jnp.cumsum(key_mask, axis=1, dtype=jnp.int32) - 1, 0)
    return tokens, key_mask, positions


def _kd_loss_fn(model: CausalLM, drafter: CausalLM, params, prompt, prompt_mask, completion,
                completion_mask, weights, temperature):
    """dp -> `kd_loss(drafter(dp), stop_grad(actor))` on the completion tokens."""
    tokens, key_mask, positions = _full_sequence(prompt, prompt_mask, completion,
                                                 completion_mask)
    start = prompt.shape[1] - 1  # the logits at column P-1+j predict completion token j
    teacher = model.apply(params, tokens, positions, key_mask)[0][:, start:]  # [B, N, V]

    def loss_fn(dp):
        student = drafter.apply(dp, tokens, positions, key_mask)[0][:, start:]
        return kd_loss(student, teacher, completion_mask, weights, temperature)

    return loss_fn


def _distill_metrics(model: CausalLM, drafter: CausalLM, params, drafter_params, *batch):
    """The metrics of `_distill_step` without a step (a frozen drafter's KL and expected
    acceptance on a rollout)."""
    return _kd_loss_fn(model, drafter, params, *batch)(drafter_params)[1]


def _distill_step(model: CausalLM, drafter: CausalLM, optimizer, params, drafter_params,
                  opt_state, prompt, prompt_mask, completion, completion_mask, weights,
                  temperature):
    """One optimizer step of `kd_loss(drafter, stop_grad(actor))` on the completion tokens;
    returns (drafter_params, opt_state, metrics). The metrics are of the pre-step drafter."""
    loss_fn = _kd_loss_fn(model, drafter, params, prompt, prompt_mask, completion,
                          completion_mask, weights, temperature)
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(drafter_params)
    updates, opt_state = optimizer.update(grads, opt_state, drafter_params)
    return optax.apply_updates(drafter_params, updates), opt_state, metrics


def _cost_pair(name: str, cost) -> tuple[float, float] | None:
    """A validated (overhead, per_token) pair of non-negative floats, or None."""
    if cost is None:
        return None
    try:
        overhead, per_token = (float(c) for c in cost)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (overhead, per_token), got {cost!r}") from None
    if not (overhead >= 0 and per_token >= 0 and overhead + per_token > 0):
        raise ValueError(f"{name} must be non-negative and not both 0, got {cost!r}")
    return overhead, per_token


class DraftLengthController:
    """Host-side choice of the draft length k (ReSpec, arXiv:2510.26475: k must adapt online).

    ctl = DraftLengthController((0, 1, 2, 4, 8), target_cost=(1.0, 0.01), draft_cost=(0.1, 1e-3))
    k = ctl.choose(batch)          # argmax_k E(k, a) / cost(k, batch)
    ctl.update(rate)               # a measured per-token acceptance rate (k > 0 rounds)

        E(k, a)    = (1 - a^(k+1)) / (1 - a)        expected tokens per round (k+1 when a = 1)
        cost(k, B) = k c_draft(B, 1) + c_target(B, k+1),   c(B, T) = overhead + per_token B T

    E assumes each drafted token is accepted independently with probability a (Leviathan et al.
    2023, eq. 1); a is the EMA (weight `decay` on the old value) of the measured rates, `prior`
    before any measurement. Costs are (overhead, per_token) pairs per model, in any one unit
    (`measure_costs` gives seconds); a tie goes to the smaller k.
    """

    def __init__(self, k_choices: Sequence[int] = (0, 1, 2, 4, 8), *,
                 target_cost: tuple[float, float] | None = None,
                 draft_cost: tuple[float, float] | None = None,
                 prior: float = 0.5, decay: float = 0.5):
        self.k_choices = _check_k_choices(k_choices)
        self.target_cost = _cost_pair("target_cost", target_cost)
        self.draft_cost = _cost_pair("draft_cost", draft_cost)
        if not 0.0 <= prior <= 1.0:
            raise ValueError(f"prior must be in [0, 1], got {prior}")
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.acceptance, self.decay, self.measurements = float(prior), float(decay), 0

    @staticmethod
    def expected_tokens(k: int, a: float) -> float:
        """E(k, a) = (1 - a^(k+1)) / (1 - a) = 1 + a + ... + a^k tokens per round."""
        return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)

    @property
    def calibrated(self) -> bool:
        return self.target_cost is not None and self.draft_cost is not None

    def cost(self, k: int, batch: int) -> float:
        """k c_draft(B, 1) + c_target(B, k + 1)."""
        if not self.calibrated:
            raise ValueError("DraftLengthController has no target_cost / draft_cost: pass them "
                             "or measure them (measure_costs)")
        c = lambda pair, tokens: pair[0] + pair[1] * batch * tokens
        return k * c(self.draft_cost, 1) + c(self.target_cost, k + 1)

    def rate(self, k: int, batch: int, a: float | None = None) -> float:
        """Expected tokens per unit cost of draft length k at batch size `batch`."""
        a = self.acceptance if a is None else a
        return self.expected_tokens(k, a) / max(self.cost(k, batch), 1e-30)

    def choose(self, batch: int, max_k: int | None = None) -> int:
        """The k of k_choices (<= max_k) with the highest expected tokens per unit cost."""
        ks = [k for k in self.k_choices if max_k is None or k <= max_k] or [min(self.k_choices)]
        return max(ks, key=lambda k: (self.rate(k, batch), -k))

    def update(self, rate: float) -> None:
        """Fold a measured per-token acceptance rate into the EMA (the first replaces the
        prior). NaN (nothing measured) is ignored."""
        if not math.isfinite(rate):
            return
        rate = min(max(float(rate), 0.0), 1.0)
        if self.measurements == 0:
            self.acceptance = rate
        else:
            self.acceptance = self.decay * self.acceptance + (1.0 - self.decay) * rate
        self.measurements += 1

    def __repr__(self) -> str:
        return (f"DraftLengthController(k_choices={self.k_choices}, target_cost="
                f"{self.target_cost}, draft_cost={self.draft_cost}, acceptance="
                f"{self.acceptance:.3f})")


def _check_k_choices(k_choices) -> tuple[int, ...]:
    ks = tuple(k_choices) if isinstance(k_choices, Sequence) else None
    if not ks or any(isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 0
                     for k in ks):
        raise ValueError(f"k_choices must be a non-empty sequence of ints >= 0, got {k_choices!r}")
    return tuple(sorted({int(k) for k in ks}))


def measure_costs(model: CausalLM, params, *,
                  shapes: Sequence[tuple[int, int]] = ((1, 1), (16, 1), (16, 9)),
                  cache_len: int = 64, repeats: int = 5, inner: int = 8) -> tuple[float, float]:
    """Fit c(B, T) = overhead + per_token * B * T (seconds) to timings of `model`'s cached
    forward of T tokens for B rows (a per-row cache_index, as in speculative decoding), at each
    (B, T) of `shapes` (at least two different B * T): `inner` forwards run in one jitted
    `lax.fori_loop`, as inside a decode loop, so the host dispatch of a call is amortised rather
    than counted as the forward's overhead; median of `repeats` timed calls after a warm-up
    (compile) call, divided by `inner`; least-squares line, clipped at 0. A rough, consistent
    cost model for `DraftLengthController`, not a benchmark."""
    if len({b * t for b, t in shapes}) < 2:
        raise ValueError(f"shapes must hold at least two different B * T, got {shapes!r}")
    cache_len = min(cache_len, model.config.max_len)

    @jax.jit
    def forwards(params, tokens, cache, index):
        def body(_, carry):
            cache, total = carry
            logits, cache = model.apply(params, tokens, None, None, cache, index)
            return cache, total + logits[0, 0, 0]

        return lax.fori_loop(0, inner, body, (cache, jnp.float32(0.0)))[1]

    sizes, seconds = [], []
    for b, t in shapes:
        if not 0 < t < cache_len:
            raise ValueError(f"measure_costs: T={t} must be in [1, cache_len={cache_len})")
        cache = init_cache(model.config, b, cache_len, model.config.compute_dtype)
        tokens = jnp.zeros((b, t), jnp.int32)
        index = jnp.full((b,), cache_len - t - 1, jnp.int32)
        forwards(params, tokens, cache, index).block_until_ready()  # compile
        times = []
        for _ in range(max(repeats, 1)):
            start = time.perf_counter()
            forwards(params, tokens, cache, index).block_until_ready()
            times.append((time.perf_counter() - start) / inner)
        sizes.append(b * t)
        seconds.append(float(np.median(times)))
    per_token, overhead = np.polyfit(np.asarray(sizes, float), np.asarray(seconds), 1)
    return max(float(overhead), 0.0), max(float(per_token), 0.0)


class DrafterState(NamedTuple):
    """What a `SpeculativeSampler` has learned (its `learning_state`), as arrays: the drafter,
    its Adam state and the `DraftLengthController`'s estimates. The controller's numbers are
    host float64 / int64 arrays, so they round-trip a checkpoint bit for bit."""

    params: Any  # the drafter's params
    opt_state: Any  # their Adam state
    acceptance: np.ndarray  # float64 scalar: the controller's acceptance-rate EMA
    measurements: np.ndarray  # int64 scalar: the rates folded into it
    costs: np.ndarray  # [2, 2] float64: (overhead, per_token) of the target, the drafter; NaN: none


def _cost_row(cost: tuple[float, float] | None) -> list[float]:
    return [math.nan, math.nan] if cost is None else [float(c) for c in cost]


def _cost_pair_of(row: np.ndarray) -> tuple[float, float] | None:
    return None if np.isnan(row).any() else (float(row[0]), float(row[1]))


class SpeculativeSampler:
    """A `Sampler` by speculative decoding with an evolving drafter (see the module docstring).

    spec = SpeculativeSampler(model, drafter, drafter_params, max_new_tokens=N, eos_id=1,
                              pad_id=0, draft_k="auto", target_cost=(...), draft_cost=(...))
    out = spec(params, prompt, prompt_mask, rng)              # GenerateOutput; k by the controller
    out, stats = spec.generate(params, prompt, prompt_mask, rng, k=4)
    metrics = spec.learn(params, seq, rewards)                 # distil the drafter after a rollout

    drafter: a smaller `CausalLM` with the model's vocabulary, starting from `drafter_params`.
    What it learns (`learning_state`, a `DrafterState`: `drafter_params`, its Adam state
    `opt_state` and the controller's estimates, replaced by calls, `learn` and `distill`) is a
    `LearningSampler`'s state: a trainer sets it from its train state before a rollout and
    keeps the new one; `init_learning_state()` is a fresh run's (the drafter it was built with).
    draft_k: "auto" (the `controller` picks k in k_choices per call) or a fixed int of k_choices.
    max_new_tokens, top_k, greedy and k are static (one program per k and input shape, compiled
    when first used); temperature and top_p are traced, as in `KVCacheSampler`.
    target_cost / draft_cost: (overhead, per_token) of each model's forward for the controller;
    when None, the first "auto" call measures them (`calibrate`).
    distill_lr, distill_steps: Adam learning rate and steps per `learn` call (0: learn nothing).
    reward_tau: None for an unweighted distillation, else the temperature of `reward_weights`.
    """

    def __init__(self, model: CausalLM, drafter: CausalLM, drafter_params, *,
                 max_new_tokens: int, eos_id: int, pad_id: int, temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0, greedy: bool = False,
                 draft_k: int | str = "auto", k_choices: Sequence[int] = (0, 1, 2, 4, 8),
                 distill_lr: float = 1e-3, distill_steps: int = 1,
                 reward_tau: float | None = None,
                 target_cost: tuple[float, float] | None = None,
                 draft_cost: tuple[float, float] | None = None):
        check_sizes(max_new_tokens, top_k)
        check_sampling(temperature, top_p)
        k_choices = _check_k_choices(k_choices)
        if draft_k != "auto" and (isinstance(draft_k, bool) or draft_k not in k_choices):
            raise ValueError(f"draft_k must be 'auto' or one of k_choices {k_choices}, got "
                             f"{draft_k!r}")
        if drafter.config.vocab_size != model.config.vocab_size:
            raise ValueError(f"drafter vocab_size={drafter.config.vocab_size} must equal the "
                             f"model's vocab_size={model.config.vocab_size}")
        if isinstance(distill_steps, bool) or not isinstance(distill_steps, int) or \
                distill_steps < 0:
            raise ValueError(f"distill_steps must be an int >= 0, got {distill_steps!r}")
        if not float(distill_lr) > 0:
            raise ValueError(f"distill_lr must be positive, got {distill_lr}")
        if reward_tau is not None and not float(reward_tau) > 0:
            raise ValueError(f"reward_tau must be positive or None, got {reward_tau}")
        self.model, self.drafter, self.drafter_params = model, drafter, drafter_params
        self._initial_drafter = drafter_params
        self.max_new_tokens, self.top_k, self.greedy = max_new_tokens, top_k, greedy
        self.eos_id, self.pad_id = eos_id, pad_id
        self.temperature, self.top_p = float(temperature), float(top_p)
        self._settings = (f32_scalar(self.temperature), f32_scalar(self.top_p))
        self.draft_k, self.k_choices = draft_k, k_choices
        self.distill_lr, self.distill_steps, self.reward_tau = distill_lr, distill_steps, \
            reward_tau
        self.controller = DraftLengthController(k_choices, target_cost=target_cost,
                                                draft_cost=draft_cost)
        self._optimizer = optax.adam(distill_lr)
        self.opt_state = self._optimizer.init(drafter_params)
        self._metrics = jit_on_mesh(functools.partial(_distill_metrics, model, drafter))
        self._step = jit_on_mesh(functools.partial(_distill_step, model, drafter,
                                                   self._optimizer))
        self._programs: dict[int, object] = {}
        self.last_stats: dict | None = None

    def init_learning_state(self) -> DrafterState:
        """A fresh run's learning state: the drafter the sampler was built with, a fresh Adam
        state and the controller's prior; the costs the controller knows (given, or measured
        by an earlier run: a property of the machine, not of the run) are kept."""
        fresh = DraftLengthController(self.k_choices)
        return DrafterState(
            self._initial_drafter, self._optimizer.init(self._initial_drafter),
            np.asarray(fresh.acceptance, np.float64), np.asarray(fresh.measurements, np.int64),
            np.asarray([_cost_row(self.controller.target_cost),
                        _cost_row(self.controller.draft_cost)], np.float64))

    @property
    def learning_state(self) -> DrafterState:
        """What the sampler has learned (see `DrafterState`); a new object on every read."""
        c = self.controller
        return DrafterState(
            self.drafter_params, self.opt_state, np.asarray(c.acceptance, np.float64),
            np.asarray(c.measurements, np.int64),
            np.asarray([_cost_row(c.target_cost), _cost_row(c.draft_cost)], np.float64))

    @learning_state.setter
    def learning_state(self, state: DrafterState) -> None:
        c = self.controller
        self.drafter_params, self.opt_state = state.params, state.opt_state
        c.acceptance, c.measurements = float(state.acceptance), int(state.measurements)
        costs = np.asarray(state.costs, np.float64)
        c.target_cost, c.draft_cost = _cost_pair_of(costs[0]), _cost_pair_of(costs[1])

    # -- decoding ------------------------------------------------------------------------------

    def _body(self, k: int):
        options = dict(max_new_tokens=self.max_new_tokens, top_k=self.top_k,
                       eos_id=self.eos_id, pad_id=self.pad_id, greedy=self.greedy)
        return (functools.partial(_plain, self.model, **options) if k == 0 else
                functools.partial(_speculative, self.model, self.drafter, k=k, **options))

    def _program(self, k: int):
        """The jitted decoder of draft length k (compiled on first use, then cached)."""
        if k not in self._programs:
            self._programs[k] = jit_on_mesh(self._body(k))
        return self._programs[k]

    def compiled_memory(self, params, prompt, prompt_mask, k: int | None = None) -> dict:
        """The compiler's memory estimate (bytes, `base.compiled_memory`) of decoding these
        prompts with draft length k (default: draft_k, or the largest k that fits when "auto")."""
        if k is None:
            k = self.draft_k if self.draft_k != "auto" else max(
                c for c in self.k_choices if c <= max(self._max_k(prompt.shape[1]), 0))
        return compiled_memory(self._body(k), params, self.drafter_params, prompt, prompt_mask,
                               jax.random.key(0), default_seq_ids(prompt, None),
                               *self._settings)

    def _slots(self, prompt_len: int, k: int) -> int:
        return prompt_len + self.max_new_tokens + (k + 1 if k else 0)

    def _check_fits(self, prompt_len: int, k: int) -> None:
        slots = self._slots(prompt_len, k)
        models = (("model", self.model), ("drafter", self.drafter))[: 2 if k else 1]
        for name, m in models:
            if slots > m.config.max_len:
                extra = f" + k + 1 = {k + 1}" if k else ""
                raise ValueError(
                    f"draft k={k}: prompt length P={prompt_len} + max_new_tokens="
                    f"{self.max_new_tokens}{extra} needs {slots} cache slots, more than the "
                    f"{name}'s LMConfig.max_len={m.config.max_len}")

    def _max_k(self, prompt_len: int) -> int:
        """The largest draft length whose cache fits both models (-1: not even k = 0)."""
        room = min(self.model.config.max_len, self.drafter.config.max_len)
        return room - prompt_len - self.max_new_tokens - 1

    def _place_drafter(self, params) -> None:
        """Replicate the drafter (and its optimizer state) on the policy's mesh, once."""
        mesh = mesh_of(params)
        if mesh is not None and mesh_of(self.drafter_params) is None:
            self.drafter_params = replicate(self.drafter_params, mesh)
            self.opt_state = replicate(self.opt_state, mesh)

    def calibrate(self, params, batch_size: int = 64, prompt_len: int = 64,
                  repeats: int = 5) -> None:
        """Measure the controller's target and drafter costs (`measure_costs`) at 1 row and
        `batch_size` rows, with the token counts a round uses and the cache length of a
        prompt of `prompt_len` tokens (capped at each model's max_len)."""
        self._place_drafter(params)
        big = max(int(batch_size), 2)
        k_max = max(self.k_choices)
        slots = self._slots(prompt_len, k_max)
        self.controller.target_cost = measure_costs(
            self.model, params, shapes=((1, 1), (big, 1), (big, k_max + 1)), repeats=repeats,
            cache_len=min(slots, self.model.config.max_len))
        self.controller.draft_cost = measure_costs(
            self.drafter, self.drafter_params, shapes=((1, 1), (big, 1), (big, 2)),
            repeats=repeats, cache_len=min(slots, self.drafter.config.max_len))

    def choose_k(self, params, batch: int, prompt_len: int) -> int:
        """The controller's draft length for this batch (measuring costs first if needed)."""
        if not self.controller.calibrated:
            self.calibrate(params, batch_size=batch, prompt_len=prompt_len)
        return self.controller.choose(batch, max_k=max(self._max_k(prompt_len), 0))

    def generate(self, params, prompt: jax.Array, prompt_mask: jax.Array, rng: jax.Array, *,
                 k: int | None = None, temperature: float | jax.Array | None = None,
                 top_p: float | jax.Array | None = None,
                 seq_ids: jax.Array | None = None) -> tuple[GenerateOutput, dict]:
        """Decode with draft length k (None: `draft_k`, or the controller's choice when "auto").

        Returns (GenerateOutput, stats) with stats Python numbers: k; rounds (target
        verification calls; decode steps for k = 0); drafted and accepted (draft tokens of live
        rows); acceptance = accepted / drafted (0 when nothing was drafted); token_acceptance =
        accepted / (accepted + rejections), the per-token rate the controller learns from;
        tokens (sum of lengths). Also kept as `last_stats`.
        """
        check_sampling(self.temperature if temperature is None else temperature,
                        self.top_p if top_p is None else top_p)
        seq_ids = default_seq_ids(prompt, seq_ids)
        b, p = prompt.shape
        self._place_drafter(params)
        if k is None:
            k = self.draft_k if self.draft_k != "auto" else self.choose_k(params, b, p)
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 0:
            raise ValueError(f"k must be an int >= 0, got {k!r}")
        k = int(k)
        self._check_fits(p, k)
        out, raw = self._program(k)(
            params, self.drafter_params, prompt, prompt_mask, rng, seq_ids,
            self._settings[0] if temperature is None else f32_scalar(temperature),
            self._settings[1] if top_p is None else f32_scalar(top_p))
        raw = {name: int(v) for name, v in raw.items()}
        drafted, accepted, trials = raw["drafted"], raw["accepted"], \
            raw["accepted"] + raw["rejected"]
        stats = {"k": k, "rounds": raw["rounds"], "drafted": drafted, "accepted": accepted,
                 "acceptance": accepted / drafted if drafted else 0.0,
                 "token_acceptance": accepted / trials if trials else 0.0,
                 "tokens": raw["tokens"]}
        if trials:  # k = 0 rounds measure nothing
            self.controller.update(stats["token_acceptance"])
        self.last_stats = stats
        return out, stats

    def __call__(self, params, prompt: jax.Array, prompt_mask: jax.Array, rng: jax.Array, *,
                 temperature: float | jax.Array | None = None,
                 top_p: float | jax.Array | None = None,
                 seq_ids: jax.Array | None = None, images=None) -> GenerateOutput:
        """The `Sampler` call: `generate` with k = draft_k (the controller's when "auto")."""
        refuse_images(images, "SpeculativeSampler")
        return self.generate(params, prompt, prompt_mask, rng, temperature=temperature,
                             top_p=top_p, seq_ids=seq_ids)[0]

    # -- drafter evolution ---------------------------------------------------------------------

    def _fit(self, params, seq, weights, steps: int) -> dict[str, float]:
        """`steps` Adam steps of the drafter on seq; metrics of the first (pre-update) step."""
        self._place_drafter(params)
        args = (seq.prompt, seq.prompt_mask, seq.completion, seq.completion_mask, weights,
                self._settings[0])
        first = None
        for _ in range(steps):
            self.drafter_params, self.opt_state, metrics = self._step(
                params, self.drafter_params, self.opt_state, *args)
            first = metrics if first is None else first
        metrics = {name: float(v) for name, v in first.items()}
        # sum_v min(p, q) on the actor's own rollouts is the expected acceptance rate of a draft
        # token: a measurement for the controller even when it has chosen k = 0 lately.
        self.controller.update(metrics["kd_acceptance"])
        return {"drafter_kd": metrics["kd_loss"], "drafter_kl": metrics["kd_kl"],
                "drafter_alpha": metrics["kd_acceptance"]}

    def learn(self, params, seq, rewards=None) -> dict[str, float]:
        """Distil the drafter from the actor `params` on a fresh rollout (ReSpec).

        seq: a `models.sequence.SeqBatch` (or any object with prompt [R, P], prompt_mask,
        completion [R, N], completion_mask): the rollout, rows i * G + j; rewards: [B, G] with
        R = B * G (used when reward_tau is set: `reward_weights` per row; else unweighted).
        Runs `distill_steps` Adam steps of `kd_loss` at the sampling temperature. Returns
        {drafter_kd (the weighted KD loss of the drafter on this rollout, before the update),
        drafter_kl (unweighted), drafter_alpha (the expected acceptance rate sum_v min(p, q)),
        acceptance and draft_k (of the last decode call)}; only the last two when
        distill_steps = 0.
        """
        last = self.last_stats or {}
        out = {"acceptance": float(last.get("acceptance", 0.0)),
               "draft_k": float(last.get("k", 0))}
        if self.distill_steps == 0:  # a frozen drafter: measured on the rollout, not trained
            self._place_drafter(params)
            rows = seq.completion.shape[0]
            metrics = {name: float(v) for name, v in self._metrics(
                params, self.drafter_params, seq.prompt, seq.prompt_mask, seq.completion,
                seq.completion_mask, np.ones((rows,), np.float32), self._settings[0]).items()}
            self.controller.update(metrics["kd_acceptance"])
            return {"drafter_kl": metrics["kd_kl"], "drafter_alpha": metrics["kd_acceptance"],
                    **out}
        rows = seq.completion.shape[0]
        if self.reward_tau is None:
            weights = np.ones((rows,), np.float32)
        else:
            if rewards is None:
                raise ValueError("learn: rewards are required when reward_tau is set")
            rewards = np.asarray(rewards, np.float32)
            if rewards.ndim != 2 or rewards.size != rows:
                raise ValueError(f"learn: rewards must have shape [B, G] with B * G = {rows} "
                                 f"rollout rows, got {rewards.shape}")
            weights = np.asarray(reward_weights(rewards, self.reward_tau), np.float32)
        return {**self._fit(params, seq, weights, self.distill_steps), **out}

    def distill(self, params, seq, steps: int) -> dict[str, float]:
        """Warm-start the drafter: `steps` unweighted KD steps towards `params` (e.g. the SFT
        model) on `seq` (as `learn`). Returns the metrics of `learn` (first step)."""
        if steps <= 0:
            raise ValueError(f"steps must be positive, got {steps}")
        return self._fit(params, seq, np.ones((seq.completion.shape[0],), np.float32), steps)

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={getattr(self, k)!r}" for k in (
            "max_new_tokens", "eos_id", "pad_id", "temperature", "top_k", "top_p", "greedy",
            "draft_k", "k_choices", "distill_lr", "distill_steps", "reward_tau"))
        return f"SpeculativeSampler({options})"


__all__ = ["DraftLengthController", "DrafterState", "SpeculativeSampler", "measure_costs"]

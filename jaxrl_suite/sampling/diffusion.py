"""Masked-diffusion decoding behind the `Sampler` protocol, and the AR-ness of decoding orders.

    sampler = DiffusionSampler(model, max_new_tokens=N, steps=S, eos_id=1, pad_id=0,
                               order="confidence")          # or "entropy", "random"
    out = sampler(params, prompt, prompt_mask, rng)           # GenerateOutput, as any Sampler
    out, order = sampler.decode(params, prompt, prompt_mask, rng)  # + each position's rank

Decoding (LLaDA, arXiv 2502.09992, sec. 2.4; Dream / DiffuCoder's `diffusion_generate`): the
completion starts as N mask tokens. Each of the S steps runs the model on [prompt | current
completion] (a full bidirectional forward; no KV cache), draws a candidate token x0_i for every
position from softmax(logits_i / T) (nucleus-filtered by top_p; argmax when greedy; the mask
token is never drawn), scores the still-masked positions, and unmasks the k_s best of them:

    confidence  score_i = p_T(x0_i)               (LLaDA's low-confidence remasking)
    entropy     score_i = -H(p_T(. | i))          (Dream / DiffuCoder's alg="entropy")
    random      score_i ~ U(0, 1)

k_s spreads the tokens evenly over the steps (LLaDA's `get_num_transfer_tokens`). With
`block_size` b > 0 (semi-autoregressive, LLaDA's blocks) the completion is decoded as N / b blocks
left to right, S / (N / b) steps each, and only the current block's positions are eligible.
Temperature shapes the token choice; with confidence or entropy order it also shapes the order,
since the scores are taken under p_T of the sampled token (DiffuCoder, sec. 3.2: higher
temperature, less autoregressive decoding). Keys: step s of sequence `seq_ids[b]` uses
fold_in(fold_in(rng, seq_ids[b]), s), so a row's decode does not depend on its batch.

Output contract: tokens up to and including the first EOS are the completion (mask 1); later
positions hold pad_id and log-prob 0. `logprobs[b, i]` is log p_T(token) at the step that
unmasked position i. Unlike an autoregressive sampler's, it is not the sequence's likelihood
under a later forward: a diffusion LM has none. RL takes its log-probs from the estimators in
`losses.coupled_grpo` instead.

AR-ness (DiffuCoder, sec. 3.1), from the order in which positions were unmasked (`decode`'s
`order[b, i]` = the rank of position i; the tokens of one step are ranked by score):
  local AR-ness@k   the fraction of the decoding steps t >= k whose position p_t continues a
                    left-to-right run of k: p_{t-j} = p_t - j for j = 1..k. Pure left-to-right
                    decoding gives 1.
  global AR-ness@k  the fraction of steps whose position is one of the first k positions still
                    masked at that step. Pure left-to-right decoding gives 1 for every k.
Both are measured over all N positions of the completion (the EOS tail included).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxrl_suite.core.parallel import jit_on_mesh
from jaxrl_suite.models.diffusion_lm import DiffusionLM, completion_logits
from jaxrl_suite.sampling.base import GenerateOutput, refuse_images
from jaxrl_suite.sampling.kv_cache import (
    check_sampling,
    default_seq_ids,
    f32_scalar,
    filter_logits,
    first_argmax,
    gumbel_rows,
    sequence_keys,
)

ORDERS = ("confidence", "entropy", "random")


def transfer_schedule(n: int, steps: int, block_size: int = 0) -> np.ndarray:
    """Tokens unmasked at each step, [steps] int32: each block's b = block_size (0 = n) positions
    spread over its steps / (n / b) steps, the first (b mod steps-per-block) steps one more."""
    b = block_size or n
    if n % b:
        raise ValueError(f"block_size={block_size} must divide max_new_tokens={n}")
    blocks = n // b
    if steps % blocks or steps < blocks:
        raise ValueError(f"steps={steps} must be a positive multiple of the {blocks} blocks "
                         f"(max_new_tokens / block_size)")
    per = steps // blocks
    if per > b:
        raise ValueError(f"steps={steps} exceeds the {n} positions: a step would unmask nothing")
    one = np.full(per, b // per, np.int32)
    one[: b % per] += 1
    return np.tile(one, blocks)


def _decode(model: DiffusionLM, params, prompt, prompt_mask, rng, seq_ids, temperature, top_p,
            *, n: int, steps: int, block_size: int, order: str, greedy: bool, eos_id: int,
            pad_id: int):
    b = prompt.shape[0]
    mask_id = model.mask_token
    schedule = jnp.asarray(transfer_schedule(n, steps, block_size))
    per_block = steps // (n // (block_size or n))
    k_max = int(transfer_schedule(n, steps, block_size).max())
    pos = jnp.arange(n, dtype=jnp.int32)
    row_keys = sequence_keys(rng, seq_ids)  # [B]

    def body(s, state):
        x, masked, logp_at, rank, count = state
        logits = completion_logits(model, params, prompt, prompt_mask, x)  # [B, N, V]
        logits = logits.at[..., mask_id].set(-jnp.inf)  # the mask token is never decoded
        scaled = logits * (1.0 / temperature)
        logp = jax.nn.log_softmax(scaled, axis=-1)  # [B, N, V] p_T, unfiltered
        keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(row_keys, s)  # [B]
        k_tok, k_ord = (jax.vmap(lambda k, i=i: jax.random.fold_in(k, i))(keys) for i in (0, 1))
        if greedy:
            x0 = first_argmax(logits.reshape(b * n, -1)).reshape(b, n)
        else:
            v = logits.shape[-1]
            filtered = filter_logits(scaled.reshape(b * n, v), 0, top_p).reshape(b, n, v)
            x0 = first_argmax(filtered + gumbel_rows(k_tok, (n, v), filtered.dtype))
        lp0 = jnp.take_along_axis(logp, x0[..., None], axis=-1)[..., 0]  # [B, N]
        if order == "confidence":
            score = jnp.exp(lp0)
        elif order == "entropy":
            score = jnp.sum(jnp.exp(logp) * jnp.where(jnp.isfinite(logp), logp, 0.0), axis=-1)
        else:
            score = jax.vmap(lambda k: jax.random.uniform(k, (n,)))(k_ord)
        block = s // per_block
        lo = block * (block_size or n)
        eligible = masked & (pos >= lo) & (pos < lo + (block_size or n))
        score = jnp.where(eligible, score, -jnp.inf)
        _, top = lax.top_k(score, k_max)  # [B, k_max], best first (ties: lower position)
        take = jnp.arange(k_max) < schedule[s]  # this step's k_s of them
        rows = jnp.arange(b)[:, None]
        chosen = jnp.zeros((b, n), jnp.int32).at[rows, top].max(
            jnp.broadcast_to(take, (b, k_max)).astype(jnp.int32)) > 0
        chosen &= eligible
        step_rank = jnp.zeros((b, n), jnp.int32).at[rows, top].set(
            jnp.broadcast_to(jnp.arange(k_max, dtype=jnp.int32), (b, k_max)))
        x = jnp.where(chosen, x0, x)
        logp_at = jnp.where(chosen, lp0, logp_at)
        rank = jnp.where(chosen, count[:, None] + step_rank, rank)
        count = count + jnp.sum(chosen, axis=1, dtype=jnp.int32)
        return x, masked & ~chosen, logp_at, rank, count

    init = (jnp.full((b, n), mask_id, jnp.int32), jnp.ones((b, n), bool),
            jnp.zeros((b, n), jnp.float32), jnp.full((b, n), -1, jnp.int32),
            jnp.zeros((b,), jnp.int32))
    x, _, logp_at, rank, _ = lax.fori_loop(0, steps, body, init)
    is_eos = x == eos_id
    first = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1), n - 1)  # [B]
    valid = pos[None, :] <= first[:, None]
    tokens = jnp.where(valid, x, pad_id)
    out = GenerateOutput(tokens, jnp.where(valid, logp_at, 0.0), valid.astype(jnp.float32),
                         jnp.sum(valid, axis=1, dtype=jnp.int32))
    return out, rank


class DiffusionSampler:
    """A `Sampler` that decodes a `DiffusionLM` by iterative unmasking (see the module
    docstring). max_new_tokens, steps, block_size, order and greedy are static; temperature and
    top_p are traced defaults of the call, as for `KVCacheSampler`."""

    def __init__(self, model: DiffusionLM, *, max_new_tokens: int, steps: int, eos_id: int,
                 pad_id: int, order: str = "confidence", block_size: int = 0,
                 temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False):
        if order not in ORDERS:
            raise ValueError(f"diffusion order must be one of {list(ORDERS)}, got {order!r}")
        transfer_schedule(max_new_tokens, steps, block_size)  # one-line errors now
        check_sampling(temperature, top_p)
        self.model = model
        self.max_new_tokens, self.steps, self.block_size = max_new_tokens, steps, block_size
        self.order, self.greedy, self.eos_id, self.pad_id = order, greedy, eos_id, pad_id
        self.temperature, self.top_p = float(temperature), float(top_p)
        self._decode = jit_on_mesh(functools.partial(
            _decode, model, n=max_new_tokens, steps=steps, block_size=block_size, order=order,
            greedy=greedy, eos_id=eos_id, pad_id=pad_id))

    def decode(self, params, prompt, prompt_mask, rng, *, temperature=None, top_p=None,
               seq_ids=None) -> tuple[GenerateOutput, jax.Array]:
        """(the completions, order [B, N] int32: the rank at which each position was
        unmasked, 0 = first)."""
        t = self.temperature if temperature is None else temperature
        p = self.top_p if top_p is None else top_p
        check_sampling(t, p)
        return self._decode(params, prompt, prompt_mask, rng, default_seq_ids(prompt, seq_ids),
                            f32_scalar(t), f32_scalar(p))

    def __call__(self, params, prompt, prompt_mask, rng, *, temperature=None, top_p=None,
                 seq_ids=None, images=None) -> GenerateOutput:
        refuse_images(images, "DiffusionSampler")
        return self.decode(params, prompt, prompt_mask, rng, temperature=temperature,
                           top_p=top_p, seq_ids=seq_ids)[0]

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={getattr(self, k)!r}" for k in (
            "max_new_tokens", "steps", "order", "block_size", "temperature", "top_p", "greedy"))
        return f"DiffusionSampler({options})"


def unmask_positions(order: np.ndarray) -> np.ndarray:
    """The positions in the order they were unmasked: [B, N], row b's argsort of order[b]."""
    return np.argsort(np.asarray(order), axis=-1, kind="stable")


def local_arness(order: np.ndarray, k: int = 1) -> float:
    """Local AR-ness@k of decoding orders [B, N] (ranks): the fraction of steps t >= k whose
    position continues a left-to-right run of k (p_{t-j} = p_t - j, j = 1..k), over all rows."""
    seq = unmask_positions(order)  # [B, N]
    n = seq.shape[1]
    if not 1 <= k < n:
        raise ValueError(f"local AR-ness@k needs 1 <= k < N={n}, got k={k}")
    ok = np.ones((seq.shape[0], n - k), bool)
    for j in range(1, k + 1):
        ok &= seq[:, k - j : n - j] == seq[:, k:] - j
    return float(ok.mean())


def global_arness(order: np.ndarray, k: int = 1) -> float:
    """Global AR-ness@k of decoding orders [B, N] (ranks): the fraction of steps whose position
    is among the first k positions still masked at that step, over all rows."""
    seq = unmask_positions(order)
    b, n = seq.shape
    if not 1 <= k <= n:
        raise ValueError(f"global AR-ness@k needs 1 <= k <= N={n}, got k={k}")
    hits = 0
    for row in seq:
        still = np.ones(n, bool)
        for p in row:
            hits += int(np.count_nonzero(still[:p]) < k)  # fewer than k masked before p
            still[p] = False
    return hits / (b * n)


__all__ = ["ORDERS", "DiffusionSampler", "global_arness", "local_arness", "transfer_schedule",
           "unmask_positions"]

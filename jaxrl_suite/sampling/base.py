"""The sampler protocol: how a trainer asks any decoding engine for completions.

    out = sampler(params, prompt, prompt_mask, rng)                      -> GenerateOutput
    out = sampler(params, prompt, prompt_mask, rng, temperature=0.7, top_p=0.9)

prompt [B, P] int32 is left-padded, prompt_mask [B, P] is True on its real tokens, and the
result holds N = max_new_tokens completion tokens per row. The log-prob contract is what
makes a sampler usable for RL: `logprobs[b, j]` is log softmax(logits / T)[tokens[b, j]] of
the policy `params` at the sampling temperature T, taken BEFORE any top-k / top-p filter,
so it equals a later full-forward recompute at the same temperature (GRPO uses it as the old
log-prob of its ratio). Off the mask (after a row's first EOS) tokens are the pad id and
log-probs are 0.

temperature and top_p are optional keyword overrides of the sampler's own settings (None =
keep them). They are traced values: a new temperature or nucleus mass reuses the compiled
program. What shapes the program is fixed when a sampler is built (max_new_tokens; for
`KVCacheSampler` also top_k and greedy decoding), and it compiles once per input shape.

`KVCacheSampler` (sampling/kv_cache.py) is the default implementation. Continuous batching
(refilling finished rows), speculative decoding (a drafter plus a verifying pass) and
diffusion decoding, added by later issues, implement this same protocol, so a trainer never
knows which engine produced its rollouts.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import jax


class GenerateOutput(NamedTuple):
    """Completions of a `Sampler`; N = max_new_tokens."""

    tokens: jax.Array  # [B, N] int32 completion tokens; pad_id after EOS
    logprobs: jax.Array  # [B, N] float32 log softmax(logits / T)[token], unfiltered; 0 off-mask
    mask: jax.Array  # [B, N] float32 1 for tokens up to and including the first EOS, else 0
    lengths: jax.Array  # [B] int32 = mask.sum(-1)


class Sampler(Protocol):
    """`sampler(params, prompt, prompt_mask, rng, *, temperature=None, top_p=None)`.

    params: the policy's parameters; prompt [B, P] int32, left-padded; prompt_mask [B, P] bool;
    rng: a PRNG key (ignored by greedy samplers); temperature, top_p: traced overrides of the
    sampler's settings (None = its own). Returns a `GenerateOutput` of [B, N] tokens, log-probs
    (the unfiltered sampling distribution, see the module docstring) and mask, and [B] lengths.
    """

    def __call__(
        self,
        params,
        prompt: jax.Array,
        prompt_mask: jax.Array,
        rng: jax.Array,
        *,
        temperature: float | jax.Array | None = None,
        top_p: float | jax.Array | None = None,
    ) -> GenerateOutput: ...


__all__ = ["GenerateOutput", "Sampler"]

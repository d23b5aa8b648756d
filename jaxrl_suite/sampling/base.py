"""The sampler protocol: how a trainer asks any decoding engine for completions.

    out = sampler(params, prompt, prompt_mask, rng)                      -> GenerateOutput
    out = sampler(params, prompt, prompt_mask, rng, temperature=0.7, top_p=0.9)
    out = sampler(params, prompt, prompt_mask, rng, seq_ids=ids)           # ids [B] int32

prompt [B, P] int32 is left-padded, prompt_mask [B, P] is True on its real tokens, and the
result holds N = max_new_tokens completion tokens per row. The log-prob contract is what
makes a sampler usable for RL: `logprobs[b, j]` is log softmax(logits / T)[tokens[b, j]] of
the policy `params` at the sampling temperature T, taken BEFORE any top-k / top-p filter,
so it equals a later full-forward recompute at the same temperature (GRPO uses it as the old
log-prob of its ratio). Off the mask (after a row's first EOS) tokens are the pad id and
log-probs are 0.

Randomness is per sequence: completion token j of the sequence numbered s (`seq_ids[b]`, default
b) is drawn with a key derived from (rng, s, j) alone (`kv_cache.token_keys`), never from the row,
slot or step that computes it. A trainer numbers a rollout's rows prompt_index * G +
sample_index, so every exact sampler (static, micro-groups, continuous batching) gives the same
completions for the same key, whatever its schedule.

A vision-language policy (`models.vlm.VisionLM`) also takes `images=`: the prompts' images,
uint8 / float [N, H, W, C] or a list per row, in the order of the image-token runs of the prompts
(`models.vlm.vision_inputs`). They are read at the prefill only; decoding continues from the
prompt's M-RoPE offset (`rope_delta`). `KVCacheSampler` supports them; the other engines refuse
them with a one-line ValueError (`refuse_images`) until they are ported.

temperature and top_p are optional keyword overrides of the sampler's own settings (None =
keep them). They are traced values: a new temperature or nucleus mass reuses the compiled
program. What shapes the program is fixed when a sampler is built (max_new_tokens; for
`KVCacheSampler` also top_k and greedy decoding), and it compiles once per input shape.

`KVCacheSampler` (sampling/kv_cache.py) is the default implementation. `ContinuousSampler`
(sampling/continuous.py: micro sampling groups, continuous batching with length-aware
scheduling) and `SpeculativeSampler` (sampling/speculative.py: a drafter LM proposes, the policy
verifies) implement this same protocol, so a trainer never knows which engine produced its
rollouts. A sampler that learns across calls is a `LearningSampler`: the continuous engine's
length predictor and the speculative sampler's drafter, whose `learn(params, seq, rewards) ->
metrics` `GRPOTrainer` calls after each rollout. What it has learned is a pytree of arrays,
`learning_state`, that the trainer keeps in its train state (checkpointed with it, so a resumed
run continues exactly) and sets on the sampler before each step's rollout.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

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
    sampler's settings (None = its own); seq_ids: [B] int32 sequence numbers for the per-sequence
    keys (None = arange(B)); images: a vision-language policy's images (None = text only; see
    the module docstring). Returns a `GenerateOutput` of [B, N] tokens, log-probs
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
        seq_ids: jax.Array | None = None,
        images: Any = None,
    ) -> GenerateOutput: ...


@runtime_checkable
class LearningSampler(Protocol):
    """A `Sampler` that learns across calls (`ContinuousSampler`'s length predictor,
    `SpeculativeSampler`'s drafter and draft-length controller).

    learning_state: what it has learned, a pytree of arrays of fixed shapes; each call (and
    `learn`) replaces it. The sampler works on it; the trainer owns it: it sets it from the
    train state before a rollout and stores the new one back (`GRPOTrainState.sampler`), so
    it is checkpointed, and a resumed run, or a new run on the same sampler, continues from
    its own. init_learning_state(): a fresh run's (a checkpoint's restore template).
    """

    learning_state: Any

    def init_learning_state(self) -> Any: ...


def image_kwargs(images) -> dict:
    """`{"images": images}` for a sampler call, or {} for text prompts (images None), so a
    sampler without the `images=` argument still serves text."""
    return {} if images is None else {"images": images}


def refuse_images(images, engine: str) -> None:
    """The one-line ValueError of an engine that does not take `images=` yet."""
    if images is not None:
        raise ValueError(f"{engine} does not take images= yet; the static KV-cache engine "
                         "(KVCacheSampler) does")


def compiled_memory(fn, *args) -> dict:
    """The compiler's memory estimate of `jax.jit(fn)(*args)` (compiled, not run), in bytes:
    argument, output, temp, alias and peak = argument + output + temp - alias. The samplers'
    `compiled_memory(params, prompt, prompt_mask)` report their decoding program's with it."""
    m = jax.jit(fn).lower(*args).compile().memory_analysis()
    out = {k: int(getattr(m, f"{k}_size_in_bytes")) for k in ("argument", "output", "temp",
                                                              "alias")}
    out["peak"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
    return out


__all__ = ["GenerateOutput", "LearningSampler", "Sampler", "compiled_memory", "image_kwargs",
           "refuse_images"]

"""A masked-diffusion language model: the causal LM's blocks without the causal mask.

LLaDA (arXiv 2502.09992) / MDLM (arXiv 2406.07524) / DiffuCoder (arXiv 2506.20639). A sequence
[prompt | completion] is corrupted by replacing completion tokens with a mask token; the model
sees the whole corrupted sequence (bidirectional attention) and predicts, at every masked
position, the token that was there:

    logits[b, i] = f_theta(x_t)[b, i]       predicts x_0[b, i]   (LLaDA; shift False)
    logits[b, i - 1] = f_theta(x_t)[b, i - 1]  predicts x_0[b, i]   (Dream / DiffuCoder; shift)

`DiffusionLM` is `models.lm.CausalLM` with `causal = False`: the same RMSNorm / RoPE / GQA /
SwiGLU blocks and the same parameter tree (so an autoregressive checkpoint can start it, as
DiffuCoder starts from Qwen2.5-Coder), and a mask token `mask_id`. Its default is the last id of
the vocabulary, an extra id the ByT5 tokenizer never emits. There is no KV cache: every decoding
step of `sampling.diffusion.DiffusionSampler` is a full forward.

The training objective is `losses.diffusion.masked_diffusion_loss`; the decoding is
`sampling.diffusion.DiffusionSampler`; the RL log-prob estimators are in
`losses.coupled_grpo`.

With `shift` False the model predicts each token at its own position, as LLaDA does. DiffuCoder
(like Dream) is adapted from an autoregressive model and keeps its shift: the logits at position
i - 1 predict token i, so an AR checkpoint's next-token head is reused as it is; the first
completion token is predicted at the last prompt position, which is never masked.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_suite.models.lm import CausalLM, LMConfig


class DiffusionLM(CausalLM):
    """Bidirectional transformer with a mask token; `__call__` as `CausalLM`'s full forward
    (tokens [B, T], positions, key_mask [B, T]) -> (logits [B, T, V], None)."""

    mask_id: int = -1  # the mask token; -1 = config.vocab_size - 1
    shift: bool = False  # position i - 1 predicts token i (an AR checkpoint's head), not i
    causal = False

    @property
    def mask_token(self) -> int:
        """The mask token id (`mask_id`, or the vocabulary's last id when -1)."""
        return self.config.vocab_size - 1 if self.mask_id < 0 else self.mask_id


def check_mask_token(model: DiffusionLM, tokenizer) -> int:
    """The model's mask token, checked against the tokenizer: inside the model's vocabulary and
    none of the tokenizer's pad / EOS ids. One-line ValueError otherwise."""
    m = model.mask_token
    if not 0 <= m < model.config.vocab_size:
        raise ValueError(f"DiffusionLM.mask_id={m} is outside the vocabulary "
                         f"(size {model.config.vocab_size})")
    if m in (tokenizer.pad_id, tokenizer.eos_id):
        raise ValueError(f"DiffusionLM.mask_id={m} is the tokenizer's pad or EOS id")
    return m


def completion_inputs(prompt: jax.Array, prompt_mask: jax.Array, completion: jax.Array):
    """(tokens [B, P+N], key_mask [B, P+N], positions [B, P+N]) of a left-padded prompt and a
    full-length completion (every one of its N positions is a real key, masked or not).
    Positions count the real tokens, so a row's first prompt token is position 0."""
    n = completion.shape[1]
    tokens = jnp.concatenate([prompt, completion.astype(prompt.dtype)], axis=1)
    key_mask = jnp.concatenate([prompt_mask.astype(bool),
                                jnp.ones((prompt.shape[0], n), bool)], axis=1)
    positions = jnp.maximum(jnp.cumsum(key_mask, axis=1) - 1, 0)
    return tokens, key_mask, positions


def completion_logits(model: DiffusionLM, params, prompt: jax.Array, prompt_mask: jax.Array,
                      completion: jax.Array) -> jax.Array:
    """The logits [B, N, V] that predict the N completion tokens of [prompt | completion] (a
    completion holding mask tokens where it is corrupted): at the completion positions, or one
    position earlier with `model.shift`."""
    tokens, key_mask, positions = completion_inputs(prompt, prompt_mask, completion)
    logits, _ = model.apply(params, tokens, positions=positions, key_mask=key_mask)
    start = prompt.shape[1] - int(model.shift)
    return logits[:, start : start + completion.shape[1]]


__all__ = ["DiffusionLM", "LMConfig", "check_mask_token", "completion_inputs",
           "completion_logits"]

"""The sequence layout of the LM trainers and the causal model's views of a completion.

`SeqBatch` holds prompts (left-padded) and completions (right-padded) in one layout that every
LM trainer, sampler and loss shares (leading axis = rows, sharded over the mesh's "data" axis).
The views run a `CausalLM` over prompt + completion and return what predicts each completion
token: logits (`completion_logits`), final-normed hidden states (`completion_hidden`), any
per-token function of the logits computed in chunks of positions (`completion_token_map`), or
a mean embedding per row (`completion_embeddings`). A masked-diffusion LM's logits of a
completion are `models.diffusion_lm.completion_logits` (they depend on a mask, not on order).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_suite.losses.chunked import chunked_token_map
from jaxrl_suite.models.lm import CausalLM, output_projection
from jaxrl_suite.models.vlm import VisionInputs


class SeqBatch(NamedTuple):
    """Prompt/completion arrays in the shared layout (leading axis = rows, sharded over "data")."""

    prompt: jax.Array  # [B, P] int32, left-padded
    prompt_mask: jax.Array  # [B, P] bool
    completion: jax.Array  # [B, N] int32, right-padded
    completion_mask: jax.Array  # [B, N] float32 (1 up to and including EOS)
    # [B, N] float32: the tokens the losses train on (None = completion_mask). A multi-turn
    # episode (algorithms/agent.py) attends to its tool outputs but zeroes them here, so they
    # carry no policy-gradient, KL or SFT term.
    loss_mask: jax.Array | None = None
    # A vision-language policy's prompt images (`models.vlm.VisionInputs` of the prompts: per-row
    # patches, their M-RoPE positions and decode offset; None = text only).
    images: VisionInputs | None = None

    @property
    def train_mask(self) -> jax.Array:
        """The mask of the loss terms: `loss_mask` if set, else `completion_mask`."""
        return self.completion_mask if self.loss_mask is None else self.loss_mask


def _apply(model: CausalLM, params, seq: SeqBatch, *, drop_last: bool, **kwargs):
    """`model.apply` over prompt + completion [B, P+N] (without the last token when `drop_last`:
    it predicts nothing). Text positions are cumsum(key_mask) - 1; with images, the prompt's
    M-RoPE positions, then the completion's text positions + rope_delta on every axis (where the
    sampler decoded them), and only the prompt's image tokens read image embeddings."""
    tokens = jnp.concatenate([seq.prompt, seq.completion], axis=1)
    key_mask = jnp.concatenate([seq.prompt_mask, seq.completion_mask > 0], axis=1)
    if drop_last:
        tokens, key_mask = tokens[:, :-1], key_mask[:, :-1]
    positions = jnp.maximum(jnp.cumsum(key_mask, axis=1) - 1, 0)
    if seq.images is None:
        return model.apply(params, tokens, positions=positions, key_mask=key_mask, **kwargs)
    im, p = seq.images, seq.prompt.shape[1]
    after = positions[:, p:] + im.rope_delta[:, None]  # [B, T - P]
    positions = jnp.concatenate([im.positions, jnp.repeat(after[..., None], 3, axis=-1)], 1)
    in_prompt = jnp.arange(tokens.shape[1]) < p
    image_mask = (tokens == model.config.image_token_id) & in_prompt
    return model.apply(params, tokens, positions=positions, key_mask=key_mask,
                       patches=im.patches, patch_positions=im.patch_positions,
                       image_mask=image_mask, **kwargs)


def completion_logits(model: CausalLM, params, seq: SeqBatch) -> jax.Array:
    """Logits that predict each completion token: [B, N, V]."""
    logits, _ = _apply(model, params, seq, drop_last=True)  # [B, P+N-1, V]
    return logits[:, seq.prompt.shape[1] - 1 :]  # [B, N, V]


def completion_hidden(model: CausalLM, params, seq: SeqBatch) -> jax.Array:
    """Final-normed hidden states that predict each completion token, [B, N, D], without the
    [B, N, V] logits (project them chunk by chunk: `completion_token_map`)."""
    _, _, h = _apply(model, params, seq, drop_last=True, return_hidden=True,
                     return_logits=False)
    return h[:, seq.prompt.shape[1] - 1 :]  # [B, N, D]


def completion_token_map(fn, model: CausalLM, params, seq: SeqBatch, *, chunk: int,
                         temperature: float = 1.0):
    """`fn(logits [B, c, V], completion [B, c]) -> per-token pytree [B, c, ...]` over the
    completion, `chunk` positions at a time (`losses.chunked.chunked_token_map`): equal to
    `fn(completion_logits(model, params, seq) / temperature, seq.completion)` without ever
    forming more than one [B, chunk, V] block of logits, forward or backward."""
    weight, transpose = output_projection(params, model.config)
    return chunked_token_map(fn, completion_hidden(model, params, seq), weight, seq.completion,
                             chunk=chunk, transpose_weight=transpose, temperature=temperature)


def completion_embeddings(model: CausalLM, params, seq: SeqBatch) -> jax.Array:
    """Mean over each completion's tokens of the model's final-normed hidden states: [B, D]."""
    _, _, h = _apply(model, params, seq, drop_last=False, return_hidden=True)  # [B, P+N, D]
    h = h[:, seq.prompt.shape[1]:].astype(jnp.float32)  # [B, N, D], the completion tokens
    m = seq.completion_mask.astype(jnp.float32)[..., None]
    return (h * m).sum(1) / jnp.maximum(m.sum(1), 1.0)

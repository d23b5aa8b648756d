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

    @property
    def train_mask(self) -> jax.Array:
        """The mask of the loss terms: `loss_mask` if set, else `completion_mask`."""
        return self.completion_mask if self.loss_mask is None else self.loss_mask



def _full_sequence(seq: SeqBatch, drop_last: bool):
    """(tokens, key_mask, positions) of prompt + completion [B, P+N] (without the last token when
    `drop_last`: it predicts nothing)."""
    tokens = jnp.concatenate([seq.prompt, seq.completion], axis=1)
    key_mask = jnp.concatenate([seq.prompt_mask, seq.completion_mask > 0], axis=1)
    if drop_last:
        tokens, key_mask = tokens[:, :-1], key_mask[:, :-1]
    positions = jnp.maximum(jnp.cumsum(key_mask, axis=1) - 1, 0)
    return tokens, key_mask, positions


def completion_logits(model: CausalLM, params, seq: SeqBatch) -> jax.Array:
    """Logits that predict each completion token: [B, N, V]."""
    tokens, key_mask, positions = _full_sequence(seq, drop_last=True)  # [B, P+N-1]
    logits, _ = model.apply(params, tokens, positions=positions, key_mask=key_mask)
    return logits[:, seq.prompt.shape[1] - 1 :]  # [B, N, V]


def completion_hidden(model: CausalLM, params, seq: SeqBatch) -> jax.Array:
    """Final-normed hidden states that predict each completion token, [B, N, D], without the
    [B, N, V] logits (project them chunk by chunk: `completion_token_map`)."""
    tokens, key_mask, positions = _full_sequence(seq, drop_last=True)  # [B, P+N-1]
    _, _, h = model.apply(params, tokens, positions=positions, key_mask=key_mask,
                          return_hidden=True, return_logits=False)
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
    tokens, key_mask, positions = _full_sequence(seq, drop_last=False)  # [B, P+N]
    _, _, h = model.apply(params, tokens, positions=positions, key_mask=key_mask,
                          return_hidden=True)
    h = h[:, seq.prompt.shape[1]:].astype(jnp.float32)  # [B, N, D], the completion tokens
    m = seq.completion_mask.astype(jnp.float32)[..., None]
    return (h * m).sum(1) / jnp.maximum(m.sum(1), 1.0)

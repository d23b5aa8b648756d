"""Flax linen models."""

from jaxrl_suite.models.diffusion_lm import DiffusionLM
from jaxrl_suite.models.lm import (
    CausalLM,
    KVCache,
    LMConfig,
    apply_rope,
    init_cache,
    rms_norm,
    rope_cos_sin,
    stack_layers,
    unstack_layers,
)
from jaxrl_suite.models.sequence import (
    SeqBatch,
    completion_embeddings,
    completion_hidden,
    completion_logits,
    completion_token_map,
)
from jaxrl_suite.models.value import ValueLM

__all__ = [
    "CausalLM",
    "DiffusionLM",
    "KVCache",
    "LMConfig",
    "SeqBatch",
    "ValueLM",
    "apply_rope",
    "completion_embeddings",
    "completion_hidden",
    "completion_logits",
    "completion_token_map",
    "init_cache",
    "rms_norm",
    "rope_cos_sin",
    "stack_layers",
    "unstack_layers",
]

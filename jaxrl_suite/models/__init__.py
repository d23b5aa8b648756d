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
from jaxrl_suite.models.vision import VisionConfig, VisionTower, patchify
from jaxrl_suite.models.vlm import (
    VisionInputs,
    VisionLM,
    VLMConfig,
    expand_image_tokens,
    mrope_positions,
    vision_inputs,
)

__all__ = [
    "CausalLM",
    "DiffusionLM",
    "KVCache",
    "LMConfig",
    "SeqBatch",
    "VLMConfig",
    "ValueLM",
    "VisionConfig",
    "VisionInputs",
    "VisionLM",
    "VisionTower",
    "apply_rope",
    "completion_embeddings",
    "completion_hidden",
    "completion_logits",
    "completion_token_map",
    "expand_image_tokens",
    "init_cache",
    "mrope_positions",
    "patchify",
    "rms_norm",
    "rope_cos_sin",
    "stack_layers",
    "unstack_layers",
    "vision_inputs",
]

"""Hugging Face checkpoints (Llama, Qwen2, Qwen3; Qwen2-VL) to and from our `CausalLM` (and
`VisionLM`), without torch.

    cfg, params, tokenizer = load_hf_checkpoint("/models/Qwen2.5-0.5B")  # a local directory
    logits, _ = CausalLM(cfg).apply(params, tokens)
    save_hf_checkpoint(params, cfg, "/tmp/trained", tokenizer=tokenizer)  # servable by HF/vLLM

A checkpoint directory holds `config.json`, the weights as `model.safetensors` or as shards named
by `model.safetensors.index.json`, and the tokenizer files. The weights are read with
`safetensors`' numpy backend (bfloat16 tensors, which numpy lacks, through `ml_dtypes`), so no
torch is needed at run time. Parameters are cast to `LMConfig.param_dtype` (float32 by default;
`LMConfig.dtype` sets the compute dtype), whatever the checkpoint's dtype, and are stacked on a
leading layer axis when the config scans its layers (`LMConfig.scanned`; `lm.stack_layers`).
The options that config.json does not hold (`OPTIONS`: dtype, param_dtype, remat, scan_layers,
attention_impl) are keyword arguments of the loaders.

The mapping (see `models/lm.py`): each HF `Linear.weight` [out, in] is our Dense kernel [in, out]
transposed; embeddings, norm scales and biases are copied as they are. From `config.json`:
hidden_size -> d_model, num_hidden_layers -> n_layers, num_attention_heads -> n_heads,
num_key_value_heads -> n_kv_heads (GQA), intermediate_size -> d_ff, head_dim,
max_position_embeddings -> max_len, rope theta (`rope_parameters.rope_theta` or the older
`rope_theta`), rms_norm_eps -> norm_eps, tie_word_embeddings. The families differ only in
Qwen2's q/k/v biases (`qkv_bias`) and Qwen3's per-head q/k RMSNorm (`qk_norm`).

Not supported (a one-line error names the field): RoPE scaling (`rope_type` other than
"default"), sliding-window attention, attention/MLP biases other than Qwen2's q/k/v, and
activations other than SiLU.

Qwen2-VL (`model_type` "qwen2_vl", HF `Qwen2VLForConditionalGeneration`) loads as a
`models.vlm.VLMConfig` and the `VisionLM` tree: the language model is a Qwen2 (the same mapping)
with M-RoPE (`mrope_section`), the tower is `models.vision.VisionTower` under `visual`
(`visual.patch_embed.proj.weight` [E, C, T, p, p], a Conv3d with stride = kernel, is the Dense
kernel [C*T*p*p, E] of the flattened patch; the rest are Linear / LayerNorm as above). Both
config.json layouts load: transformers 5's (`text_config`, `vision_config`, `rope_parameters`
{rope_type: default, mrope_section, rope_theta}) and transformers 4's (text fields at the top,
`rope_scaling` {type: mrope, mrope_section}, `rope_theta`, `vision_config.in_chans`), and both
tensor layouts: `model.layers.*`, `visual.*` (transformers 4, and what `save_pretrained` still
writes) and `model.language_model.*`, `model.visual.*` (transformers 5's module names). The
image mean / std come from preprocessor_config.json when present. We save transformers 5's
config.json (as its `save_pretrained` writes it; tested with transformers 5.25), transformers 4's
tensor names and a preprocessor_config.json of `patchify`'s processing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import struct
from pathlib import Path

import jax
import numpy as np

from jaxrl_suite.core.config import NonNegativeInt, Positive
from jaxrl_suite.models import lora as _lora
from jaxrl_suite.models.lm import LMConfig, stack_layers, unstack_layers
from jaxrl_suite.models.vision import CLIP_MEAN, CLIP_STD, VisionConfig
from jaxrl_suite.models.vlm import VLMConfig

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
}
_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
_PREPROCESSOR = "preprocessor_config.json"
# transformers 5's names of Qwen2-VL tensors -> the transformers 4 names we map (and save)
_VLM_PREFIXES = (("model.language_model.", "model."), ("model.visual.", "visual."))
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some older checkpoints saved
_FIELD_NAMES = {  # LMConfig field -> config.json field
    "vocab_size": "vocab_size", "d_model": "hidden_size", "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads",
    "d_ff": "intermediate_size", "max_len": "max_position_embeddings", "head_dim": "head_dim",
    "rope_theta": "rope_theta", "norm_eps": "rms_norm_eps",
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# LMConfig fields that config.json does not hold
OPTIONS = ("dtype", "param_dtype", "remat", "scan_layers", "attention_impl")


@dataclasses.dataclass(frozen=True)
class ModelConfig(LMConfig):
    """An experiment's `model` section: `LMConfig` sizes for a model trained from scratch, or
    `hf_path`, a local Hugging Face checkpoint directory to start from (then the sizes, and the
    tokenizer, come from the checkpoint; only the `OPTIONS` (dtype, param_dtype, remat,
    scan_layers, attention_impl) and the LoRA fields are still read from here: `options()`).

    `lora_rank` > 0 trains LoRA adapters (`models.lora`, Hu et al. arXiv:2106.09685) on the
    projections named in `lora_targets`, y = x W + (lora_alpha / lora_rank) x A B, with the base
    weights W frozen (from scratch or from `hf_path` alike)."""

    hf_path: str | None = None  # e.g. --set model.hf_path=/models/Qwen2.5-0.5B
    lora_rank: NonNegativeInt = 0  # LoRA rank r (0 = off: every parameter trains)
    lora_alpha: Positive = 16.0  # LoRA scale: the update is (lora_alpha / lora_rank) x A B
    lora_targets: tuple[str, ...] = _lora.TARGETS  # of q, k, v, o (attention), gate, up, down

    def __post_init__(self):
        super().__post_init__()  # check_fields(self, "model."): every field's Range, lora_* too
        _lora.check_lora(self.lora_rank, self.lora_alpha, self.lora_targets)

    @property
    def lora(self) -> _lora.LoraConfig | None:
        """The `LoraConfig` of the lora_* fields, or None when `lora_rank` is 0."""
        if not self.lora_rank:
            return None
        return _lora.LoraConfig(self.lora_rank, self.lora_alpha, tuple(self.lora_targets))

    def lm_config(self) -> LMConfig:
        """The plain `LMConfig` of these fields (without `hf_path`)."""
        return LMConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LMConfig)})

    def options(self) -> dict:
        """The `OPTIONS` fields, as keyword arguments of `load_hf_checkpoint`."""
        return {name: getattr(self, name) for name in OPTIONS}


@dataclasses.dataclass(frozen=True)
class VisionModelConfig(VLMConfig):
    """A vision-language experiment's `model` section: `VLMConfig` sizes (the LM, `vision` the
    image tower, the special ids) for a `VisionLM` trained from scratch, or `hf_path`, a local
    Qwen2-VL checkpoint directory (then only the `OPTIONS` are read from here). No LoRA yet."""

    hf_path: str | None = None  # e.g. --set model.hf_path=/models/Qwen2-VL-2B

    def lm_config(self) -> VLMConfig:
        """The plain `VLMConfig` of these fields (without `hf_path`)."""
        return VLMConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(VLMConfig)})

    def options(self) -> dict:
        """The `OPTIONS` fields, as keyword arguments of `load_hf_checkpoint`."""
        return {name: getattr(self, name) for name in OPTIONS}


class HFCheckpointError(ValueError):
    """A checkpoint that cannot be mapped onto `CausalLM`; the message names the field/tensor."""


# ---------------------------------------------------------------------------------------------
# config.json <-> LMConfig


def _rope_theta(hf: dict, where: str) -> float:
    """RoPE base of a config.json; scaled RoPE variants (llama3, yarn, ...) are refused."""
    rope = hf.get("rope_parameters") or {}
    legacy = hf.get("rope_scaling") or {}  # transformers 4 name
    for field, spec in (("rope_parameters", rope), ("rope_scaling", legacy)):
        kind = spec.get("rope_type", spec.get("type", "default"))
        if kind not in (None, "default"):
            raise HFCheckpointError(f"{where}: field '{field}.rope_type'={kind!r} is not "
                                    "supported (only unscaled RoPE, 'default')")
    return float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))


def config_from_hf(hf: dict, *, dtype: str = "float32", where: str = "config.json",
                   param_dtype: str = "float32", remat: str = "none",
                   scan_layers: bool | None = None, attention_impl: str | None = None,
                   preprocessor: dict | None = None) -> LMConfig:
    """Our `LMConfig` for a Hugging Face `config.json` dict (Llama, Qwen2 or Qwen3; a
    `VLMConfig` for Qwen2-VL, whose image mean / std come from `preprocessor`, the
    preprocessor_config.json dict, when given), with the `OPTIONS` that config.json does not
    hold (dtype, param_dtype, remat, scan_layers, attention_impl)."""
    options = dict(dtype=dtype, param_dtype=param_dtype, remat=remat, scan_layers=scan_layers,
                   attention_impl=attention_impl)
    if hf.get("model_type") == "qwen2_vl":
        return _vlm_config_from_hf(hf, where, preprocessor or {}, options)
    model_type = hf.get("model_type")
    if model_type not in ARCHITECTURES:
        raise HFCheckpointError(f"{where}: field 'model_type'={model_type!r} is not supported "
                                f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise HFCheckpointError(f"{where}: field 'hidden_act'={act!r} is not supported (silu)")
    bias = bool(hf.get("attention_bias", False))
    if bias or hf.get("mlp_bias", False):
        field = "attention_bias" if bias else "mlp_bias"
        raise HFCheckpointError(f"{where}: field '{field}'=true is not supported")
    if hf.get("use_sliding_window", False):
        raise HFCheckpointError(f"{where}: field 'use_sliding_window'=true is not supported")
    for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "intermediate_size"):
        if field not in hf:
            raise HFCheckpointError(f"{where}: missing field '{field}'")
    n_heads = int(hf["num_attention_heads"])
    head_dim = hf.get("head_dim")
    if head_dim is not None and int(head_dim) == hf["hidden_size"] // n_heads:
        head_dim = None  # our default
    try:
        return LMConfig(
            vocab_size=int(hf["vocab_size"]),
            d_model=int(hf["hidden_size"]),
            n_layers=int(hf["num_hidden_layers"]),
            n_heads=n_heads,
            n_kv_heads=int(hf.get("num_key_value_heads") or n_heads),
            d_ff=int(hf["intermediate_size"]),
            max_len=int(hf.get("max_position_embeddings", 2048)),
            rope_theta=_rope_theta(hf, where),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            dtype=dtype,
            head_dim=None if head_dim is None else int(head_dim),
            qkv_bias=model_type == "qwen2",
            qk_norm=model_type == "qwen3",
            param_dtype=param_dtype,
            remat=remat,
            scan_layers=scan_layers,
            attention_impl=attention_impl,
        )
    except ValueError as e:  # say it in config.json's field names
        msg = re.sub(r"config field 'model\.(\w+)'", r"\1", str(e)).replace("LMConfig.", "")
        for ours, theirs in _FIELD_NAMES.items():
            msg = re.sub(rf"\b{ours}\b", f"'{theirs}'", msg)
        raise HFCheckpointError(f"{where}: {msg}") from None


def _vlm_config_from_hf(hf: dict, where: str, preprocessor: dict, options: dict) -> VLMConfig:
    """`VLMConfig` of a Qwen2-VL config.json in either layout: transformers 5 (`text_config`
    with `rope_parameters` {rope_type: default, mrope_section, rope_theta}) or transformers 4
    (the text fields at the top, `rope_scaling` {type: mrope, mrope_section}, `rope_theta`)."""
    nested = hf.get("text_config") or {}
    text = {**hf, **nested}
    field = "rope_parameters" if text.get("rope_parameters") else "rope_scaling"
    rope = text.get(field) or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", "mrope"):
        raise HFCheckpointError(f"{where}: field '{field}.rope_type'={kind!r} is not supported "
                                "(only M-RoPE, 'default' / 'mrope')")
    if "mrope_section" not in rope:
        raise HFCheckpointError(f"{where}: missing field '{field}.mrope_section'")
    theta = float(rope.get("rope_theta", text.get("rope_theta", 1e6)))
    tie = bool(hf.get("tie_word_embeddings") or nested.get("tie_word_embeddings"))
    lm = config_from_hf({**text, "model_type": "qwen2", "rope_scaling": None,
                         "rope_parameters": {"rope_type": "default", "rope_theta": theta},
                         "tie_word_embeddings": tie}, where=where, **options)
    v = hf.get("vision_config") or {}
    mlp_ratio = float(v.get("mlp_ratio", 4))
    if mlp_ratio != int(mlp_ratio):
        raise HFCheckpointError(f"{where}: field 'vision_config.mlp_ratio'={mlp_ratio} is not "
                                "supported (a whole number)")
    special = {"image_token_id": ("image_token_id", 151655),
               "vision_start_id": ("vision_start_token_id", 151652),
               "vision_end_id": ("vision_end_token_id", 151653),
               "video_token_id": ("video_token_id", 151656)}
    try:
        vision = VisionConfig(
            patch_size=int(v.get("patch_size", v.get("spatial_patch_size", 14))),
            temporal_patch_size=int(v.get("temporal_patch_size", 2)),
            in_channels=int(v.get("in_channels", v.get("in_chans", 3))),
            embed_dim=int(v.get("embed_dim", 1280)), depth=int(v.get("depth", 32)),
            n_heads=int(v.get("num_heads", 16)), mlp_ratio=int(mlp_ratio),
            spatial_merge_size=int(v.get("spatial_merge_size", 2)),
            out_dim=int(v.get("hidden_size", lm.d_model)),
            rope_theta=float((v.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
            hidden_act=v.get("hidden_act", "quick_gelu"),
            image_mean=tuple(preprocessor.get("image_mean", CLIP_MEAN)),
            image_std=tuple(preprocessor.get("image_std", CLIP_STD)))
        return VLMConfig(**{**{f.name: getattr(lm, f.name) for f in dataclasses.fields(LMConfig)},
                            "mrope_section": tuple(int(x) for x in rope["mrope_section"])},
                         vision=vision, **{ours: int(hf.get(theirs, default))
                                           for ours, (theirs, default) in special.items()})
    except ValueError as e:  # say it in config.json's field names
        msg = str(e).replace("LMConfig.mrope_section", f"'{field}.mrope_section'")
        msg = msg.replace("VLMConfig.vision.out_dim", "'vision_config.hidden_size'").replace(
            "d_model=", "'hidden_size'=")
        msg = re.sub(r"VisionConfig\.(\w+)", r"'vision_config.\1'", msg)
        msg = re.sub(r"config field 'vision\.(\w+)'", r"'vision_config.\1'", msg)
        for ours, (theirs, _) in special.items():
            msg = msg.replace(f"VLMConfig.{ours}", f"'{theirs}'")
        raise HFCheckpointError(f"{where}: {msg}") from None


def model_type_of(config: LMConfig) -> str:
    """The HF family a config is saved as: qwen2_vl (a `VLMConfig`), qwen3 (q/k norm), qwen2
    (q/k/v bias) or llama."""
    if isinstance(config, VLMConfig):
        if config.qk_norm or not config.qkv_bias or config.head_dim not in (
                None, config.d_model // config.n_heads):
            raise HFCheckpointError("a VLMConfig is saved as Qwen2-VL, which needs qkv_bias, no "
                                    "qk_norm and head_dim = d_model / n_heads")
        return "qwen2_vl"
    if config.qk_norm and config.qkv_bias:
        raise HFCheckpointError("LMConfig with both qk_norm and qkv_bias matches no HF family")
    return "qwen3" if config.qk_norm else "qwen2" if config.qkv_bias else "llama"


def _vlm_config_to_hf(config: VLMConfig, text: dict) -> dict:
    """Qwen2-VL's config.json (transformers 5 layout, as its `save_pretrained` writes it) around
    the text fields `text` of the qwen2 config of the same LM."""
    v = config.vision
    drop = ("architectures", "model_type", "rope_theta", "rope_parameters", "head_dim",
            "tie_word_embeddings", "torch_dtype", "attention_bias")
    text = {k: x for k, x in text.items() if k not in drop}
    text.update(model_type="qwen2_vl_text", rope_parameters={
        "rope_type": "default", "rope_theta": config.rope_theta,
        "mrope_section": list(config.mrope_section)})
    return {
        "architectures": [ARCHITECTURES["qwen2_vl"]],
        "model_type": "qwen2_vl",
        "dtype": "float32",
        "image_token_id": config.image_token_id,
        "video_token_id": config.video_token_id,
        "vision_start_token_id": config.vision_start_id,
        "vision_end_token_id": config.vision_end_id,
        "tie_word_embeddings": config.tie_embeddings,
        "text_config": text,
        "vision_config": {
            "model_type": "qwen2_vl_vision", "depth": v.depth, "embed_dim": v.embed_dim,
            "hidden_size": v.out_dim, "hidden_act": v.hidden_act, "mlp_ratio": v.mlp_ratio,
            "num_heads": v.n_heads, "in_channels": v.in_channels, "patch_size": v.patch_size,
            "spatial_merge_size": v.spatial_merge_size,
            "temporal_patch_size": v.temporal_patch_size,
            "rope_parameters": {"rope_type": "axial", "rope_theta": v.rope_theta},
        },
    }


def preprocessor_to_hf(config: VLMConfig) -> dict:
    """The preprocessor_config.json of a Qwen2-VL model: HF's image processor doing what
    `models.vision.patchify` does (this tower's patching and normalisation, no resizing: images
    come at multiples of patch_size * merge_size)."""
    v = config.vision
    return {"image_processor_type": "Qwen2VLImageProcessor", "do_resize": False,
            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "do_convert_rgb": True, "image_mean": list(v.image_mean),
            "image_std": list(v.image_std), "patch_size": v.patch_size,
            "temporal_patch_size": v.temporal_patch_size, "merge_size": v.spatial_merge_size}


def config_to_hf(config: LMConfig, *, tokenizer=None) -> dict:
    """The `config.json` dict of a Hugging Face model equal to `CausalLM(config)` (or, for a
    `VLMConfig`, to `VisionLM(config)`: Qwen2-VL)."""
    if isinstance(config, VLMConfig):
        model_type_of(config)  # a Qwen2-VL or a one-line error
        lm = LMConfig(**{f.name: getattr(config, f.name) for f in dataclasses.fields(LMConfig)
                         if f.name != "mrope_section"})
        hf = _vlm_config_to_hf(config, config_to_hf(lm, tokenizer=tokenizer))
        for key in ("eos_token_id", "pad_token_id", "bos_token_id"):
            if key in hf["text_config"]:
                hf[key] = hf["text_config"][key]
        return hf
    model_type = model_type_of(config)
    hf = {
        "architectures": [ARCHITECTURES[model_type]],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.resolved_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_len,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,  # transformers 4 reads this, 5 reads rope_parameters
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "tie_word_embeddings": config.tie_embeddings,
        "attention_bias": False,
        "torch_dtype": "float32",
    }
    if model_type == "llama":
        hf["mlp_bias"] = False
    else:
        hf["use_sliding_window"] = False
    if tokenizer is not None:
        hf["eos_token_id"] = tokenizer.eos_id
        hf["pad_token_id"] = tokenizer.pad_id
        bos = getattr(tokenizer.hf, "bos_token_id", None)
        if bos is not None:
            hf["bos_token_id"] = int(bos)
    return hf


# ---------------------------------------------------------------------------------------------
# tensor names and shapes


def _layout(config: LMConfig) -> dict[str, tuple[tuple[str, ...], tuple[int, ...], bool | str]]:
    """HF tensor name -> (our param path, HF shape, kind) for every tensor of `config`; kind:
    False (copied), True (a Linear: transposed) or "conv" (`_to_ours`)."""
    out = _lm_layout(config)
    if isinstance(config, VLMConfig):
        out.update(_vision_layout(config.vision))
    return out


def _vision_layout(v: VisionConfig) -> dict:
    """The tower's tensors (`models/vision.py`), under `visual.` as transformers 4 names them."""
    e, wide = v.embed_dim, v.embed_dim * v.merge_tokens
    out = {"visual.patch_embed.proj.weight": (
        ("visual", "patch_embed", "kernel"),
        (e, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size), "conv")}
    linears = {"merger.mlp.0": (("merger", "mlp_0"), wide, wide),
               "merger.mlp.2": (("merger", "mlp_2"), v.out_dim, wide)}
    norms = {"merger.ln_q": ("merger", "ln_q")}
    for i in range(v.depth):
        hf, ours = f"blocks.{i}.", f"blocks_{i}"
        linears[hf + "attn.qkv"] = ((ours, "attn", "qkv"), 3 * e, e)
        linears[hf + "attn.proj"] = ((ours, "attn", "proj"), e, e)
        linears[hf + "mlp.fc1"] = ((ours, "mlp", "fc1"), e * v.mlp_ratio, e)
        linears[hf + "mlp.fc2"] = ((ours, "mlp", "fc2"), e, e * v.mlp_ratio)
        norms[hf + "norm1"], norms[hf + "norm2"] = (ours, "norm1"), (ours, "norm2")
    for name, (path, rows, cols) in linears.items():
        out[f"visual.{name}.weight"] = (("visual", *path, "kernel"), (rows, cols), True)
        out[f"visual.{name}.bias"] = (("visual", *path, "bias"), (rows,), False)
    for name, path in norms.items():
        out[f"visual.{name}.weight"] = (("visual", *path, "scale"), (e,), False)
        out[f"visual.{name}.bias"] = (("visual", *path, "bias"), (e,), False)
    return out


def _to_ours(x: np.ndarray, kind: bool | str) -> np.ndarray:
    """An HF tensor as our leaf: a Linear [out, in] transposed to a Dense kernel [in, out]; the
    patch Conv3d [E, C, T, p, p] (stride = kernel) as the Dense kernel [C*T*p*p, E] of the
    flattened patch (`models.vision.patchify`'s (C, T, p, p) order)."""
    if kind == "conv":
        return np.ascontiguousarray(x.reshape(x.shape[0], -1).T)
    return np.ascontiguousarray(x.T) if kind else x


def _to_hf(x: np.ndarray, kind: bool | str, shape: tuple[int, ...]) -> np.ndarray:
    """Inverse of `_to_ours`."""
    if kind == "conv":
        return np.ascontiguousarray(x.T).reshape(shape)
    return np.ascontiguousarray(x.T) if kind else x


def _lm_layout(config: LMConfig) -> dict[str, tuple[tuple[str, ...], tuple[int, ...], bool]]:
    """The causal LM's tensors: (our param path, HF shape, transposed?)."""
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    hd, nh, nk = config.resolved_head_dim, config.n_heads, config.n_kv_heads
    out = {"model.embed_tokens.weight": (("embed", "embedding"), (v, d), False),
           "model.norm.weight": (("final_norm", "scale"), (d,), False)}
    if not config.tie_embeddings:
        out["lm_head.weight"] = (("lm_head", "kernel"), (v, d), True)
    for i in range(config.n_layers):
        hf, ours = f"model.layers.{i}.", f"layer_{i}"
        out[hf + "input_layernorm.weight"] = ((ours, "attn_norm", "scale"), (d,), False)
        out[hf + "post_attention_layernorm.weight"] = ((ours, "mlp_norm", "scale"), (d,), False)
        for name, rows in (("q", nh * hd), ("k", nk * hd), ("v", nk * hd)):
            out[hf + f"self_attn.{name}_proj.weight"] = ((ours, "attn", name, "kernel"),
                                                         (rows, d), True)
            if config.qkv_bias:
                out[hf + f"self_attn.{name}_proj.bias"] = ((ours, "attn", name, "bias"),
                                                           (rows,), False)
        out[hf + "self_attn.o_proj.weight"] = ((ours, "attn", "o", "kernel"), (d, nh * hd), True)
        if config.qk_norm:
            for name in ("q", "k"):
                out[hf + f"self_attn.{name}_norm.weight"] = ((ours, "attn", f"{name}_norm",
                                                              "scale"), (hd,), False)
        for name, shape in (("gate", (f, d)), ("up", (f, d)), ("down", (d, f))):
            out[hf + f"mlp.{name}_proj.weight"] = ((ours, "mlp", name, "kernel"), shape, True)
    return out


def params_from_hf(tensors: dict[str, np.ndarray], config: LMConfig, *,
                   where: str = "checkpoint") -> dict:
    """Our `{"params": ...}` tree (numpy, in `config.param_dtype`) from HF-named tensors; strict
    about names and shapes (a tied checkpoint's redundant `lm_head.weight` is ignored). The tree
    is the scanned one (`stack_layers`: subtree `layers`, leaves [L, ...]) when
    `config.scanned`."""
    layout = _layout(config)
    if isinstance(config, VLMConfig):  # transformers 5's names -> transformers 4's
        tensors = {_legacy_name(n): x for n, x in tensors.items()}
    extra = [n for n in tensors if n not in layout and not n.endswith(_IGNORED_SUFFIXES)
             and not (n == "lm_head.weight" and config.tie_embeddings)]
    if extra:
        raise HFCheckpointError(f"{where}: unexpected tensor '{extra[0]}' for this "
                                f"{model_type_of(config)} config ({len(extra)} in all)")
    tree: dict = {}
    for name, (path, shape, kind) in layout.items():
        if name not in tensors:
            raise HFCheckpointError(f"{where}: missing tensor '{name}'")
        x = tensors[name]
        if tuple(x.shape) != shape:
            raise HFCheckpointError(f"{where}: tensor '{name}' has shape {tuple(x.shape)} but "
                                    f"config.json implies {shape}")
        x = np.asarray(x, dtype=config.param_jnp_dtype)
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = _to_ours(x, kind)
    if config.scanned:
        tree = stack_layers(tree, config.n_layers)
    return {"params": tree}


def params_to_hf(params, config: LMConfig) -> dict[str, np.ndarray]:
    """HF-named float32 tensors of our params (`{"params": ...}` or the inner tree; unrolled, or
    scanned with a `layers` stack, whatever `config.scan_layers` says)."""
    tree = params.get("params", params)
    if "layers" in tree:
        tree = unstack_layers(tree, config.n_layers)
    out = {}
    for name, (path, shape, kind) in _layout(config).items():
        node = tree
        try:
            for key in path:
                node = node[key]
        except KeyError:
            missing = "/".join(path)
            raise HFCheckpointError(f"params lack '{missing}' (for tensor '{name}')") from None
        x = np.asarray(jax.device_get(node), dtype=np.float32)
        if kind == "conv" and x.size != math.prod(shape):
            raise HFCheckpointError(f"param '{'/'.join(path)}' has shape {x.shape}, "
                                    f"config implies {shape}")
        x = _to_hf(x, kind, shape)
        if x.shape != shape:
            raise HFCheckpointError(f"param '{'/'.join(path)}' has shape {x.shape}, "
                                    f"config implies {shape}")
        out[name] = x
    return out


def _legacy_name(name: str) -> str:
    """A Qwen2-VL tensor name in transformers 4's layout (`model.layers.*`, `visual.*`), from
    transformers 5's (`model.language_model.*`, `model.visual.*`) or as it is."""
    for new, old in _VLM_PREFIXES:
        if name.startswith(new):
            return old + name[len(new):]
    return name


# ---------------------------------------------------------------------------------------------
# safetensors files


def _header(path: Path) -> tuple[dict, int]:
    """A safetensors file's JSON header and the byte offset where its data starts."""
    with path.open("rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise HFCheckpointError(f"{path}: not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", raw)
        try:
            header = json.loads(fh.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise HFCheckpointError(f"{path}: not a safetensors file (bad header)") from None
    header.pop("__metadata__", None)
    return header, 8 + n


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """All tensors of one .safetensors file as numpy arrays (bfloat16 ones as float32)."""
    from safetensors import safe_open

    path = Path(path)
    header, start = _header(path)
    out = {}
    bf16 = [k for k, v in header.items() if v["dtype"] == "BF16"]
    if bf16:  # safetensors' numpy backend has no bfloat16: view the bytes through ml_dtypes
        import ml_dtypes

        data = np.memmap(path, dtype=np.uint8, mode="r")
        for k in bf16:
            lo, hi = header[k]["data_offsets"]
            x = np.frombuffer(data[start + lo : start + hi], dtype=ml_dtypes.bfloat16)
            out[k] = x.reshape(header[k]["shape"]).astype(np.float32)
    with safe_open(str(path), framework="np") as f:
        for k in f.keys():
            if k not in out:
                out[k] = f.get_tensor(k)
    return out


def _weight_files(path: Path) -> list[Path]:
    index = path / _INDEX
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError):
            raise HFCheckpointError(f"{index}: no 'weight_map' in the index file") from None
        files = [path / f for f in dict.fromkeys(weight_map.values())]
        for f in files:
            if not f.exists():
                raise FileNotFoundError(f"{index} names shard {f.name}, which is missing")
        return files
    if (path / _SINGLE).exists():
        return [path / _SINGLE]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no {_SINGLE}, {_INDEX} or *.safetensors files")
    return files


# ---------------------------------------------------------------------------------------------
# load / save


def load_hf_config(path: str | Path, *, dtype: str = "float32", **options) -> LMConfig:
    """The `LMConfig` of the checkpoint directory `path` (reads only config.json); `options`:
    param_dtype, remat, scan_layers, attention_impl (as `config_from_hf`)."""
    cfg_file = Path(path).expanduser() / "config.json"
    if not cfg_file.exists():
        raise FileNotFoundError(f"{cfg_file} is missing (not a Hugging Face checkpoint directory)")
    hf = _read_json(cfg_file)
    pre = cfg_file.with_name(_PREPROCESSOR)
    if hf.get("model_type") == "qwen2_vl" and pre.exists():  # the image mean / std
        options["preprocessor"] = _read_json(pre)
    return config_from_hf(hf, dtype=dtype, where=str(cfg_file), **options)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise HFCheckpointError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None


def load_hf_checkpoint(path: str | Path, *, dtype: str = "float32", tokenizer: bool = True,
                       param_dtype: str = "float32", remat: str = "none",
                       scan_layers: bool | None = None, attention_impl: str | None = None):
    """Read a local Hugging Face Llama / Qwen2 / Qwen3 checkpoint directory.

    Args:
      path: directory with config.json, model.safetensors (or shards + index) and tokenizer files.
      dtype: our compute dtype ("float32" | "bfloat16").
      param_dtype: the dtype the params are cast to ("float32" | "bfloat16").
      remat, scan_layers, attention_impl: the `LMConfig` fields of those names (scan_layers
        decides the params' layout: scanned ones are stacked on a leading layer axis).
      tokenizer: also load the tokenizer (a missing one is an error); False returns None for it.

    Returns:
      (LMConfig, params {"params": ...} of numpy arrays in param_dtype, Tokenizer or None).
    """
    path = Path(path).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"Hugging Face checkpoint directory {path} does not exist")
    config = load_hf_config(path, dtype=dtype, param_dtype=param_dtype, remat=remat,
                            scan_layers=scan_layers, attention_impl=attention_impl)
    tensors: dict[str, np.ndarray] = {}
    for f in _weight_files(path):
        tensors.update(read_safetensors(f))
    params = params_from_hf(tensors, config, where=str(path))
    tok = None
    if tokenizer:
        from jaxrl_suite.envs.text.tokenizer import load_tokenizer

        if not any((path / f).exists() for f in _TOKENIZER_FILES):
            raise FileNotFoundError(f"{path}: no tokenizer files ({', '.join(_TOKENIZER_FILES)}); "
                                    "pass tokenizer=False to load the weights alone")
        tok = load_tokenizer(str(path))
    return config, params, tok


def save_hf_checkpoint(params, config: LMConfig, path: str | Path, *, tokenizer=None,
                       max_shard_bytes: int = 5 * 2**30, merge_lora: bool = False,
                       lora: _lora.LoraConfig | None = None) -> Path:
    """Write `params` as a Hugging Face checkpoint directory (float32 safetensors + config.json,
    plus the tokenizer's files when given), loadable by `transformers.AutoModelForCausalLM` and
    by `load_hf_checkpoint`. Above `max_shard_bytes` the weights are split into shards named by
    model.safetensors.index.json, as `save_pretrained` does. Returns the directory.

    Params with LoRA adapters need `merge_lora=True`: the adapters are folded into the weights,
    W' = W + (alpha / r) A B (`models.lora.merge_lora`, with `lora`, or `config.lora` when
    `config` is a `ModelConfig`), and a plain model is written."""
    from safetensors.numpy import save_file

    if merge_lora:
        lora = lora if lora is not None else getattr(config, "lora", None)
        if lora is None:
            raise ValueError("save_hf_checkpoint(merge_lora=True) needs lora= (the LoraConfig "
                             "the adapters were trained with)")
        params = _lora.merge_lora(params, lora)
    elif _lora.split_lora(params)[1]:
        raise ValueError("save_hf_checkpoint: params hold LoRA adapters; pass merge_lora=True "
                         "(and lora=) to fold them into the weights")
    path = Path(path).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    tensors = params_to_hf(params, config)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, x in tensors.items():
        if shards[-1] and size + x.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = x
        size += x.nbytes
    for old in [*path.glob("*.safetensors"), path / _INDEX]:  # no stale shards from a prior save
        old.unlink(missing_ok=True)
    meta = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(path / _SINGLE), metadata=meta)
    else:
        n, weight_map = len(shards), {}
        for i, shard in enumerate(shards, 1):
            fname = f"model-{i:05d}-of-{n:05d}.safetensors"
            save_file(shard, str(path / fname), metadata=meta)
            weight_map.update(dict.fromkeys(shard, fname))
        total = int(sum(x.nbytes for x in tensors.values()))
        (path / _INDEX).write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    (path / "config.json").write_text(json.dumps(config_to_hf(config, tokenizer=tokenizer),
                                                 indent=2) + "\n")
    if isinstance(config, VLMConfig):
        (path / _PREPROCESSOR).write_text(json.dumps(preprocessor_to_hf(config), indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.hf.save_pretrained(str(path))
    return path


def num_params(config: LMConfig) -> int:
    """Parameter count of `CausalLM(config)` (or `VisionLM` for a `VLMConfig`; from the HF
    layout, no arrays built)."""
    return int(sum(math.prod(shape) for _, shape, _ in _layout(config).values()))


__all__ = [
    "ARCHITECTURES",
    "HFCheckpointError",
    "ModelConfig",
    "OPTIONS",
    "config_from_hf",
    "config_to_hf",
    "load_hf_checkpoint",
    "load_hf_config",
    "model_type_of",
    "num_params",
    "params_from_hf",
    "params_to_hf",
    "preprocessor_to_hf",
    "read_safetensors",
    "save_hf_checkpoint",
    "VisionModelConfig",
]

"""Hugging Face checkpoints (Llama, Qwen2, Qwen3) to and from our `CausalLM`, without torch.

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

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
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
                   scan_layers: bool | None = None,
                   attention_impl: str | None = None) -> LMConfig:
    """Our `LMConfig` for a Hugging Face `config.json` dict (Llama, Qwen2 or Qwen3), with the
    `OPTIONS` that config.json does not hold (dtype, param_dtype, remat, scan_layers,
    attention_impl)."""
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


def model_type_of(config: LMConfig) -> str:
    """The HF family a config is saved as: qwen3 (q/k norm), qwen2 (q/k/v bias) or llama."""
    if config.qk_norm and config.qkv_bias:
        raise HFCheckpointError("LMConfig with both qk_norm and qkv_bias matches no HF family")
    return "qwen3" if config.qk_norm else "qwen2" if config.qkv_bias else "llama"


def config_to_hf(config: LMConfig, *, tokenizer=None) -> dict:
    """The `config.json` dict of a Hugging Face model equal to `CausalLM(config)`."""
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


def _layout(config: LMConfig) -> dict[str, tuple[tuple[str, ...], tuple[int, ...], bool]]:
    """HF tensor name -> (our param path, HF shape, transposed?) for every tensor of `config`."""
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
    extra = [n for n in tensors if n not in layout and not n.endswith(_IGNORED_SUFFIXES)
             and not (n == "lm_head.weight" and config.tie_embeddings)]
    if extra:
        raise HFCheckpointError(f"{where}: unexpected tensor '{extra[0]}' for this "
                                f"{model_type_of(config)} config ({len(extra)} in all)")
    tree: dict = {}
    for name, (path, shape, transpose) in layout.items():
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
        node[path[-1]] = np.ascontiguousarray(x.T) if transpose else x
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
    for name, (path, shape, transpose) in _layout(config).items():
        node = tree
        try:
            for key in path:
                node = node[key]
        except KeyError:
            missing = "/".join(path)
            raise HFCheckpointError(f"params lack '{missing}' (for tensor '{name}')") from None
        x = np.asarray(jax.device_get(node), dtype=np.float32)
        x = np.ascontiguousarray(x.T) if transpose else x
        if x.shape != shape:
            raise HFCheckpointError(f"param '{'/'.join(path)}' has shape {x.shape}, "
                                    f"config implies {shape}")
        out[name] = x
    return out


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
    try:
        hf = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise HFCheckpointError(f"{cfg_file}: not valid JSON ({e.msg}, line {e.lineno})") from None
    return config_from_hf(hf, dtype=dtype, where=str(cfg_file), **options)


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
    if tokenizer is not None:
        tokenizer.hf.save_pretrained(str(path))
    return path


def num_params(config: LMConfig) -> int:
    """Parameter count of `CausalLM(config)` (from the HF layout; no arrays built)."""
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
    "read_safetensors",
    "save_hf_checkpoint",
]

"""Per-device memory of the GRPO update and the sampler at real model sizes, on fake devices.

    python benchmarks/bench_scale.py                     # docs/scaling.md's table (tens of minutes)
    python benchmarks/bench_scale.py --models qwen2.5-7b --meshes fsdp8 --options bf16-block
    python benchmarks/bench_scale.py --models qwen2-vl-2b --meshes fsdp8 --options bf16-block
    python benchmarks/bench_scale.py --smoke             # tiny models, a minute (run by tests)

Nothing is allocated or run: the parameters are `jax.eval_shape`d, the inputs are
`jax.ShapeDtypeStruct`s placed by the sharding rules (`models/sharding.py`) on a mesh of fake CPU
devices (`--xla_force_host_platform_device_count`, set here before JAX starts), and the update
(`GRPOTrainer.update_fn`: policy loss, gradient, AdamW) and the sampler (`sampling.kv_cache`'s
prefill + decode loop) are lowered and compiled for them. The figures are the compiler's
`memory_analysis()` per device: arguments (params, optimizer state, batch), outputs, and
temporaries. These are COMPILER ESTIMATES for the XLA:CPU backend, not measurements on an
accelerator; a GPU/TPU compiler schedules (and so peaks) differently.

    peak per device ~ arguments + outputs + temporaries - aliased

The trainers do not donate the train state to the update, so its new copy (the outputs) is
counted beside the old one (the arguments); `peak_donated` = arguments + temporaries is what a
donating update would need.

The model shapes are those of the published config.json files (written below). The batch is
`--rows` sequences of `--prompt` + `--new` tokens (64 x (512 + 512) by default); the layers are
scanned (`model.scan_layers`), so a 32-layer model compiles as one layer.

A vision-language model (qwen2-vl-2b: Qwen2-VL-2B's config.json, mapped by `models.hf`'s
`config_from_hf`) gets one `--image`-pixel square image per row: the update's `SeqBatch.images`
and the sampler's `images=` are `models.vlm.VisionInputs` ShapeDtypeStructs split by rows like
the tokens (patches [rows, 1, (image/p)^2, C*T*p*p] float32, ...), and (image / p / m)^2 of the
prompt's tokens are image tokens (448 pixels: 1024 patches, 256 tokens). The tower follows the
options' remat, scan and compute dtype: its 32 blocks run as one scan over their parameters
(stacked at each call; the tree keeps HF's per-block names), each block remat-ed with the LM's
policy. Its parameters are split by the sharding table's tower rows like the LM's; they match no
LoRA target (frozen under LoRA).
"""

from __future__ import annotations

import os
import sys

if "jax" not in sys.modules:  # fake devices must be set before JAX starts
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=64")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxrl_suite.algorithms.grpo import GRPOBatch, GRPOTrainer  # noqa: E402
from jaxrl_suite.algorithms.grpo_config import GRPOConfig, MemoryConfig  # noqa: E402
from jaxrl_suite.core.parallel import data_sharding, make_mesh  # noqa: E402
from jaxrl_suite.envs.text import make_task  # noqa: E402
from jaxrl_suite.envs.text.tokenizer import load_tokenizer  # noqa: E402
from jaxrl_suite.models import (  # noqa: E402
    CausalLM,
    LMConfig,
    VisionConfig,
    VisionInputs,
    VisionLM,
    VLMConfig,
)
from jaxrl_suite.models.hf import config_from_hf, num_params  # noqa: E402
from jaxrl_suite.models.lora import LoraConfig, apply_lora  # noqa: E402
from jaxrl_suite.models.sequence import SeqBatch  # noqa: E402
from jaxrl_suite.models.sharding import tree_shardings  # noqa: E402
from jaxrl_suite.sampling import kv_cache  # noqa: E402

# From the published config.json of each model (hidden_size, intermediate_size, ...).
MODELS = {
    "qwen2.5-1.5b": dict(vocab_size=151936, d_model=1536, n_layers=28, n_heads=12, n_kv_heads=2,
                         d_ff=8960, rope_theta=1e6, tie_embeddings=True, qkv_bias=True,
                         norm_eps=1e-6, max_len=32768),
    "qwen2.5-7b": dict(vocab_size=152064, d_model=3584, n_layers=28, n_heads=28, n_kv_heads=4,
                       d_ff=18944, rope_theta=1e6, tie_embeddings=False, qkv_bias=True,
                       norm_eps=1e-6, max_len=32768),
    "llama-3-8b": dict(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                       d_ff=14336, rope_theta=5e5, tie_embeddings=False, qkv_bias=False,
                       norm_eps=1e-5, max_len=8192),
    "tiny": dict(vocab_size=512, d_model=64, n_layers=8, n_heads=4, n_kv_heads=2, d_ff=128,
                 max_len=256),
    # Qwen2-VL-2B-Instruct's config.json as published (transformers 4 layout; the one
    # tests/models/test_hf_qwen2_vl.py maps to 2,208,985,600 parameters), through config_from_hf
    "qwen2-vl-2b": {
        "architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl",
        "bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652,
        "vision_end_token_id": 151653, "vision_token_id": 151654, "image_token_id": 151655,
        "video_token_id": 151656, "hidden_act": "silu", "hidden_size": 1536,
        "intermediate_size": 8960, "max_position_embeddings": 32768, "max_window_layers": 28,
        "num_attention_heads": 12, "num_hidden_layers": 28, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_sliding_window": False,
        "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16,
                          "in_chans": 3, "hidden_size": 1536, "patch_size": 14,
                          "spatial_merge_size": 2, "spatial_patch_size": 14,
                          "temporal_patch_size": 2},
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "vocab_size": 151936},
    # the smoke's VLM: "tiny" with M-RoPE and a 2-block tower of 4 x 4 patches (images of a
    # multiple of 8 pixels; 16 x 16: 16 patches, 4 tokens)
    "tiny-vl": dict(vocab_size=512, d_model=64, n_layers=8, n_heads=4, n_kv_heads=2, d_ff=128,
                    max_len=256, mrope_section=(2, 3, 3),
                    vision=VisionConfig(patch_size=4, embed_dim=32, depth=2, n_heads=2,
                                        out_dim=64)),
}
# name -> (devices, data, fsdp, tensor)
MESHES = {
    "data8": (8, 8, 1, 1),
    "fsdp8": (8, 1, 8, 1),
    "fsdp8-tp2": (16, 1, 8, 2),
    "fsdp64": (64, 1, 64, 1),
}
# name -> (compute dtype, remat, LoRA rank, micro-batches, log-prob chunk); params float32
OPTIONS = {
    "f32": ("float32", "none", 0, 1, 0),
    "bf16": ("bfloat16", "none", 0, 1, 0),
    "bf16-block": ("bfloat16", "block", 0, 1, 0),
    "bf16-block-chunk": ("bfloat16", "block", 0, 1, 128),
    "bf16-block-chunk-mb8": ("bfloat16", "block", 0, 8, 128),
    "lora16-bf16-block-chunk": ("bfloat16", "block", 16, 1, 128),
    "lora16-bf16-block-chunk-mb8": ("bfloat16", "block", 16, 8, 128),
}
DEFAULT_OPTIONS = ("f32", "bf16-block", "bf16-block-chunk", "bf16-block-chunk-mb8",
                   "lora16-bf16-block-chunk", "lora16-bf16-block-chunk-mb8")
SETTINGS = ("dtype", "remat", "lora_rank", "micro_batches", "logprob_chunk")


def _abstract(tree, shardings):
    """ShapeDtypeStructs of `tree`'s leaves carrying `shardings`."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def _memory(compiled) -> dict:
    m = compiled.memory_analysis()
    out = {k: int(getattr(m, f"{k}_size_in_bytes")) for k in
           ("argument", "output", "temp", "alias")}
    out["peak"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
    # what the peak would be if the input state were donated (its output written in place);
    # the trainers do not donate it
    out["peak_donated"] = out["argument"] + out["temp"]
    return out


def model_config(model_name: str, **options) -> LMConfig:
    """The `LMConfig` (a `VLMConfig` for a vision-language model) of `MODELS[model_name]`, with
    `options` (dtype, remat, scan_layers): a config.json dict goes through `config_from_hf`."""
    entry = MODELS[model_name]
    if "model_type" in entry:
        return config_from_hf(entry, where=model_name, **options)
    return (VLMConfig if "vision" in entry else LMConfig)(**entry, **options)


def build(model_name: str, option: str, mesh, rows: int, new: int):
    """(model, trainer) for one configuration."""
    dtype, remat, rank, micro, chunk = OPTIONS[option]
    cfg = model_config(model_name, dtype=dtype, remat=remat, scan_layers=True)
    model = (VisionLM if isinstance(cfg, VLMConfig) else CausalLM)(cfg)
    if rank:  # adapters on every projection; the base is frozen (no gradient, no Adam state)
        model = apply_lora(model, LoraConfig(rank=rank, alpha=2.0 * rank))
    grpo = GRPOConfig(prompts_per_step=rows // 8, group_size=8, max_new_tokens=new,
                      memory=MemoryConfig(train_micro_batch=0 if micro == 1 else rows // micro,
                                          logprob_chunk=chunk))
    trainer = GRPOTrainer(model, load_tokenizer(), make_task("arithmetic"), grpo, mesh=mesh,
                          prompt_len=8)
    return model, trainer


def abstract_state(trainer, model, mesh):
    """The train state as placed ShapeDtypeStructs (nothing allocated)."""
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32))
    state = jax.eval_shape(lambda p: trainer.init_state(p, jax.random.PRNGKey(0)), params)
    return _abstract(state, tree_shardings(state, mesh)), params


def image_tokens(config: LMConfig, image: int) -> int:
    """LM tokens of one `image`-pixel square image (0 for a text model)."""
    if not isinstance(config, VLMConfig):
        return 0
    return (image // config.vision.patch_size) ** 2 // config.vision.merge_tokens


def abstract_images(config: LMConfig, mesh, rows: int, prompt: int,
                    image: int) -> VisionInputs | None:
    """One `image`-pixel square image per row as `VisionInputs` ShapeDtypeStructs split by rows
    (None for a text model)."""
    if not isinstance(config, VLMConfig):
        return None
    v, rows_sh = config.vision, data_sharding(mesh)
    s = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=rows_sh)
    patches = (image // v.patch_size) ** 2
    return VisionInputs(s((rows, 1, patches, v.patch_dim), jnp.float32),
                        s((rows, 1, patches, 2), jnp.int32), s((rows, prompt, 3), jnp.int32),
                        s((rows,), jnp.int32))


def compile_update(trainer, state, mesh, rows: int, prompt: int, new: int,
                   images: VisionInputs | None = None):
    rows_sh = data_sharding(mesh)
    s = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=rows_sh)
    seq = SeqBatch(s((rows, prompt), jnp.int32), s((rows, prompt), jnp.bool_),
                   s((rows, new), jnp.int32), s((rows, new), jnp.float32), images=images)
    batch = GRPOBatch(seq, s((rows, new), jnp.float32), None, s((rows,), jnp.float32))
    shardings = jax.tree.map(lambda x: x.sharding, state)
    with jax.set_mesh(mesh):
        fn = jax.jit(trainer.update_fn, out_shardings=(shardings, None))
        return fn.lower(state, batch).compile()


def compile_sampler(model, params, mesh, rows: int, prompt: int, new: int,
                    images: VisionInputs | None = None):
    params = _abstract(params, tree_shardings(params, mesh))
    rows_sh = data_sharding(mesh)
    tokens = jax.ShapeDtypeStruct((rows, prompt), jnp.int32, sharding=rows_sh)
    mask = jax.ShapeDtypeStruct((rows, prompt), jnp.bool_, sharding=rows_sh)
    scalar = jax.ShapeDtypeStruct((), jnp.float32, sharding=NamedSharding(mesh, P()))
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=NamedSharding(mesh, P()))
    seq_ids = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=rows_sh)
    generate = functools.partial(kv_cache.generate_tokens, model, max_new_tokens=new, top_k=0,
                                 eos_id=1, pad_id=0, greedy=False)
    with jax.set_mesh(mesh):
        return jax.jit(generate).lower(params, tokens, mask, key, seq_ids, scalar, scalar,
                                       images).compile()


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f}" if n >= 2**28 else f"{n / 2**30:.2g}"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["qwen2.5-1.5b", "qwen2.5-7b", "llama-3-8b"],
                   choices=sorted(MODELS))
    p.add_argument("--meshes", nargs="+", default=list(MESHES), choices=list(MESHES))
    p.add_argument("--options", nargs="+", default=list(DEFAULT_OPTIONS), choices=list(OPTIONS))
    p.add_argument("--rows", type=int, default=64, help="sequences per GRPO batch")
    p.add_argument("--prompt", type=int, default=512,
                   help="prompt tokens per sequence (a VLM's image tokens included: --image)")
    p.add_argument("--new", type=int, default=512, help="completion tokens per sequence")
    p.add_argument("--image", type=int, default=448,
                   help="a vision-language model's image per row: its side in pixels (a "
                        "multiple of patch x merge, 28 for Qwen2-VL); its (side / 28)^2 LM "
                        "tokens (448: 256) are part of --prompt, which must hold them + 2 "
                        "(vision start / end)")
    p.add_argument("--no-sampler", action="store_true", help="only the update")
    p.add_argument("--smoke", action="store_true",
                   help="tiny model on 2 meshes, tiny-vl on 1; a minute")
    p.add_argument("--out", type=Path, default=Path("results/bench_scale.json"))
    a = p.parse_args(argv)
    # (model, meshes, options) to compile
    plans = [(m, a.meshes, a.options) for m in a.models]
    if a.smoke:  # + the tiny VLM on one mesh and option (one 16 x 16 image, 4 tokens, per row)
        plans = [("tiny", ["data8", "fsdp8-tp2"], ["f32", "lora16-bf16-block-chunk-mb8"]),
                 ("tiny-vl", ["fsdp8-tp2"], ["bf16-block-chunk-mb8"])]
        a.rows, a.prompt, a.new, a.image = 64, 8, 8, 16
    for model_name, _, _ in plans:  # the prompt must hold each VLM's image tokens
        cfg = model_config(model_name)
        if isinstance(cfg, VLMConfig):
            unit = cfg.vision.patch_size * cfg.vision.spatial_merge_size
            if a.image <= 0 or a.image % unit:
                p.exit(2, f"bench_scale: --image {a.image} is not a positive multiple of "
                          f"patch x merge = {unit} pixels ({model_name})\n")
            need = image_tokens(cfg, a.image) + 2
            if a.prompt < need:
                p.exit(2, f"bench_scale: --prompt {a.prompt} cannot hold {model_name}'s "
                          f"{need - 2} image tokens + 2 (vision start / end) of a {a.image}-pixel "
                          f"image; use --prompt >= {need} or a smaller --image\n")
    vlm = any(isinstance(model_config(m), VLMConfig) for m, _, _ in plans)
    print(f"GRPO update and sampler, {a.rows} x ({a.prompt} + {a.new}) tokens"
          + (f" (VLMs: one {a.image} x {a.image} image per row, in the prompt)" if vlm else "")
          + f", on {jax.device_count()} fake {jax.default_backend()} devices")
    print("  per-device GiB = compiler estimates from memory_analysis() (compiled, not run)")
    head = (f"  {'model':13} {'mesh':10} {'options':27} {'params':>7} {'args':>7} {'temp':>7} "
            f"{'peak':>7} {'donated':>8} {'compile s':>9}")
    print(head)
    rows = []
    for model_name, meshes, options in plans:
        cfg = model_config(model_name)
        n = num_params(cfg)
        for mesh_name in meshes:
            devices, data, fsdp, tensor = MESHES[mesh_name]
            mesh = make_mesh(devices, data=data, fsdp=fsdp, tensor=tensor)
            sampled = set()
            for option in options:
                row = {"model": model_name, "params": n, "mesh": mesh_name,
                       "mesh_shape": [data, fsdp, tensor], "option": option,
                       "settings": dict(zip(SETTINGS, OPTIONS[option], strict=True))}
                if isinstance(cfg, VLMConfig):
                    row["image"] = {"pixels": a.image, "tokens": image_tokens(cfg, a.image)}
                try:
                    model, trainer = build(model_name, option, mesh, a.rows, a.new)
                    state, params = abstract_state(trainer, model, mesh)
                    images = abstract_images(model.config, mesh, a.rows, a.prompt, a.image)
                    t0 = time.perf_counter()
                    compiled = compile_update(trainer, state, mesh, a.rows, a.prompt, a.new,
                                              images)
                    row["update"] = dict(_memory(compiled), compile_s=time.perf_counter() - t0)
                    dtype = OPTIONS[option][0]
                    if not a.no_sampler and dtype not in sampled:
                        sampled.add(dtype)
                        t0 = time.perf_counter()
                        compiled = compile_sampler(model, params, mesh, a.rows, a.prompt, a.new,
                                                   images)
                        row["sampler"] = dict(_memory(compiled),
                                              compile_s=time.perf_counter() - t0)
                except ValueError as e:  # a mesh the shapes do not divide over: said, skipped
                    row["error"] = str(e)
                rows.append(row)
                if "error" in row:
                    print(f"  {model_name:13} {mesh_name:10} {option:27} skipped: {row['error']}")
                    continue
                u = row["update"]
                print(f"  {model_name:13} {mesh_name:10} {option:27} {n / 1e9:6.2f}B "
                      f"{_gib(u['argument']):>7} {_gib(u['temp']):>7} {_gib(u['peak']):>7} "
                      f"{_gib(u['peak_donated']):>8} {u['compile_s']:9.1f}")
                if "sampler" in row:
                    s = row["sampler"]
                    print(f"  {'':13} {'':10} {'  sampler ' + OPTIONS[option][0]:27} {'':>7} "
                          f"{_gib(s['argument']):>7} {_gib(s['temp']):>7} {_gib(s['peak']):>7} "
                          f"{'':>8} {s['compile_s']:9.1f}")
    result = {"rows": rows, "batch": {"rows": a.rows, "prompt": a.prompt, "new": a.new,
                                      "image": a.image},
              "note": "per-device bytes are XLA:CPU compiler estimates (memory_analysis), "
                      "not measured on an accelerator",
              "devices": jax.device_count(), "backend": jax.default_backend()}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()

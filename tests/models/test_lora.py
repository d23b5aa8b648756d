"""LoRA (models/lora.py): adapters beside the kernels, B = 0 is the base model, merging is exact,
scanned layers, the sharding table, and a merged Hugging Face checkpoint that transformers loads.

One tiny model (d_model 32, 2 layers, GQA 4:2, Qwen2 q/k/v biases, untied head) and one token
batch for every test; the adapters' B is made non-zero where a test needs the update to count.
"""

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from jaxrl_suite.core.parallel import MESH_AXES
from jaxrl_suite.models import CausalLM, LMConfig
from jaxrl_suite.models.hf import ModelConfig
from jaxrl_suite.models.lora import (
    TARGETS,
    LoraConfig,
    apply_lora,
    combine_lora,
    init_lora,
    is_adapter,
    lora_config_of,
    merge_lora,
    split_lora,
)
from jaxrl_suite.models.sharding import path_str, tree_shardings

CFG = LMConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
               qkv_bias=True, tie_embeddings=False)
LORA = LoraConfig(rank=4, alpha=8.0)
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 8)), jnp.int32)


def _nonzero_b(params, seed=1):
    """The params with every adapter B drawn at random (so the update changes the logits)."""
    key = jax.random.PRNGKey(seed)
    return jax.tree_util.tree_map_with_path(
        lambda p, x: 0.1 * jax.random.normal(jax.random.fold_in(key, zlib.crc32(
            path_str(p).encode()) % 2**31), x.shape)
        if path_str(p).endswith("kernel_lora_b") else x, params)


@pytest.fixture(scope="module", params=[False, True], ids=["unrolled", "scanned"])
def lora(request):
    """(base model, base params, LoRA model, LoRA params at init) for both layer layouts."""
    import dataclasses

    cfg = dataclasses.replace(CFG, scan_layers=request.param)
    base_model = CausalLM(cfg)
    base = base_model.init(jax.random.PRNGKey(0), TOKENS)
    model = apply_lora(base_model, LORA)
    return base_model, base, model, init_lora(model, base, jax.random.PRNGKey(1))


def test_init_adds_adapters_beside_each_kernel_and_keeps_the_base_logits_exactly(lora):
    base_model, base, model, params = lora
    assert lora_config_of(model) == LORA and lora_config_of(base_model) is None
    base2, adapters = split_lora(params)
    # the base is passed through as it was (the same arrays)
    assert jax.tree.structure(base2) == jax.tree.structure(base)
    assert all(a is b for a, b in zip(jax.tree.leaves(base2), jax.tree.leaves(base), strict=True))
    flat = {path_str(p): x for p, x in jax.tree_util.tree_leaves_with_path(params)}
    kernels = [k for k in flat if k.endswith("/kernel") and "lm_head" not in k]
    assert len(kernels) == 7 * (1 if "params/layers/attn/q/kernel" in flat else CFG.n_layers)
    for k in kernels:
        w, a, b = flat[k], flat[k + "_lora_a"], flat[k + "_lora_b"]
        assert a.shape == (*w.shape[:-1], 4) and b.shape == (*w.shape[:-2], 4, w.shape[-1])
        assert np.abs(a).max() > 0 and not np.any(b)  # A random, B = 0 (qwix's init)
    assert sorted(path_str(p) for p, _ in jax.tree_util.tree_leaves_with_path(adapters)) == \
        sorted(k for k in flat if is_adapter(k))
    assert combine_lora(base2, adapters).keys() == params.keys()
    np.testing.assert_array_equal(model.apply(params, TOKENS)[0],
                                  base_model.apply(base, TOKENS)[0])


def test_merged_weights_give_the_adapted_models_logits(lora):
    base_model, base, model, params = lora
    params = _nonzero_b(params)
    adapted = model.apply(params, TOKENS)[0]
    assert np.abs(adapted - base_model.apply(base, TOKENS)[0]).max() > 1e-2  # B counts
    merged = merge_lora(params, LORA)
    assert jax.tree.structure(merged) == jax.tree.structure(base)
    np.testing.assert_allclose(base_model.apply(merged, TOKENS)[0], adapted, atol=1e-5, rtol=0)
    # W' = W + (alpha / r) A B, qwix's scaling
    layer = merged["params"].get("layers") or merged["params"]["layer_0"]
    src = params["params"].get("layers") or params["params"]["layer_0"]
    q = src["attn"]["q"]
    want = q["kernel"] + 2.0 * np.matmul(q["kernel_lora_a"], q["kernel_lora_b"])
    np.testing.assert_allclose(layer["attn"]["q"]["kernel"], want, atol=1e-6)
    with pytest.raises(ValueError, match="has rank 4 but lora_rank=8"):
        merge_lora(params, LoraConfig(rank=8, alpha=8.0))


def test_targets_select_the_modules_and_bad_fields_are_one_line_errors():
    base_model = CausalLM(CFG)
    shapes = jax.eval_shape(lambda: apply_lora(base_model, LoraConfig(
        rank=2, alpha=2.0, targets=("v", "down"))).init(jax.random.PRNGKey(0), TOKENS))
    adapted = {path_str(p).rsplit("/", 2)[-2] for p, _ in
               jax.tree_util.tree_leaves_with_path(shapes) if is_adapter(path_str(p))}
    assert adapted == {"v", "down"}
    assert LoraConfig().targets == TARGETS == ("q", "k", "v", "o", "gate", "up", "down")
    assert ModelConfig().lora is None
    assert ModelConfig(lora_rank=8, lora_targets=("q",)).lora == LoraConfig(8, 16.0, ("q",))
    for kwargs, match in ((dict(lora_rank=-1),
                           "config field 'model.lora_rank' must be >= 0, got -1"),
                          (dict(lora_rank=4, lora_alpha=0.0),
                           "config field 'model.lora_alpha' must be > 0, got 0.0"),
                          (dict(lora_targets=("q", "qkv")), "model.lora_targets .* 'qkv'"),
                          (dict(lora_targets=()), r"model.lora_targets .*\(empty\)"),
                          (dict(lora_targets=("q", "q")), "model.lora_targets .*duplicates")):
        with pytest.raises(ValueError, match=match) as e:
            ModelConfig(**kwargs)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="LoraConfig.rank must be an integer >= 1"):
        LoraConfig(rank=0)
    with pytest.raises(ValueError, match="already has LoRA adapters"):
        apply_lora(apply_lora(base_model, LORA), LORA)


def test_adapters_shard_like_their_kernels_and_keep_the_rank_whole(lora):
    *_, params = lora
    mesh = AbstractMesh((2, 2, 2), MESH_AXES)  # data 2, fsdp 2, tensor 2
    specs = {path_str(p): s.spec for p, s in
             jax.tree_util.tree_leaves_with_path(tree_shardings(params, mesh))}
    stacked = "params/layers/attn/q/kernel" in specs
    pre, lead = ("params/layers/", (None,)) if stacked else ("params/layer_0/", ())
    want = {  # A [in, r]: in as the kernel's; B [r, out]: out as the kernel's
        "attn/q": (("fsdp", None), (None, "tensor")),
        "attn/k": (("fsdp", None), (None, "tensor")),
        "attn/v": (("fsdp", None), (None, "tensor")),
        "attn/o": (("tensor", None), (None, "fsdp")),
        "mlp/gate": (("fsdp", None), (None, "tensor")),
        "mlp/up": (("fsdp", None), (None, "tensor")),
        "mlp/down": (("tensor", None), (None, "fsdp")),
    }
    for module, (a, b) in want.items():
        assert specs[pre + module + "/kernel_lora_a"] == P(*lead, *a), module
        assert specs[pre + module + "/kernel_lora_b"] == P(*lead, *b), module
        kernel = specs[pre + module + "/kernel"]
        assert kernel[len(lead)] == a[0] and kernel[len(lead) + 1] == b[1]


# ---------------------------------------------------------------------------------------------
# save_hf_checkpoint(merge_lora=True) reloaded by transformers


def test_merged_hf_checkpoint_loads_in_transformers_with_the_adapted_logits(tmp_path,
                                                                            hf_parity):
    pytest.importorskip("torch")  # the [hf] extra; .ci/run installs it
    transformers = pytest.importorskip("transformers")
    from jaxrl_suite.models.hf import load_hf_checkpoint, save_hf_checkpoint

    hp = hf_parity
    hp.save_tiny_checkpoint("qwen2", tmp_path / "base")
    config, base, tok = load_hf_checkpoint(tmp_path / "base")
    lora = LoraConfig(rank=4, alpha=8.0, targets=("q", "v", "o", "down"))
    model = apply_lora(CausalLM(config), lora)
    params = _nonzero_b(init_lora(model, base, jax.random.PRNGKey(2)))

    with pytest.raises(ValueError, match="params hold LoRA adapters; pass merge_lora=True"):
        save_hf_checkpoint(params, config, tmp_path / "out")
    with pytest.raises(ValueError, match=r"merge_lora=True\) needs lora="):
        save_hf_checkpoint(params, config, tmp_path / "out", merge_lora=True)
    out = save_hf_checkpoint(params, config, tmp_path / "out", tokenizer=tok, merge_lora=True,
                             lora=lora)

    ids, mask = hp.fixed_batch()
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    adapted = np.asarray(model.apply(params, jnp.asarray(ids), jnp.asarray(positions),
                                     jnp.asarray(mask, bool))[0])
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    real = mask.astype(bool)
    theirs = hp.torch_logits(reloaded, ids, mask)
    np.testing.assert_allclose(theirs[real], adapted[real], atol=1e-4, rtol=0)
    base_logits = hp.our_logits(config, base, ids, mask)
    assert np.abs(base_logits[real] - adapted[real]).max() > 1e-2  # the adapters count

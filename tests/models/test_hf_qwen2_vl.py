"""Qwen2-VL checkpoints: our VisionLM against transformers' PyTorch Qwen2VLForConditionalGeneration.

A tiny random model (vision depth 2, embed 32, patch 4, merge 2, temporal 2; text hidden 64,
2 layers, 4 heads, 2 kv heads, mrope_section [2, 3, 3]) is built from a config (no download),
saved with `save_pretrained`, loaded with `load_hf_checkpoint` and compared with the PyTorch
image processor, tower, forward (HF computing its own M-RoPE positions) and `generate`.
"""

import dataclasses
import functools
import json
import shutil
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the [hf] extra; .ci/run installs it
transformers = pytest.importorskip("transformers")

from jaxrl_suite.models.hf import (  # noqa: E402
    HFCheckpointError,
    config_from_hf,
    load_hf_checkpoint,
    num_params,
    save_hf_checkpoint,
)
from jaxrl_suite.models.vision import (  # noqa: E402
    VisionConfig,
    VisionTower,
    patch_positions,
    patchify,
)
from jaxrl_suite.models.vlm import VisionLM, expand_image_tokens, vision_inputs  # noqa: E402
from jaxrl_suite.sampling import KVCacheSampler  # noqa: E402

PAD, EOS = 0, 1
START, END, IMG, VIDEO = 259, 260, 261, 262  # our ByT5 defaults
TEXT = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-6, eos_token_id=EOS, pad_token_id=PAD, bos_token_id=None,
            rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3],
                             "rope_theta": 10000.0})
VISION = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=4, patch_size=4,
              spatial_merge_size=2, temporal_patch_size=2, mlp_ratio=2)
ATOL = 2e-5  # float32; observed max |diff| ~1e-5 on logits up to ~8


def _torch_model():
    """A seeded random Qwen2VLForConditionalGeneration; every weight ~ N(0, 0.2) and the norm
    scales ~ N(1, 0.3), so biases, norms and the merger all count."""
    cfg = transformers.Qwen2VLConfig(text_config=TEXT, vision_config=VISION,
                                     image_token_id=IMG, video_token_id=VIDEO,
                                     vision_start_token_id=START, vision_end_token_id=END)
    torch.manual_seed(0)
    model = transformers.Qwen2VLForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_scale = name.endswith("weight") and ("norm" in name or "ln_q" in name)
            p.normal_(1.0 if is_scale else 0.0, 0.3 if is_scale else 0.2)
    return model


def _processor(**kwargs):
    with warnings.catch_warnings():  # without torchvision it falls back to the PIL backend
        warnings.simplefilter("ignore")
        return transformers.Qwen2VLImageProcessor(patch_size=4, merge_size=2,
                                                  temporal_patch_size=2, do_resize=False,
                                                  **kwargs)


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """(torch model, checkpoint dir, our config, our params)."""
    model = _torch_model()
    path = tmp_path_factory.mktemp("qwen2_vl") / "ckpt"
    model.save_pretrained(path)
    config, params, tok = load_hf_checkpoint(path, tokenizer=False)
    assert tok is None
    return model, path, config, params


def _images():
    return np.random.default_rng(0).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)


def _batch(config):
    """Left-padded [2, T]: row 0 text + image + text, row 1 two images between text."""
    grid = [[1, 8, 8]]
    row0 = expand_image_tokens([5, 6, START, IMG, END, 7, 8], grid, config)
    row1 = expand_image_tokens([9, START, IMG, END, 10, 11, START, IMG, END, 12, 13, 14],
                               grid * 2, config)
    t = max(len(row0), len(row1))
    ids, mask = np.zeros((2, t), np.int64), np.zeros((2, t), np.int64)
    for b, row in enumerate((row0, row1)):
        ids[b, t - len(row):], mask[b, t - len(row):] = row, 1
    return ids, mask


def _hf_inputs(ids, mask, images):
    out = _processor()(list(images), return_tensors="np")
    return dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                pixel_values=torch.tensor(out["pixel_values"]),
                image_grid_thw=torch.tensor(out["image_grid_thw"]),
                mm_token_type_ids=torch.tensor((ids == IMG).astype(np.int64)))


@functools.cache
def _forward(config):
    return jax.jit(VisionLM(config).apply)


def _our_logits(config, params, ids, mask, images):
    vi = vision_inputs(images, ids, mask, config)
    logits, _ = _forward(config)(
        params, jnp.asarray(ids, jnp.int32), vi.positions, jnp.asarray(mask, bool),
        patches=vi.patches, patch_positions=vi.patch_positions)
    return np.asarray(logits)


def test_config_and_param_tree(hf):
    _, _, config, params = hf
    assert (config.d_model, config.n_layers, config.n_kv_heads, config.mrope_section) == (
        64, 2, 2, (2, 3, 3))
    assert config.qkv_bias and not config.tie_embeddings and config.rope_theta == 1e4
    assert config.vision == VisionConfig(patch_size=4, temporal_patch_size=2, embed_dim=32,
                                         depth=2, n_heads=4, mlp_ratio=2, out_dim=64)
    assert (config.image_token_id, config.vision_start_id, config.vision_end_id) == (IMG, START,
                                                                                    END)
    init = VisionLM(config).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    assert jax.tree.structure(init) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(init), jax.tree.leaves(params), strict=True):
        assert a.shape == b.shape and b.dtype == np.float32


def test_patchify_equals_the_image_processor(hf):
    config = hf[2]
    images = _images()
    odd = np.random.default_rng(1).integers(0, 256, (16, 24, 3), dtype=np.uint8)
    for batch in (list(images), [odd, images[0]]):
        ref = _processor()(batch, return_tensors="np")
        patches, grid = patchify(batch, config.vision)
        np.testing.assert_array_equal(grid, ref["image_grid_thw"])
        np.testing.assert_allclose(patches, ref["pixel_values"], atol=1e-6, rtol=0)
    # float images in [0, 1] (HF: do_rescale=False), and another mean / std
    floats = images.astype(np.float32) / 255
    half = dataclasses.replace(config.vision, image_mean=(0.5,) * 3, image_std=(0.25,) * 3)
    ref = _processor(do_rescale=False, image_mean=[0.5] * 3, image_std=[0.25] * 3)(
        list(floats), return_tensors="np")
    np.testing.assert_allclose(patchify(floats, half)[0], ref["pixel_values"], atol=1e-6, rtol=0)


def test_tower_equals_model_visual(hf):
    model, _, config, params = hf
    ref = _processor()(list(_images()), return_tensors="np")
    with torch.no_grad():
        want = model.model.visual(torch.tensor(ref["pixel_values"]),
                                  grid_thw=torch.tensor(ref["image_grid_thw"])).pooler_output
    patches, grid = patchify(_images(), config.vision)
    want = want.numpy().reshape(3, 16, -1)
    assert np.abs(want).max() > 1.0
    # the Python loop, and the scan over the same tree (`scan_layers`) with per-block remat
    for tower in (VisionTower(config.vision), VisionTower(config.vision, remat="block",
                                                          scan=True)):
        got = tower.apply({"params": params["params"]["visual"]}, patches.reshape(3, 64, -1),
                          patch_positions(grid, config.vision).reshape(3, 64, 2))
        np.testing.assert_allclose(np.asarray(got), want, atol=ATOL, rtol=0)


def test_logits_and_positions_equal_transformers(hf):
    """Text + image + text with left padding and two images in one row: our logits (positions
    from `mrope_positions`) equal HF's, which computes its own positions (get_rope_index)."""
    model, _, config, params = hf
    ids, mask = _batch(config)
    inputs = _hf_inputs(ids, mask, _images())
    with torch.no_grad():
        ref = model(**inputs).logits.numpy()
        pos, delta = model.model.get_rope_index(
            inputs["input_ids"], inputs["mm_token_type_ids"], inputs["image_grid_thw"],
            attention_mask=inputs["attention_mask"])
    vi = vision_inputs(_images(), ids, mask, config)
    np.testing.assert_array_equal(vi.positions, pos.numpy().transpose(1, 2, 0))
    np.testing.assert_array_equal(vi.rope_delta, delta.numpy()[:, 0])
    real = mask.astype(bool)
    ours = _our_logits(config, params, ids, mask, _images())
    assert np.abs(ref[real]).max() > 2.0
    np.testing.assert_allclose(ours[real], ref[real], atol=ATOL, rtol=0)


def test_cached_greedy_decode_equals_generate_and_the_full_forward(hf):
    """Our KV-cache sampler (image prefill, then decode at T_real + j + rope_delta) against
    HF's `generate`, and its log-probs against HF's full forward over [prompt | completion]."""
    model, _, config, params = hf
    ids, mask = _batch(config)
    n = 6
    sampler = KVCacheSampler(VisionLM(config), max_new_tokens=n, eos_id=EOS, pad_id=PAD,
                             greedy=True)
    out = sampler(params, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, bool),
                  jax.random.key(0), images=_images())
    inputs = _hf_inputs(ids, mask, _images())
    with torch.no_grad():
        gen = model.generate(**inputs, max_new_tokens=n, do_sample=False, eos_token_id=EOS,
                             pad_token_id=PAD)
    want = gen[:, ids.shape[1]:].numpy()
    np.testing.assert_array_equal(np.asarray(out.tokens), want)
    assert len(set(want.ravel().tolist())) > 3

    full = np.concatenate([ids, want], axis=1)
    full_mask = np.concatenate([mask, np.ones_like(want)], axis=1)
    with torch.no_grad():
        logits = model(**_hf_inputs(full, full_mask, _images())).logits
    logp = torch.log_softmax(logits[:, ids.shape[1] - 1 : -1], -1).numpy()
    want_logp = np.take_along_axis(logp, want[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(out.logprobs), want_logp, atol=ATOL, rtol=0)


def test_save_round_trip(hf, tmp_path):
    model, _, config, params = hf
    params = jax.tree.map(lambda x: x + 0.01 * np.sign(x), params)  # our values, not the file's
    out = save_hf_checkpoint(params, config, tmp_path / "rt")
    config2, params2, _ = load_hf_checkpoint(out, tokenizer=False)
    assert config2 == config
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2), strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)
    # transformers loads it as Qwen2-VL with our logits, and its processor patches as we do
    reloaded = transformers.Qwen2VLForConditionalGeneration.from_pretrained(out).eval()
    ids, mask = _batch(config)
    with torch.no_grad():
        ref = reloaded(**_hf_inputs(ids, mask, _images())).logits.numpy()
    real = mask.astype(bool)
    np.testing.assert_allclose(_our_logits(config, params, ids, mask, _images())[real],
                               ref[real], atol=ATOL, rtol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proc = transformers.Qwen2VLImageProcessor.from_pretrained(out)
    got = proc(list(_images()), return_tensors="np")["pixel_values"]  # as saved: no resize
    np.testing.assert_allclose(got, patchify(_images(), config.vision)[0], atol=1e-6, rtol=0)


def _transformers4_layout(path, dst):
    """The checkpoint with a transformers 4 config.json: text fields at the top, rope_scaling
    {type: mrope, mrope_section} and rope_theta, vision in_chans (as Qwen2-VL-2B publishes it)."""
    shutil.copytree(path, dst)
    cfg = json.loads((dst / "config.json").read_text())
    text = cfg.pop("text_config")
    rope = text.pop("rope_parameters")
    for key in ("model_type", "layer_types", "dtype"):
        text.pop(key, None)
    vision = cfg["vision_config"]
    vision["in_chans"] = vision.pop("in_channels")
    vision.pop("rope_parameters")
    cfg.update(text, rope_theta=rope["rope_theta"],
               rope_scaling={"type": "mrope", "mrope_section": rope["mrope_section"]})
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_both_key_and_config_layouts_load(hf, tmp_path):
    """transformers 5 tensor names (model.language_model.*, model.visual.*) and transformers 4
    ones (model.layers.*, visual.*, as save_pretrained writes them); both config.json layouts."""
    from safetensors.numpy import load_file, save_file

    model, path, config, params = hf
    tensors = load_file(path / "model.safetensors")
    assert any(k.startswith("visual.") for k in tensors)  # save_pretrained's names: transformers 4
    renamed = {("model.language_model." + k[6:] if k.startswith("model.") else
                "model." + k if k.startswith("visual.") else k): x for k, x in tensors.items()}
    assert any(k.startswith("model.visual.") for k in renamed)
    v5 = tmp_path / "v5"
    shutil.copytree(path, v5)
    save_file(renamed, v5 / "model.safetensors", metadata={"format": "pt"})
    for other in (v5, _transformers4_layout(path, tmp_path / "v4")):
        config2, params2, _ = load_hf_checkpoint(other, tokenizer=False)
        assert config2 == config
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2), strict=True):
            np.testing.assert_array_equal(a, b)
    # transformers reads the transformers 4 config.json as the same model
    old = transformers.Qwen2VLForConditionalGeneration.from_pretrained(tmp_path / "v4").eval()
    ids, mask = _batch(config)
    inputs = _hf_inputs(ids, mask, _images())
    with torch.no_grad():
        np.testing.assert_allclose(old(**inputs).logits.numpy(), model(**inputs).logits.numpy(),
                                   atol=1e-6, rtol=0)


def test_errors_name_the_field(hf):
    _, path, _, _ = hf
    base = json.loads((path / "config.json").read_text())
    text = base["text_config"]
    cases = {
        "'rope_parameters.rope_type'='yarn'": {
            "text_config": {**text, "rope_parameters": {**text["rope_parameters"],
                                                        "rope_type": "yarn"}}},
        "missing field 'rope_parameters.mrope_section'": {
            "text_config": {**text, "rope_parameters": {"rope_type": "default"}}},
        "'rope_parameters.mrope_section'=[2, 2, 2]": {
            "text_config": {**text, "rope_parameters": {**text["rope_parameters"],
                                                        "mrope_section": [2, 2, 2]}}},
        "'vision_config.mlp_ratio'=2.5": {"vision_config": {**VISION, "mlp_ratio": 2.5}},
        "'vision_config.hidden_act'": {"vision_config": {**VISION, "hidden_act": "silu"}},
        "'vision_config.hidden_size'=32": {"vision_config": {**VISION, "hidden_size": 32}},
        "'image_token_id'=999": {"image_token_id": 999},
        "'use_sliding_window'": {"text_config": {**text, "use_sliding_window": True}},
    }
    for match, edit in cases.items():
        with pytest.raises(HFCheckpointError, match=match.replace("[", r"\[")) as e:
            config_from_hf({**base, **edit})
        assert "\n" not in str(e.value)


def test_real_qwen2_vl_2b_config_maps_to_the_published_size():
    """Qwen2-VL-2B-Instruct's config.json as published (transformers 4 layout; written once,
    in bench_scale, whose memory plan compiles it). Its model.safetensors.index.json gives
    total_size 4,417,971,200 bytes of bfloat16 (tied embeddings, no lm_head): 2,208,985,600
    parameters."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[2] / "benchmarks" / "bench_scale.py"
    spec = importlib.util.spec_from_file_location("bench_scale", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # JAX has started: its fake-device flag is left alone
    hf = bench.MODELS["qwen2-vl-2b"]  # the one copy of the published config.json
    cfg = config_from_hf(hf)
    assert (cfg.d_model, cfg.n_heads, cfg.resolved_head_dim, cfg.mrope_section) == (
        1536, 12, 128, (16, 24, 24))
    assert cfg.tie_embeddings and cfg.scanned and cfg.rope_theta == 1e6
    assert (cfg.vision.embed_dim, cfg.vision.depth, cfg.vision.patch_size) == (1280, 32, 14)
    assert num_params(cfg) == 2_208_985_600

"""The vision-language model (models/vlm.py): the placeholder and position rules worked by hand,
and the KV-cache sampler's image prefill against a full forward. M-RoPE against 1-D RoPE is in
test_lm.py; HF parity (transformers' Qwen2-VL) in test_hf_qwen2_vl.py."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.models import (
    CausalLM,
    LMConfig,
    VisionConfig,
    VisionLM,
    VLMConfig,
    expand_image_tokens,
    mrope_positions,
    vision_inputs,
)
from jaxrl_suite.sampling import (
    ContinuousSampler,
    DiffusionSampler,
    KVCacheSampler,
    SpeculativeSampler,
)

TEXT = LMConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=64)
SMALL = VLMConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, max_len=128,
                  mrope_section=(2, 3, 3),
                  vision=VisionConfig(embed_dim=32, depth=1, mlp_ratio=2, out_dim=64))
S, E, IMG = SMALL.vision_start_id, SMALL.vision_end_id, SMALL.image_token_id


def _perturbed(params, rng, scale=0.1):
    """Every leaf + scale * N(0, 1), so biases and norm scales count."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(rng, len(leaves))
    return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape)
                                     for x, k in zip(leaves, keys, strict=True)])


def test_mrope_positions_worked_by_hand():
    """Row 0: two pads, text, an image of LLM grid 2 x 3, text. Row 1: two images."""
    grid = [1, 4, 6]  # patches; merged 2 x 3 = 6 tokens
    row0 = [0, 0, 10, S] + [IMG] * 6 + [E, 11]
    row1 = [S] + [IMG] * 6 + [E, S] + [IMG] * 6 + [E]
    t = max(len(row0), len(row1))
    tokens = np.zeros((2, t), np.int32)
    tokens[0, t - len(row0):], tokens[1, t - len(row1):] = row0, row1
    mask = tokens != 0
    pos, delta = mrope_positions(tokens, [grid] * 3, SMALL, mask)
    pad = t - len(row0)
    image = lambda s: [(s, s + j, s + k) for j in range(2) for k in range(3)]
    want0 = [(0, 0, 0)] * (pad + 2) + [(0, 0, 0), (1, 1, 1)] + image(2) + [(5, 5, 5), (6, 6, 6)]
    want1 = [(0, 0, 0)] + image(1) + [(4, 4, 4), (5, 5, 5)] + image(6) + [(9, 9, 9)]
    np.testing.assert_array_equal(pos[0], want0)
    np.testing.assert_array_equal(pos[1], want1)
    np.testing.assert_array_equal(delta, [7 - 10, 10 - 16])  # max + 1 - real tokens
    text, d = mrope_positions(tokens[:, :4] * 0 + 5, np.zeros((0, 3)), SMALL)
    np.testing.assert_array_equal(text[..., 0], np.broadcast_to(np.arange(4), (2, 4)))
    assert (d == 0).all()

    with pytest.raises(ValueError, match=r"run of 6 image tokens, but grid \(1, 4, 4\) needs 4"):
        mrope_positions(tokens, [[1, 4, 4]] * 3, SMALL, mask)
    with pytest.raises(ValueError, match="3 grids but 1 image-token runs"):
        mrope_positions(tokens[:1], [grid] * 3, SMALL, mask[:1])
    with pytest.raises(ValueError, match="more image-token runs"):
        mrope_positions(tokens, [grid] * 2, SMALL, mask)


def test_expand_image_tokens():
    ids = [5, S, IMG, E, 6, S, IMG, E]
    out = expand_image_tokens(ids, [[1, 8, 8], [1, 4, 6]], SMALL)
    assert out == [5, S] + [IMG] * 16 + [E, 6, S] + [IMG] * 6 + [E]
    with pytest.raises(ValueError, match="2 image placeholders .* but 1 grids"):
        expand_image_tokens(ids, [[1, 8, 8]], SMALL)


@pytest.mark.parametrize("field, value, match", [
    ("mrope_section", None, "mrope_section is null"),
    ("mrope_section", (2, 3, 4), r"mrope_section=\[2, 3, 4\] must be 3 parts"),
    ("d_model", 96, "vision.out_dim=64 must equal d_model=96"),
    ("image_token_id", 400, "image_token_id=400 is outside the vocabulary"),
    ("video_token_id", 261, "special ids must differ"),
])
def test_bad_config_names_the_field(field, value, match):
    kwargs = {field: value}
    if field == "d_model":
        kwargs["mrope_section"] = (4, 4, 4)
    with pytest.raises(ValueError, match=match) as e:
        dataclasses.replace(SMALL, **kwargs)
    assert "\n" not in str(e.value)


def test_defaults_are_the_studies_sizes():
    cfg = VLMConfig()
    assert (cfg.n_layers, cfg.d_model, cfg.qkv_bias, cfg.mrope_section) == (4, 128, True,
                                                                          (4, 6, 6))
    v = cfg.vision
    assert (v.depth, v.embed_dim, v.patch_size, v.out_dim) == (2, 64, 4, 128)
    images = np.zeros((1, 32, 32, 3), np.uint8)
    prompt = expand_image_tokens([cfg.vision_start_id, cfg.image_token_id, cfg.vision_end_id],
                                 [[1, 8, 8]], cfg)
    vi = vision_inputs(images, np.asarray([prompt]), None, cfg)
    assert vi.patches.shape == (1, 1, 64, 96) and len(prompt) == 16 + 2  # 64 patches -> 16


@functools.cache
def _model_and_params():
    model = VisionLM(SMALL)
    params = model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))  # no patches
    return model, _perturbed(params, jax.random.key(1), 0.05)


def test_param_tree_is_the_causal_lms_plus_visual():
    model, params = _model_and_params()
    text = CausalLM(SMALL).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    assert set(params["params"]) == set(text["params"]) | {"visual"}
    assert jax.tree.structure(params["params"]["visual"]) == jax.tree.structure(
        VisionLM(SMALL).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]["visual"])
    # without images it is the causal LM
    tokens = jnp.asarray([[3, 4, 5, 6]], jnp.int32)
    lm_params = {"params": {k: v for k, v in params["params"].items() if k != "visual"}}
    np.testing.assert_array_equal(model.apply(params, tokens)[0],
                                  CausalLM(SMALL).apply(lm_params, tokens)[0])


def _batch():
    """Left-padded prompts [2, P] (row 1 holds two images) and their 3 images, 16 x 24 each."""
    cfg = SMALL
    grid = [1, 4, 6]
    row0 = expand_image_tokens([10, 11, S, IMG, E, 12], [grid], cfg)
    row1 = expand_image_tokens([S, IMG, E, 13, S, IMG, E, 14, 15], [grid] * 2, cfg)
    p = max(len(row0), len(row1))
    prompt = np.zeros((2, p), np.int32)
    prompt[0, p - len(row0):], prompt[1, p - len(row1):] = row0, row1
    images = np.random.default_rng(3).integers(0, 256, (3, 16, 24, 3), dtype=np.uint8)
    return prompt, prompt != 0, images


def test_sampler_with_images_equals_the_full_forward():
    """The static KV-cache engine's image prefill + decode against one full forward over
    [prompt | completion] whose positions are `vision_inputs` of the whole sequence: the
    sampled log-probs are the full forward's log-softmax at the sampled tokens."""
    model, params = _model_and_params()
    prompt, mask, images = _batch()
    n = 6
    sampler = KVCacheSampler(model, max_new_tokens=n, eos_id=-1, pad_id=0, temperature=1.0)
    out = sampler(params, jnp.asarray(prompt), jnp.asarray(mask), jax.random.key(5),
                  images=[images[0], images[1:]])
    full = np.concatenate([prompt, np.asarray(out.tokens)], axis=1)
    full_mask = np.concatenate([mask, np.ones((2, n), bool)], axis=1)
    vi = vision_inputs(images, full, full_mask, SMALL)
    logits, _ = jax.jit(model.apply)(params, jnp.asarray(full), vi.positions,
                                     jnp.asarray(full_mask), patches=vi.patches,
                                     patch_positions=vi.patch_positions)
    p = prompt.shape[1]
    logp = jax.nn.log_softmax(logits[:, p - 1 : p - 1 + n], axis=-1)
    want = np.take_along_axis(np.asarray(logp), np.asarray(out.tokens)[..., None], -1)[..., 0]
    np.testing.assert_allclose(out.logprobs, want, atol=1e-5)
    # the decode positions continue from the offset: T_real + j + rope_delta on every axis
    real = mask.sum(1)
    for j in range(n):
        np.testing.assert_array_equal(vi.positions[:, p + j],
                                      np.repeat((real + j + vi.rope_delta)[:, None], 3, 1))
    # the images reach the completions: other images, other log-probs
    other = sampler(params, jnp.asarray(prompt), jnp.asarray(mask), jax.random.key(5),
                    images=255 - images)
    assert np.abs(np.asarray(other.logprobs) - np.asarray(out.logprobs)).max() > 1e-3
    assert sampler._generate._cache_size() == 1  # one program for both calls


def test_images_need_a_vision_lm_and_the_static_engine():
    model, params = _model_and_params()
    prompt, mask, images = _batch()
    text = CausalLM(TEXT)
    with pytest.raises(ValueError, match="images= needs a VisionLM, the model is CausalLM"):
        KVCacheSampler(text, max_new_tokens=2, eos_id=1, pad_id=0)(
            None, prompt, mask, jax.random.key(0), images=images)
    with pytest.raises(ValueError, match="images of one call must share one size"):
        KVCacheSampler(model, max_new_tokens=2, eos_id=1, pad_id=0)(
            params, prompt, mask, jax.random.key(0),
            images=[images[0], images[1], np.zeros((16, 16, 3), np.uint8)])
    text_params = CausalLM(TEXT).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    engines = {
        "ContinuousSampler": ContinuousSampler(text, slots=2, max_new_tokens=2, eos_id=1,
                                               pad_id=0),
        "SpeculativeSampler": SpeculativeSampler(text, text, text_params, max_new_tokens=2,
                                                 eos_id=1, pad_id=0),
        "DiffusionSampler": DiffusionSampler(text, max_new_tokens=2, steps=2, eos_id=1,
                                             pad_id=0),
    }
    for name, engine in engines.items():
        with pytest.raises(ValueError, match=f"^{name} does not take images= yet") as e:
            engine(text_params, prompt, mask, jax.random.key(0), images=images)
        assert "\n" not in str(e.value)


def test_completion_views_read_the_prompt_images_and_continue_at_the_offset():
    """`SeqBatch(images=)`: completion_logits of [prompt | sampled completion] give the static
    engine's sampled log-probs (image prefill, decode at T_real + j + rope_delta); and an image
    id inside a completion is text, as it was when sampled: its embedding row moves the logits
    after it, not before."""
    from jaxrl_suite.models.sequence import SeqBatch, completion_logits

    model, params = _model_and_params()
    prompt, mask, images = _batch()
    n = 5
    sampler = KVCacheSampler(model, max_new_tokens=n, eos_id=-1, pad_id=0, temperature=1.0)
    vi = vision_inputs([images[0], images[1:]], prompt, mask, SMALL)
    out = sampler(params, jnp.asarray(prompt), jnp.asarray(mask), jax.random.key(7), images=vi)
    seq = SeqBatch(jnp.asarray(prompt), jnp.asarray(mask), out.tokens,
                   jnp.ones_like(out.logprobs), images=vi)
    view = jax.jit(completion_logits, static_argnums=0)
    logp = jax.nn.log_softmax(view(model, params, seq), axis=-1)
    got = np.take_along_axis(np.asarray(logp), np.asarray(out.tokens)[..., None], -1)[..., 0]
    np.testing.assert_allclose(got, out.logprobs, atol=1e-5)

    completion = np.asarray(out.tokens).copy()
    completion[:, 2] = IMG
    seq = seq._replace(completion=jnp.asarray(completion))
    emb = params["params"]["embed"]["embedding"]
    moved = jax.tree.map(lambda x: x, params)
    moved["params"]["embed"]["embedding"] = emb.at[IMG].add(1.0)
    # (the tied output projection's column IMG moves everywhere: left out)
    a, b = (np.delete(np.asarray(view(model, p_, seq)), IMG, -1) for p_ in (params, moved))
    np.testing.assert_array_equal(a[:, :3], b[:, :3])  # prompt image tokens ignore the row
    assert np.abs(a[:, 3:] - b[:, 3:]).max() > 1e-3  # the completion's image id reads it


def _count_remats(jaxpr) -> int:
    """remat2 equations in `jaxpr` and every jaxpr inside it (a scan's body)."""
    n = 0
    for eqn in jaxpr.eqns:
        n += eqn.primitive.name == "remat2"
        for v in eqn.params.values():
            for sub in v if isinstance(v, tuple | list) else (v,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    n += _count_remats(inner)
    return n


@pytest.mark.parametrize("remat", ["block", "full"])
@pytest.mark.parametrize("scan", [False, True])
def test_remat_covers_the_towers_blocks_and_keeps_params_and_gradient(remat, scan):
    """`remat` wraps each ViT block as it wraps the LM's: one remat per block in the forward (a
    loop), or one in each scan's body (`scan_layers`: the tower's blocks are scanned too); the
    parameter tree is unchanged, and the gradient of a loss with images equals remat off's
    (float32)."""
    base = dataclasses.replace(SMALL, vision=dataclasses.replace(SMALL.vision, depth=2),
                               scan_layers=scan)
    prompt, mask, images = _batch()
    vi = vision_inputs([images[0], images[1:]], prompt, mask, base)

    def loss(model, params):
        logits, _ = model.apply(params, prompt, vi.positions, mask, patches=vi.patches,
                                patch_positions=vi.patch_positions)
        logp = jax.nn.log_softmax(logits[:, :-1])
        return -(jnp.take_along_axis(logp, prompt[:, 1:, None], -1)[..., 0] * mask[:, 1:]).sum()

    plain, rematted = VisionLM(base), VisionLM(dataclasses.replace(base, remat=remat))
    init = lambda m: m.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    params = _perturbed(init(plain), jax.random.key(1), 0.05)
    assert (jax.tree_util.tree_structure(init(rematted))
            == jax.tree_util.tree_structure(params))  # same names (HF's mapping)
    assert "blocks_1" in params["params"]["visual"]
    jaxpr = jax.make_jaxpr(functools.partial(loss, rematted))(params).jaxpr
    assert _count_remats(jaxpr) == (2 if scan else base.n_layers + base.vision.depth)
    want = jax.jit(jax.grad(functools.partial(loss, plain)))(params)  # jitted: one compile,
    got = jax.jit(jax.grad(functools.partial(loss, rematted)))(params)  # not op by op
    assert float(np.abs(want["params"]["visual"]["blocks_0"]["attn"]["qkv"]["kernel"]).max()) > 0
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), got, want)

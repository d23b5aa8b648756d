"""Tests for the masked-diffusion LM: bidirectional attention, padding, the shared parameter tree
with the causal LM, the mask token, and the completion logits of [prompt | completion].

One tiny config and one input shape ([2, 12]) for every full forward here, so each model's
`apply` compiles once; the numerics are checked against the causal LM on the same params and
against inputs built by hand.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lm_helpers import peaked_params

from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.models import CausalLM, LMConfig, init_cache
from jaxrl_suite.models.diffusion_lm import (
    DiffusionLM,
    check_mask_token,
    completion_inputs,
    completion_logits,
)

CFG = LMConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64)
B, T = 2, 12  # the one full-forward shape
P, N = 8, 4  # prompt / completion split of T for completion_logits


@pytest.fixture(scope="module")
def models():
    """(DiffusionLM, CausalLM, params) with params perturbed so that the logits are far from
    uniform (the default init's logits barely move with the input)."""
    diffusion, causal = DiffusionLM(CFG), CausalLM(CFG)

    params = jax.jit(lambda rng: peaked_params(diffusion, rng))(jax.random.key(0))
    return diffusion, causal, params


@pytest.fixture(scope="module")
def apply(models):
    """Jitted full forwards (tokens, positions, key_mask) -> logits of both models, [B, T]."""
    diffusion, causal, _ = models
    return {name: jax.jit(lambda p, x, pos, m, model=model: model.apply(
        p, x, positions=pos, key_mask=m)[0]) for name, model in
        (("diffusion", diffusion), ("causal", causal))}


def _tokens(seed):
    return np.asarray(jax.random.randint(jax.random.key(seed), (B, T), 2, CFG.vocab_size - 1),
                      np.int32)


def _positions(mask):
    """Positions counting the real tokens of each row (0 on padding), by hand."""
    out = np.zeros(mask.shape, np.int32)
    for b in range(mask.shape[0]):
        out[b, mask[b]] = np.arange(mask[b].sum())
    return out


ALL = np.ones((B, T), bool)
ARANGE = np.broadcast_to(np.arange(T, dtype=np.int32), (B, T))


def test_a_later_token_changes_earlier_logits_only_in_the_diffusion_lm(models, apply):
    _, _, params = models
    x = _tokens(1)
    y = x.copy()
    j = 9
    y[:, j] = np.where(x[:, j] == 5, 6, 5)  # change the token at position j only
    for name in ("diffusion", "causal"):
        a = np.asarray(apply[name](params, x, ARANGE, ALL))
        b = np.asarray(apply[name](params, y, ARANGE, ALL))
        assert a.shape == (B, T, CFG.vocab_size) and np.isfinite(a).all()
        earlier = np.abs(a[:, :j] - b[:, :j]).max(axis=-1)  # [B, j]
        later = np.abs(a[:, j:] - b[:, j:]).max(axis=-1)
        assert later.min() > 1e-3, name  # the changed token and what follows see it
        if name == "diffusion":
            assert earlier.min() > 1e-3, earlier  # every earlier position sees it too
        else:
            np.testing.assert_allclose(a[:, :j], b[:, :j], atol=1e-6)  # causal: none does


def test_padding_keys_do_not_affect_the_real_positions(models, apply):
    _, _, params = models
    x = _tokens(2)
    mask = np.ones((B, T), bool)
    mask[0, :3] = False  # left padding
    mask[1, 10:] = False  # right padding: a bidirectional query would see it
    mask[1, 4] = False  # and a padding key in the middle
    other = np.where(mask, x, _tokens(3))  # the same real tokens, other padding tokens
    pos = _positions(mask)
    a = np.asarray(apply["diffusion"](params, x, pos, mask))
    b = np.asarray(apply["diffusion"](params, other, pos, mask))
    np.testing.assert_allclose(a[mask], b[mask], atol=1e-5)
    # Control: the same change with the padding attended to moves the real positions' logits.
    a = np.asarray(apply["diffusion"](params, x, pos, ALL))
    b = np.asarray(apply["diffusion"](params, other, pos, ALL))
    assert np.abs(a[mask] - b[mask]).max(axis=-1).min() > 1e-3


def test_the_parameter_tree_is_the_causal_lms_and_its_params_run(models, apply):
    diffusion, causal, params = models
    shapes = lambda p: jax.tree.map(lambda v: (v.shape, v.dtype), p)
    d_params = jax.eval_shape(diffusion.init, jax.random.key(1), jnp.zeros((1, 4), jnp.int32))
    c_params = jax.eval_shape(causal.init, jax.random.key(1), jnp.zeros((1, 4), jnp.int32))
    assert jax.tree.structure(d_params) == jax.tree.structure(c_params)
    assert shapes(d_params) == shapes(c_params)
    assert jax.tree.leaves(shapes(params)) == jax.tree.leaves(shapes(c_params))
    # Causal params run in the diffusion LM; with every key real, the last position attends
    # to the same keys under both masks, so its logits agree, and the first position's do not.
    x = _tokens(4)
    c_init = causal.init(jax.random.key(1), jnp.zeros((1, 4), jnp.int32))
    for p in (params, c_init):
        d = np.asarray(apply["diffusion"](p, x, ARANGE, ALL))
        c = np.asarray(apply["causal"](p, x, ARANGE, ALL))
        assert np.isfinite(d).all()
        np.testing.assert_allclose(d[:, -1], c[:, -1], atol=1e-5)
    assert np.abs(d[:, 0] - c[:, 0]).max() > 1e-4


def test_mask_token_default_and_override_and_no_kv_cache(models):
    _, _, params = models
    assert DiffusionLM(CFG).mask_token == CFG.vocab_size - 1 == 383
    assert DiffusionLM(CFG, mask_id=7).mask_token == 7
    assert DiffusionLM(dataclasses.replace(CFG, vocab_size=300)).mask_token == 299
    cache = init_cache(CFG, 1, 8)
    with pytest.raises(ValueError, match="bidirectional") as err:
        DiffusionLM(CFG).apply(params, jnp.zeros((1, 2), jnp.int32), cache=cache, cache_index=0)
    assert "\n" not in str(err.value)
    # the causal LM takes the same cache (the refusal is the diffusion LM's)
    logits, _ = jax.eval_shape(lambda p, c: CausalLM(CFG).apply(
        p, jnp.zeros((1, 2), jnp.int32), cache=c, cache_index=0), params, cache)
    assert logits.shape == (1, 2, CFG.vocab_size)


def test_check_mask_token_one_line_errors():
    tok = load_tokenizer()
    assert (tok.pad_id, tok.eos_id) == (0, 1)
    assert check_mask_token(DiffusionLM(CFG), tok) == CFG.vocab_size - 1
    assert check_mask_token(DiffusionLM(CFG, mask_id=5), tok) == 5
    for mask_id, words in ((CFG.vocab_size, "outside the vocabulary"),
                           (CFG.vocab_size + 10, "outside the vocabulary"),
                           (tok.pad_id, "pad or EOS"), (tok.eos_id, "pad or EOS")):
        with pytest.raises(ValueError) as err:
            check_mask_token(DiffusionLM(CFG, mask_id=mask_id), tok)
        message = str(err.value)
        assert "\n" not in message and words in message and str(mask_id) in message, message


def test_completion_logits_slice_the_full_forward_at_the_completion(models, apply):
    diffusion, _, params = models
    x = _tokens(5)
    prompt_mask = np.ones((B, P), bool)
    prompt_mask[0, :3] = False  # row 0: a left-padded prompt of 5 tokens
    prompt = np.where(prompt_mask, x[:, :P], 0).astype(np.int32)
    completion = x[:, P:].copy()
    completion[0, 1] = completion[1, 2:] = diffusion.mask_token  # a corrupted completion
    got = np.asarray(jax.jit(lambda p, *a: completion_logits(diffusion, p, *a))(
        params, prompt, prompt_mask, completion))
    assert got.shape == (B, N, CFG.vocab_size)

    # by hand: [prompt | completion], every completion position a real key, positions counting
    # the real tokens (row 0's first prompt token is position 0, its completion starts at 5)
    tokens = np.concatenate([prompt, completion], axis=1)
    key_mask = np.concatenate([prompt_mask, np.ones((B, N), bool)], axis=1)
    positions = _positions(key_mask)
    assert positions[0, P:].tolist() == [5, 6, 7, 8] and positions[1, P:].tolist() == [8, 9, 10, 11]
    built = completion_inputs(prompt, prompt_mask, completion)
    for mine, theirs in zip((tokens, key_mask, positions), built, strict=True):
        np.testing.assert_array_equal(np.asarray(theirs), mine)
    full = np.asarray(apply["diffusion"](params, tokens, positions, key_mask))
    np.testing.assert_allclose(got, full[:, P:], atol=1e-5)
    # the slice is the completion's: the prompt's last position differs
    assert np.abs(got[:, 0] - full[:, P - 1]).max() > 1e-3
    # with the AR shift (Dream / DiffuCoder) the logits one position earlier predict each token:
    # the same forward (the shift changes no parameter), sliced from the prompt's last position
    shifted = DiffusionLM(CFG, shift=True)
    got_shift = np.asarray(jax.jit(lambda p, *a: completion_logits(shifted, p, *a))(
        params, prompt, prompt_mask, completion))
    np.testing.assert_allclose(got_shift, full[:, P - 1 : P - 1 + N], atol=1e-5)

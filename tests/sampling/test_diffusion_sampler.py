"""DiffusionSampler: transfer schedule, output contract, keys, blocks, orders; AR-ness metrics.

Three compiled decode programs in all (confidence sampled, confidence greedy with blocks, random
sampled), each called with one batch shape [4, 6] -> 12 new tokens in 6 steps.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.models.diffusion_lm import DiffusionLM, LMConfig, completion_logits
from jaxrl_suite.sampling.diffusion import (
    DiffusionSampler,
    global_arness,
    local_arness,
    transfer_schedule,
)

N, STEPS, BLOCK, P = 12, 6, 4, 6
MODEL = DiffusionLM(LMConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64))
MASK = MODEL.mask_token


# --- transfer_schedule ---------------------------------------------------------------------


def test_transfer_schedule_hand_cases():
    np.testing.assert_array_equal(transfer_schedule(8, 3), [3, 3, 2])
    np.testing.assert_array_equal(transfer_schedule(8, 4, block_size=4), [2, 2, 2, 2])
    np.testing.assert_array_equal(transfer_schedule(10, 4, block_size=5), [3, 2, 3, 2])
    np.testing.assert_array_equal(transfer_schedule(5, 5), [1, 1, 1, 1, 1])
    np.testing.assert_array_equal(transfer_schedule(N, STEPS, BLOCK), [2] * 6)
    for n, steps, block in [(8, 3, 0), (8, 4, 4), (12, 6, 4), (7, 3, 0), (16, 8, 2), (9, 9, 3)]:
        s = transfer_schedule(n, steps, block)
        assert s.shape == (steps,) and s.sum() == n and s.min() >= 1


@pytest.mark.parametrize("n, steps, block, match", [
    (8, 4, 3, r"^block_size=3 must divide max_new_tokens=8$"),
    (8, 3, 4, r"^steps=3 must be a positive multiple of the 2 blocks"),
    (8, 0, 0, r"^steps=0 must be a positive multiple"),
    (4, 5, 0, r"^steps=5 exceeds the 4 positions"),
    (8, 12, 2, r"^steps=12 exceeds the 8 positions"),
])
def test_transfer_schedule_errors(n, steps, block, match):
    with pytest.raises(ValueError, match=match) as e:
        transfer_schedule(n, steps, block)
    assert "\n" not in str(e.value)


def test_sampler_constructor_errors_are_one_line():
    with pytest.raises(ValueError, match=r"^block_size=5 must divide max_new_tokens=12$"):
        DiffusionSampler(MODEL, max_new_tokens=N, steps=STEPS, eos_id=1, pad_id=0, block_size=5)
    with pytest.raises(ValueError, match=r"^diffusion order must be one of"):
        DiffusionSampler(MODEL, max_new_tokens=N, steps=STEPS, eos_id=1, pad_id=0, order="l2r")
    with pytest.raises(ValueError, match=r"^temperature must be positive"):
        DiffusionSampler(MODEL, max_new_tokens=N, steps=STEPS, eos_id=1, pad_id=0,
                         temperature=0.0)


# --- the sampler ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok():
    t = load_tokenizer("byt5")
    assert (t.eos_id, t.pad_id) == (1, 0) and MASK == 383
    return t


@pytest.fixture(scope="module")
def prompts(tok):
    """Left-padded prompts [4, P] and mask of different lengths."""
    tokens, mask = tok.encode_batch(["ab", "hello", "x", "1+2="], P, side="left")
    return jnp.asarray(tokens, jnp.int32), jnp.asarray(mask)


@pytest.fixture(scope="module")
def init_params():
    return jax.jit(MODEL.init)(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))


def _params(init_params, eos_boost):
    """Random params with the embeddings scaled up (logits far from uniform). With eos_boost,
    every embedding gets a large constant coordinate 0 and EOS's is larger by eos_boost, so
    the final-normed state points along it and EOS gets a logit bonus (~6% per token)."""
    params = jax.tree.map(lambda x: x, init_params)  # a copy of the dicts
    e = 5.0 * np.asarray(params["params"]["embed"]["embedding"])
    if eos_boost:
        e[:, 0] = 10.0
        e[1, 0] += eos_boost
    params["params"]["embed"]["embedding"] = jnp.asarray(e)
    return params


@pytest.fixture(scope="module")
def params(init_params):
    return _params(init_params, 0.0)


@pytest.fixture(scope="module")
def eos_params(init_params):
    return _params(init_params, 0.5)


def _sampler(**kw):
    return DiffusionSampler(MODEL, max_new_tokens=N, steps=STEPS, eos_id=1, pad_id=0, **kw)


@pytest.fixture(scope="module")
def confidence():
    return _sampler(order="confidence")


@pytest.fixture(scope="module")
def greedy_blocks():
    return _sampler(order="confidence", greedy=True, block_size=BLOCK)


@pytest.fixture(scope="module")
def random_order():
    return _sampler(order="random")


@pytest.fixture(scope="module")
def eos_decodes(confidence, eos_params, prompts):
    """decode() outputs of the EOS-prone params for 4 rngs."""
    return [confidence.decode(eos_params, *prompts, jax.random.key(r)) for r in range(4)]


def _assert_permutation(order):
    order = np.asarray(order)
    assert order.shape == (4, N) and order.dtype == np.int32
    np.testing.assert_array_equal(np.sort(order, axis=1), np.tile(np.arange(N), (4, 1)))


def test_output_contract(eos_decodes, confidence, eos_params, prompts):
    with_eos = without_eos = 0
    for out, order in eos_decodes:
        _assert_permutation(order)
        tokens, mask = np.asarray(out.tokens), np.asarray(out.mask)
        logp, lengths = np.asarray(out.logprobs), np.asarray(out.lengths)
        assert tokens.shape == mask.shape == logp.shape == (4, N) and tokens.dtype == np.int32
        assert not np.any(tokens == MASK)
        for b in range(4):
            eos = np.flatnonzero(tokens[b] == 1)
            first = eos[0] if eos.size else N - 1
            with_eos += bool(eos.size) and first < N - 1
            without_eos += not eos.size
            np.testing.assert_array_equal(mask[b], np.arange(N) <= first)
            np.testing.assert_array_equal(tokens[b, first + 1:], 0)
        np.testing.assert_array_equal(lengths, mask.sum(axis=1))
        np.testing.assert_array_equal(logp[mask == 0], 0.0)
        assert np.all(np.isfinite(logp)) and np.all(logp[mask > 0] <= 0.0)
        assert np.any(logp[mask > 0] < 0.0)
    assert with_eos and without_eos  # both cases of the contract were exercised
    again = confidence(eos_params, *prompts, jax.random.key(0))  # __call__ is decode()[0]
    for x, y in zip(again, eos_decodes[0][0], strict=True):
        np.testing.assert_array_equal(x, y)


def test_different_rngs_give_different_samples(eos_decodes):
    a, b = np.asarray(eos_decodes[0][1]), np.asarray(eos_decodes[1][1])
    assert not np.array_equal(a, b)


def test_seq_ids_make_rows_independent_of_the_batch(confidence, params, prompts):
    prompt, pmask = prompts
    rng = jax.random.key(11)
    base, base_order = confidence.decode(params, prompt, pmask, rng)  # seq_ids = arange(4)
    perm = np.array([3, 0, 2, 1])
    out, order = confidence.decode(params, prompt[perm], pmask[perm], rng,
                                   seq_ids=jnp.asarray(perm, jnp.int32))
    np.testing.assert_array_equal(out.tokens, np.asarray(base.tokens)[perm])
    np.testing.assert_array_equal(order, np.asarray(base_order)[perm])
    np.testing.assert_allclose(out.logprobs, np.asarray(base.logprobs)[perm], atol=1e-6)
    # row 0 takes the other row's seq_id 1 and prompt: its row; the other seq_ids differ
    same = np.array([1, 1, 1, 1])
    out, order = confidence.decode(params, prompt[same], pmask[same], rng,
                                   seq_ids=jnp.asarray([1, 4, 5, 6], jnp.int32))
    np.testing.assert_array_equal(out.tokens[0], base.tokens[1])
    np.testing.assert_array_equal(order[0], base_order[1])
    tokens = np.asarray(out.tokens)
    assert len({tuple(r) for r in tokens}) == 4  # one prompt, four keys: four samples


def test_greedy_does_not_depend_on_rng(greedy_blocks, params, prompts):
    a, order_a = greedy_blocks.decode(params, *prompts, jax.random.key(0))
    b, order_b = greedy_blocks.decode(params, *prompts, jax.random.key(1),
                                      seq_ids=jnp.asarray([7, 8, 9, 10], jnp.int32))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(order_a, order_b)
    assert not np.any(np.asarray(a.tokens) == MASK)


def test_greedy_first_step_unmasks_the_most_confident_positions(greedy_blocks, params, prompts):
    # Step 0 sees an all-mask completion and may unmask block 0 only (positions 0..3); it
    # takes the 2 with the highest max-probability (mask token excluded), best first.
    out, order = greedy_blocks.decode(params, *prompts, jax.random.key(0))
    full = jnp.full((4, N), MASK, jnp.int32)
    logits = np.asarray(jax.jit(lambda *a: completion_logits(MODEL, *a))(params, *prompts, full),
                        np.float64)
    logits[..., MASK] = -np.inf
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    conf = logp.max(-1)[:, :BLOCK]  # [4, BLOCK]
    best = np.argsort(-conf, axis=1)[:, :2]
    order, tokens = np.asarray(order), np.asarray(out.tokens)
    for b in range(4):
        np.testing.assert_array_equal(order[b, best[b]], [0, 1])
        np.testing.assert_array_equal(tokens[b, best[b]], logits[b, best[b]].argmax(-1))
        np.testing.assert_allclose(out.logprobs[b, best[b]], conf[b, best[b]], atol=1e-4)


def test_block_size_ranks_blocks_left_to_right(greedy_blocks, params, prompts):
    _, order = greedy_blocks.decode(params, *prompts, jax.random.key(0))
    _assert_permutation(order)
    order = np.asarray(order)
    for j in range(N // BLOCK):
        block = order[:, j * BLOCK:(j + 1) * BLOCK]
        np.testing.assert_array_equal(np.sort(block, axis=1),
                                      np.tile(np.arange(j * BLOCK, (j + 1) * BLOCK), (4, 1)))


def test_random_order_differs_from_confidence_order(random_order, confidence, params, prompts):
    rng = jax.random.key(3)
    _, order_r = random_order.decode(params, *prompts, rng)
    _, order_c = confidence.decode(params, *prompts, rng)
    _, order_r2 = random_order.decode(params, *prompts, jax.random.key(4))
    _assert_permutation(order_r)
    assert not np.array_equal(order_r, order_c)
    assert not np.array_equal(order_r, order_r2)


# --- AR-ness -------------------------------------------------------------------------------


def test_arness_left_to_right_is_one():
    order = np.tile(np.arange(6), (2, 1))  # rank of position i = i
    for k in range(1, 6):
        assert local_arness(order, k) == 1.0
    for k in range(1, 7):
        assert global_arness(order, k) == 1.0


def test_arness_right_to_left():
    n = 6
    order = np.tile(np.arange(n)[::-1], (3, 1))  # position n-1 first
    assert local_arness(order, 1) == 0.0
    for k in range(1, n + 1):
        np.testing.assert_allclose(global_arness(order, k), k / n)


def test_arness_hand_example():
    # Positions unmasked in the order [1, 2, 0, 3, 4]: ranks order[i] = [2, 0, 1, 3, 4].
    # local@1, steps 1..4: 2 after 1 yes; 0 after 2 no; 3 after 0 no; 4 after 3 yes -> 2/4.
    # local@2, steps 2..4: 0 (needs -1, -2) no; 3 (needs 2 then 1; had 0, 2) no;
    #   4 (needs 3 then 2; had 3, 0) no -> 0/3.
    # global@1: step 0 takes 1 while 0 is masked, no; step 1 takes 2, 0 masked, no; steps 2, 3,
    #   4 take the leftmost masked position, yes -> 3/5.
    # global@2: at most one masked position lies left of each step's position -> 5/5.
    order = np.array([[2, 0, 1, 3, 4]])
    assert local_arness(order, 1) == 0.5
    assert local_arness(order, 2) == 0.0
    assert global_arness(order, 1) == 0.6
    assert global_arness(order, 2) == 1.0
    # two rows average over all steps: with left-to-right, local@1 = (2 + 4) / 8
    both = np.array([[2, 0, 1, 3, 4], [0, 1, 2, 3, 4]])
    assert local_arness(both, 1) == 6 / 8
    assert global_arness(both, 1) == 8 / 10


def test_arness_k_out_of_range():
    order = np.tile(np.arange(5), (1, 1))
    for k in (0, 5):
        with pytest.raises(ValueError, match=rf"^local AR-ness@k needs 1 <= k < N=5, got k={k}$"):
            local_arness(order, k)
    for k in (0, 6):
        with pytest.raises(ValueError, match=rf"^global AR-ness@k needs 1 <= k <= N=5, got k={k}$"):
            global_arness(order, k)
    assert global_arness(order, 5) == 1.0  # k = N is allowed

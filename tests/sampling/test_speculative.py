"""SpeculativeSampler: exact target distribution (chi-square), greedy parity with KVCacheSampler,
log-prob contract, drafter distillation, the draft-length controller and option checks."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from scipy.stats import chisquare

from jaxrl_suite.core.checkpoint import Checkpointer
from jaxrl_suite.models import CausalLM, LMConfig
from jaxrl_suite.models.sequence import SeqBatch
from jaxrl_suite.sampling import KVCacheSampler, SpeculativeSampler
from jaxrl_suite.sampling.speculative import DrafterState, DraftLengthController, measure_costs

V, P, N, EOS, PAD = 8, 4, 8, 1, 0
CFG = LMConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_len=40)
DRAFT_CFG = LMConfig(vocab_size=V, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32,
                     max_len=40)
MODEL, DRAFTER = CausalLM(CFG), CausalLM(DRAFT_CFG)
COSTS = dict(target_cost=(1.0, 0.01), draft_cost=(0.1, 0.001))
B_BIG = 10_000  # rows of the distribution tests (one batched call each)


def _init(model, seed, scale):
    """Random params with embeddings scaled by `scale` (a larger scale, more peaked logits)."""
    rng = jax.random.key(seed)
    flat, unravel = ravel_pytree(model.init(rng, jnp.zeros((1, 4), jnp.int32)))
    params = unravel(flat + 0.1 * jax.random.normal(jax.random.fold_in(rng, 1), flat.shape))
    params["params"]["embed"]["embedding"] *= scale
    return params


@functools.cache
def _params():
    return jax.jit(functools.partial(_init, MODEL, scale=2.0))(0)


@functools.cache
def _drafter_params():  # a different random model: rejections happen
    return jax.jit(functools.partial(_init, DRAFTER, scale=1.0))(1)


# One sampler object per static setting, shared by the tests (one compile per k and shape).
SPEC = SpeculativeSampler(MODEL, DRAFTER, _drafter_params(), max_new_tokens=N, eos_id=EOS,
                          pad_id=PAD, draft_k=2, k_choices=(0, 1, 2, 3), distill_lr=2e-2,
                          distill_steps=4, **COSTS)


@functools.cache
def _noisy_target_params():  # a drafter close to the target: greedy drafts often match
    flat, unravel = ravel_pytree(_params())
    return unravel(flat + 0.05 * jax.random.normal(jax.random.key(9), flat.shape))


GREEDY_SPEC = SpeculativeSampler(MODEL, MODEL, _noisy_target_params(), max_new_tokens=N,
                                 eos_id=EOS, pad_id=PAD, greedy=True, k_choices=(0, 1, 3),
                                 **COSTS)
GREEDY_KV = KVCacheSampler(MODEL, max_new_tokens=N, eos_id=EOS, pad_id=PAD, greedy=True)


@jax.jit
def _full_logits(params, tokens, mask):
    positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
    return MODEL.apply(params, tokens, positions, mask)[0]  # [B, S, V]


def _np_filter(scaled, top_p):
    """numpy nucleus filter of one row [V]: the smallest top set with mass >= top_p."""
    order = np.argsort(-scaled, kind="stable")
    if top_p < 1.0:
        vals = scaled[order].astype(np.float64)
        probs = np.exp(vals - vals.max())
        probs /= probs.sum()
        order = order[np.cumsum(probs) - probs < top_p]
    out = np.full_like(scaled, -np.inf)
    out[order] = scaled[order]
    return out


CHI_PROMPT = np.array([3, 5, 2, 6], np.int32)


def _exact_joint(temperature, top_p):
    """p(t1, t2, t3) of the filtered target over cells (V+1)^3, index V = 'after EOS'."""
    seqs = np.array([[*CHI_PROMPT, a, b] for a in range(V) for b in range(V)], np.int32)
    logits = np.asarray(_full_logits(_params(), seqs, np.ones_like(seqs, bool)), np.float64)
    probs = np.zeros(logits.shape)
    for idx in np.ndindex(*logits.shape[:2]):
        filtered = _np_filter(logits[idx] / temperature, top_p)
        e = np.exp(filtered - filtered.max())
        probs[idx] = e / e.sum()
    p1 = probs[0, P - 1]  # [V]
    p2 = probs[::V, P]  # [a, V]: p(b | a), row a*V + any b
    p3 = probs[:, P + 1].reshape(V, V, V)  # p(c | a, b)
    joint = np.zeros((V + 1,) * 3)
    for a in range(V):
        if a == EOS:
            joint[a, V, V] = p1[a]
            continue
        for b in range(V):
            if b == EOS:
                joint[a, b, V] = p1[a] * p2[a, b]
            else:
                joint[a, b, :V] = p1[a] * p2[a, b] * p3[a, b]
    return joint


@functools.cache
def _big_run(temperature, top_p, seed):
    prompt = np.broadcast_to(CHI_PROMPT, (B_BIG, P))
    overrides = {} if (temperature, top_p) == (1.0, 1.0) else dict(temperature=temperature,
                                                                  top_p=top_p)
    out, stats = SPEC.generate(_params(), prompt, np.ones((B_BIG, P), bool),
                               jax.random.key(seed), **overrides)
    return jax.tree.map(np.asarray, out), stats


def _chi_square(observed_cells, expected_probs, n):
    """p-value of observed counts against expected probabilities, merging cells whose expected
    count is < 5 into one; zero-probability cells must be empty."""
    observed = np.bincount(observed_cells, minlength=expected_probs.size).astype(float)
    expected = expected_probs.ravel() * n
    assert observed[expected_probs.ravel() == 0].sum() == 0  # never outside the support
    small = expected < 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


@pytest.mark.parametrize("temperature, top_p, seed", [(1.0, 1.0, 0), (0.8, 0.9, 1)])
def test_samples_follow_the_target_distribution(temperature, top_p, seed):
    out, stats = _big_run(temperature, top_p, seed)
    joint = _exact_joint(temperature, top_p)
    cells = np.where(out.mask > 0, out.tokens, V)[:, :3]  # [B, 3], V = after EOS
    n = len(cells)
    p_first = _chi_square(cells[:, 0], joint.sum((1, 2)), n)
    p_pair = _chi_square(cells[:, 0] * (V + 1) + cells[:, 1], joint.sum(2), n)
    p_triple = _chi_square((cells[:, 0] * (V + 1) + cells[:, 1]) * (V + 1) + cells[:, 2],
                           joint, n)
    print(f"T={temperature} top_p={top_p}: chi-square p-values first={p_first:.3g} "
          f"pair={p_pair:.3g} triple={p_triple:.3g}; acceptance={stats['acceptance']:.3f} "
          f"token_acceptance={stats['token_acceptance']:.3f} rounds={stats['rounds']}")
    assert min(p_first, p_pair, p_triple) > 1e-3
    assert 0.05 < stats["acceptance"] < 0.95  # both accept and reject branches ran
    assert stats["k"] == 2 and stats["drafted"] > 0 and stats["tokens"] == int(out.lengths.sum())
    assert len(np.unique(cells[:, 1])) > 4  # really sampled


def test_logprobs_equal_full_forward_and_mask_contract():
    out, _ = _big_run(1.0, 1.0, 0)
    rows = slice(0, 256)
    tokens, mask, logprobs = out.tokens[rows], out.mask[rows], out.logprobs[rows]
    full = np.concatenate([np.broadcast_to(CHI_PROMPT, (256, P)), tokens], axis=1)
    logits = _full_logits(_params(), full, np.ones_like(full, bool))[:, P - 1 : -1]
    expected = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), tokens[..., None], -1)[..., 0]
    np.testing.assert_allclose(logprobs, np.asarray(expected) * mask, atol=1e-5)
    _check_contract(out)


def _check_contract(out):
    """mask: 1 up to and including the first EOS, 0 after; pad and logprob 0 off the mask."""
    assert out.tokens.dtype == np.int32 and out.tokens.shape == out.mask.shape
    np.testing.assert_array_equal(out.lengths, out.mask.sum(-1))
    for tok, mask, lp, length in zip(out.tokens, out.mask, out.logprobs, out.lengths,
                                     strict=True):
        hits = np.flatnonzero(tok[:length] == EOS)
        n_live = hits[0] + 1 if hits.size else N
        assert length == n_live
        np.testing.assert_array_equal(mask, np.arange(N) < n_live)
        assert np.all(tok[n_live:] == PAD) and np.all(lp[n_live:] == 0.0)
        assert np.all(lp[:n_live] < 0.0)
    assert 0 < (out.lengths < N).mean() < 1  # EOS stopped some rows early, not all


def test_keys_are_per_sequence():
    """A sequence's completion depends on (rng, seq_id), not on its row: permuted seq_ids give
    the permuted rows."""
    out, _ = _big_run(1.0, 1.0, 0)
    perm = np.random.default_rng(0).permutation(B_BIG).astype(np.int32)
    again, _ = SPEC.generate(_params(), np.broadcast_to(CHI_PROMPT, (B_BIG, P)),
                             np.ones((B_BIG, P), bool), jax.random.key(0), seq_ids=perm)
    np.testing.assert_array_equal(again.tokens, out.tokens[perm])
    np.testing.assert_allclose(again.logprobs, out.logprobs[perm], atol=1e-6)


def _greedy_prompts(b=16, seed=3):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, P + 1, size=b)
    tokens = rng.integers(2, V, size=(b, P))
    mask = np.arange(P)[None, :] >= P - lengths[:, None]
    return np.where(mask, tokens, 0).astype(np.int32), mask


@pytest.mark.parametrize("k", [0, 1, 3])
def test_greedy_equals_plain_greedy_decoding(k):
    prompt, mask = _greedy_prompts()
    params = _params()
    ref = jax.tree.map(np.asarray, GREEDY_KV(params, prompt, mask, jax.random.key(0),
                                             temperature=0.7))
    out, stats = GREEDY_SPEC.generate(params, prompt, mask, jax.random.key(1), k=k,
                                      temperature=0.7)
    out = jax.tree.map(np.asarray, out)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.mask, ref.mask)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)
    _check_contract(out)
    assert stats["k"] == k and stats["tokens"] == int(ref.lengths.sum())
    if k:
        assert 0.1 < stats["acceptance"] < 0.9  # drafts accepted and rejected
        assert stats["rounds"] < N - 1  # fewer target calls than plain decoding


@pytest.mark.parametrize("k", [1, 3])
def test_drafter_equal_to_the_target_accepts_every_draft(k):
    """With the target itself as the drafter every greedy draft is accepted: a check of the
    drafter's per-row cache slots and positions, including the 2-token re-feed that follows a
    round where all k drafts (so the drafter is 2 tokens behind) were accepted."""
    prompt, mask = _greedy_prompts()
    saved = GREEDY_SPEC.drafter_params
    GREEDY_SPEC.drafter_params = _params()
    try:
        out, stats = GREEDY_SPEC.generate(_params(), prompt, mask, jax.random.key(0), k=k)
    finally:
        GREEDY_SPEC.drafter_params = saved
    assert stats["acceptance"] == 1.0 and stats["token_acceptance"] == 1.0
    assert int(out.lengths.max()) == N
    assert stats["rounds"] == -(-(N - 1) // (k + 1))  # k + 1 tokens per round


def test_auto_call_uses_the_controller_and_records_stats():
    prompt, mask = _greedy_prompts()
    ctl = GREEDY_SPEC.controller
    expected = ctl.choose(len(prompt))
    assert expected in (1, 3)  # B = 16 at these costs: speculation pays
    out = GREEDY_SPEC(_params(), prompt, mask, jax.random.key(0))
    assert GREEDY_SPEC.last_stats["k"] == expected
    assert out.tokens.shape == (16, N)
    assert ctl.measurements > 0


def test_learn_distils_the_drafter_and_raises_acceptance():
    params = _params()
    saved = SPEC.drafter_params, SPEC.opt_state, SPEC.reward_tau
    rng = np.random.default_rng(7)
    distinct = rng.integers(2, V, size=(8, P)).astype(np.int32)
    lengths = np.array([4, 3, 2, 4, 1, 4, 3, 2])
    distinct_mask = np.arange(P)[None, :] >= P - lengths[:, None]
    prompt = np.tile(np.where(distinct_mask, distinct, 0), (B_BIG // 8, 1))
    mask = np.tile(distinct_mask, (B_BIG // 8, 1))
    try:
        before, stats0 = SPEC.generate(params, prompt, mask, jax.random.key(5))
        seq = SeqBatch(prompt[:256], mask[:256], before.tokens[:256], before.mask[:256])
        rewards = np.asarray(before.lengths[:256], np.float32).reshape(32, 8)  # varied
        metrics = [SPEC.learn(params, seq, rewards) for _ in range(4)]
        kd = [m["drafter_kd"] for m in metrics]
        assert kd[-1] < 0.5 * kd[0], kd
        assert metrics[-1]["drafter_alpha"] > metrics[0]["drafter_alpha"]
        assert metrics[0]["draft_k"] == 2 and metrics[0]["acceptance"] == stats0["acceptance"]
        _, stats1 = SPEC.generate(params, prompt, mask, jax.random.key(6))
        print(f"acceptance before learn {stats0['acceptance']:.3f}, after "
              f"{stats1['acceptance']:.3f}; KD {kd[0]:.3f} -> {kd[-1]:.3f}")
        assert stats1["acceptance"] > stats0["acceptance"] + 0.1
        warm = SPEC.distill(params, seq, steps=2)  # the warm-start path: same step function
        assert warm["drafter_kd"] < kd[0] and SPEC._step._cache_size() == 1

        # Reward weighting changes the update; equal rewards (all weights 1) do not.
        def one_learn(tau, r):
            SPEC.drafter_params, SPEC.opt_state, SPEC.reward_tau = saved[0], saved[1], tau
            SPEC.learn(params, seq, r)
            return ravel_pytree(SPEC.drafter_params)[0]

        plain = one_learn(None, rewards)
        weighted = one_learn(1.0, rewards)
        equal = one_learn(1.0, np.ones((32, 8), np.float32))
        assert float(jnp.max(jnp.abs(weighted - plain))) > 1e-4
        np.testing.assert_allclose(equal, plain, atol=1e-6)
        with pytest.raises(ValueError, match="rewards"):
            SPEC.learn(params, seq, rewards.reshape(-1))
    finally:
        SPEC.drafter_params, SPEC.opt_state, SPEC.reward_tau = saved


def test_a_frozen_drafter_is_measured_not_trained_and_a_fresh_state_restores_it(tmp_path):
    params = _params()
    saved = SPEC.learning_state, SPEC.distill_steps
    rng = np.random.default_rng(8)
    mask = np.arange(P)[None, :] >= P - rng.integers(1, P + 1, size=(B_BIG, 1))
    prompt = np.where(mask, rng.integers(2, V, size=(B_BIG, P)), 0).astype(np.int32)
    try:
        out = SPEC(params, prompt, mask, jax.random.key(3))  # the compiled B_BIG program
        seq = SeqBatch(prompt[:256], mask[:256], out.tokens[:256], out.mask[:256])
        SPEC.distill_steps = 0
        frozen = SPEC.learn(params, seq)
        assert SPEC.drafter_params is saved[0].params  # not trained
        SPEC.distill_steps = 1
        trained = SPEC.learn(params, seq, np.ones((32, 8), np.float32))  # metrics: before step
        np.testing.assert_allclose(frozen["drafter_alpha"], trained["drafter_alpha"], rtol=1e-5)
        assert 0.0 < frozen["drafter_alpha"] < 1.0 and frozen["drafter_kl"] > 0
        assert SPEC.drafter_params is not saved[0].params
        learned = SPEC.learning_state
        assert int(learned.measurements) == int(saved[0].measurements) + 3  # call, 2 learns

        # What it learned round-trips a checkpoint bit for bit, into a fresh state's structure.
        ckpt = Checkpointer(tmp_path / "drafter")
        ckpt.save(1, learned, force=True)
        restored, _ = ckpt.restore(SPEC.init_learning_state())
        ckpt.close()
        assert type(restored) is DrafterState and restored.acceptance.dtype == np.float64
        for a, b in zip(jax.tree.leaves(learned), jax.tree.leaves(restored), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert float(restored.acceptance) == SPEC.controller.acceptance  # not rounded
        np.testing.assert_array_equal(restored.costs, [COSTS["target_cost"], COSTS["draft_cost"]])

        # A new run starts from the drafter the sampler was built with; a resumed one from
        # the restored state.
        SPEC.learning_state = SPEC.init_learning_state()
        assert SPEC.drafter_params is _drafter_params()
        assert (SPEC.controller.acceptance, SPEC.controller.measurements) == (0.5, 0)
        assert SPEC.controller.target_cost == COSTS["target_cost"]  # costs are kept
        SPEC.learning_state = restored
        assert SPEC.controller.acceptance == learned.acceptance
        assert SPEC.controller.measurements == learned.measurements
        np.testing.assert_array_equal(ravel_pytree(SPEC.drafter_params)[0],
                                      ravel_pytree(learned.params)[0])
    finally:
        SPEC.learning_state, SPEC.distill_steps = saved


def test_controller_hand_cases():
    ctl = DraftLengthController((0, 1, 2, 4, 8), target_cost=(1.0, 0.01),
                                draft_cost=(0.1, 0.001))
    assert ctl.acceptance == 0.5 and ctl.expected_tokens(3, 0.5) == pytest.approx(1.875)
    assert ctl.expected_tokens(4, 1.0) == 5 and ctl.expected_tokens(0, 0.3) == 1
    # cost(k, B) = k (0.1 + 0.001 B) + 1 + 0.01 B (k + 1)
    assert ctl.cost(2, 10) == pytest.approx(2 * 0.11 + 1.3)
    ctl.update(0.95)  # the first measurement replaces the prior
    assert ctl.acceptance == 0.95
    assert ctl.choose(1) == 8  # batch 1, high acceptance: draft long
    assert ctl.choose(1024) == 0  # large batch: verification costs ~ (k + 1) B, no drafting
    ks = [ctl.choose(b) for b in (1, 16, 64, 256, 1024)]
    assert ks == sorted(ks, reverse=True) and len(set(ks)) > 2  # k falls as the batch grows
    assert ctl.choose(1, max_k=3) == 2  # limited by the cache room
    for _ in range(20):
        ctl.update(0.05)  # the EMA follows a falling acceptance
    assert ctl.acceptance < 0.1 and ctl.choose(1) <= 1
    ctl.update(float("nan"))  # nothing measured: ignored
    assert ctl.acceptance < 0.1


class _FakeClock:
    """`time` for speculative.py: perf_counter() returns a scripted clock in which timed call i
    (a pair of reads, start then end) lasts durations[i] seconds."""

    def __init__(self, durations):
        self.reads = [t for d in durations for t in (0.0, d)]

    def perf_counter(self):
        return self.reads.pop(0)


def _least_squares(x, y):
    """(intercept, slope) of the least-squares line, from the closed form."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    slope = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    return y.mean() - slope * x.mean(), slope


@pytest.mark.parametrize("seconds, expected", [
    # on the line c(B, T) = 2 ms + 0.5 ms * B * T (B * T = 1, 3, 24): worked by hand
    ([2.5e-3, 3.5e-3, 14.0e-3], (2.0e-3, 0.5e-3)),
    # off any line: the closed-form least squares, intercept 2.2577 ms, slope 0.49025 ms
    ([2.5e-3, 4.0e-3, 14.0e-3], _least_squares([1, 3, 24], [2.5e-3, 4.0e-3, 14.0e-3])),
    # times that fall as B * T grows: slope -0.2967 ms, clipped to 0 (the intercept is not)
    ([9.0e-3, 8.0e-3, 2.0e-3], (_least_squares([1, 3, 24], [9.0e-3, 8.0e-3, 2.0e-3])[0], 0.0)),
    # a steep line through intercept -0.4487 ms: the overhead clipped to 0 (the slope is not)
    ([0.5e-3, 2.0e-3, 20.0e-3], (0.0, _least_squares([1, 3, 24], [0.5e-3, 2.0e-3, 20.0e-3])[1])),
])
def test_measure_costs_fits_a_line(monkeypatch, seconds, expected):
    """measure_costs on scripted timings: the forwards are compiled and run, but the clock is
    fake, so the fitted (overhead, per_token) must equal the expected line exactly. Per shape,
    2 timed calls of `inner` forwards, 1 ms per forward apart: the median is `seconds`."""
    import jaxrl_suite.sampling.speculative as spec_mod

    shapes, inner = ((1, 1), (1, 3), (8, 3)), 4
    clock = _FakeClock([inner * (t + dt) for t in seconds for dt in (-0.5e-3, 0.5e-3)])
    monkeypatch.setattr(spec_mod, "time", clock)
    got = measure_costs(DRAFTER, _drafter_params(), shapes=shapes, cache_len=16, repeats=2,
                        inner=inner)
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-15)
    assert clock.reads == []  # exactly one start and one end read per timed call


def test_measure_costs_rejects_bad_shapes():
    with pytest.raises(ValueError, match="shapes"):
        measure_costs(DRAFTER, _drafter_params(), shapes=((2, 2), (4, 1)))


@pytest.mark.parametrize("kwargs, match", [
    (dict(draft_k=5), "draft_k"),
    (dict(draft_k="fast"), "draft_k"),
    (dict(k_choices=()), "k_choices"),
    (dict(k_choices=(0, -1)), "k_choices"),
    (dict(distill_steps=-1), "distill_steps"),
    (dict(distill_lr=0.0), "distill_lr"),
    (dict(reward_tau=0.0), "reward_tau"),
    (dict(temperature=0.0), "temperature"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(target_cost=(1.0,)), "target_cost"),
    (dict(drafter=CausalLM(dataclasses.replace(DRAFT_CFG, vocab_size=V + 1))), "vocab_size"),
])
def test_bad_options_raise_one_line_errors(kwargs, match):
    args = dict(drafter=DRAFTER, max_new_tokens=N, eos_id=EOS, pad_id=PAD)
    args.update(kwargs)
    drafter = args.pop("drafter")
    with pytest.raises(ValueError, match=match) as info:
        SpeculativeSampler(MODEL, drafter, _drafter_params(), **args)
    assert "\n" not in str(info.value)


def test_bad_call_arguments_raise():
    prompt, mask = _greedy_prompts()
    with pytest.raises(ValueError, match="max_len"):  # P + N + k + 1 > 40
        GREEDY_SPEC.generate(_params(), prompt, mask, jax.random.key(0), k=40)
    with pytest.raises(ValueError, match="k must be"):
        GREEDY_SPEC.generate(_params(), prompt, mask, jax.random.key(0), k=-1)
    with pytest.raises(ValueError, match="top_p"):
        GREEDY_SPEC(_params(), prompt, mask, jax.random.key(0), top_p=0.0)
    with pytest.raises(ValueError, match="seq_ids"):
        GREEDY_SPEC(_params(), prompt, mask, jax.random.key(0), seq_ids=np.arange(3))

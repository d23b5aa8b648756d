"""SIREN's top-p entropy, peak-entropy mask and self-anchored regulariser; the naive bonus."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.losses.common import token_entropy as entropy
from jaxrl_suite.losses.siren import (
    REGULARIZERS,
    naive_entropy_bonus,
    peak_entropy_mask,
    siren_regularizer,
    top_p_entropy,
)


def np_softmax(z):
    z = np.asarray(z, np.float64)
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_entropy(probs):
    probs = probs[probs > 0]
    return float(-(probs * np.log(probs)).sum())


def np_top_p_entropy(logits_row, p):
    probs = np.sort(np_softmax(logits_row))[::-1]
    kept, mass = [], 0.0
    for q in probs:  # add tokens until the mass reaches p
        kept.append(q)
        mass += q
        if mass >= p:
            break
    kept = np.array(kept) / np.sum(kept)
    return np_entropy(kept)


@pytest.mark.parametrize("p", [0.3, 0.6, 0.9, 0.99])
def test_top_p_entropy_matches_numpy(p):
    logits = np.random.default_rng(0).normal(size=(3, 4, 11)) * 2.0
    got = np.asarray(jax.jit(lambda x: top_p_entropy(x, p=p))(jnp.asarray(logits, jnp.float32)))
    assert got.shape == (3, 4)
    for i in range(3):
        for t in range(4):
            assert got[i, t] == pytest.approx(np_top_p_entropy(logits[i, t], p), abs=2e-5)


def test_top_p_entropy_hand_case_and_limits():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = jnp.asarray(np.log(probs), jnp.float32)[None, None]
    kept = np.array([0.5, 0.3]) / 0.8  # 0.5 < 0.75 <= 0.8: the second token reaches p
    assert float(top_p_entropy(logits, p=0.75)[0, 0]) == pytest.approx(np_entropy(kept), rel=1e-5)
    assert float(top_p_entropy(logits, p=0.2)[0, 0]) == pytest.approx(0.0, abs=1e-6)  # top-1
    # p = 1: the full distribution.
    rand = jnp.asarray(np.random.default_rng(1).normal(size=(1, 5, 7)), jnp.float32)
    np.testing.assert_allclose(top_p_entropy(rand, p=1.0), entropy(rand), rtol=1e-5, atol=1e-6)
    for r in range(5):
        assert float(entropy(rand)[0, r]) == pytest.approx(np_entropy(np_softmax(rand[0, r])),
                                                           rel=1e-5)
    # A one-hot distribution has zero entropy, full and top-p.
    onehot = jnp.asarray([[[0.0, 0.0, 80.0, 0.0]]])
    assert float(entropy(onehot)[0, 0]) == pytest.approx(0.0, abs=1e-6)
    assert float(top_p_entropy(onehot, p=0.9)[0, 0]) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="top_p"):
        top_p_entropy(rand, p=0.0)


@pytest.mark.parametrize("quantile", [0.0, 0.25, 0.5, 0.8, 0.95, 1.0])
def test_peak_entropy_mask_keeps_the_quantile_of_the_valid_tokens(quantile):
    rng = np.random.default_rng(2)
    ent = rng.permutation(np.arange(40, dtype=np.float32)).reshape(4, 10) / 7.0  # distinct
    mask = (rng.random((4, 10)) < 0.7).astype(np.float32)
    got = np.asarray(peak_entropy_mask(jnp.asarray(ent), jnp.asarray(mask), quantile=quantile))
    n = int(mask.sum())
    assert int(got.sum()) == n - math.ceil(quantile * (n - 1) - 1e-9)
    assert not got[mask == 0].any()  # padding is never kept
    threshold = np.quantile(ent[mask > 0], quantile)
    np.testing.assert_array_equal(got, (mask > 0) & (ent >= threshold))
    strict = np.asarray(peak_entropy_mask(jnp.asarray(ent), jnp.asarray(mask), quantile=quantile,
                                          strict=True))
    np.testing.assert_array_equal(strict, (mask > 0) & (ent > threshold))
    hit = np.isclose(ent[mask > 0], threshold).any()  # the quantile lands on a token
    assert int(strict.sum()) == int(got.sum()) - int(hit)


def test_peak_entropy_mask_ties_at_zero():
    """Top-p entropy is exactly 0 wherever one token reaches p: with 7 zeros in 10 tokens the
    0.5-quantile is 0, so ">=" keeps every token and strict ">" only the 3 positive ones."""
    ent = jnp.asarray([[0.0, 0.0, 0.3, 0.0, 0.0, 0.7, 0.0, 0.0, 0.2, 0.0]])
    mask = jnp.ones_like(ent)
    assert float(peak_entropy_mask(ent, mask, quantile=0.5).sum()) == 10
    np.testing.assert_array_equal(
        np.asarray(peak_entropy_mask(ent, mask, quantile=0.5, strict=True)),
        np.asarray(ent) > 0)


def test_siren_regularizer_matches_numpy():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(2, 6, 9)).astype(np.float32) * 1.5
    mask = np.ones((2, 6), np.float32)
    mask[1, 4:] = 0
    top_p, quantile, anchor, coef = 0.8, 0.5, 0.7, 0.3
    fn = jax.jit(lambda x, m: siren_regularizer(x, m, top_p=top_p, quantile=quantile,
                                                anchor=anchor, coef=coef))
    penalty, metrics = fn(jnp.asarray(logits), jnp.asarray(mask))
    h_p = np.array([[np_top_p_entropy(logits[i, t], top_p) for t in range(6)] for i in range(2)])
    full = np.array([[np_entropy(np_softmax(logits[i, t])) for t in range(6)] for i in range(2)])
    valid = mask > 0
    peak = valid & (h_p > np.quantile(h_p[valid], quantile))  # strictly above
    h_bar = h_p[peak].mean()
    assert float(penalty) == pytest.approx(coef * (h_bar - anchor) ** 2, rel=1e-4)
    assert float(metrics["siren_entropy"]) == pytest.approx(h_bar, rel=1e-5)
    assert float(metrics["top_p_entropy"]) == pytest.approx(h_p[valid].mean(), rel=1e-5)
    assert float(metrics["entropy"]) == pytest.approx(full[valid].mean(), rel=1e-5)
    assert float(metrics["masked_fraction"]) == pytest.approx(peak.sum() / valid.sum())
    assert float(metrics["anchor"]) == pytest.approx(anchor)


def test_siren_pulls_the_entropy_towards_the_anchor_from_either_side():
    logits = jnp.asarray(np.random.default_rng(4).normal(size=(2, 5, 8)), jnp.float32)
    mask = jnp.ones((2, 5))

    def h_bar(x):
        return siren_regularizer(x, mask, top_p=0.9, quantile=0.5, anchor=0.0, coef=1.0)[1][
            "siren_entropy"]

    h0 = float(h_bar(logits))
    for anchor in (h0 + 0.5, h0 - 0.5):
        loss = lambda x, a=anchor: siren_regularizer(x, mask, top_p=0.9, quantile=0.5,
                                                     anchor=a, coef=1.0)[0]
        stepped = logits - 0.05 * jax.grad(loss)(logits)
        assert abs(float(h_bar(stepped)) - anchor) < abs(h0 - anchor)


def test_naive_bonus_is_minus_coef_times_the_mean_full_entropy():
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(2, 3, 6)).astype(np.float32)
    mask = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    bonus, metrics = jax.jit(lambda x, m: naive_entropy_bonus(x, m, coef=0.01))(
        jnp.asarray(logits), jnp.asarray(mask))
    full = [np_entropy(np_softmax(logits[i, t])) for i, t in zip(*np.nonzero(mask), strict=True)]
    assert float(metrics["entropy"]) == pytest.approx(np.mean(full), rel=1e-5)
    assert float(bonus) == pytest.approx(-0.01 * np.mean(full), rel=1e-5)
    # Minimising the bonus raises the entropy.
    grad = jax.grad(lambda x: naive_entropy_bonus(x, jnp.asarray(mask), coef=1.0)[0])(
        jnp.asarray(logits))
    higher = naive_entropy_bonus(jnp.asarray(logits) - 0.1 * grad, jnp.asarray(mask), coef=1.0)
    assert float(higher[1]["entropy"]) > float(metrics["entropy"])


def test_siren_ignores_the_zero_top_p_entropy_ties():
    """Most tokens confident (top-p entropy exactly 0): H_bar averages only the uncertain ones."""
    logits = np.full((1, 6, 5), -20.0, np.float32)
    logits[0, :, 0] = 20.0  # one-hot rows: H_p = 0
    logits[0, 4] = [2.0, 1.0, 0.0, -20, -20]  # two uncertain rows: the 0.5-quantile is 0
    logits[0, 5] = [0.5, 0.5, -20, -20, -20]
    mask = np.ones((1, 6), np.float32)
    _, metrics = siren_regularizer(jnp.asarray(logits), jnp.asarray(mask), top_p=0.9,
                                   quantile=0.5, anchor=0.0, coef=1.0)
    h_p = np.array([np_top_p_entropy(logits[0, t], 0.9) for t in range(6)])
    assert (h_p == 0).sum() == 4 and (h_p[[4, 5]] > 0).all()
    assert float(metrics["masked_fraction"]) == pytest.approx(2 / 6)
    assert float(metrics["siren_entropy"]) == pytest.approx(h_p[[4, 5]].mean(), rel=1e-5)


def test_registered_regularizers_share_one_signature_and_log_their_penalty():
    assert REGULARIZERS.names() == ["naive", "none", "siren"]
    rng = np.random.default_rng(6)
    logits = jnp.asarray(rng.normal(size=(2, 5, 7)) * 1.5, jnp.float32)
    mask = jnp.asarray([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], jnp.float32)
    kw = dict(coef=0.3, top_p=0.8, quantile=0.5, anchor=0.4)
    out = {name: jax.jit(functools.partial(REGULARIZERS.get(name), **kw))(logits, mask)
           for name in REGULARIZERS}
    penalty, metrics = out["none"]
    assert float(penalty) == 0.0 and metrics == {}
    want, _ = naive_entropy_bonus(logits, mask, coef=0.3)
    penalty, metrics = out["naive"]
    assert float(penalty) == pytest.approx(float(want)) and set(metrics) == {"entropy_reg"}
    assert float(metrics["entropy_reg"]) == float(penalty) < 0
    want, want_metrics = siren_regularizer(logits, mask, top_p=0.8, quantile=0.5, anchor=0.4,
                                           coef=0.3)
    penalty, metrics = out["siren"]
    assert float(penalty) == pytest.approx(float(want)) and float(penalty) > 0
    assert set(metrics) == {"entropy_reg", "top_p_entropy", "siren_entropy", "masked_fraction",
                            "anchor"}  # the full entropy is the trainer's own metric
    for k in ("siren_entropy", "masked_fraction", "anchor"):
        assert float(metrics[k]) == pytest.approx(float(want_metrics[k])), k

"""losses.w2s: weak-to-strong losses vs a numpy transcription of the authors' torch code."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.core.registry import UnknownNameError
from jaxrl_suite.losses import (
    W2S_LOSSES,
    logconf_loss,
    performance_gap_recovered,
    product_loss,
    xent_w2s_loss,
)


@jax.jit
def _evaluate(z, y, step_frac, aux_coef, warmup_frac, alpha, beta):
    losses = {
        "xent": xent_w2s_loss,
        "authors": functools.partial(logconf_loss, aux_coef=aux_coef, warmup_frac=warmup_frac),
        "linear": functools.partial(logconf_loss, aux_coef=aux_coef, warmup_frac=warmup_frac,
                                    ramp="linear"),
        "product": functools.partial(product_loss, alpha=alpha, beta=beta),
    }
    return {k: jax.value_and_grad(fn, has_aux=True)(z, y, step_frac) for k, fn in losses.items()}


def evaluate(z, y, step_frac, aux_coef=0.5, warmup_frac=0.1, alpha=1.0, beta=1.0):
    """name -> ((loss, metrics), d loss / d logits) for "xent", "authors" and "linear" (logconf
    with that ramp) and "product". One program, compiled once per batch shape: step_frac and
    the hyperparameters are traced."""
    return _evaluate(z, y, step_frac, aux_coef, warmup_frac, alpha, beta)


# -- numpy reference: weak_to_strong/loss.py line by line, in float64 ----------------------------

def np_softmax(z):
    z = np.asarray(z, np.float64)
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_xent(z, target):
    """torch.nn.functional.cross_entropy(z, target) with probability targets, mean over rows."""
    return float(-(np.asarray(target, np.float64) * np.log(np_softmax(z))).sum(-1).mean())


def np_logconf(z, y, step_frac, aux_coef=0.5, warmup_frac=0.1, ramp="authors"):
    y = np.asarray(y, np.float64)
    if ramp == "authors":
        coef = 1.0 if step_frac > warmup_frac else step_frac
    else:
        coef = min(step_frac / warmup_frac, 1.0)
    coef = coef * aux_coef
    preds = np_softmax(z)
    mean_weak = y.mean(0)
    assert mean_weak.shape == (2,)
    threshold = np.quantile(preds[:, 0], mean_weak[1])  # numpy default: 'linear'
    strong = np.stack([preds[:, 0] >= threshold, preds[:, 0] < threshold], 1).astype(np.float64)
    target = y * (1 - coef) + strong * coef
    agreement = np.mean(strong.argmax(1) == y.argmax(1))
    return np_xent(z, target), dict(coef=coef, threshold=threshold, strong=strong,
                                    target=target, agreement=agreement)


def np_product(z, y, alpha=1.0, beta=1.0):
    target = np.power(np_softmax(z), beta) * np.power(np.asarray(y, np.float64), alpha)
    target /= target.sum(-1, keepdims=True)
    return np_xent(z, target), target


def _batch(b, kind, seed):
    rng = np.random.default_rng(seed)
    offset = np.array([1.0, 0.0]) if kind.startswith("imbalanced") else 0.0
    logits = (rng.normal(size=(b, 2)) * 2 + offset).astype(np.float32)
    if kind.endswith("soft"):
        y1 = rng.beta(1.0, 6.0, size=b) if kind.startswith("imbalanced") else rng.random(b)
    else:
        y1 = (rng.random(b) < (0.15 if kind.startswith("imbalanced") else 0.5)).astype(float)
        y1[-1] = 1.0  # at least one row of class 1
    labels = np.stack([1 - y1, y1], 1).astype(np.float32)
    return logits, labels


# Batch sizes 8 and 33 here, 4 in the hand case, 5 in the vmap test: four compiles in all.
CASES = [(8, "hard"), (8, "soft"), (33, "soft"), (33, "imbalanced_hard"), (33, "imbalanced_soft")]


@pytest.mark.parametrize("b, kind", CASES)
def test_losses_match_numpy_reference_on_random_batches(b, kind):
    logits, labels = _batch(b, kind, seed=b * 10 + len(kind))
    acc = np.mean(logits.argmax(1) == labels.argmax(1))

    for step_frac, alpha, beta in [(0.05, 1.0, 1.0), (0.7, 0.5, 2.0)]:
        out = {k: v[0] for k, v in evaluate(logits, labels, step_frac, alpha=alpha,
                                            beta=beta).items()}

        loss, m = out["xent"]
        np.testing.assert_allclose(loss, np_xent(logits, labels), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(m["loss"], loss)
        np.testing.assert_allclose(m["student_agreement"], acc)

        for ramp in ("authors", "linear"):
            loss, m = out[ramp]
            ref, r = np_logconf(logits, labels, step_frac, ramp=ramp)
            np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(m["loss"], ref, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(m["aux_coef"], r["coef"], rtol=1e-6)
            np.testing.assert_allclose(m["threshold"], r["threshold"], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(m["strong_agreement"], r["agreement"])
            np.testing.assert_allclose(m["student_agreement"], acc)

        loss, m = out["product"]
        np.testing.assert_allclose(loss, np_product(logits, labels, alpha, beta)[0],
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(m["student_agreement"], acc)


def test_hard_labels_match_torch_style_xent_and_special_cases_reduce_to_xent():
    logits, labels = _batch(8, "hard", seed=3)
    # one-hot weak labels: the usual -log p(label)
    ref = -np.mean(np.log(np_softmax(logits))[np.arange(8), labels.argmax(1)])
    np.testing.assert_allclose(evaluate(logits, labels, 0.0)["xent"][0][0], ref, rtol=1e-5)
    # aux_coef = 0 is the naive student; product with beta = 0, alpha = 1 trains on the labels
    logits, labels = _batch(8, "soft", seed=4)
    out = evaluate(logits, labels, 0.5, aux_coef=0.0, beta=0.0)
    (xent, _), xent_grad = out["xent"]
    for name in ("authors", "linear", "product"):
        (loss, _), grad = out[name]
        np.testing.assert_allclose(loss, xent, rtol=1e-6)
        np.testing.assert_allclose(grad, xent_grad, atol=1e-7)


# step_frac: 0, 0.05, 0.1 (= warmup_frac), 0.1001 (just past), 0.5
RAMP_STEPS = [0.0, 0.05, 0.1, 0.1001, 0.5]
RAMP_EXPECTED = {
    "authors": [0.0, 0.025, 0.05, 0.5, 0.5],  # rises to 0.05, then jumps to 0.5
    "linear": [0.0, 0.25, 0.5, 0.5, 0.5],
}


@pytest.mark.parametrize("ramp", ["authors", "linear"])
def test_ramp_values(ramp):
    logits, labels = _batch(8, "soft", seed=5)
    evaluate(logits, labels, 0.3)  # compiled before the loop
    compiles = _evaluate._cache_size()
    coefs = [float(evaluate(logits, labels, s)[ramp][0][1]["aux_coef"]) for s in RAMP_STEPS]
    np.testing.assert_allclose(coefs, RAMP_EXPECTED[ramp], rtol=1e-6, atol=1e-9)
    assert _evaluate._cache_size() == compiles  # step_frac is traced: no retrace per step
    for s, c in zip(RAMP_STEPS, RAMP_EXPECTED[ramp], strict=True):
        assert np_logconf(logits, labels, s, ramp=ramp)[1]["coef"] == pytest.approx(c)
    # a different aux_coef / warmup_frac scales and stretches the ramp
    m = evaluate(logits, labels, 0.1, aux_coef=0.2, warmup_frac=0.4)[ramp][0][1]
    np.testing.assert_allclose(m["aux_coef"], 0.2 * (0.1 if ramp == "authors" else 0.25),
                               rtol=1e-6)


# p0 = [0.9, 0.2, 0.6, 0.4]; sorted [0.2, 0.4, 0.6, 0.9]
HAND_P = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.4, 0.6]])
HAND_CASES = {
    # weak labels, expected threshold, expected hard labels (class of each row)
    # m1 = 0.5: quantile at 1.5 -> 0.4 + 0.5 * 0.2 = 0.5; p0 < 0.5 -> class 1
    "balanced": ([[1, 0], [0, 1], [0, 1], [1, 0]], 0.5, [0, 1, 0, 1]),
    # m1 = 0.25: quantile at 0.75 -> 0.2 + 0.75 * 0.2 = 0.35; only the p0 = 0.2 row is class 1,
    # although the weak model put class 1 on the p0 = 0.9 row
    "imbalanced": ([[0, 1], [1, 0], [1, 0], [1, 0]], 0.35, [0, 1, 0, 0]),
    # soft: m1 = (0.3 + 0.6 + 0.5 + 0.1) / 4 = 0.375: quantile at 1.125 -> 0.4 + 0.125 * 0.2
    "soft": ([[0.7, 0.3], [0.4, 0.6], [0.5, 0.5], [0.9, 0.1]], 0.425, [0, 1, 0, 1]),
    # m1 = 1: t = max p0 = 0.9 and `>=` keeps that row in class 0 (as the authors' code)
    "all_one": ([[0, 1]] * 4, 0.9, [0, 1, 1, 1]),
    # m1 = 0: t = min p0 = 0.2, every row class 0
    "all_zero": ([[1, 0]] * 4, 0.2, [0, 0, 0, 0]),
}


@pytest.mark.parametrize("case", list(HAND_CASES))
def test_threshold_and_hard_labels_on_a_hand_batch(case):
    labels, threshold, classes = HAND_CASES[case]
    labels = np.asarray(labels, np.float32)
    logits = np.log(HAND_P).astype(np.float32)
    hard = np.eye(2)[classes]
    step_frac = 0.5  # coef = aux_coef = 0.5
    target = 0.5 * labels + 0.5 * hard

    (loss, m), grad = evaluate(logits, labels, step_frac)["authors"]
    np.testing.assert_allclose(m["threshold"], threshold, atol=1e-6)
    np.testing.assert_allclose(loss, np_xent(logits, target), rtol=1e-6)
    np.testing.assert_allclose(m["strong_agreement"], np.mean(hard.argmax(1) == labels.argmax(1)))
    # the gradient (p - target) / B gives back the hard labels: h = (p - B g - (1 - c) y) / c
    recovered = (HAND_P - 4 * np.asarray(grad) - 0.5 * labels) / 0.5
    np.testing.assert_allclose(recovered, hard, atol=1e-5)
    # the numpy transcription agrees on the hand case too
    _, r = np_logconf(logits, labels, step_frac)
    np.testing.assert_allclose(r["threshold"], threshold, atol=1e-6)
    np.testing.assert_array_equal(r["strong"], hard)


@pytest.mark.parametrize("b, kind", [(8, "soft"), (33, "imbalanced_hard")])
def test_gradients_are_softmax_ce_with_the_target_held_fixed(b, kind):
    logits, labels = _batch(b, kind, seed=b + 1)
    p = np_softmax(logits)
    for step_frac, alpha, beta in [(0.05, 1.0, 1.0), (0.7, 0.5, 2.0)]:
        out = evaluate(logits, labels, step_frac, alpha=alpha, beta=beta)
        for ramp in ("authors", "linear"):
            # the hard labels are detached: the gradient is that of the CE to the fixed target
            target = np_logconf(logits, labels, step_frac, ramp=ramp)[1]["target"]
            np.testing.assert_allclose(out[ramp][1], (p - target) / b, atol=1e-6)
        np.testing.assert_allclose(out["product"][1],
                                   (p - np_product(logits, labels, alpha, beta)[1]) / b,
                                   atol=1e-6)
        np.testing.assert_allclose(out["xent"][1], (p - labels) / b, atol=1e-6)
    # central finite differences of the logconf loss (float64 reference; the hard labels do not
    # change for a small step, so the difference sees the fixed-target CE)
    eps = 1e-6
    z = logits.astype(np.float64)
    fd = np.zeros_like(z)
    for i in range(b):
        for k in range(2):
            dz = np.zeros_like(z)
            dz[i, k] = eps
            fd[i, k] = (np_logconf(z + dz, labels, 0.7)[0] - np_logconf(z - dz, labels, 0.7)[0])
    fd /= 2 * eps
    np.testing.assert_allclose(evaluate(logits, labels, 0.7)["authors"][1], fd, atol=1e-5)


def test_jit_and_vmap_over_a_seed_axis():
    seeds = [_batch(5, kind, seed=s) for s, kind in enumerate(["soft", "hard", "imbalanced_soft"])]
    logits = np.stack([s[0] for s in seeds])  # [S, B, 2]
    labels = np.stack([s[1] for s in seeds])  # [S, B, 2]
    # [S]; not 0.1 itself: float32(0.1) > 0.1 in the float64 reference
    steps = np.array([0.05, 0.08, 0.6], np.float32)

    @jax.jit
    def sweep(z, y, s):
        def one(z, y, s):
            return (xent_w2s_loss(z, y, s)[0], logconf_loss(z, y, s)[0],
                    logconf_loss(z, y, s)[1]["aux_coef"], product_loss(z, y, s)[0])
        return jax.vmap(one)(z, y, s)

    xent, logconf, coef, product = sweep(logits, labels, steps)
    for i in range(3):
        np.testing.assert_allclose(xent[i], np_xent(logits[i], labels[i]), rtol=1e-5)
        ref, r = np_logconf(logits[i], labels[i], float(steps[i]))
        np.testing.assert_allclose(logconf[i], ref, rtol=1e-5)
        np.testing.assert_allclose(coef[i], r["coef"], rtol=1e-6)
        np.testing.assert_allclose(product[i], np_product(logits[i], labels[i])[0], rtol=1e-5)


def test_registry():
    assert W2S_LOSSES.names() == ["logconf", "product", "xent"]
    assert W2S_LOSSES.get("xent") is xent_w2s_loss
    assert W2S_LOSSES.get("logconf") is logconf_loss
    assert W2S_LOSSES.get("product") is product_loss
    with pytest.raises(ValueError, match="already registered"):
        W2S_LOSSES.register("xent", xent_w2s_loss)


def test_bad_shapes_and_hyperparameters_raise():
    logits, labels = _batch(4, "soft", seed=0)
    for fn in (xent_w2s_loss, logconf_loss, product_loss):
        with pytest.raises(ValueError, match="logits"):
            fn(logits[:, 0], labels, 0.1)
        with pytest.raises(ValueError, match="labels"):
            fn(logits, labels[:3], 0.1)
        with pytest.raises(ValueError, match="labels"):
            fn(logits, labels[:, :1], 0.1)
        with pytest.raises(ValueError, match="step_frac"):
            fn(logits, labels, np.array([0.1, 0.2]))
    with pytest.raises(ValueError, match="logits"):  # logconf is binary only
        logconf_loss(np.zeros((4, 3)), np.full((4, 3), 1 / 3), 0.1)
    with pytest.raises(ValueError, match="aux_coef"):
        logconf_loss(logits, labels, 0.1, aux_coef=1.5)
    with pytest.raises(ValueError, match="warmup_frac"):
        logconf_loss(logits, labels, 0.1, warmup_frac=-0.1)
    with pytest.raises(UnknownNameError, match="ramp.*authors, linear"):
        logconf_loss(logits, labels, 0.1, ramp="cosine")
    with pytest.raises(ValueError, match="alpha"):
        product_loss(logits, labels, 0.1, alpha=-1.0)
    with pytest.raises(ValueError, match="beta"):
        product_loss(logits, labels, 0.1, beta=-1.0)


def test_performance_gap_recovered():
    assert performance_gap_recovered(0.8, 0.6, 0.9) == pytest.approx(2 / 3)
    assert isinstance(performance_gap_recovered(0.8, 0.6, 0.9), float)
    assert performance_gap_recovered(0.9, 0.6, 0.9) == pytest.approx(1.0)  # matches ceiling
    assert performance_gap_recovered(0.6, 0.6, 0.9) == 0.0  # no better than the weak model
    assert performance_gap_recovered(0.5, 0.6, 0.8) == pytest.approx(-0.5)  # worse: < 0
    assert performance_gap_recovered(0.9, 0.6, 0.8) == pytest.approx(1.5)  # beats ceiling: > 1
    assert np.isnan(performance_gap_recovered(0.7, 0.6, 0.6))  # no gap: undefined
    # elementwise over seeds, with broadcasting, NaN only where the denominator is 0
    pgr = performance_gap_recovered([0.7, 0.75, 0.5, 0.6], [0.6, 0.6, 0.6, 0.6],
                                    np.array([0.8, 0.9, 0.6, 0.7]))
    np.testing.assert_allclose(pgr, [0.5, 0.5, np.nan, 0.0])
    np.testing.assert_allclose(performance_gap_recovered(jnp.array([0.7, 0.8]), 0.6, 1.0),
                               [0.25, 0.5], rtol=1e-6)  # float32 inputs

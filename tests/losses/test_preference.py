"""losses.preference: DPO and ORPO vs float64 numpy references, closed-form gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.losses import dpo_loss, orpo_loss
from jaxrl_suite.losses.preference import log_odds


def np_log_sigmoid(x):
    return -np.logaddexp(0.0, -x)


def np_dpo(c, cm, r, rm, rc, rr, beta, w):
    """float64 reference: (loss, margin, accuracy, chosen reward, rejected reward)."""
    c, r, rc, rr = (np.asarray(x, np.float64) for x in (c, r, rc, rr))
    w = np.ones(len(c)) if w is None else np.asarray(w, np.float64)
    seq = lambda x, m: np.array([sum(x[i, t] for t in range(x.shape[1]) if m[i, t] > 0)
                                 for i in range(len(x))])
    chosen = beta * (seq(c, cm) - seq(rc, cm))
    rejected = beta * (seq(r, rm) - seq(rr, rm))
    margin = chosen - rejected
    mean = lambda x: np.sum(w * x) / np.sum(w)
    return (mean(-np_log_sigmoid(margin)), mean(margin), mean(margin > 0), mean(chosen),
            mean(rejected))


def np_orpo(c, cm, r, rm, lam, w):
    """float64 reference with the naive log-odds: (loss, nll, L_OR, margin, accuracy)."""
    c, r = np.asarray(c, np.float64), np.asarray(r, np.float64)
    w = np.ones(len(c)) if w is None else np.asarray(w, np.float64)
    num = den = 0.0
    margins = []
    for i in range(len(c)):
        lp = []
        for x, m in ((c, cm), (r, rm)):
            valid = [x[i, t] for t in range(x.shape[1]) if m[i, t] > 0]
            p = np.exp(np.mean(valid))
            lp.append(np.log(p / (1 - p)))
        margins.append(lp[0] - lp[1])
        for t in range(c.shape[1]):
            if cm[i, t] > 0:
                num -= w[i] * c[i, t]
                den += w[i]
    margins = np.array(margins)
    mean = lambda x: np.sum(w * x) / np.sum(w)
    or_loss = mean(-np_log_sigmoid(margins))
    nll = num / den
    return nll + lam * or_loss, nll, or_loss, mean(margins), mean(margins > 0)


def _case(seed=0, b=4, t=6, t_rej=5):
    rng = np.random.default_rng(seed)
    logp = lambda *s: np.log(rng.uniform(0.05, 0.95, s)).astype(np.float32)
    c, r, rc, rr = logp(b, t), logp(b, t_rej), logp(b, t), logp(b, t_rej)
    cm = (rng.random((b, t)) < 0.7).astype(np.float32)
    rm = (rng.random((b, t_rej)) < 0.7).astype(np.float32)
    cm[:, 0] = rm[:, 0] = 1.0
    # padding holds garbage (-inf): it must not matter
    c, r = np.where(cm > 0, c, -np.inf), np.where(rm > 0, r, -np.inf)
    rc, rr = np.where(cm > 0, rc, -np.inf), np.where(rm > 0, rr, -np.inf)
    return c, cm, r, rm, rc, rr


WEIGHTS = np.array([1.0, 0.5, 0.0, 2.0], np.float32)


@pytest.mark.parametrize("weighted, beta", [(False, 0.1), (True, 0.5)])
@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_dpo_matches_numpy(weighted, beta, transform):
    c, cm, r, rm, rc, rr = _case()
    w = WEIGHTS if weighted else None
    fn = transform(lambda *a: dpo_loss(*a[:6], beta=beta, weights=a[6]))
    loss, m = fn(c, cm, r, rm, rc, rr, w)
    ref = np_dpo(c, cm, r, rm, rc, rr, beta, w)
    names = ["dpo_loss", "dpo_margin", "dpo_accuracy", "dpo_chosen_reward", "dpo_rejected_reward"]
    np.testing.assert_allclose(loss, ref[0], rtol=1e-5)
    for name, expected in zip(names, ref, strict=True):
        np.testing.assert_allclose(m[name], expected, rtol=1e-5, atol=1e-6, err_msg=name)


def test_dpo_gradient_is_the_closed_form():
    c, cm, r, rm, rc, rr = _case(1)
    beta, b = 0.3, len(c)
    grads = jax.grad(lambda c, r, rc, rr: dpo_loss(c, cm, r, rm, rc, rr, beta=beta)[0],
                     argnums=(0, 1, 2, 3))(c, r, rc, rr)
    seq = lambda x, m: np.where(m > 0, x, 0.0).astype(np.float64).sum(1)
    z = beta * ((seq(c, cm) - seq(rc, cm)) - (seq(r, rm) - seq(rr, rm)))  # [B]
    coef = beta / (1.0 + np.exp(z)) / b  # beta * sigmoid(-z) / B
    np.testing.assert_allclose(grads[0], -coef[:, None] * cm, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grads[1], coef[:, None] * rm, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(grads[2], 0.0)  # the reference is data
    np.testing.assert_array_equal(grads[3], 0.0)


def test_dpo_hand_case():
    # chosen: log pi = -1, ref -2 -> log-ratio +1; rejected: log pi = -3, ref -2 -> -1.
    c, cm = np.array([[-0.25, -0.75, -9.0]]), np.array([[1.0, 1.0, 0.0]])
    rc = np.array([[-1.0, -1.0, -9.0]])
    r, rm = np.array([[-3.0, 0.0]]), np.array([[1.0, 0.0]])
    rr = np.array([[-2.0, 5.0]])
    loss, m = dpo_loss(c, cm, r, rm, rc, rr, beta=0.5)  # z = 0.5 * (1 - (-1)) = 1
    np.testing.assert_allclose(loss, np.log1p(np.exp(-1.0)), rtol=1e-6)
    np.testing.assert_allclose([m["dpo_margin"], m["dpo_accuracy"], m["dpo_chosen_reward"],
                                m["dpo_rejected_reward"]], [1.0, 1.0, 0.5, -0.5], rtol=1e-6)
    # equal policy and reference: loss log 2, margin 0, accuracy 0 (margin > 0 is strict)
    loss, m = dpo_loss(c, cm, r, rm, c, r)
    np.testing.assert_allclose(loss, np.log(2.0), rtol=1e-6)
    assert float(m["dpo_accuracy"]) == 0.0


@pytest.mark.parametrize("weighted, lam", [(False, 0.1), (True, 0.7)])
@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_orpo_matches_numpy(weighted, lam, transform):
    c, cm, r, rm, _, _ = _case(2)
    w = WEIGHTS if weighted else None
    fn = transform(lambda c, cm, r, rm, w: orpo_loss(c, cm, r, rm, lam=lam, weights=w))
    loss, m = fn(c, cm, r, rm, w)
    ref = np_orpo(c, cm, r, rm, lam, w)
    names = ["orpo_loss", "orpo_nll", "orpo_or_loss", "orpo_log_odds_margin", "orpo_accuracy"]
    np.testing.assert_allclose(loss, ref[0], rtol=1e-5)
    for name, expected in zip(names, ref, strict=True):
        np.testing.assert_allclose(m[name], expected, rtol=1e-5, atol=1e-6, err_msg=name)
    grads = jax.grad(lambda c, r: orpo_loss(c, cm, r, rm, lam=lam, weights=w)[0],
                     argnums=(0, 1))(c, r)
    assert all(np.all(np.isfinite(g)) for g in grads)
    np.testing.assert_array_equal(np.asarray(grads[0])[cm == 0], 0.0)


def test_orpo_hand_case():
    # chosen mean log-prob log(0.5) -> odds 1, log odds 0; rejected log(0.2) -> odds 1/4.
    c, cm = np.log([[0.5, 0.5, 0.3]]), np.array([[1.0, 1.0, 0.0]])
    r, rm = np.log([[0.2, 0.2]]), np.ones((1, 2))
    loss, m = orpo_loss(c, cm, r, rm, lam=0.5)
    z = np.log(4.0)  # log odds ratio
    or_loss = np.log1p(np.exp(-z))  # = log(5/4)
    np.testing.assert_allclose(m["orpo_log_odds_margin"], z, rtol=1e-6)
    np.testing.assert_allclose(m["orpo_or_loss"], np.log(1.25), rtol=1e-6)
    np.testing.assert_allclose(m["orpo_nll"], np.log(2.0), rtol=1e-6)
    np.testing.assert_allclose(loss, np.log(2.0) + 0.5 * or_loss, rtol=1e-6)
    assert float(m["orpo_accuracy"]) == 1.0


def test_log_odds_stable_vs_naive_and_finite_near_zero():
    lp = np.array([-30.0, -5.0, -1.0, -0.6931, -0.3, -0.01, -1e-3], np.float32)
    naive = lp.astype(np.float64) - np.log1p(-np.exp(lp.astype(np.float64)))
    np.testing.assert_allclose(log_odds(lp), naive, rtol=1e-5, atol=1e-6)
    # near P = 1: the naive float32 formula is inaccurate or infinite, the stable one is not
    near = jnp.array([-1e-4, -1e-5, -1e-9, 0.0], jnp.float32)
    out = np.asarray(log_odds(near))
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out[:2], [-1e-4 - np.log(1e-4), -1e-5 - np.log(1e-5)], rtol=1e-4)
    np.testing.assert_allclose(out[2:], -1e-6 - np.log(-np.expm1(-1e-6)), rtol=1e-4)  # clipped
    with np.errstate(divide="ignore"):  # the naive float32 formula: exp(-1e-9) rounds to 1
        assert not np.isfinite(np.float32(-1e-9) - np.log1p(-np.exp(np.float32(-1e-9))))
    g = jax.grad(lambda x: jnp.sum(log_odds(x)))(near)
    assert np.all(np.isfinite(g)) and float(g[3]) == 0.0  # clipped: no gradient
    # a chosen sequence the model is certain of keeps the ORPO loss finite
    loss, _ = orpo_loss(jnp.full((1, 3), -1e-9), jnp.ones((1, 3)), jnp.full((1, 2), -2.0),
                        jnp.ones((1, 2)))
    assert np.isfinite(float(loss))


def test_bad_inputs_raise():
    c, cm, r, rm, rc, rr = _case()
    with pytest.raises(ValueError, match="chosen_mask"):
        dpo_loss(c, cm[:, :-1], r, rm, rc, rr)
    with pytest.raises(ValueError, match="rejected_logp"):
        orpo_loss(c, cm, r[:-1], rm[:-1])
    with pytest.raises(ValueError, match="ref_rejected_logp"):
        dpo_loss(c, cm, r, rm, rc, rr[:, :-1])
    with pytest.raises(ValueError, match="weights"):
        orpo_loss(c, cm, r, rm, weights=np.ones(3))
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(c, cm, r, rm, rc, rr, beta=0.0)
    with pytest.raises(ValueError, match="max_logp"):
        orpo_loss(c, cm, r, rm, max_logp=0.0)

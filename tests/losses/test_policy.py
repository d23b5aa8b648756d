"""The policy-loss parts (losses.policy) and the registered variants gspo and cispo (losses.grpo).

Expected values come from float64 numpy loops written below and from hand-worked cases.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.losses import (
    POLICY_LOSSES,
    aggregate,
    cispo_loss,
    clipped_surrogate,
    grpo_loss,
    gspo_loss,
    importance_ratio,
    k3_kl,
)

LOSS_TYPES = ["grpo", "dapo", "bnpo", "dr_grpo"]
TRANSFORMS = pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
RTOL, ATOL = 1e-5, 1e-6


def random_batch(seed, n=6, t=7):
    """(logp, old_logp, ref_logp, adv, mask) in float64; ratios spread around 1; row 0 fully
    valid, row 1 fully masked."""
    rng = np.random.default_rng(seed)
    old = -rng.exponential(1.0, (n, t))
    noise = rng.standard_normal((2, n, t))
    mask = np.where(np.arange(n)[:, None] == 0, 1.0, rng.random((n, t)) < 0.7) * (
        np.arange(n)[:, None] != 1)
    logp = old + 0.4 * noise[0]
    return logp, old, logp + 0.3 * noise[1], rng.standard_normal(n), mask


def f32(*xs):
    return tuple(jnp.asarray(x, jnp.float32) for x in xs)


def np_aggregate(x, m, loss_type):
    n, t = x.shape
    guard = lambda total: total if total > 0 else 1.0  # zero totals only (weights may be < 1)
    if loss_type == "grpo":
        return sum((x[i] * m[i]).sum() / guard(m[i].sum()) for i in range(n)) / n
    if loss_type in ("dapo", "bnpo"):
        return (x * m).sum() / guard(m.sum())
    return (x * m).sum() / (n * t)


# ------------------------------------------------------------------------------ importance_ratio


@TRANSFORMS
def test_token_ratio_matches_numpy_and_is_one_on_padding(transform):
    logp, old, _, _, mask = random_batch(0)
    got = transform(importance_ratio)(*f32(logp, old, mask))
    want = np.where(mask > 0, np.exp(logp - old), 1.0)
    np.testing.assert_allclose(got, want, rtol=RTOL)


@TRANSFORMS
def test_sequence_ratio_is_the_length_normalised_ratio_broadcast(transform):
    logp, old, _, _, mask = random_batch(1)
    got = transform(lambda a, b, m: importance_ratio(a, b, m, "sequence"))(*f32(logp, old, mask))
    n, t = logp.shape
    for i in range(n):
        count = mask[i].sum()
        mean = sum((logp[i, j] - old[i, j]) for j in range(t) if mask[i, j]) / max(count, 1)
        np.testing.assert_allclose(got[i], np.full(t, math.exp(mean)), rtol=RTOL)
    assert np.all(np.asarray(got[1]) == 1.0)  # no valid token: s = 1


def test_ratio_gradients():
    # Hand case: one sequence, valid tokens 0 and 1, token 2 padded with -inf.
    #   d r_t / d logp_t = r_t (token level, diagonal);
    #   s = exp((0.2 + 0.6) / 2) = exp(0.4), d s / d logp_t = s / 2 on both valid tokens.
    old = jnp.array([[-1.0, -2.0, 0.0]])
    logp = jnp.array([[-0.8, -1.4, -jnp.inf]])
    mask = jnp.array([[1.0, 1.0, 0.0]])
    jac = jax.jacobian(lambda lp: importance_ratio(lp, old, mask))(logp)[0, :, 0, :]  # [T, T]
    np.testing.assert_allclose(jac, np.diag([math.exp(0.2), math.exp(0.6), 0.0]), rtol=RTOL)
    jac = jax.jacobian(lambda lp: importance_ratio(lp, old, mask, "sequence"))(logp)[0, :, 0, :]
    s = math.exp(0.4)
    np.testing.assert_allclose(jac, [[s / 2, s / 2, 0.0]] * 3, rtol=RTOL)
    # old_logp is data: no gradient flows into it.
    grad_old = jax.grad(lambda o: importance_ratio(logp, o, mask, "sequence").sum())(old)
    np.testing.assert_array_equal(grad_old, 0.0)


def test_unknown_level_is_an_error():
    with pytest.raises(ValueError, match="level.*'word'.*'token'"):
        importance_ratio(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.ones((1, 2)), "word")


# ----------------------------------------------------------------------------- clipped_surrogate


@TRANSFORMS
@pytest.mark.parametrize("per_token_adv", [False, True], ids=["adv[N]", "adv[N,T]"])
def test_clipped_surrogate_matches_numpy(transform, per_token_adv):
    logp, old, _, adv, _ = random_batch(2)
    ratio = np.exp(logp - old)
    if per_token_adv:
        adv = adv[:, None] * np.random.default_rng(3).random(ratio.shape)
    pg, clipped = transform(lambda r, a: clipped_surrogate(r, a, 0.1, 0.28))(*f32(ratio, adv))
    want_pg, want_clip = np.zeros(ratio.shape), np.zeros(ratio.shape, bool)
    for i, j in np.ndindex(ratio.shape):
        a = adv[i, j] if per_token_adv else adv[i]
        r = ratio[i, j]
        want_pg[i, j] = -min(r * a, min(max(r, 0.9), 1.28) * a)
        want_clip[i, j] = (r < 0.9 and a < 0) or (r > 1.28 and a > 0)
    np.testing.assert_allclose(pg, want_pg, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(clipped, want_clip)
    assert 0 < want_clip.sum() < want_clip.size


def test_clipped_surrogate_hand_case():
    # r = 1.5 > 1.2 with A = +1: pg = -1.2, clipped; r = 1.5 with A = -1: pg = +1.5, not clipped;
    # r = 0.5 < 0.8 with A = -1: min(-0.5, -0.8) = -0.8 -> pg = 0.8, clipped.
    pg, clipped = clipped_surrogate(jnp.array([[1.5], [1.5], [0.5]]), jnp.array([1.0, -1.0, -1.0]),
                                    0.2, 0.2)
    np.testing.assert_allclose(pg[:, 0], [-1.2, 1.5, 0.8], rtol=RTOL)
    np.testing.assert_array_equal(clipped[:, 0], [True, False, True])


# ----------------------------------------------------------------------------------------- k3_kl


@TRANSFORMS
def test_k3_matches_numpy_is_nonnegative_and_zero_on_padding(transform):
    logp, _, ref, _, mask = random_batch(4)
    ref = np.where(mask > 0, ref, np.inf)  # padding may hold inf
    got = transform(k3_kl)(*f32(logp, ref, mask))
    d = ref - logp
    want = np.where(mask > 0, np.exp(np.where(mask > 0, d, 0.0)) - d - 1, 0.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(got) >= 0.0)
    # Hand case: d = log 2: 2 - log 2 - 1 = 0.306853.
    np.testing.assert_allclose(k3_kl(jnp.array([[0.0]]), jnp.array([[math.log(2.0)]])),
                               [[1.0 - math.log(2.0)]], rtol=RTOL)


# ------------------------------------------------------------------------------------- aggregate


@TRANSFORMS
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_aggregate_matches_numpy_with_weights(transform, loss_type):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((5, 6))
    m = rng.random((5, 6)) * (rng.random((5, 6)) < 0.6)
    m[2] = 0.0
    got = transform(lambda a, b: aggregate(a, b, loss_type))(*f32(x, m))
    np.testing.assert_allclose(got, np_aggregate(x, m, loss_type), rtol=RTOL, atol=ATOL)


def test_aggregate_hand_case_and_unknown_type():
    x = jnp.array([[1.0, 2.0, 5.0], [3.0, 0.0, 0.0]])
    m = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert float(aggregate(x, m, "grpo")) == pytest.approx((1.5 + 3.0) / 2)
    assert float(aggregate(x, m, "dapo")) == pytest.approx(6.0 / 3)
    assert float(aggregate(x, m, "dr_grpo")) == pytest.approx(6.0 / 6)
    with pytest.raises(ValueError, match="loss_type.*'ppo'.*'dr_grpo'"):
        aggregate(x, m, "ppo")


# ------------------------------------------------------------------------------------------ gspo


def np_gspo_loss(logp, old, ref, adv, mask, eps_lo, eps_hi, beta, loss_type):
    n, t = logp.shape
    pg, clipped = np.zeros((n, t)), np.zeros((n, t))
    ratio = np.ones((n, t))
    for i in range(n):
        valid = [j for j in range(t) if mask[i, j]]
        s = math.exp(sum(logp[i, j] - old[i, j] for j in valid) / max(len(valid), 1))
        ratio[i] = s
        pg[i] = -min(s * adv[i], min(max(s, 1 - eps_lo), 1 + eps_hi) * adv[i])
        clipped[i] = (s < 1 - eps_lo and adv[i] < 0) or (s > 1 + eps_hi and adv[i] > 0)
    d = np.where(mask > 0, ref - logp, 0.0)
    kl = np.exp(d) - d - 1
    loss = np_aggregate(pg, mask, loss_type) + beta * np_aggregate(kl, mask, loss_type)
    token_mean = lambda x: (x * mask).sum() / mask.sum()
    return loss, {"pg_loss": np_aggregate(pg, mask, loss_type), "kl": token_mean(kl),
                  "ratio": token_mean(ratio), "clip_frac": token_mean(clipped)}


@TRANSFORMS
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_gspo_matches_numpy(transform, loss_type):
    logp, old, ref, adv, mask = random_batch(6)
    logp = old + 0.05 * (logp - old)  # sequence ratios near 1, some inside the clip range
    kw = dict(clip_eps=0.005, clip_eps_high=0.01, beta=0.1, loss_type=loss_type)
    got_loss, got = transform(lambda *a: gspo_loss(*a, **kw))(*f32(logp, old, ref, adv, mask))
    want_loss, want = np_gspo_loss(logp, old, ref, adv, mask, 0.005, 0.01, 0.1, loss_type)
    np.testing.assert_allclose(got_loss, want_loss, rtol=RTOL, atol=ATOL)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=RTOL, atol=ATOL, err_msg=k)
    assert 0 < want["clip_frac"] < 1


def test_gspo_default_clip_range_is_the_papers_and_grpo_agg_is_the_sequence_mean():
    # One valid token per sequence: s = r, so GSPO equals GRPO at the same clip range; with
    # the paper's default range (3e-4, 4e-4) r = 1.0002 is inside it, r = 1.0005 is clipped.
    old = jnp.zeros((2, 2))
    logp = jnp.log(jnp.array([[1.0002, 1.0], [1.0005, 1.0]]))
    mask, adv = jnp.array([[1.0, 0.0], [1.0, 0.0]]), jnp.array([1.0, 1.0])
    loss, m = gspo_loss(logp, old, None, adv, mask)
    np.testing.assert_allclose(loss, -(1.0002 + 1.0004) / 2, rtol=1e-6)
    assert float(m["clip_frac"]) == 0.5
    np.testing.assert_allclose(loss, grpo_loss(logp, old, None, adv, mask, clip_eps=3e-4,
                                               clip_eps_high=4e-4)[0], rtol=1e-6)


def test_gspo_gradient_is_the_sequence_level_one():
    # loss = -mean_i s_i A_i (no clipping): d loss / d logp_it = -A_i s_i / (n_i * N) on the
    # valid tokens of sequence i, the same on each of them (not -A_i r_it / (n_i N) as in GRPO).
    logp, old, _, adv, mask = random_batch(7)
    logp = old + 0.1 * (logp - old)
    args = f32(logp, old, adv, mask)
    grad = jax.grad(lambda lp: gspo_loss(lp, args[1], None, args[2], args[3], clip_eps=10.0,
                                         clip_eps_high=10.0)[0])(args[0])
    n = logp.shape[0]
    for i in range(n):
        count = mask[i].sum()
        if count == 0:
            np.testing.assert_array_equal(grad[i], 0.0)
            continue
        s = math.exp(((logp[i] - old[i]) * mask[i]).sum() / count)
        np.testing.assert_allclose(grad[i], -adv[i] * s / (count * n) * mask[i], rtol=1e-4,
                                   atol=1e-7)


# ----------------------------------------------------------------------------------------- cispo


def np_cispo_pg(logp, old, adv, mask, eps_lo, eps_hi):
    n, t = logp.shape
    pg, clipped = np.zeros((n, t)), np.zeros((n, t))
    for i, j in np.ndindex(n, t):
        if not mask[i, j]:
            continue
        r = math.exp(logp[i, j] - old[i, j])
        pg[i, j] = -min(max(r, 1 - eps_lo), 1 + eps_hi) * adv[i] * logp[i, j]
        clipped[i, j] = r < 1 - eps_lo or r > 1 + eps_hi
    return pg, clipped


@TRANSFORMS
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_cispo_matches_numpy(transform, loss_type):
    logp, old, ref, adv, mask = random_batch(8)
    got_loss, got = transform(lambda *a: cispo_loss(*a, beta=0.1, loss_type=loss_type))(
        *f32(logp, old, ref, adv, mask))
    pg, clipped = np_cispo_pg(logp, old, adv, mask, 1.0, 0.28)
    d = np.where(mask > 0, ref - logp, 0.0)
    kl = np.exp(d) - d - 1
    want = np_aggregate(pg, mask, loss_type) + 0.1 * np_aggregate(kl, mask, loss_type)
    np.testing.assert_allclose(got_loss, want, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got["pg_loss"], np_aggregate(pg, mask, loss_type), rtol=RTOL,
                               atol=ATOL)
    np.testing.assert_allclose(got["clip_frac"], (clipped * mask).sum() / mask.sum(), rtol=RTOL)
    assert 0 < float(got["clip_frac"]) < 1


def test_cispo_keeps_the_gradient_of_clipped_tokens_with_a_capped_weight():
    # dapo: d loss / d logp_it = -w_it A_i / sum(m), w = clip(r, 0, 1.28), on every valid token,
    # including those whose ratio is above the range (where GRPO's gradient is 0).
    logp, old, _, adv, mask = random_batch(9)
    lp, o, a, m = f32(logp, old, adv, mask)
    lp = jnp.where(m > 0, lp, -jnp.inf)  # padding may hold -inf
    loss, grad = jax.value_and_grad(lambda x: cispo_loss(x, o, None, a, m)[0])(lp)
    w = np.minimum(np.exp(logp - old), 1.28)
    want = np.where(mask > 0, -w * adv[:, None] / mask.sum(), 0.0)
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-7)
    assert np.isfinite(float(loss)) and (np.exp(logp - old)[mask > 0] > 1.28).any()
    # On-policy (old = logp), w = 1: the same gradient as GRPO's, -A m / sum(m).
    g_cispo = jax.grad(lambda x: cispo_loss(x, x, None, a, m)[0])(f32(logp)[0])
    g_grpo = jax.grad(lambda x: grpo_loss(x, x, None, a, m, loss_type="dapo")[0])(f32(logp)[0])
    np.testing.assert_allclose(g_cispo, g_grpo, rtol=1e-5, atol=1e-8)


# -------------------------------------------------------------------------------------- registry


def test_registry_entries_share_one_signature_and_metric_keys():
    assert POLICY_LOSSES.names() == ["cispo", "grpo", "gspo"]
    logp, old, ref, adv, mask = f32(*random_batch(10))
    keys = None
    for name in POLICY_LOSSES:
        loss, metrics = POLICY_LOSSES.get(name)(
            logp, old, ref, adv, mask, clip_eps=0.2, clip_eps_high=0.3, beta=0.05,
            loss_type="dapo", token_weights=mask, entropy_mask=None)
        assert loss.shape == () and np.isfinite(float(loss)), name
        keys = keys or set(metrics)
        assert set(metrics) == keys == {"pg_loss", "kl", "ratio", "clip_frac"}, name
    assert POLICY_LOSSES.get("grpo") is grpo_loss

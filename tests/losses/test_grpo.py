"""Tests for jaxrl_suite.losses.grpo and the per-token helpers in losses.common.

Expected values come from a float64 numpy reference written with loops below, and from a
hand-worked case.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.losses import (
    group_advantages,
    grpo_loss,
    masked_mean,
    token_entropy,
    token_logprobs,
)

SCALES = ["group", "batch", "none"]
LOSS_TYPES = ["grpo", "dapo", "bnpo", "dr_grpo"]
TRANSFORMS = pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
RTOL, ATOL = 1e-5, 1e-6


# ----------------------------------------------------------------------------- numpy reference


def np_group_advantages(rewards, scale, eps=1e-4):
    rewards = np.asarray(rewards, np.float64)
    b, g = rewards.shape
    batch_std = np.std(rewards, ddof=1)
    out = np.zeros_like(rewards)
    for i in range(b):
        mean = sum(rewards[i]) / g
        if scale == "group":
            denom = np.std(rewards[i], ddof=1) + eps
        elif scale == "batch":
            denom = batch_std + eps
        else:
            denom = 1.0
        for j in range(g):
            out[i, j] = (rewards[i, j] - mean) / denom
    return out


def np_grpo_loss(
    logp,
    old_logp,
    ref_logp,
    adv,
    mask,
    clip_eps=0.2,
    clip_eps_high=None,
    beta=0.0,
    loss_type="grpo",
    token_weights=None,
    entropy_mask=None,
):
    """Loop reference; returns (loss, metrics) as python floats."""
    n, t = logp.shape
    lo = clip_eps
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    w = np.ones((n, t)) if token_weights is None else token_weights
    pg = np.zeros((n, t))
    kl = np.zeros((n, t))
    ratio = np.zeros((n, t))
    clipped = np.zeros((n, t))
    for i in range(n):
        for j in range(t):
            r = math.exp(logp[i, j] - old_logp[i, j])
            ratio[i, j] = r
            pg[i, j] = -min(r * adv[i], min(max(r, 1 - lo), 1 + hi) * adv[i])
            if entropy_mask is not None:  # dropped from the pg sum, kept in the normaliser
                pg[i, j] *= entropy_mask[i, j]
            clipped[i, j] = (r < 1 - lo and adv[i] < 0) or (r > 1 + hi and adv[i] > 0)
            if ref_logp is not None:
                d = ref_logp[i, j] - logp[i, j]
                kl[i, j] = math.exp(d) - d - 1

    def guard(count):  # max(count, 1) for 0/1 masks; also exact for fractional weights
        return count if count > 0 else 1.0

    def aggregate(x, m):
        if loss_type == "grpo":
            per_seq = [
                sum(x[i, j] * m[i, j] for j in range(t)) / guard(sum(m[i])) for i in range(n)
            ]
            return sum(per_seq) / n
        total = sum(x[i, j] * m[i, j] for i in range(n) for j in range(t))
        if loss_type in ("dapo", "bnpo"):
            return total / guard(m.sum())
        return total / (n * t)  # dr_grpo

    def token_mean(x):
        return (x * mask).sum() / max(mask.sum(), 1)

    pg_loss = aggregate(pg, mask * w)
    loss = pg_loss + beta * aggregate(kl, mask)
    metrics = {
        "pg_loss": pg_loss,
        "kl": token_mean(kl),
        "ratio": token_mean(ratio),
        "clip_frac": token_mean(clipped),
    }
    return loss, metrics


def random_batch(seed, n=6, t=7, token_weights=False):
    """Float64 numpy arrays; ratios spread so both clip branches occur; row 1 fully masked."""
    rng = np.random.default_rng(seed)
    old_logp = -rng.exponential(1.0, (n, t))
    logp = old_logp + 0.4 * rng.standard_normal((n, t))
    ref_logp = logp + 0.3 * rng.standard_normal((n, t))
    adv = rng.standard_normal(n)
    mask = (rng.random((n, t)) < 0.7).astype(np.float64)
    mask[1] = 0.0
    mask[0] = 1.0
    batch = dict(logp=logp, old_logp=old_logp, ref_logp=ref_logp, adv=adv, mask=mask)
    if token_weights:
        w = rng.random((n, t))
        w[rng.random((n, t)) < 0.3] = 0.0
        batch["token_weights"] = w
    return batch


def call_loss(transform, batch, **kwargs):
    """grpo_loss on float32 copies of `batch`; static keyword arguments are bound before jit."""
    f32 = lambda x: None if x is None else jnp.asarray(x, jnp.float32)
    args = tuple(f32(x) for x in _positional(batch))
    fn = transform(lambda args, w, e: grpo_loss(*args, token_weights=w, entropy_mask=e, **kwargs))
    return fn(args, f32(batch.get("token_weights")), f32(batch.get("entropy_mask")))


def _positional(batch):
    return batch["logp"], batch["old_logp"], batch["ref_logp"], batch["adv"], batch["mask"]


# ------------------------------------------------------------------------------ group_advantages


@TRANSFORMS
@pytest.mark.parametrize("scale", SCALES)
def test_group_advantages_matches_numpy(transform, scale):
    rng = np.random.default_rng(0)
    rewards = rng.standard_normal((5, 8))
    rewards[2] = 3.0  # a constant group
    rewards[3] = rng.integers(0, 2, 8)  # binary rewards, the common case
    fn = transform(functools.partial(group_advantages, scale=scale))
    got = fn(jnp.asarray(rewards, jnp.float32))
    assert got.shape == (5, 8)
    np.testing.assert_allclose(got, np_group_advantages(rewards, scale), rtol=RTOL, atol=1e-5)


def test_group_advantages_hand_case():
    # Group [1, 0, 0, 1]: mean 0.5, deviations +-0.5, ddof=1 variance 4 * 0.25 / 3 = 1/3,
    # std 1/sqrt(3) = 0.57735; so A = +-0.5 / (0.57735 + 1e-4) = +-0.86588.
    rewards = jnp.array([[1.0, 0.0, 0.0, 1.0]])
    std = 1.0 / math.sqrt(3.0)
    a = 0.5 / (std + 1e-4)
    np.testing.assert_allclose(group_advantages(rewards), [[a, -a, -a, a]], rtol=RTOL)
    np.testing.assert_allclose(
        group_advantages(rewards, scale="none"), [[0.5, -0.5, -0.5, 0.5]], rtol=RTOL
    )
    # One group: the batch std equals the group std.
    np.testing.assert_allclose(
        group_advantages(rewards, scale="batch"), group_advantages(rewards), rtol=RTOL
    )


@pytest.mark.parametrize("scale", SCALES)
def test_group_advantages_constant_group_is_zero(scale):
    rewards = jnp.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    got = group_advantages(rewards, scale=scale)
    assert np.all(np.isfinite(got))
    np.testing.assert_array_equal(got, np.zeros((2, 3)))


def test_group_advantages_integer_rewards():
    got = group_advantages(jnp.array([[1, 0, 0, 1]]))
    assert jnp.issubdtype(got.dtype, jnp.floating)
    np.testing.assert_allclose(got, group_advantages(jnp.array([[1.0, 0.0, 0.0, 1.0]])))


# ------------------------------------------------------------------------------------- grpo_loss


@TRANSFORMS
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize(
    "hyper",
    [
        dict(),
        dict(clip_eps=0.1, clip_eps_high=0.28, beta=0.04),
        dict(clip_eps=0.3, beta=0.5),
    ],
    ids=["default", "clip_higher_kl", "wide_kl"],
)
def test_grpo_loss_matches_numpy(transform, loss_type, hyper):
    batch = random_batch(1)
    got_loss, got = call_loss(transform, batch, loss_type=loss_type, **hyper)
    want_loss, want = np_grpo_loss(*_positional(batch), loss_type=loss_type, **hyper)
    assert got_loss.shape == ()
    np.testing.assert_allclose(got_loss, want_loss, rtol=RTOL, atol=ATOL)
    assert set(got) == set(want)
    for k in want:
        assert got[k].shape == (), k
        np.testing.assert_allclose(got[k], want[k], rtol=RTOL, atol=ATOL, err_msg=k)
    assert 0 < want["clip_frac"] < 1  # the random batch does exercise clipping


@TRANSFORMS
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_grpo_loss_token_weights_match_numpy(transform, loss_type):
    batch = random_batch(2, token_weights=True)
    got_loss, got = call_loss(transform, batch, loss_type=loss_type, beta=0.1)
    want_loss, want = np_grpo_loss(
        *_positional(batch), loss_type=loss_type, beta=0.1, token_weights=batch["token_weights"]
    )
    np.testing.assert_allclose(got_loss, want_loss, rtol=RTOL, atol=ATOL)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=RTOL, atol=ATOL, err_msg=k)


@TRANSFORMS
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("with_weights", [False, True], ids=["mask", "mask+weights"])
def test_grpo_loss_entropy_mask_matches_numpy(transform, loss_type, with_weights):
    batch = random_batch(3, token_weights=with_weights)
    batch["entropy_mask"] = (np.random.default_rng(4).random(batch["mask"].shape) < 0.4) * 1.0
    got_loss, got = call_loss(transform, batch, loss_type=loss_type, beta=0.1)
    want_loss, want = np_grpo_loss(
        *_positional(batch), loss_type=loss_type, beta=0.1,
        token_weights=batch.get("token_weights"), entropy_mask=batch["entropy_mask"],
    )
    np.testing.assert_allclose(got_loss, want_loss, rtol=RTOL, atol=ATOL)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=RTOL, atol=ATOL, err_msg=k)
    # All ones is a no-op; a token dropped by the entropy mask still counts in the normaliser,
    # so the result differs from giving it weight 0 (which removes it from both).
    plain = call_loss(transform, batch | {"entropy_mask": None}, loss_type=loss_type)[0]
    ones = call_loss(transform, batch | {"entropy_mask": np.ones_like(batch["mask"])},
                     loss_type=loss_type)[0]
    np.testing.assert_allclose(ones, plain, rtol=1e-6)
    if loss_type != "dr_grpo" and not with_weights:
        as_weights = call_loss(transform, batch | {"token_weights": batch["entropy_mask"],
                                                    "entropy_mask": None}, loss_type=loss_type)[0]
        masked = call_loss(transform, batch, loss_type=loss_type)[0]
        assert abs(float(as_weights) - float(masked)) > 1e-4


@TRANSFORMS
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_grpo_loss_without_ref(transform, loss_type):
    batch = random_batch(3)
    batch["ref_logp"] = None
    loss, metrics = call_loss(transform, batch, loss_type=loss_type)
    want_loss, _ = np_grpo_loss(*_positional(batch), loss_type=loss_type)
    np.testing.assert_allclose(loss, want_loss, rtol=RTOL, atol=ATOL)
    assert metrics["kl"] == 0.0


# Hand-worked case. N = 2, T = 2, clip 0.2, A = [+1, -1], mask [[1, 1], [1, 0]],
# logp - old_logp = [[0.5, 0], [0.5, 0]], so r = [[e^0.5, 1], [e^0.5, 1]], e^0.5 = 1.648721.
#   (0,0) A=+1, r=1.6487 > 1.2: min(1.6487, 1.2) = 1.2       -> pg = -1.2       (clipped)
#   (0,1) A=+1, r=1:                                          -> pg = -1
#   (1,0) A=-1, r=1.6487: min(-1.6487, -1.2) = -1.6487        -> pg = +1.648721  (not clipped)
#   (1,1) masked out (its pg of +1 must not count).
# grpo:    mean(( -1.2 - 1) / 2, 1.648721 / 1) = (-1.1 + 1.648721) / 2 = 0.2743606
# dapo:    (-1.2 - 1 + 1.648721) / 3 = -0.5512787 / 3                  = -0.1837596
# dr_grpo: -0.5512787 / (N * T = 4)                                     = -0.1378197
# clip_frac = 1/3; ratio = (2 * 1.648721 + 1) / 3 = 1.432481.
E05 = math.exp(0.5)
HAND_EXPECTED = {
    "grpo": ((-1.2 - 1.0) / 2 + E05) / 2,
    "dapo": (-1.2 - 1.0 + E05) / 3,
    "bnpo": (-1.2 - 1.0 + E05) / 3,
    "dr_grpo": (-1.2 - 1.0 + E05) / 4,
}


def hand_batch():
    old_logp = jnp.array([[-1.0, -2.0], [-1.5, -0.5]])
    logp = old_logp + jnp.array([[0.5, 0.0], [0.5, 0.0]])
    return logp, old_logp, jnp.array([1.0, -1.0]), jnp.array([[1.0, 1.0], [1.0, 0.0]])


@TRANSFORMS
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_grpo_loss_hand_case(transform, loss_type):
    logp, old_logp, adv, mask = hand_batch()
    fn = transform(functools.partial(grpo_loss, loss_type=loss_type))
    loss, metrics = fn(logp, old_logp, None, adv, mask)
    np.testing.assert_allclose(loss, HAND_EXPECTED[loss_type], rtol=RTOL)
    np.testing.assert_allclose(metrics["pg_loss"], HAND_EXPECTED[loss_type], rtol=RTOL)
    np.testing.assert_allclose(metrics["clip_frac"], 1 / 3, rtol=RTOL)
    np.testing.assert_allclose(metrics["ratio"], (2 * E05 + 1) / 3, rtol=RTOL)
    # A bool mask gives the same result.
    loss_bool, _ = fn(logp, old_logp, None, adv, mask.astype(bool))
    np.testing.assert_allclose(loss_bool, loss, rtol=RTOL)


def test_grpo_loss_hand_case_gradient():
    # grpo: d loss / d logp_it = -r_it * A_i / (count_i * N) on unclipped valid tokens.
    #   (0,0) clipped -> 0;  (0,1) -1 * 1 / (2 * 2) = -0.25;
    #   (1,0) -e^0.5 * -1 / (1 * 2) = +0.824361;  (1,1) masked -> 0.
    logp, old_logp, adv, mask = hand_batch()
    grad = jax.grad(lambda lp: grpo_loss(lp, old_logp, None, adv, mask)[0])(logp)
    np.testing.assert_allclose(grad, [[0.0, -0.25], [E05 / 2, 0.0]], rtol=RTOL, atol=ATOL)


def test_clip_eps_high_widens_upper_range():
    # With clip_eps_high = 0.7 > e^0.5 - 1 = 0.6487, token (0,0) is no longer clipped:
    # grpo loss = mean((-1.6487 - 1) / 2, 1.6487) = (-1.324361 + 1.648721) / 2.
    logp, old_logp, adv, mask = hand_batch()
    loss, metrics = grpo_loss(logp, old_logp, None, adv, mask, clip_eps_high=0.7)
    np.testing.assert_allclose(loss, ((-E05 - 1.0) / 2 + E05) / 2, rtol=RTOL)
    assert metrics["clip_frac"] == 0.0


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_gradient_zero_on_masked_and_clipped_tokens(loss_type):
    b = random_batch(4)
    logp, old_logp, ref_logp, adv, mask = (jnp.asarray(x, jnp.float32) for x in _positional(b))
    loss_fn = lambda lp: grpo_loss(lp, old_logp, None, adv, mask, loss_type=loss_type)[0]
    grad = np.asarray(jax.grad(loss_fn)(logp))
    ratio = np.exp(b["logp"] - b["old_logp"])
    a = b["adv"][:, None]
    clipped = ((ratio > 1.2) & (a > 0)) | ((ratio < 0.8) & (a < 0))
    masked = b["mask"] == 0
    assert clipped[~masked].sum() > 0 and masked.sum() > 0
    np.testing.assert_array_equal(grad[masked | clipped], 0.0)
    assert np.all(grad[~masked & ~clipped] != 0.0)


def test_on_policy_gradient_with_old_logp_equal_to_logp():
    # old_logp is treated as data: with old_logp = logp, r = 1 and d loss / d logp = -A m / |m|.
    b = random_batch(5)
    logp, _, _, adv, mask = (jnp.asarray(x, jnp.float32) for x in _positional(b))
    grad = jax.grad(lambda lp: grpo_loss(lp, lp, None, adv, mask, loss_type="dapo")[0])(logp)
    want = -b["adv"][:, None] * b["mask"] / b["mask"].sum()
    np.testing.assert_allclose(grad, want, rtol=RTOL, atol=ATOL)


def test_padding_may_hold_inf():
    b = random_batch(6)
    logp, old_logp, ref_logp, adv, mask = (jnp.asarray(x, jnp.float32) for x in _positional(b))
    pad = mask == 0
    logp = jnp.where(pad, -jnp.inf, logp)
    old_logp = jnp.where(pad, jnp.inf, old_logp)
    ref_logp = jnp.where(pad, jnp.inf, ref_logp)
    for loss_type in LOSS_TYPES:
        fn = functools.partial(
            grpo_loss,
            old_logp=old_logp,
            ref_logp=ref_logp,
            advantages=adv,
            mask=mask,
            beta=0.1,
            loss_type=loss_type,
        )
        (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(logp)
        assert np.isfinite(loss) and all(np.isfinite(v) for v in metrics.values())
        assert np.all(np.isfinite(grad))
        want, _ = np_grpo_loss(*_positional(b), beta=0.1, loss_type=loss_type)
        np.testing.assert_allclose(loss, want, rtol=RTOL, atol=ATOL)


# ------------------------------------------------------------------------------------ KL term


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_kl_zero_when_policy_equals_reference(loss_type):
    b = random_batch(7)
    logp, old_logp, _, adv, mask = (jnp.asarray(x, jnp.float32) for x in _positional(b))
    loss, metrics = grpo_loss(logp, old_logp, logp, adv, mask, beta=0.3, loss_type=loss_type)
    loss0, _ = grpo_loss(logp, old_logp, None, adv, mask, loss_type=loss_type)
    assert metrics["kl"] == 0.0
    np.testing.assert_allclose(loss, loss0, rtol=RTOL, atol=ATOL)


def test_k3_is_nonnegative_per_token():
    rng = np.random.default_rng(8)
    n, t = 5, 9
    logp = jnp.asarray(-rng.exponential(2.0, (n, t)), jnp.float32)
    ref_logp = jnp.asarray(-rng.exponential(2.0, (n, t)), jnp.float32)
    adv = jnp.zeros((n,))
    onehots = jnp.eye(n * t).reshape(n * t, n, t)  # one valid token per mask
    per_token_kl = jax.vmap(lambda m: grpo_loss(logp, logp, ref_logp, adv, m, beta=1.0)[1]["kl"])(
        onehots
    )
    assert np.all(per_token_kl >= 0.0)
    d = np.asarray(ref_logp - logp, np.float64).reshape(-1)
    np.testing.assert_allclose(per_token_kl, np.exp(d) - d - 1, rtol=1e-4, atol=1e-6)


def test_traced_beta_with_reference():
    b = random_batch(9)
    args = tuple(jnp.asarray(x, jnp.float32) for x in _positional(b))
    fn = jax.jit(lambda beta: grpo_loss(*args, beta=beta)[0])
    want, _ = np_grpo_loss(*_positional(b), beta=0.2)
    np.testing.assert_allclose(fn(0.2), want, rtol=RTOL, atol=ATOL)


# ------------------------------------------------------------------------------- token_weights


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_token_weights_equal_to_mask_is_a_no_op(loss_type):
    b = random_batch(10)
    args = tuple(jnp.asarray(x, jnp.float32) for x in _positional(b))
    mask = args[-1]
    kw = dict(beta=0.1, loss_type=loss_type)
    loss, metrics = grpo_loss(*args, **kw)
    loss_w, metrics_w = grpo_loss(*args, token_weights=mask, **kw)
    np.testing.assert_allclose(loss_w, loss, rtol=RTOL, atol=ATOL)
    for k in metrics:
        np.testing.assert_allclose(metrics_w[k], metrics[k], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_zero_token_weights_remove_tokens_from_pg_term_only(loss_type):
    b = random_batch(11)
    logp, old_logp, ref_logp, adv, mask = (jnp.asarray(x, jnp.float32) for x in _positional(b))
    keep = jnp.asarray(np.random.default_rng(11).random(mask.shape) < 0.5, jnp.float32)
    keep = keep.at[2].set(0.0)  # a row whose pg term is removed entirely
    kw = dict(loss_type=loss_type)
    # beta = 0: weighting by `keep` equals masking those tokens out.
    loss_w, m_w = grpo_loss(logp, old_logp, None, adv, mask, token_weights=keep, **kw)
    loss_cut, _ = grpo_loss(logp, old_logp, None, adv, mask * keep, **kw)
    np.testing.assert_allclose(loss_w, loss_cut, rtol=RTOL, atol=ATOL)
    # beta > 0: the pg term loses the tokens, the KL term keeps the full mask.
    loss_w, m_w = grpo_loss(logp, old_logp, ref_logp, adv, mask, beta=0.2, token_weights=keep, **kw)
    loss_full, m_full = grpo_loss(logp, old_logp, ref_logp, adv, mask, beta=0.2, **kw)
    np.testing.assert_allclose(m_w["pg_loss"], loss_cut, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(
        loss_w - m_w["pg_loss"], loss_full - m_full["pg_loss"], rtol=RTOL, atol=ATOL
    )
    for k in ("kl", "ratio", "clip_frac"):
        np.testing.assert_allclose(m_w[k], m_full[k], rtol=RTOL, atol=ATOL)
    # And no gradient flows to logp through the pg term of removed tokens.
    grad = jax.grad(
        lambda lp: grpo_loss(lp, old_logp, None, adv, mask, token_weights=keep, **kw)[0]
    )(logp)
    np.testing.assert_array_equal(np.asarray(grad)[np.asarray(keep) == 0], 0.0)


# ---------------------------------------------------------------------------------------- errors


def test_errors_name_the_argument():
    logp, old_logp, adv, mask = hand_batch()
    with pytest.raises(ValueError, match=r"rewards.*\(4,\)"):
        group_advantages(jnp.zeros(4))
    with pytest.raises(ValueError, match=r"rewards.*\(3, 1\)"):
        group_advantages(jnp.zeros((3, 1)))
    with pytest.raises(ValueError, match="scale.*'bogus'.*'group'"):
        group_advantages(jnp.zeros((2, 4)), scale="bogus")
    with pytest.raises(ValueError, match="loss_type.*'ppo'.*'dr_grpo'"):
        grpo_loss(logp, old_logp, None, adv, mask, loss_type="ppo")
    with pytest.raises(ValueError, match="beta.*ref_logp"):
        grpo_loss(logp, old_logp, None, adv, mask, beta=0.1)
    with pytest.raises(ValueError, match="beta.*ref_logp"):
        jax.jit(lambda beta: grpo_loss(logp, old_logp, None, adv, mask, beta=beta))(0.0)
    with pytest.raises(ValueError, match=r"logp.*\(4,\)"):
        grpo_loss(logp.reshape(-1), old_logp, None, adv, mask)
    with pytest.raises(ValueError, match=r"advantages.*rank 1"):
        grpo_loss(logp, old_logp, None, adv[:, None], mask)
    with pytest.raises(ValueError, match=r"advantages.*\(2,\)"):
        grpo_loss(logp, old_logp, None, adv[:1], mask)
    with pytest.raises(ValueError, match="old_logp"):
        grpo_loss(logp, old_logp[:, :1], None, adv, mask)
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(logp, old_logp, old_logp.T[:1], adv, mask, beta=0.1)
    with pytest.raises(ValueError, match="mask"):
        grpo_loss(logp, old_logp, None, adv, mask[0])
    with pytest.raises(ValueError, match="token_weights"):
        grpo_loss(logp, old_logp, None, adv, mask, token_weights=mask[:1])
    with pytest.raises(ValueError, match="logits"):
        token_entropy(jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match="targets"):
        token_logprobs(jnp.zeros((2, 3, 5)), jnp.zeros((2, 4), jnp.int32))


# ---------------------------------------------------------------------------- per-token helpers


def np_log_softmax(logits):
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


@TRANSFORMS
def test_token_logprobs_matches_numpy(transform):
    rng = np.random.default_rng(12)
    logits = 30.0 * rng.standard_normal((3, 4, 11))  # large logits: needs a stable softmax
    logits[0, 0] += 1000.0
    targets = rng.integers(0, 11, (3, 4))
    got = transform(token_logprobs)(jnp.asarray(logits, jnp.float32), jnp.asarray(targets))
    want = np.take_along_axis(np_log_softmax(logits), targets[..., None], -1)[..., 0]
    assert got.shape == (3, 4)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_token_logprobs_upcasts_bfloat16():
    logits = jnp.zeros((1, 2, 4), jnp.bfloat16)
    got = token_logprobs(logits, jnp.zeros((1, 2), jnp.int32))
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, np.full((1, 2), -math.log(4)), rtol=1e-6)


@TRANSFORMS
def test_token_entropy_matches_numpy(transform):
    rng = np.random.default_rng(13)
    logits = 5.0 * rng.standard_normal((3, 4, 11))
    got = transform(token_entropy)(jnp.asarray(logits, jnp.float32))
    logp = np_log_softmax(logits)
    want = -(np.exp(logp) * logp).sum(-1)
    assert got.shape == (3, 4)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # Uniform over V tokens: log V.
    np.testing.assert_allclose(token_entropy(jnp.zeros((1, 1, 8))), [[math.log(8)]], rtol=1e-6)


def test_token_entropy_with_masked_vocabulary_is_finite():
    logits = jnp.array([[[0.0, 0.0, -jnp.inf, 1.0]]])
    ent, grad = jax.value_and_grad(lambda x: token_entropy(x).sum())(logits)
    want = token_entropy(jnp.array([[[0.0, 0.0, 1.0]]]))
    np.testing.assert_allclose(ent, want[0, 0], rtol=1e-6)
    assert np.all(np.isfinite(grad))


@TRANSFORMS
def test_masked_mean(transform):
    rng = np.random.default_rng(14)
    x = rng.standard_normal((4, 5))
    mask = (rng.random((4, 5)) < 0.5).astype(np.float64)
    mask[2] = 0.0
    fn = transform(masked_mean)
    np.testing.assert_allclose(
        fn(jnp.asarray(x, jnp.float32), jnp.asarray(mask)), (x * mask).sum() / mask.sum(), rtol=1e-5
    )
    per_row = transform(functools.partial(masked_mean, axis=-1))(
        jnp.asarray(x, jnp.float32), jnp.asarray(mask, bool)
    )
    want = [(x[i] * mask[i]).sum() / max(mask[i].sum(), 1) for i in range(4)]
    np.testing.assert_allclose(per_row, want, rtol=1e-5, atol=1e-7)
    assert per_row[2] == 0.0
    assert fn(jnp.ones(3), jnp.zeros(3)) == 0.0
    grad = jax.grad(lambda v: masked_mean(v, jnp.zeros(3)))(jnp.ones(3))
    np.testing.assert_array_equal(grad, 0.0)

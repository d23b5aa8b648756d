"""GRPO's objective (losses.objective.grpo_objective) against an independent numpy recomputation.

The numpy side is written from the papers, not from the library: log-softmax and entropy of
random logits, the token ratio r = exp(logp - old), the clipped surrogate
-min(r A, clip(r, 1 - eps, 1 + eps_high) A) (DeepSeekMath arXiv 2402.03300; DAPO's clip-higher,
arXiv 2503.14476), Schulman's k3 KL exp(ref - logp) - (ref - logp) - 1, the token mean over the
batch ("dapo") or the per-sequence mean then the mean ("grpo"), and the naive entropy bonus
-coef * mean H. This is the default trainer's loss (policy_loss "grpo", loss_type "dapo").
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.losses import (
    REGULARIZERS,
    ObjectiveBatch,
    ObjectiveHParams,
    TokenStats,
    grpo_objective,
    register_regularizer,
)

RTOL, ATOL = 1e-5, 1e-6
HP = ObjectiveHParams(policy_loss="grpo", clip_eps=0.2, clip_eps_high=0.28, beta=0.05,
                      loss_type="dapo", entropy_reg="naive", entropy_coef=0.03)


def case(seed=0, b=6, n=7, v=11):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(b, n, v)) * 1.5
    targets = rng.integers(0, v, size=(b, n))
    lengths = rng.integers(1, n + 1, size=b)
    lengths[0] = n
    mask = (np.arange(n)[None] < lengths[:, None]).astype(np.float64)
    z = logits - logits.max(-1, keepdims=True)
    logsm = z - np.log(np.exp(z).sum(-1, keepdims=True))
    logp = np.take_along_axis(logsm, targets[..., None], -1)[..., 0]
    entropy = -(np.exp(logsm) * logsm).sum(-1)
    old = logp + rng.normal(size=(b, n)) * 0.3  # ratios on both sides of the clip range
    ref = logp + rng.normal(size=(b, n)) * 0.2
    adv = rng.normal(size=b)
    return dict(logits=logits, logp=logp, entropy=entropy, old=old, ref=ref, adv=adv, mask=mask)


def f32(x):
    return jnp.asarray(x, jnp.float32)


def run(c, hp=HP, *, stats="full", **batch):
    if stats == "full":
        token_stats = TokenStats(f32(c["logp"]), f32(c["entropy"]), logits=f32(c["logits"]))
    else:  # chunked: per-token statistics only
        token_stats = TokenStats(f32(c["logp"]), f32(c["entropy"]))
    obj = ObjectiveBatch(f32(c["mask"]), f32(c["old"]), f32(c["ref"]), f32(c["adv"]), **batch)
    return jax.jit(lambda s, o: grpo_objective(s, o, hp))(token_stats, obj)


def np_aggregate(x, m, loss_type):
    if loss_type == "dapo":
        return (x * m).sum() / m.sum()
    assert loss_type == "grpo"
    return np.mean((x * m).sum(1) / m.sum(1))


def np_objective(c, *, eps=0.2, eps_high=0.28, beta=0.05, coef=0.03, loss_type="dapo",
                 weights=None, pg_factor=None):
    logp, old, ref, adv, m = c["logp"], c["old"], c["ref"], c["adv"][:, None], c["mask"]
    r = np.exp(logp - old)
    pg = -np.minimum(r * adv, np.clip(r, 1 - eps, 1 + eps_high) * adv)
    if pg_factor is not None:
        pg = pg * pg_factor
    kl = np.exp(ref - logp) - (ref - logp) - 1
    pg_mask = m if weights is None else m * weights
    pg_loss = np_aggregate(pg, pg_mask, loss_type)
    bonus = -coef * (c["entropy"] * m).sum() / m.sum()
    loss = pg_loss + beta * np_aggregate(kl, m, loss_type) + bonus
    clipped = ((r < 1 - eps) & (adv < 0)) | ((r > 1 + eps_high) & (adv > 0))
    metrics = {"pg_loss": pg_loss, "kl": (kl * m).sum() / m.sum(),
               "ratio": (r * m).sum() / m.sum(), "clip_frac": (clipped * m).sum() / m.sum(),
               "entropy": (c["entropy"] * m).sum() / m.sum(), "entropy_reg": bonus}
    return loss, metrics


@pytest.mark.parametrize("stats", ["full", "chunked"])
@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_default_objective_matches_numpy(stats, loss_type):
    c = case(0)
    loss, metrics = run(c, dataclasses.replace(HP, loss_type=loss_type), stats=stats)
    want, want_metrics = np_objective(c, loss_type=loss_type)
    np.testing.assert_allclose(loss, want, rtol=RTOL, atol=ATOL)
    assert set(metrics) == set(want_metrics)
    for k, v in want_metrics.items():
        np.testing.assert_allclose(metrics[k], v, rtol=RTOL, atol=ATOL, err_msg=k)
    assert 0 < float(metrics["clip_frac"]) < 1  # both branches of the surrogate are exercised
    # the two aggregations differ on ragged lengths: the test can tell them apart
    other = np_objective(c, loss_type="grpo" if loss_type == "dapo" else "dapo")[0]
    assert abs(other - want) > 1e-3


def test_gradient_wrt_logp_matches_numpy():
    # d/dlogp of the pg term: -r A / sum(m) where the unclipped branch is the minimum, else 0;
    # of beta * k3: beta (1 - exp(ref - logp)) / sum(m). (The naive bonus acts on the entropy.)
    c = case(1)
    m, adv = c["mask"], c["adv"][:, None]

    def loss(logp):
        s = TokenStats(logp, f32(c["entropy"]))
        o = ObjectiveBatch(f32(m), f32(c["old"]), f32(c["ref"]), f32(c["adv"]))
        return grpo_objective(s, o, HP)[0]

    grad = jax.grad(loss)(f32(c["logp"]))
    r = np.exp(c["logp"] - c["old"])
    active = r * adv <= np.clip(r, 0.8, 1.28) * adv
    want = (np.where(active, -r * adv, 0.0) + 0.05 * (1 - np.exp(c["ref"] - c["logp"])))
    want = want * m / m.sum()
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-7)
    assert (~active & (m > 0)).any() and (active & (m > 0)).any()


def test_token_weights_weigh_the_pg_term_only():
    c = case(2)
    w = np.random.default_rng(3).uniform(0.0, 2.0, size=c["mask"].shape)
    w[:, 0] = 0.0  # some tokens dropped from the pg term
    loss, metrics = run(c, token_weights=f32(w))
    want, want_metrics = np_objective(c, weights=w)
    np.testing.assert_allclose(loss, want, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(metrics["pg_loss"], want_metrics["pg_loss"], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(metrics["kl"], want_metrics["kl"], rtol=RTOL)  # unweighted
    unweighted, _ = run(c)
    assert abs(float(loss) - float(unweighted)) > 1e-4
    ones, _ = run(c, token_weights=f32(np.ones_like(w)))
    np.testing.assert_allclose(ones, unweighted, rtol=1e-7)


def test_high_entropy_mask_and_tis_weights_match_numpy():
    # The 80/20 mask keeps the tokens at or above the entropy quantile (numpy's linear one);
    # TIS weighs each pg term by min(exp(old - sampler), cap), outside the normaliser.
    c = case(4)
    sampler = c["old"] + np.random.default_rng(5).normal(size=c["old"].shape) * 0.5
    hp = dataclasses.replace(HP, high_entropy_quantile=0.6, tis_cap=1.5)
    loss, metrics = run(c, hp, sampler_logp=f32(sampler))
    m = c["mask"]
    threshold = np.quantile(c["entropy"][m > 0], 0.6)
    keep = (c["entropy"] >= threshold) & (m > 0)
    u = np.minimum(np.exp(c["old"] - sampler), 1.5)
    want, want_metrics = np_objective(c, pg_factor=keep * u)
    np.testing.assert_allclose(loss, want, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(metrics["pg_token_frac"], keep.sum() / m.sum(), rtol=RTOL)
    np.testing.assert_allclose(metrics["tis_weight"], (u * m).sum() / m.sum(), rtol=RTOL)
    np.testing.assert_allclose(metrics["tis_capped_frac"],
                               ((np.exp(c["old"] - sampler) > 1.5) * m).sum() / m.sum(),
                               rtol=RTOL)
    assert 0 < float(metrics["tis_capped_frac"]) < 1 and 0 < float(metrics["pg_token_frac"]) < 1


def test_micro_batches_of_a_sequence_mean_sum_to_the_batch_token_means():
    # loss_type "grpo" in k = 2 micro-batches (weighted 1/2 each): the naive bonus and the token
    # means, rescaled by the micro-batch's token share, average to the whole batch's.
    c = case(6)
    hp = dataclasses.replace(HP, loss_type="grpo")
    _, whole = run(c, hp)
    n_tokens = f32(c["mask"].sum())
    parts = []
    for rows in (slice(0, 3), slice(3, 6)):
        part = {k: v[rows] for k, v in c.items()}
        parts.append(run(part, dataclasses.replace(hp, micro_batches=2), n_tokens=n_tokens)[1])
    assert c["mask"][:3].sum() != c["mask"][3:].sum()  # unequal shares
    for k in ("entropy_reg", "entropy", "kl", "ratio", "clip_frac"):
        np.testing.assert_allclose((parts[0][k] + parts[1][k]) / 2, whole[k], rtol=RTOL,
                                   atol=ATOL, err_msg=k)


def test_siren_needs_its_top_p_entropy_and_works_from_either_statistics():
    c = case(7)
    hp = dataclasses.replace(HP, entropy_reg="siren", siren_top_p=0.8, siren_quantile=0.5)
    full_loss, full = run(c, hp, anchor=f32(0.7))
    with pytest.raises(ValueError, match="needs top_p_entropy"):
        run(c, hp, stats="chunked", anchor=f32(0.7))
    from jaxrl_suite.losses.siren import top_p_entropy

    h_p = top_p_entropy(f32(c["logits"]), p=0.8)
    s = TokenStats(f32(c["logp"]), f32(c["entropy"]), top_p_entropy=h_p)
    o = ObjectiveBatch(f32(c["mask"]), f32(c["old"]), f32(c["ref"]), f32(c["adv"]),
                       anchor=f32(0.7))
    loss, metrics = grpo_objective(s, o, hp)
    np.testing.assert_allclose(loss, full_loss, rtol=RTOL, atol=ATOL)
    assert set(metrics) == set(full) >= {"siren_entropy", "masked_fraction", "anchor"}
    for k in full:
        np.testing.assert_allclose(metrics[k], full[k], rtol=RTOL, atol=ATOL, err_msg=k)


def test_a_new_regulariser_is_one_function_and_one_registry_line():
    c = case(8)

    @register_regularizer("square_entropy", needs=("entropy",))
    def square_entropy(stats, mask, *, coef, top_p, quantile, anchor):
        pen = coef * jnp.sum(stats["entropy"] ** 2 * mask) / jnp.sum(mask)
        return pen, {"entropy_reg": pen}

    try:
        hp = dataclasses.replace(HP, entropy_reg="square_entropy")
        loss, metrics = run(c, hp, stats="chunked")
        m = c["mask"]
        pen = 0.03 * (c["entropy"] ** 2 * m).sum() / m.sum()
        want = np_objective(c, coef=0.0)[0] + pen
        np.testing.assert_allclose(loss, want, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(metrics["entropy_reg"], pen, rtol=RTOL)
        np.testing.assert_allclose(run(c, hp)[0], loss, rtol=RTOL, atol=ATOL)  # from logits
    finally:
        REGULARIZERS.unregister("square_entropy")


def test_without_entropies_the_objective_is_the_policy_loss():
    # A diffusion LM's log-prob estimates: no softmax, so no entropy term and no metric of it;
    # old_logp None is the current estimate, detached (ratio 1).
    c = case(9)
    s = TokenStats(f32(c["logp"]))
    o = ObjectiveBatch(f32(c["mask"]), None, f32(c["ref"]), f32(c["adv"]))
    hp = dataclasses.replace(HP, entropy_reg="none")
    loss, metrics = grpo_objective(s, o, hp)
    want, want_metrics = np_objective(dict(c, old=c["logp"]), coef=0.0)
    np.testing.assert_allclose(loss, want, rtol=RTOL, atol=ATOL)
    assert set(metrics) == {"pg_loss", "kl", "ratio", "clip_frac"}
    np.testing.assert_allclose(metrics["ratio"], 1.0, rtol=1e-6)
    with pytest.raises(ValueError, match="need the token entropies"):
        grpo_objective(s, o, HP)  # naive

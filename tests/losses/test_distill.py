"""losses.distill: the forward-KL distillation loss and ReSpec reward weights vs numpy loops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.losses import kd_loss, reward_weights


def np_kd(student, teacher, mask, weights, temperature):
    """float64 loops: (weighted token-mean KL(p_t || q_s), unweighted mean, mean sum min(p, q))."""
    b, n, _ = student.shape
    weights = np.ones(b) if weights is None else weights
    num = den = kl_sum = acc_sum = count = 0.0
    for i in range(b):
        for j in range(n):
            s = student[i, j].astype(np.float64) / temperature
            t = teacher[i, j].astype(np.float64) / temperature
            log_q = s - np.log(np.sum(np.exp(s - s.max()))) - s.max()
            log_p = t - np.log(np.sum(np.exp(t - t.max()))) - t.max()
            p = np.exp(log_p)
            kl = sum(p[v] * (log_p[v] - log_q[v]) for v in range(len(p)) if p[v] > 0)
            num += weights[i] * mask[i, j] * kl
            den += weights[i] * mask[i, j]
            kl_sum += mask[i, j] * kl
            acc_sum += mask[i, j] * np.minimum(p, np.exp(log_q)).sum()
            count += mask[i, j]
    return num / den, kl_sum / count, acc_sum / count


def np_reward_weights(rewards, tau, eps=1e-4):
    rewards = np.asarray(rewards, np.float64)
    out = []
    for row in rewards:
        adv = (row - row.mean()) / (np.std(row, ddof=1) + eps)
        e = np.exp(adv / tau - np.max(adv / tau))
        out.extend(len(row) * e / e.sum())
    return np.asarray(out)


def _case(seed=0, b=3, n=5, v=7):
    rng = np.random.default_rng(seed)
    student = rng.normal(size=(b, n, v)).astype(np.float32) * 2
    teacher = rng.normal(size=(b, n, v)).astype(np.float32) * 2
    mask = (rng.random((b, n)) < 0.7).astype(np.float32)
    mask[:, 0] = 1.0
    return student, teacher, mask


@pytest.mark.parametrize("weighted, temperature", [(False, 1.0), (True, 1.0), (True, 0.7)])
@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_kd_loss_matches_numpy_loop(weighted, temperature, transform):
    student, teacher, mask = _case()
    weights = np.array([0.5, 2.0, 1.25], np.float32) if weighted else None
    fn = transform(lambda s, t, m, w: kd_loss(s, t, m, w, temperature))
    loss, metrics = fn(student, teacher, mask, weights)
    ref_loss, ref_kl, ref_acc = np_kd(student, teacher, mask, weights, temperature)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["kd_loss"], ref_loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["kd_kl"], ref_kl, rtol=1e-5)
    np.testing.assert_allclose(metrics["kd_acceptance"], ref_acc, rtol=1e-5)
    assert float(loss) > 0 and 0 < float(metrics["kd_acceptance"]) < 1


def test_kd_loss_identical_logits_is_zero_and_masked_tokens_do_not_count():
    student, _, mask = _case(1)
    loss, metrics = kd_loss(student, student, mask)
    assert abs(float(loss)) < 1e-6 and abs(float(metrics["kd_acceptance"]) - 1) < 1e-5
    # Garbage off the mask changes nothing; an all-zero mask gives 0, not NaN.
    other = np.where(mask[..., None] > 0, student, 100.0 * np.sign(student))
    np.testing.assert_allclose(kd_loss(other, student, mask)[0], 0.0, atol=1e-6)
    assert float(kd_loss(student, student + 1.0, np.zeros_like(mask))[0]) == 0.0


def test_kd_loss_teacher_with_masked_vocab_is_finite():
    student, teacher, mask = _case(2)
    teacher[..., :3] = -np.inf  # a top-k filtered teacher: p = 0 there (0 log 0 = 0)
    loss, grads = jax.value_and_grad(lambda s: kd_loss(s, teacher, mask)[0])(student)
    ref, _, _ = np_kd(student, np.where(np.isinf(teacher), -1e30, teacher), mask, None, 1.0)
    np.testing.assert_allclose(loss, ref, rtol=1e-5)
    assert np.all(np.isfinite(grads))


def test_kd_gradient_flows_only_to_the_student():
    student, teacher, mask = _case(3)
    gs, gt = jax.grad(lambda s, t: kd_loss(s, t, mask)[0], argnums=(0, 1))(student, teacher)
    assert np.abs(np.asarray(gs)).sum() > 0
    np.testing.assert_array_equal(gt, 0.0)
    # d loss / d student = (q - p) / T * mask / count (the usual KD gradient)
    t = 0.5
    gs = jax.grad(lambda s: kd_loss(s, teacher, mask, temperature=t)[0])(student)
    q = jax.nn.softmax(student / t, -1)
    p = jax.nn.softmax(teacher / t, -1)
    expected = (q - p) / t * mask[..., None] / mask.sum()
    np.testing.assert_allclose(gs, expected, atol=1e-6)


def test_kd_loss_bad_shapes_raise():
    student, teacher, mask = _case()
    with pytest.raises(ValueError, match="teacher_logits"):
        kd_loss(student, teacher[:, :-1], mask)
    with pytest.raises(ValueError, match="seq_weights"):
        kd_loss(student, teacher, mask, np.ones(5))
    with pytest.raises(ValueError, match="temperature"):
        kd_loss(student, teacher, mask, temperature=0.0)


@pytest.mark.parametrize("tau", [1.0, 0.3, 5.0])
def test_reward_weights_match_numpy_softmax(tau):
    rewards = np.array([[1.0, 0.0, 0.0, 0.5], [0.2, 0.9, 0.9, 0.1], [0.0, 0.0, 1.0, 1.0]],
                       np.float32)
    w = np.asarray(reward_weights(rewards, tau))
    np.testing.assert_allclose(w, np_reward_weights(rewards, tau), rtol=1e-5)
    assert w.shape == (12,)
    np.testing.assert_allclose(w.reshape(3, 4).sum(1), 4.0, rtol=1e-5)  # mean 1 per group
    assert w[0] > w[3] > w[1]  # higher reward, larger weight
    np.testing.assert_allclose(jax.jit(reward_weights)(rewards, tau), w, rtol=1e-6)


def test_reward_weights_of_equal_rewards_are_one():
    rewards = np.array([[0.3, 0.3, 0.3], [1.0, 1.0, 1.0]], np.float32)
    np.testing.assert_allclose(reward_weights(rewards), np.ones(6), rtol=1e-6)
    # a weighted loss with all-one weights is the unweighted loss
    student, teacher, mask = _case(4, b=6)
    np.testing.assert_allclose(kd_loss(student, teacher, mask, reward_weights(rewards))[0],
                               kd_loss(student, teacher, mask)[0], rtol=1e-6)


def test_reward_weights_bad_inputs_raise():
    with pytest.raises(ValueError, match="tau"):
        reward_weights(jnp.ones((2, 3)), tau=0.0)
    with pytest.raises(ValueError, match="rewards"):
        reward_weights(jnp.ones((6,)))

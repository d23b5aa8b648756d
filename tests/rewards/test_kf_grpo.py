"""KF-GRPO's reward (rewards/kf_grpo.py) against a loop over prompts written from the equation,
Video-R1's T-GRPO rule as its special case worked by hand, and under jit."""

import jax
import numpy as np
import pytest

from jaxrl_suite.rewards.kf_grpo import T_GRPO, contrast_gate, kf_grpo_rewards


def loop_rewards(r, c, views, m, bonus, ratio, margin):
    out = np.array(r, np.float64)
    for b in range(len(r)):
        p = np.mean(c[b])
        q = max(np.mean(v[b]) for v in views)
        if p >= ratio * q + margin:
            out[b] += bonus * m[b] * np.asarray(c[b])
    return out


@pytest.mark.parametrize("seed", range(4))
def test_matches_a_loop_over_prompts(seed):
    rng = np.random.default_rng(seed)
    c = (rng.random((6, 8)) < 0.5).astype(np.float32)
    r = c + 0.5 * rng.random((6, 8))
    views = [(rng.random((6, 4)) < 0.4).astype(np.float32) for _ in range(2)]
    m = rng.random(6)
    got = kf_grpo_rewards(r, c, views, m, bonus=0.3, ratio=1.0, margin=0.125)
    np.testing.assert_allclose(got, loop_rewards(r, c, views, m, 0.3, 1.0, 0.125), atol=1e-6)
    jitted = jax.jit(lambda r, c, v, m: kf_grpo_rewards(r, c, v, m))(r, c, views, m)
    np.testing.assert_allclose(jitted, got, atol=1e-6)


def test_t_grpo_by_hand():
    # prompt 0: ordered 3/4 right, shuffled 1/2: 0.75 >= 0.8 * 0.5 -> +0.3 on the right ones;
    # prompt 1: ordered 1/4, shuffled 2/2: 0.25 < 0.8 -> no bonus
    c = np.array([[1, 1, 0, 1], [0, 0, 1, 0]], np.float32)
    shuffled = np.array([[1, 0], [1, 1]], np.float32)
    got = kf_grpo_rewards(c, c, [shuffled], 1.0, **T_GRPO)
    np.testing.assert_allclose(got, [[1.3, 1.3, 0, 1.3], [0, 0, 1, 0]], atol=1e-6)
    np.testing.assert_array_equal(contrast_gate(c, [shuffled], ratio=0.8, margin=0.0), [1, 0])


def test_saliency_scales_and_the_best_view_gates():
    c = np.array([[1, 1, 1, 0]], np.float32)  # p = 0.75
    low, high = np.array([[1, 0]], np.float32), np.array([[1, 1]], np.float32)
    got = kf_grpo_rewards(c, c, [low], 0.5, bonus=0.4, margin=0.125)  # 0.75 >= 0.625
    np.testing.assert_allclose(got, [[1.2, 1.2, 1.2, 0.0]], atol=1e-6)
    # the uniform view at 1.0 beats the ordered rollouts: no bonus, even with the weak view
    np.testing.assert_allclose(kf_grpo_rewards(c, c, [low, high], 1.0), c, atol=1e-6)
    with pytest.raises(ValueError, match="contrast"):
        contrast_gate(c, [])

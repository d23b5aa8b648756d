"""GAE against a numpy loop and the PPO loss against hand-computed cases."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.losses.ppo import gae, ppo_loss


def gae_numpy(rewards, values, next_values, terminated, dones, gamma, lam):
    """Direct backward loop, one batch column at a time."""
    T, N = rewards.shape
    adv = np.zeros((T, N))
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            bootstrap = gamma * (1 - terminated[t, n]) * next_values[t, n]
            delta = rewards[t, n] + bootstrap - values[t, n]
            running = delta + gamma * lam * (1 - dones[t, n]) * running
            adv[t, n] = running
    return adv, adv + values


def test_gae_matches_numpy_loop_with_terminations_and_truncations():
    rng = np.random.default_rng(0)
    T, N = 37, 5
    rewards = rng.normal(size=(T, N))
    values = rng.normal(size=(T, N))
    next_values = rng.normal(size=(T, N))
    terminated = rng.random((T, N)) < 0.1
    truncated = (rng.random((T, N)) < 0.1) & ~terminated
    dones = terminated | truncated
    ref_adv, ref_ret = gae_numpy(rewards, values, next_values, terminated, dones, 0.97, 0.9)
    adv, ret = jax.jit(gae)(
        *(jnp.asarray(x, jnp.float32) for x in (rewards, values, next_values)),
        jnp.asarray(terminated), jnp.asarray(dones), 0.97, 0.9,
    )
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-4, atol=1e-4)


def test_gae_hand_computed_truncation_bootstraps_and_termination_does_not():
    # Two steps, one env. Step 0 is truncated with V(final)=10; step 1 terminates.
    r = jnp.array([[1.0], [2.0]])
    v = jnp.array([[0.5], [0.25]])
    nv = jnp.array([[10.0], [7.0]])
    term = jnp.array([[False], [True]])
    done = jnp.array([[True], [True]])
    adv, ret = gae(r, v, nv, term, done, 0.9, 0.8)
    # A_1 = 2 - 0.25 = 1.75 (no bootstrap at termination); A_0 = 1 + 0.9*10 - 0.5 = 9.5 (cut).
    np.testing.assert_allclose(adv[:, 0], [9.5, 1.75], rtol=1e-6)
    np.testing.assert_allclose(ret[:, 0], [10.0, 2.0], rtol=1e-6)


def test_gae_lambda_one_is_discounted_return_minus_value():
    r = jnp.array([1.0, 1.0, 1.0])[:, None]
    v = jnp.zeros((3, 1))
    nv = jnp.array([0.0, 0.0, 4.0])[:, None]
    z = jnp.zeros((3, 1), bool)
    adv, _ = gae(r, v, nv, z, z, 0.5, 1.0)
    # Monte Carlo with bootstrap 4 at the end: 1 + .5 + .25 + .125*4 ...
    np.testing.assert_allclose(adv[:, 0], [1 + 0.5 + 0.25 + 0.5, 1 + 0.5 + 1.0, 1 + 2.0], rtol=1e-6)


def test_gae_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="share one shape"):
        gae(jnp.zeros((3, 2)), jnp.zeros((3, 2)), jnp.zeros((3, 1)), jnp.zeros((3, 2)),
            jnp.zeros((3, 2)), 0.9, 0.9)


def test_ppo_loss_hand_computed():
    # Two samples; ratios e^{0.5} ~ 1.6487 (A=+1, clipped to 1.2) and e^{-0.5} ~ 0.6065 (A=-1,
    # clipped to 0.8: min(-0.6065, -0.8) = -0.8).
    logp = jnp.array([0.0, -1.0])
    old = jnp.array([-0.5, -0.5])
    adv = jnp.array([1.0, -1.0])
    values = jnp.array([1.0, 0.0])
    old_values = jnp.array([0.0, 0.0])
    returns = jnp.array([2.0, 1.0])
    ent = jnp.array([0.3, 0.5])
    loss, m = ppo_loss(logp, old, adv, values, old_values, returns, ent, clip_eps=0.2,
                       vf_coef=0.5, ent_coef=0.1, normalize_advantages=False)
    policy = -(1.2 * 1.0 + (-0.8)) / 2  # = -0.2
    # value: sample 0: unclipped (1-2)^2=1, clipped V=0.2 -> (0.2-2)^2=3.24 -> max 3.24;
    #        sample 1: (0-1)^2 = 1 both -> 1. L_V = 0.5 * (3.24 + 1)/2 = 1.06
    value = 0.5 * (3.24 + 1.0) / 2
    np.testing.assert_allclose(m["policy_loss"], policy, rtol=1e-6)
    np.testing.assert_allclose(m["value_loss"], value, rtol=1e-6)
    np.testing.assert_allclose(m["entropy"], 0.4, rtol=1e-6)
    np.testing.assert_allclose(loss, policy + 0.5 * value - 0.1 * 0.4, rtol=1e-6)
    r = np.exp([0.5, -0.5])
    np.testing.assert_allclose(m["approx_kl"], np.mean((r - 1) - np.array([0.5, -0.5])), rtol=1e-5)
    np.testing.assert_allclose(m["clip_frac"], 1.0)


def test_ppo_loss_without_value_clip_and_with_normalised_advantages():
    logp = jnp.zeros(4)
    adv = jnp.array([1.0, 2.0, 3.0, 4.0])
    values = jnp.array([1.0, 1.0, 1.0, 1.0])
    old_values = jnp.zeros(4)
    returns = jnp.array([3.0, 3.0, 3.0, 3.0])
    _, m = ppo_loss(logp, logp, adv, values, old_values, returns, jnp.zeros(4), clip_value=False)
    # ratio 1 -> policy loss = -mean(normalised A) = 0; value = 0.5 * (1-3)^2 = 2.
    np.testing.assert_allclose(m["policy_loss"], 0.0, atol=1e-6)
    np.testing.assert_allclose(m["value_loss"], 2.0, rtol=1e-6)


def test_ppo_loss_gradient_is_zero_outside_the_clip_region():
    adv = jnp.array([1.0])

    def f(logp):
        return ppo_loss(logp, jnp.zeros(1), adv, jnp.zeros(1), jnp.zeros(1), jnp.zeros(1),
                        jnp.zeros(1), normalize_advantages=False)[0]

    assert float(jax.grad(f)(jnp.array([0.5]))[0]) == 0.0  # ratio 1.65 > 1.2 with A > 0
    assert float(jax.grad(f)(jnp.array([0.1]))[0]) < 0.0  # inside: pushes logp up

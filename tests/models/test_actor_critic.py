"""Actor-critic network and its distributions against direct formulas."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.models.actor_critic import ActorCritic, Categorical, DiagGaussian


def test_categorical_matches_softmax_formulas():
    logits = jnp.array([[1.0, 2.0, 0.5], [0.0, 0.0, 0.0]])
    d = Categorical(logits)
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(d.log_prob(jnp.array([1, 2])), np.log([p[0, 1], p[1, 2]]), rtol=1e-6)
    np.testing.assert_allclose(d.entropy(), -(p * np.log(p)).sum(-1), rtol=1e-6)
    np.testing.assert_array_equal(d.mode(), [1, 0])
    samples = jax.vmap(lambda k: d.sample(k))(jax.random.split(jax.random.key(0), 4000))
    freq = np.bincount(np.asarray(samples[:, 0]), minlength=3) / 4000
    np.testing.assert_allclose(freq, p[0], atol=0.03)


def test_diag_gaussian_matches_normal_density():
    mean = jnp.array([[0.5, -1.0]])
    log_std = jnp.array([[0.0, math.log(2.0)]])
    d = DiagGaussian(mean, log_std)
    a = jnp.array([[1.0, 1.0]])
    ref = sum(
        -0.5 * ((x - m) / s) ** 2 - math.log(s) - 0.5 * math.log(2 * math.pi)
        for x, m, s in [(1.0, 0.5, 1.0), (1.0, -1.0, 2.0)]
    )
    np.testing.assert_allclose(d.log_prob(a), [ref], rtol=1e-6)
    ref_ent = sum(0.5 * math.log(2 * math.pi * math.e * s**2) for s in (1.0, 2.0))
    np.testing.assert_allclose(d.entropy(), [ref_ent], rtol=1e-6)
    x = jax.vmap(d.sample)(jax.random.split(jax.random.key(1), 20000))[:, 0]
    np.testing.assert_allclose(x.mean(0), [0.5, -1.0], atol=0.05)
    np.testing.assert_allclose(x.std(0), [1.0, 2.0], rtol=0.05)


def test_samples_from_noise_drawn_ahead_follow_the_distribution():
    # Categorical: Gumbel-max over noise drawn ahead is `sample` with the same key, bit for bit,
    # and its frequencies are the softmax's.
    logits = jnp.array([1.0, 2.0, 0.5])
    d = Categorical(jnp.broadcast_to(logits, (20000, 3)))
    key = jax.random.key(2)
    a = d.sample_from(Categorical.noise(key, d.logits.shape))
    np.testing.assert_array_equal(a, d.sample(key))
    p = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose(np.bincount(np.asarray(a), minlength=3) / 20000, p, atol=0.015)
    # DiagGaussian: mean + std * standard normal noise.
    g = DiagGaussian(jnp.broadcast_to(jnp.array([0.5, -1.0]), (20000, 2)),
                     jnp.broadcast_to(jnp.array([0.0, math.log(2.0)]), (20000, 2)))
    x = g.sample_from(DiagGaussian.noise(key, g.mean.shape))
    np.testing.assert_array_equal(x, g.sample(key))
    np.testing.assert_allclose(x.mean(0), [0.5, -1.0], atol=0.05)
    np.testing.assert_allclose(x.std(0), [1.0, 2.0], rtol=0.05)


def test_actor_critic_shapes_and_init_scales():
    net = ActorCritic(action_dim=3)
    params = net.init(jax.random.key(0), jnp.zeros(5))
    dist, value = net.apply(params, jnp.ones((7, 5)))
    assert dist.logits.shape == (7, 3) and value.shape == (7,)
    # Policy head initialised with gain 0.01: logits start near uniform.
    assert float(jnp.abs(dist.logits).max()) < 0.1
    cont = ActorCritic(action_dim=2, discrete=False)
    p2 = cont.init(jax.random.key(0), jnp.zeros(3))
    d2, v2 = cont.apply(p2, jnp.ones((4, 3)))
    assert d2.mean.shape == (4, 2) and d2.log_std.shape == (4, 2) and v2.shape == (4,)
    np.testing.assert_allclose(p2["params"]["log_std"], 0.0)


def test_orthogonal_init_equals_the_lapack_qr_initializer():
    """Our Gram-Schmidt initializer gives JAX's QR-based orthogonal matrix for the same key."""
    from jaxrl_suite.models.actor_critic import orthogonal

    for shape in [(4, 64), (64, 64), (64, 2), (3, 1)]:
        key = jax.random.key(3)
        ours = np.asarray(orthogonal(1.4)(key, shape))
        ref = np.asarray(jax.nn.initializers.orthogonal(1.4)(key, shape))
        np.testing.assert_allclose(ours, ref, atol=2e-6)
        q = ours / 1.4
        small = min(shape)
        gram = q.T @ q if shape[0] >= shape[1] else q @ q.T
        np.testing.assert_allclose(gram, np.eye(small), atol=2e-6)

"""The registered advantage estimators (losses.advantages) against numpy loops and hand cases.

`group` (group_advantages) has its own tests in test_grpo.py.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.losses import (
    ADVANTAGES,
    group_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)

TRANSFORMS = pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])


def rewards_batch():
    rng = np.random.default_rng(0)
    r = rng.standard_normal((5, 6))
    r[2] = 1.5  # a constant group
    r[3] = rng.integers(0, 2, 6)  # binary rewards
    r[4] += 3.0  # a prompt with a much higher mean
    return r


def np_rloo(r):
    b, g = r.shape
    out = np.zeros_like(r)
    for i in range(b):
        for j in range(g):
            out[i, j] = r[i, j] - sum(r[i, k] for k in range(g) if k != j) / (g - 1)
    return out


def np_batch_normalise(x, eps=1e-4):
    flat = x.reshape(-1)
    mean = sum(flat) / flat.size
    std = math.sqrt(sum((v - mean) ** 2 for v in flat) / (flat.size - 1))
    return (x - mean) / (std + eps)


@TRANSFORMS
def test_rloo_matches_the_leave_one_out_loop(transform):
    r = rewards_batch()
    got = transform(rloo_advantages)(jnp.asarray(r, jnp.float32))
    np.testing.assert_allclose(got, np_rloo(r), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[2], 0.0)


def test_rloo_hand_case_has_no_std_scaling():
    # [1, 0, 0, 1]: 1 - (0 + 0 + 1) / 3 = 2/3 and 0 - (0 + 1 + 1) / 3 = -2/3, i.e.
    # G / (G - 1) = 4/3 times the centred reward, whatever scale says.
    for scale in ("group", "batch", "none"):
        got = rloo_advantages(jnp.array([[1.0, 0.0, 0.0, 1.0]]), scale=scale)
        np.testing.assert_allclose(got, [[2 / 3, -2 / 3, -2 / 3, 2 / 3]], rtol=1e-6)
    np.testing.assert_allclose(rloo_advantages(jnp.array([[3.0, 1.0]])), [[2.0, -2.0]])


@TRANSFORMS
def test_reinforce_pp_normalises_over_the_batch_without_a_group_baseline(transform):
    r = rewards_batch()
    got = transform(reinforce_pp_advantages)(jnp.asarray(r, jnp.float32))
    np.testing.assert_allclose(got, np_batch_normalise(r), rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(got[4]) > 0)  # the high-mean prompt: all positive, no baseline
    assert abs(float(got[2].mean())) > 0.1  # the constant group is not zeroed


@TRANSFORMS
def test_reinforce_pp_baseline_subtracts_the_group_mean_then_normalises(transform):
    r = rewards_batch()
    got = transform(reinforce_pp_baseline_advantages)(jnp.asarray(r, jnp.float32))
    centred = r - r.mean(axis=1, keepdims=True)
    np.testing.assert_allclose(got, np_batch_normalise(centred), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[2], 0.0, atol=1e-6)
    # Not GRPO's "batch" scale: that divides by the std of the raw rewards.
    batch_scaled = group_advantages(jnp.asarray(r, jnp.float32), scale="batch")
    assert not np.allclose(got, batch_scaled, rtol=1e-2)


def test_reinforce_pp_hand_case():
    # [[1, 0], [1, 1]]: mean 3/4, ddof=1 variance (3 * 1/16 + 9/16) / 3 = 1/4, std 1/2.
    got = reinforce_pp_advantages(jnp.array([[1.0, 0.0], [1.0, 1.0]]), eps=0.0)
    np.testing.assert_allclose(got, [[0.5, -1.5], [0.5, 0.5]], rtol=1e-6)
    # With the group baseline: centred [[.5, -.5], [0, 0]], mean 0, std sqrt(0.5 / 3).
    got = reinforce_pp_baseline_advantages(jnp.array([[1.0, 0.0], [1.0, 1.0]]), eps=0.0)
    a = 0.5 / math.sqrt(0.5 / 3)
    np.testing.assert_allclose(got, [[a, -a], [0.0, 0.0]], rtol=1e-6)


def test_registry_entries_share_one_signature_and_check_their_input():
    assert ADVANTAGES.names() == ["group", "reinforce_pp", "reinforce_pp_baseline", "rloo"]
    assert ADVANTAGES.get("group") is group_advantages
    r = jnp.asarray(rewards_batch(), jnp.float32)
    outs = {}
    for name in ADVANTAGES:
        fn = ADVANTAGES.get(name)
        outs[name] = np.asarray(fn(r, scale="group", eps=1e-4))
        assert outs[name].shape == r.shape and outs[name].dtype == np.float32, name
        with pytest.raises(ValueError, match=r"rewards.*\(3, 1\)"):
            fn(jnp.zeros((3, 1)), scale="group", eps=1e-4)
        with pytest.raises(ValueError, match=r"rewards.*rank 2"):
            fn(jnp.zeros(4), scale="group", eps=1e-4)
    names = list(outs)
    for i, a in enumerate(names):  # every entry is a different estimator
        for b in names[i + 1:]:
            assert not np.allclose(outs[a], outs[b], atol=1e-3), (a, b)

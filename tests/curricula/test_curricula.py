"""Tests for jaxrl_suite.curricula: round robin, random, SPaCE and SPDRL.

References are independent of the implementation: hand-computed SPaCE sets (the value tables and
the expected picks are worked out in the comments), numpy closed forms for Gaussian KL and
log-density, and direct counting for the baselines. Jitted functions are built once per
curriculum object to keep the number of compiles small.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.core.registry import UnknownNameError
from jaxrl_suite.curricula import (
    CURRICULA,
    SPDRL,
    Curriculum,
    RandomCurriculum,
    RoundRobin,
    SPaCE,
    gaussian_kl,
    gaussian_log_pdf,
    make_curriculum,
)

KEY = jax.random.key(0)


def index_instances(n):
    """Instances whose single feature is their own index: [[0.], [1.], ..., [n-1.]]."""
    return np.arange(n, dtype=np.float32)[:, None]


def table_value_fn(table):
    """value_fn for index_instances: V(c) = table[c]."""
    return lambda c: table[c[:, 0].astype(jnp.int32)]


def members(cur, state):
    return set(np.flatnonzero(np.asarray(cur.in_set(state))).tolist())


# ----------------------------------------------------------------------------- numpy references


def np_gaussian_kl(m0, s0, m1, s1):
    m0, s0, m1, s1 = (np.asarray(x, np.float64) for x in (m0, s0, m1, s1))
    k = m0.shape[0]
    s1_inv = np.linalg.inv(s1)
    d = m1 - m0
    return 0.5 * (
        np.trace(s1_inv @ s0)
        + d @ s1_inv @ d
        - k
        + np.linalg.slogdet(s1)[1]
        - np.linalg.slogdet(s0)[1]
    )


def np_gaussian_logpdf(x, m, s):
    x, m, s = (np.asarray(v, np.float64) for v in (x, m, s))
    k = m.shape[0]
    d = x - m
    quad = np.einsum("ni,ij,nj->n", d, np.linalg.inv(s), d)
    return -0.5 * (quad + np.linalg.slogdet(s)[1] + k * np.log(2 * np.pi))


def physical_gaussian(cur, state):
    """Mean and covariance of p_nu in physical units, computed with numpy."""
    scale = np.asarray(cur.target_std, np.float64)
    chol = np.asarray(state.chol, np.float64)
    mean = np.asarray(cur.target_mean, np.float64) + scale * np.asarray(state.mean, np.float64)
    cov = np.diag(scale) @ chol @ chol.T @ np.diag(scale)
    return mean, cov


# ----------------------------------------------------------------------------- all curricula

INSTANCES = np.stack([np.linspace(0.25, 1.0, 6), np.linspace(8.0, 12.0, 6)], 1).astype(np.float32)
LOWER, UPPER = INSTANCES.min(0), INSTANCES.max(0)


def smooth_value_fn(c):
    return 5.0 - jnp.sum((c - jnp.array([0.5, 10.0])) ** 2, axis=-1)


ALL = {
    "round_robin": lambda: RoundRobin(INSTANCES, stride=2),
    "random": lambda: RandomCurriculum(INSTANCES),
    "space": lambda: SPaCE(INSTANCES, kappa=2, initial="random"),
    "spdrl": lambda: SPDRL(
        INSTANCES, lower=LOWER, upper=UPPER, num_samples=64, num_opt_steps=20, alpha_offset=0
    ),
}


@pytest.mark.parametrize("name", list(ALL))
def test_jit_vmap_fixed_shapes_and_range(name):
    cur = ALL[name]()
    assert isinstance(cur, Curriculum)
    n, seeds = 16, 3

    def run(key):
        k_init, k_sample, k_update = jax.random.split(key, 3)
        state = cur.init(k_init)
        before = cur.sample(state, k_sample, n)
        state2 = cur.update(state, k_update, smooth_value_fn)
        after = cur.sample(state2, k_sample, n)
        return state, state2, before, after, cur.metrics(state2)

    keys = jax.random.split(KEY, seeds)
    state, state2, before, after, metrics = jax.jit(jax.vmap(run))(keys)
    # the state keeps its structure, shapes and dtypes through update
    s_leaves, s2_leaves = jax.tree.leaves(state), jax.tree.leaves(state2)
    assert jax.tree.structure(state) == jax.tree.structure(state2)
    for a, b in zip(s_leaves, s2_leaves, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
    assert set(metrics) == set(cur.metrics(cur.init(KEY)))
    for v in metrics.values():
        assert v.shape == (seeds,)
        assert np.all(np.isfinite(np.asarray(v, np.float64)))
    for contexts in (before, after):
        contexts = np.asarray(contexts)
        assert contexts.shape == (seeds, n, 2) and contexts.dtype == np.float32
        flat = contexts.reshape(-1, 2)
        if name == "spdrl":
            assert np.all(flat >= LOWER) and np.all(flat <= UPPER)
        else:  # every context is one of the instances
            dist = np.abs(flat[:, None, :] - INSTANCES[None]).sum(-1).min(1)
            np.testing.assert_array_equal(dist, 0.0)


def test_make_curriculum():
    assert isinstance(make_curriculum("round_robin", INSTANCES), RoundRobin)
    assert isinstance(make_curriculum("random", INSTANCES), RandomCurriculum)
    space = make_curriculum("space", INSTANCES, kappa=3, eta=0.2)
    assert isinstance(space, SPaCE) and space.kappa == 3 and space.eta == 0.2
    assert isinstance(make_curriculum("spdrl", INSTANCES, epsilon=0.1), SPDRL)
    with pytest.raises(UnknownNameError, match="'spcae'.*random, round_robin, space, spdrl"):
        make_curriculum("spcae", INSTANCES)


def test_curricula_registry_refuses_duplicates():
    assert CURRICULA.names() == ["random", "round_robin", "space", "spdrl"]
    assert CURRICULA.get("space") is SPaCE and CURRICULA.get("spdrl") is SPDRL
    with pytest.raises(ValueError, match="already registered"):
        CURRICULA.register("space", RoundRobin)


def test_constructor_validation():
    with pytest.raises(ValueError, match="ordering"):
        SPaCE(INSTANCES, ordering="best")
    with pytest.raises(ValueError, match="kappa"):
        SPaCE(INSTANCES, kappa=0)
    with pytest.raises(ValueError, match=r"\[N, F\]"):
        RoundRobin(np.zeros(5))
    with pytest.raises(ValueError, match="target_mean"):
        SPDRL()
    with pytest.raises(ValueError, match="init_std"):
        SPDRL(INSTANCES, init_std=[1.0, 2.0, 3.0])


# ----------------------------------------------------------------------------- baselines


def test_round_robin_covers_every_instance_equally():
    n_inst, n = 5, 3
    cur = RoundRobin(index_instances(n_inst))  # stride 1
    state, counts = cur.init(KEY), np.zeros(n_inst, int)
    batches = []
    for _ in range(n_inst):  # one full cycle of the pointer
        batch = np.asarray(cur.sample(state, KEY, n))[:, 0].astype(int)
        batches.append(batch.tolist())
        counts += np.bincount(batch, minlength=n_inst)
        state = cur.update(state, KEY, None)
    np.testing.assert_array_equal(counts, n)  # every instance exactly n times
    assert batches[:2] == [[0, 1, 2], [1, 2, 3]] and batches[4] == [4, 0, 1]
    assert int(state.pointer) == 0  # back at the start

    # stride = batch size: disjoint consecutive blocks, one pass over the set every 2 updates
    cur = RoundRobin(index_instances(6), stride=3)
    state = cur.init(KEY)
    first = np.asarray(cur.sample(state, KEY, 3))[:, 0]
    state = cur.update(state, KEY, None)
    second = np.asarray(cur.sample(state, KEY, 3))[:, 0]
    np.testing.assert_array_equal(first, [0, 1, 2])
    np.testing.assert_array_equal(second, [3, 4, 5])


def test_random_covers_all_instances():
    n_inst, n = 7, 2800
    cur = RandomCurriculum(index_instances(n_inst))
    state = cur.init(KEY)
    idx = np.asarray(cur.sample(state, jax.random.key(3), n))[:, 0].astype(int)
    counts = np.bincount(idx, minlength=n_inst)
    assert counts.min() > 0.8 * n / n_inst and counts.max() < 1.2 * n / n_inst
    state = cur.update(state, KEY, None)
    assert int(cur.metrics(state)["num_updates"]) == 1


# ----------------------------------------------------------------------------- SPaCE

# Six instances c_i = i, kappa = 2, eta = 0.1, initial set {0, 1} (the first kappa instances).
# Values at the three checks (members 0, 1 first; then the non-members 2..5):
#   V1 = [10, 10, 1, 10,  2, 30]   first check: no reference, never grows; mean m1 = 10
#   V2 = [20, 20, 1, 10,  2, 30]   m2 = 20, |20 - 10| / 10 = 1.0 > eta   -> size stays 2
#   V3 = [21, 21, 3, 15,  5, 31]   m3 = 21, |21 - 20| / 20 = 0.05 <= eta -> size 2 + kappa = 4
# Scores of the non-members at the third check (V2 -> V3):
#   improvement          V3 - V2           : c2: 2,   c3: 5,   c4: 3,   c5: 1     -> add {3, 4}
#   relative_improvement (V3 - V2) / |V2|  : c2: 2.0, c3: 0.5, c4: 1.5, c5: 0.033 -> add {2, 4}
#   absolute             V3                : c2: 3,   c3: 15,  c4: 5,   c5: 31    -> add {3, 5}
SPACE_TABLES = np.array(
    [[10, 10, 1, 10, 2, 30], [20, 20, 1, 10, 2, 30], [21, 21, 3, 15, 5, 31]], np.float32
)
EXPECTED_ADDED = {"improvement": {3, 4}, "relative_improvement": {2, 4}, "absolute": {3, 5}}


def space_updater(cur):
    return jax.jit(lambda s, table: cur.update(s, KEY, table_value_fn(table)))


@pytest.mark.parametrize("ordering", list(EXPECTED_ADDED))
def test_space_growth_and_orderings(ordering):
    cur = SPaCE(index_instances(6), eta=0.1, kappa=2, ordering=ordering, rerank=False)
    update = space_updater(cur)
    state = cur.init(KEY)
    assert int(state.set_size) == 2 and members(cur, state) == {0, 1}

    sizes, means = [], []
    for table in SPACE_TABLES:
        state = update(state, jnp.asarray(table))
        sizes.append(int(cur.metrics(state)["set_size"]))
        means.append(float(cur.metrics(state)["mean_value"]))
        if len(sizes) < 3:  # mean changed by more than eta: the set must not grow or change
            assert members(cur, state) == {0, 1}
    assert sizes == [2, 2, 4]
    np.testing.assert_allclose(means, [10.0, 20.0, 21.0])
    assert members(cur, state) == {0, 1} | EXPECTED_ADDED[ordering]

    # sampling is uniform over exactly the current set
    idx = np.asarray(cur.sample(state, jax.random.key(1), 2000))[:, 0].astype(int)
    counts = np.bincount(idx, minlength=6)
    assert set(np.flatnonzero(counts).tolist()) == members(cur, state)
    assert counts[counts > 0].min() > 400

    # constant values from now on: the set keeps stagnating and grows to N, never beyond
    for _ in range(4):
        state = update(state, jnp.asarray(SPACE_TABLES[-1]))
        assert int(state.set_size) <= 6
    assert int(state.set_size) == 6 and members(cur, state) == set(range(6))


# Four instances, kappa = 1, eta = 0.1, initial set {0}, ordering "improvement":
#   V1 = [5, 1, 2,   3]  first check, m = 5, ranking by V1: [0, 3, 2, 1]
#   V2 = [6, 4, 2,   3]  m over {0} = 6, |6 - 5| / 5 = 0.2 > eta: size stays 1;
#                        improvement [1, 3, 0, 0]
#   V3 = [6, 6.3, 4.5, 3] improvement vs V2: [0, 2.3, 2.5, 0]
# rerank=True (authors' code): after V2 the whole list is re-ranked, set = top-1 = {1}
#   (instance 0 leaves); at V3 the mean over {1} is 6.3, |6.3 - 6| / 6 = 0.05 <= eta: size 2,
#   set = top-2 of [0, 2.3, 2.5, 0] = {1, 2}.
# rerank=False: the set stays {0} after V2; at V3 the mean over {0} is 6, change 0 <= eta:
#   size 2, add the best non-member (instance 2, improvement 2.5): {0, 2}.
RERANK_TABLES = np.array([[5, 1, 2, 3], [6, 4, 2, 3], [6, 6.3, 4.5, 3]], np.float32)


@pytest.mark.parametrize(
    "rerank, expected", [(True, [{0}, {1}, {1, 2}]), (False, [{0}, {0}, {0, 2}])]
)
def test_space_rerank_versus_incremental(rerank, expected):
    cur = SPaCE(index_instances(4), eta=0.1, kappa=1, rerank=rerank)
    update = space_updater(cur)
    state = cur.init(KEY)
    got = []
    for table in RERANK_TABLES:
        state = update(state, jnp.asarray(table))
        got.append(members(cur, state))
    assert got == expected
    assert int(state.set_size) == 2


def test_space_random_initial_set_and_zero_mean_guard():
    cur = SPaCE(index_instances(10), kappa=3, initial="random", rerank=False)
    sets = [members(cur, cur.init(jax.random.key(s))) for s in range(4)]
    assert all(len(s) == 3 for s in sets) and len({frozenset(s) for s in sets}) > 1

    # all-zero values: relative change 0 / max(0, tiny) = 0 -> stagnation, no NaN
    update = space_updater(cur)
    state = cur.init(KEY)
    for _ in range(2):
        state = update(state, jnp.zeros(10))
    assert int(state.set_size) == 6
    assert np.isfinite(float(cur.metrics(state)["mean_value"]))


# ----------------------------------------------------------------------------- SPDRL


def test_gaussian_kl_and_log_pdf_match_numpy():
    rng = np.random.default_rng(0)
    for f in (1, 3):
        a0, a1 = rng.normal(size=(f, f)), rng.normal(size=(f, f))
        s0, s1 = a0 @ a0.T + 0.5 * np.eye(f), a1 @ a1.T + 0.5 * np.eye(f)
        m0, m1 = rng.normal(size=f), rng.normal(size=f)
        l0, l1 = np.linalg.cholesky(s0), np.linalg.cholesky(s1)
        got = gaussian_kl(*(jnp.asarray(x, jnp.float32) for x in (m0, l0, m1, l1)))
        np.testing.assert_allclose(float(got), np_gaussian_kl(m0, s0, m1, s1), rtol=1e-4)
        assert abs(float(gaussian_kl(*(jnp.asarray(x) for x in (m0, l0, m0, l0))))) < 1e-5
        x = rng.normal(size=(5, f))
        got = gaussian_log_pdf(jnp.asarray(x), jnp.asarray(m0), jnp.asarray(l0))
        np.testing.assert_allclose(got, np_gaussian_logpdf(x, m0, s0), rtol=1e-4, atol=1e-4)


def test_spdrl_defaults_fit_target_to_instances():
    inst = np.array([[0.5, 9.8], [1.0, 9.8], [1.5, 9.8]], np.float32)  # gravity constant
    cur = SPDRL(inst)
    np.testing.assert_allclose(cur.target_mean, [1.0, 9.8], rtol=1e-6)
    # std of the first feature; the constant second feature gets the floor 1e-3 * 9.8
    np.testing.assert_allclose(cur.target_std, [np.std([0.5, 1.0, 1.5]), 9.8e-3], rtol=1e-5)
    state = cur.init(KEY)
    mean, cov = physical_gaussian(cur, state)
    np.testing.assert_allclose(mean, cur.target_mean, rtol=1e-6)
    np.testing.assert_allclose(np.sqrt(np.diag(cov)), 0.1 * np.asarray(cur.target_std), rtol=1e-5)
    # kl_to_target metric equals the numpy closed form in physical units
    kl = np_gaussian_kl(mean, cov, cur.target_mean, np.diag(np.square(cur.target_std)))
    np.testing.assert_allclose(float(cur.metrics(state)["kl_to_target"]), kl, rtol=1e-4)


def test_spdrl_moves_toward_higher_value_within_trust_region():
    eps = 0.2
    cur = SPDRL(INSTANCES, epsilon=eps, alpha_offset=1000, num_samples=256)
    update = jax.jit(lambda s, k: cur.update(s, k, lambda c: 3.0 * c[:, 0]))
    state = cur.init(KEY)
    means = [float(cur.metrics(state)["mean_0"])]
    for i in range(4):
        old = physical_gaussian(cur, state)
        state = update(state, jax.random.key(10 + i))
        new = physical_gaussian(cur, state)
        kl_step = np_gaussian_kl(*new, *old)  # KL(p_new || p_old), numpy, physical units
        assert kl_step <= eps + 1e-4
        np.testing.assert_allclose(float(state.kl_step), kl_step, rtol=1e-3, atol=1e-5)
        assert float(cur.metrics(state)["alpha"]) == 0.0
        means.append(float(cur.metrics(state)["mean_0"]))
    assert np.all(np.diff(means) > 0), means  # V increases with feature 0: the mean follows
    assert means[-1] - means[0] > 0.02


def test_spdrl_alpha_schedule_and_moves_toward_target():
    zeta, offset = 2.0, 2
    cur = SPDRL(
        INSTANCES,
        init_mean=[0.3, 8.5],
        alpha_offset=offset,
        zeta=zeta,
        num_samples=64,
        epsilon=0.25,
    )
    update = jax.jit(lambda s, k: cur.update(s, k, lambda c: jnp.full((c.shape[0],), 2.0)))
    state = cur.init(KEY)
    kls = [float(cur.metrics(state)["kl_to_target"])]
    alphas = []
    for i in range(6):
        kl_before = kls[-1]
        state = update(state, jax.random.key(i))
        m = cur.metrics(state)
        alphas.append(float(m["alpha"]))
        if i >= offset:  # alpha = zeta * mean V / KL(p_old || mu)
            np.testing.assert_allclose(alphas[-1], zeta * 2.0 / kl_before, rtol=1e-4)
        kls.append(float(m["kl_to_target"]))
        assert float(m["kl_step"]) <= 0.25 + 1e-4
    assert alphas[:offset] == [0.0] * offset and min(alphas[offset:]) > 0
    # constant values and alpha = 0: nothing to gain, the distribution stays put
    np.testing.assert_allclose(kls[: offset + 1], kls[0], rtol=1e-5)
    # alpha > 0: KL to the target decreases at every update
    assert np.all(np.diff(kls[offset:]) < 0), kls


def test_forward_substitution_matches_numpy_solve():
    from jaxrl_suite.curricula.spdrl import solve_triangular

    rng = np.random.default_rng(0)
    chol = np.tril(rng.normal(size=(3, 3))) + 3 * np.eye(3)
    b = rng.normal(size=(3, 5))
    np.testing.assert_allclose(solve_triangular(chol, b), np.linalg.solve(chol, b), rtol=1e-5)
    np.testing.assert_allclose(solve_triangular(chol, b[:, 0]), np.linalg.solve(chol, b[:, 0]),
                               rtol=1e-5)

"""ExIt buffer, learnability, rank sampling and diversity bonus against numpy and Python loops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.curricula.exit import ExItBuffer, diversity_bonus, learnability, rank_weights


def _np_learnability(r):
    r = np.asarray(r, np.float64)
    span = r.max() - r.min()
    return 0.0 if span == 0 else np.var((r - r.min()) / span)


def test_learnability_matches_numpy_and_masks():
    rng = np.random.default_rng(0)
    groups = rng.normal(size=(5, 8))
    got = np.asarray(learnability(jnp.asarray(groups)))
    np.testing.assert_allclose(got, [_np_learnability(g) for g in groups], rtol=1e-5)
    assert float(learnability(jnp.array([0.0, 1.0]))) == pytest.approx(0.25)  # the maximum
    assert float(learnability(jnp.full(4, 3.0))) == 0.0
    mask = np.array([True, True, False, True, False, True, True, True])
    assert float(learnability(jnp.asarray(groups[0]), jnp.asarray(mask))) == pytest.approx(
        _np_learnability(groups[0][mask]), rel=1e-5)


def test_rank_weights_hand_case_and_temperature():
    pr = jnp.array([0.1, 0.5, 0.3, 9.0])
    valid = jnp.array([True, True, True, False])
    h = np.array([1 / 3, 1.0, 1 / 2, 0.0])
    np.testing.assert_allclose(rank_weights(pr, valid), h / h.sum(), rtol=1e-6)
    np.testing.assert_allclose(rank_weights(pr, valid, 0.5), h**2 / (h**2).sum(), rtol=1e-6)
    np.testing.assert_array_equal(rank_weights(pr, jnp.zeros(4, bool)), np.zeros(4))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        rank_weights(pr, valid, 0.0)


def _np_insert(buf, entries):
    """The insertion rule by a Python loop over the slots."""
    for task, pr in entries:
        empty = [i for i, e in enumerate(buf["slots"]) if e is None]
        if empty:
            slot = empty[0]
        else:
            slot = min(range(len(buf["slots"])),
                       key=lambda i: (buf["slots"][i][1], buf["slots"][i][2]))
            if not pr > buf["slots"][slot][1]:
                continue
        buf["slots"][slot] = (task, pr, buf["count"])
        buf["count"] += 1


def test_insert_fills_then_evicts_the_lowest_priority_like_a_python_loop():
    buf = ExItBuffer(capacity=6, response_len=3, min_size=1)
    insert = jax.jit(buf.insert)
    state = buf.init()
    ref = {"slots": [None] * 6, "count": 0}
    rng = np.random.default_rng(1)
    for _ in range(8):  # batches of 4 new entries, some masked out, priorities with ties
        m = 4
        task = rng.integers(0, 100, m)
        pr = rng.choice([0.0, 0.1, 0.2, 0.3], m)
        mask = rng.random(m) < 0.8
        resp = rng.integers(0, 50, (m, 3))
        state = insert(state, task, np.ones(m), resp, np.full(m, 3), np.zeros(m), pr, mask)
        _np_insert(ref, [(t, p) for t, p, ok in zip(task, pr, mask, strict=True) if ok])
        got = sorted((int(t), round(float(p), 4)) for t, p, v in zip(
            state.task, state.priority, state.valid, strict=True) if v)
        want = sorted((int(s[0]), round(float(s[1]), 4)) for s in ref["slots"] if s is not None)
        assert got == want
    assert int(buf.size(state)) == 6


def test_insert_stores_tokens_and_rejects_bad_shapes():
    buf = ExItBuffer(capacity=2, response_len=3)
    s = buf.insert(buf.init(), [7], [2], [[4, 5, 6]], [2], [0.5], [0.1], [True])
    np.testing.assert_array_equal(s.response[0], [4, 5, 6])
    assert int(s.turn[0]) == 2 and int(s.response_len[0]) == 2 and float(s.score[0]) == 0.5
    assert not bool(s.valid[1])
    with pytest.raises(ValueError, match=r"response must be \[M, 3\]"):
        buf.insert(buf.init(), [7], [2], [[4, 5]], [2], [0.5], [0.1], [True])


def test_sample_respects_min_size_p_select_p_div_and_rank_weights():
    buf = ExItBuffer(capacity=8, response_len=2, p_select=0.5, p_div=0.1, min_size=4)
    s = buf.insert(buf.init(), np.arange(3), np.ones(3), np.zeros((3, 2)), np.ones(3),
                   np.zeros(3), np.array([0.3, 0.1, 0.2]), np.ones(3, bool))
    b = jax.jit(buf.sample, static_argnums=2)(s, jax.random.PRNGKey(0), 64)
    assert not bool(b.from_buffer.any())  # 3 < min_size entries
    s = buf.insert(s, [3], [1], [[0, 0]], [1], [0.0], [0.4], [True])
    n = 20000
    b = buf.sample(s, jax.random.PRNGKey(1), n)
    assert abs(float(b.from_buffer.mean()) - 0.5) < 0.02
    assert abs(float(b.divergent.mean()) - 0.1) < 0.01
    freq = np.bincount(np.asarray(b.index), minlength=8) / n
    np.testing.assert_allclose(freq, np.asarray(rank_weights(s.priority, s.valid)), atol=0.015)
    assert freq[4:].sum() == 0  # never an empty slot


def test_update_priority_touches_only_masked_slots():
    buf = ExItBuffer(capacity=4, response_len=1)
    s = buf.insert(buf.init(), np.arange(4), np.ones(4), np.zeros((4, 1)), np.ones(4),
                   np.zeros(4), np.zeros(4), np.ones(4, bool))
    s = buf.update_priority(s, jnp.array([1, 3]), jnp.array([0.7, 0.9]),
                            jnp.array([True, False]))
    np.testing.assert_allclose(s.priority, [0.0, 0.7, 0.0, 0.0])


def test_diversity_bonus_matches_numpy_and_spares_failures():
    rng = np.random.default_rng(2)
    e = rng.normal(size=(6, 4)).astype(np.float32)
    adv = np.array([1.0, -0.5, 0.3, 2.0, -1.0, 0.0], np.float32)
    d = np.linalg.norm(e - e.mean(0), axis=1)
    b = (d - d.min()) / (d.max() - d.min())
    want = np.where(adv > 0, adv * b, adv)
    got, m = diversity_bonus(jnp.asarray(e), jnp.asarray(adv))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m["bonus"], b, rtol=1e-5, atol=1e-6)
    same, _ = diversity_bonus(jnp.ones((3, 2)), jnp.array([1.0, 2.0, -1.0]))
    np.testing.assert_allclose(same, [1.0, 2.0, -1.0])  # equal distances: unchanged
    mask = np.array([True, True, True, True, False, False])
    d4 = np.linalg.norm(e[:4] - e[:4].mean(0), axis=1)
    b4 = (d4 - d4.min()) / (d4.max() - d4.min())
    got, _ = diversity_bonus(jnp.asarray(e), jnp.asarray(adv), jnp.asarray(mask))
    np.testing.assert_allclose(got[:4], np.where(adv[:4] > 0, adv[:4] * b4, adv[:4]), rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(ValueError, match="embeddings must have rank 2"):
        diversity_bonus(jnp.ones(3), jnp.ones(3))


@pytest.mark.parametrize("field, value, message", [
    ("p_select", 1.5, "p_select must be in"), ("capacity", 0, "capacity must be >= 1"),
    ("rank_temperature", 0.0, "rank_temperature must be > 0"),
])
def test_bad_buffer_config(field, value, message):
    with pytest.raises(ValueError, match=message):
        ExItBuffer(**{field: value})

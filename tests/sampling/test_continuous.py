"""ContinuousSampler (micro sampling groups, continuous batching) and the length-aware schedule:
every schedule reproduces the static sampler's completions; decode-step counts match a numpy
simulation; the predictor, the orders and the options."""

import jax
import numpy as np
import pytest
from test_kv_cache import MODEL, N, _params, _prompts

from jaxrl_suite.core.checkpoint import Checkpointer
from jaxrl_suite.sampling import ContinuousSampler, KVCacheSampler, LearningSampler
from jaxrl_suite.sampling.schedule import (
    LengthPredictor,
    LengthTable,
    decode_steps,
    prompt_ids,
    queue_order,
)

EOS = 14  # a frequent token of this model: lengths 2..12
LENGTHS = (6, 4, 1, 5, 2, 6, 3, 5, 6, 2, 4, 1)  # 12 rows: 4 prompts x G = 3 below
STATIC = KVCacheSampler(MODEL, max_new_tokens=N, eos_id=EOS, pad_id=0)


def _rollout():
    """4 prompts x 3 samples, rows prompt-major like a GRPO rollout; EOS stops some rows."""
    prompt, mask = _prompts(lengths=LENGTHS[:4])
    return np.repeat(np.asarray(prompt), 3, 0), np.repeat(np.asarray(mask), 3, 0)


# One sampler per compiled program: micro-groups of two sizes, continuous FIFO and SJF, LPT.
SAMPLERS = {
    "rounds-2": ContinuousSampler(MODEL, slots=2, refill="rounds", order="fifo",
                                  max_new_tokens=N, eos_id=EOS, pad_id=0),
    "rounds-5": ContinuousSampler(MODEL, slots=5, refill="rounds", order="fifo",
                                  max_new_tokens=N, eos_id=EOS, pad_id=0),
    "fifo-4": ContinuousSampler(MODEL, slots=4, refill="continuous", order="fifo",
                                max_new_tokens=N, eos_id=EOS, pad_id=0),
    "sjf-4": ContinuousSampler(MODEL, slots=4, refill="continuous", order="sjf",
                               max_new_tokens=N, eos_id=EOS, pad_id=0),
}


@pytest.fixture(scope="module")
def static_out():
    prompt, mask = _rollout()
    return STATIC(_params(), prompt, mask, jax.random.key(5))


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_every_schedule_gives_the_static_completions(name, static_out):
    sampler = SAMPLERS[name]
    prompt, mask = _rollout()
    ref = static_out
    lengths = np.asarray(ref.lengths)
    assert 1 < len(set(lengths.tolist())) and lengths.min() < N  # EOS spread the lengths
    for call in range(2):  # the second call orders by the lengths the first one taught
        out, stats = sampler.generate(_params(), prompt, mask, jax.random.key(5))
        np.testing.assert_array_equal(out.tokens, ref.tokens)
        np.testing.assert_array_equal(out.mask, ref.mask)
        np.testing.assert_array_equal(out.lengths, ref.lengths)
        # Same draws from logits computed in batches of another size: equal up to float rounding
        np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)
        assert stats["decode_steps"] == decode_steps(lengths, stats["queue"], sampler.slots,
                                                     sampler.refill)
        assert stats["prefills"] == len(prompt)
        if sampler.order == "sjf" and call == 1:  # the predictor ordered the queue
            assert not np.array_equal(stats["queue"], np.arange(len(prompt)))
            assert np.all(np.diff(lengths[stats["queue"]].reshape(4, 3).mean(1)) >= 0)


def test_static_matches_seq_ids_of_a_bigger_rollout(static_out):
    """The rows of a rollout sampled alone, with their ids, are the rollout's rows."""
    prompt, mask = _rollout()
    out = SAMPLERS["fifo-4"](_params(), prompt[6:], mask[6:], jax.random.key(5),
                             seq_ids=np.arange(6, 12))
    np.testing.assert_array_equal(out.tokens, np.asarray(static_out.tokens)[6:])


def test_decode_steps_reference_hand_cases():
    lengths = np.array([5, 1, 3, 9, 2, 2])
    q = np.arange(6)
    # rounds of 2 rows needing a slot: {5, (1), 3} -> 4, {9, 2} -> 8, {2} -> 1
    assert decode_steps(lengths, q, 2, "rounds") == 4 + 8 + 1
    # continuous, 2 slots: 4 | 2 (the 1 takes no slot), then 8 at t=2, 1 at t=4, 1 at t=5
    assert decode_steps(lengths, q, 2, "continuous") == 10
    assert decode_steps(lengths, q, 6, "continuous") == 8 == decode_steps(lengths, q, 6, "rounds")
    # length-sorted rounds are optimal: never more steps than FIFO rounds
    rng = np.random.default_rng(0)
    for _ in range(50):
        ls = rng.integers(1, 30, size=24)
        assert decode_steps(ls, queue_order(ls, "lpt"), 4, "rounds") <= decode_steps(
            ls, q.tolist() + list(range(6, 24)), 4, "rounds")


def test_length_predictor_ema_and_fallback():
    pred = LengthPredictor(decay=0.5, default=7.0)
    t0 = pred.init()
    np.testing.assert_array_equal(pred.predict(t0, [1, 2]), [7.0, 7.0])
    t1 = pred.update(t0, [1, 1, 2], np.array([4, 6, 10]))  # prompt 1: mean 5; prompt 2: 10
    np.testing.assert_allclose(pred.predict(t1, [1, 2, 3]), [5.0, 10.0, 20.0 / 3.0])  # 3: mean
    t2 = pred.update(t1, [1], np.array([9]))
    np.testing.assert_allclose(pred.predict(t2, [1]), [0.5 * 5.0 + 0.5 * 9.0])
    np.testing.assert_allclose(pred.predict(t1, [1]), [5.0])  # an update makes a new table
    np.testing.assert_array_equal(pred.predict(t0, [1]), [7.0])
    assert (int(t2.count), float(t2.total)) == (4, 29.0)
    np.testing.assert_array_equal(t2.ids[:3], [1, 2, -1])  # slots in first-seen order
    np.testing.assert_array_equal(queue_order(np.array([3.0, 1.0, 3.0, 2.0]), "sjf"), [1, 3, 0, 2])
    np.testing.assert_array_equal(queue_order(np.array([3.0, 1.0, 3.0, 2.0]), "lpt"), [0, 2, 3, 1])
    ids = prompt_ids(np.array([[0, 5, 6], [9, 5, 6], [5, 6, 0]]),
                     np.array([[0, 1, 1], [0, 1, 1], [1, 1, 0]], bool))
    assert ids[0] == ids[1] == ids[2]  # the id is of the real tokens only


def _dict_predictor(rollouts, decay, default):
    """The predictor as it was before its state became arrays (a dict of Python floats): its
    predictions before each rollout of `rollouts` [(ids, lengths)]."""
    ema, total, count, out = {}, 0.0, 0, []
    for ids, lengths in rollouts:
        mean_all = total / count if count else default
        out.append(np.array([ema.get(i, mean_all) for i in ids], np.float64))
        by_id = {}
        for i, n in zip(ids, np.asarray(lengths, np.float64), strict=True):
            by_id.setdefault(i, []).append(float(n))
        for i, ns in by_id.items():
            m = float(np.mean(ns))
            ema[i] = m if i not in ema else decay * ema[i] + (1.0 - decay) * m
        total += float(np.asarray(lengths, np.float64).sum())
        count += len(lengths)
    return out


def test_length_table_predicts_what_the_dict_did_and_round_trips_a_checkpoint(tmp_path):
    rng = np.random.default_rng(3)
    prompts = rng.integers(0, 2**32, size=40).tolist()  # crc32-sized ids
    rollouts = []
    for _ in range(30):  # GRPO-like: 4 prompts x 3 samples a rollout, prompts seen again
        ids = np.repeat(rng.choice(prompts, size=4, replace=False), 3).tolist()
        rollouts.append((ids, rng.integers(1, 57, size=12)))
    pred = LengthPredictor(decay=0.3, default=28.0, capacity=64)
    table, got = pred.init(), []
    for ids, lengths in rollouts:
        got.append(pred.predict(table, ids))
        table = pred.update(table, ids, lengths)
    for a, b in zip(got, _dict_predictor(rollouts, 0.3, 28.0), strict=True):
        np.testing.assert_array_equal(a, b)  # bit for bit
    ckpt = Checkpointer(tmp_path / "lengths")
    ckpt.save(1, table, force=True)
    back, _ = ckpt.restore(pred.init())
    ckpt.close()
    assert type(back) is LengthTable
    for a, b in zip(table, back, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def test_the_sampler_predicts_from_the_learning_state_it_is_given(static_out):
    sampler = SAMPLERS["sjf-4"]
    assert isinstance(sampler, LearningSampler)
    prompt, mask = _rollout()
    kept = sampler.learning_state
    try:
        sampler.learning_state = sampler.init_learning_state()  # a fresh run: N / 2 for all
        _, stats = sampler.generate(_params(), prompt, mask, jax.random.key(5))
        assert stats["predicted_length"] == N / 2
        np.testing.assert_array_equal(stats["queue"], np.arange(len(prompt)))  # all ties
        taught = sampler.learning_state
        assert int(taught.count) == len(prompt)
        lengths = np.asarray(static_out.lengths)
        assert float(taught.total) == lengths.sum()
        sampler.learning_state = taught  # e.g. restored from a checkpoint: ordered by it
        _, stats = sampler.generate(_params(), prompt, mask, jax.random.key(5))
        assert stats["predicted_length"] == pytest.approx(lengths.mean())
        assert np.all(np.diff(lengths[stats["queue"]].reshape(4, 3).mean(1)) >= 0)
    finally:
        sampler.learning_state = kept


def test_length_predictor_refuses_more_prompts_than_its_capacity():
    pred = LengthPredictor(capacity=2)
    table = pred.update(pred.init(), [5, 5, 6], np.array([1, 2, 3]))
    table = pred.update(table, [6, 5], np.array([4, 4]))  # seen prompts: fine
    with pytest.raises(ValueError, match="3 distinct prompts exceed its capacity 2"):
        pred.update(table, [7], np.array([1]))
    with pytest.raises(ValueError, match="capacity must be a positive int"):
        LengthPredictor(capacity=0)


@pytest.mark.parametrize("kwargs, error", [
    (dict(slots=0), "slots must be positive"),
    (dict(refill="eager"), "refill must be one of"),
    (dict(order="random"), "order must be one of"),
    (dict(temperature=0.0), "temperature must be positive"),
])
def test_bad_options_raise(kwargs, error):
    base = dict(slots=2, max_new_tokens=4, eos_id=1, pad_id=0)
    with pytest.raises(ValueError, match=error):
        ContinuousSampler(MODEL, **{**base, **kwargs})

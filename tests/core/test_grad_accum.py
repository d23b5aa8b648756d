"""Gradient accumulation in `make_train_step`: k micro-batches give the full-batch update.

One tiny linear "LM" (logits = x @ W, [8 rows, 5 positions, vocab 7]) with ragged masks, so a
micro-batch's token count differs from another's; SGD at lr 1 makes new params = params - grad.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl_suite.core.train import init_train_state, make_train_step, map_rows, split_rows
from jaxrl_suite.losses import grpo_loss, token_logprobs
from jaxrl_suite.losses.sft import sft_loss

B, T, D, V, K = 8, 5, 3, 7, 4


@pytest.fixture(scope="module")
def data():
    r = np.random.RandomState(0)
    lengths = np.array([5, 1, 3, 0, 2, 5, 4, 1])
    return {
        "x": jnp.asarray(r.randn(B, T, D), jnp.float32),
        "y": jnp.asarray(r.randint(0, V, (B, T)), jnp.int32),
        "mask": jnp.asarray(np.arange(T) < lengths[:, None], jnp.float32),
        "old": jnp.asarray(-2.0 + 0.3 * r.randn(B, T), jnp.float32),
        "ref": jnp.asarray(-2.0 + 0.3 * r.randn(B, T), jnp.float32),
        "adv": jnp.asarray(r.randn(B), jnp.float32),
        "scale": jnp.float32(1.5),  # a non-row leaf, passed whole to every micro-batch
    }


def logp(params, b):
    return token_logprobs(jnp.einsum("btd,dv->btv", b["x"], params["w"]) * b["scale"], b["y"])


def sft(params, b):
    return sft_loss(logp(params, b), b["mask"])


def policy(loss_type, beta):
    def loss_fn(params, b):
        return grpo_loss(logp(params, b), b["old"], b["ref"], b["adv"], b["mask"],
                         loss_type=loss_type, beta=beta, clip_eps=0.1)
    return loss_fn


def tokens(b):
    return jnp.sum(b["mask"])


def run(loss_fn, data, k, weight_fn=None, sum_metrics=()):
    params = {"w": jnp.asarray(np.random.RandomState(1).randn(D, V), jnp.float32)}
    tx = optax.sgd(1.0)
    step = make_train_step(loss_fn, tx, micro_batches=k, weight_fn=weight_fn,
                           sum_metrics=sum_metrics)
    return jax.jit(step)(init_train_state(params, tx, jax.random.PRNGKey(0)), data)


CASES = {  # name: (loss_fn, weight_fn)
    "sft": (sft, tokens),
    "grpo": (policy("grpo", 0.0), None),
    "grpo_kl": (policy("grpo", 0.3), None),
    "dr_grpo_kl": (policy("dr_grpo", 0.3), None),
    "dapo_kl": (policy("dapo", 0.3), tokens),
}


@pytest.mark.parametrize("name", list(CASES))
def test_accumulated_update_equals_the_full_batch_one(data, name):
    loss_fn, weight_fn = CASES[name]
    sums = ("tokens",) if name == "sft" else ()
    full, m_full = run(loss_fn, data, 1)
    acc, m_acc = run(loss_fn, data, K, weight_fn, sums)
    np.testing.assert_allclose(acc.params["w"], full.params["w"], rtol=1e-5, atol=1e-6)
    assert set(m_acc) == set(m_full)
    for key in ("loss", "grad_norm", "pg_loss", "nll", "tokens"):
        if key in m_full:
            np.testing.assert_allclose(m_acc[key], m_full[key], rtol=1e-5, atol=1e-7,
                                       err_msg=key)


def test_one_micro_batch_is_the_plain_step(data):
    full, m_full = run(sft, data, 1)
    again, m_again = run(sft, data, 1, tokens)  # weight_fn is unused at k = 1
    np.testing.assert_array_equal(again.params["w"], full.params["w"])
    assert float(m_again["loss"]) == float(m_full["loss"])


def test_rows_are_split_interleaved_and_other_leaves_pass_whole(data):
    chunks, join = split_rows(data, K)
    x = dict(zip(sorted(k for k in data if k != "scale"), chunks, strict=True))["adv"]
    assert x.shape == (K, B // K)
    np.testing.assert_array_equal(x[1], np.asarray(data["adv"])[1::K])  # rows 1, 1+K, ...
    one = join(tuple(c[2] for c in chunks))
    assert one["scale"] is data["scale"] and one["x"].shape == (B // K, T, D)
    ys = map_rows(lambda b: b["x"].sum(-1) * b["scale"], data, 2)
    np.testing.assert_allclose(ys, data["x"].sum(-1) * 1.5, rtol=1e-6)
    with pytest.raises(ValueError, match="3 chunks do not divide the 8 rows"):
        split_rows(data, 3)


def test_zero_total_weight_gives_a_zero_update(data):
    empty = dict(data, mask=jnp.zeros_like(data["mask"]))
    new, m = run(sft, empty, K, tokens, ("tokens",))
    assert float(m["loss"]) == 0.0 and float(m["grad_norm"]) == 0.0 and float(m["tokens"]) == 0

"""sampling.runner: `map_batches` (the fixed-shape host batch loop) against direct unbatched
computations, on one device and on meshes of 8 fake CPU devices; `LMRunner.complete` against
direct sampler calls; `score` and `evaluate` on hand-built cases."""

import textwrap
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lm_helpers import peaked_params

from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text import ArithmeticTask
from jaxrl_suite.envs.text.base import Verdicts
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.models import CausalLM, LMConfig
from jaxrl_suite.sampling import KVCacheSampler, LMRunner, map_batches, repeat_each

TOK, TASK = load_tokenizer(), ArithmeticTask(digits=1)
P, N = 8, 6


def _square_plus(x):
    return {"y": x * x + 1, "pair": jnp.stack([x, -x], axis=1)}


def test_map_batches_pads_trims_keeps_order_and_compiles_once():
    traces, calls = [], []

    @jax.jit
    def f(x):
        traces.append(x.shape)  # runs once per trace
        return _square_plus(x)

    def fn(local, b):
        calls.append((list(local), b))
        return f(jnp.asarray(local, jnp.float32))

    items = list(range(3, 14))  # 11 items: not a multiple of the batch size
    got = map_batches(fn, items, batch_size=4, mesh=make_mesh(1))
    x = np.asarray(items, np.float32)
    np.testing.assert_array_equal(got["y"], x * x + 1)  # padding trimmed, order kept
    np.testing.assert_array_equal(got["pair"], np.stack([x, -x], axis=1))
    assert [c[1] for c in calls] == [0, 1, 2]
    assert calls[-1][0] == [11, 12, 13, 13]  # the last batch padded with its last item
    assert traces == [(4,)]  # one compiled shape serves every batch
    # host arrays (this process's rows) come back the same way
    host = map_batches(lambda local, b: np.asarray(local) * 10, items, batch_size=5,
                       mesh=make_mesh(1))
    np.testing.assert_array_equal(host, np.asarray(items) * 10)
    with pytest.raises(ValueError, match="at least one item"):
        map_batches(fn, [], batch_size=4, mesh=make_mesh(1))


MESH_SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    assert jax.device_count() == 8, jax.devices()
    from jaxrl_suite.core.parallel import make_mesh, shard_batch
    from jaxrl_suite.sampling import map_batches

    f = jax.jit(lambda x: {"y": x * x + 1, "pair": jnp.stack([x, -x], axis=1)})
    items = list(range(3, 16))  # 13 items
    x = np.asarray(items, np.float32)
    for axes, batch_size, rows in [((8, 1, 1), 12, 8), ((2, 2, 2), 6, 4), ((1, 1, 8), 3, 3)]:
        mesh = make_mesh(8, data=axes[0], fsdp=axes[1], tensor=axes[2])
        seen = []

        def fn(local, b):
            seen.append(len(local))
            out = f(shard_batch(np.asarray(local, np.float32), mesh))
            shards = {s.index[0].start for s in out["y"].addressable_shards}
            assert len(shards) == mesh.shape["data"] * mesh.shape["fsdp"], shards
            return out

        got = map_batches(fn, items, batch_size=batch_size, mesh=mesh)
        # batch size rounded down to a multiple of the batch shards (data x fsdp)
        assert set(seen) == {rows}, (axes, seen)
        np.testing.assert_array_equal(got["y"], x * x + 1)
        np.testing.assert_array_equal(got["pair"], np.stack([x, -x], axis=1))
    print("OK")
    """
)


def test_map_batches_on_meshes_of_eight_devices(run_on_host_devices):
    run_on_host_devices(MESH_SCRIPT, 8)


# ---- LMRunner on a tiny model ----


@pytest.fixture(scope="module")
def tiny():
    model = CausalLM(LMConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32,
                              max_len=P + N))
    params = jax.jit(lambda k: peaked_params(model, k))(jax.random.key(0))
    runner = LMRunner(model, TOK, TASK, mesh=make_mesh(1), prompt_len=P, max_new_tokens=N)
    return model, params, runner


def _direct(sampler, params, examples, key, **kw):
    """One direct sampler call on these examples' prompts: (texts, lengths)."""
    ids, mask = TOK.encode_batch([e.prompt for e in examples], P)
    out = sampler(params, jnp.asarray(ids), jnp.asarray(mask), key, **kw)
    return TOK.decode_batch(out.tokens, out.mask), np.asarray(out.mask).sum(axis=1)


def test_complete_equals_direct_sampler_calls_on_the_same_batches(tiny):
    model, params, runner = tiny
    examples = TASK.examples("test", 0, 5)
    batches = [examples[:4], examples[4:] * 4]  # what the runner runs: the last one padded
    greedy = KVCacheSampler(model, greedy=True, max_new_tokens=N, eos_id=TOK.eos_id,
                            pad_id=TOK.pad_id)
    want = [_direct(greedy, params, b, jax.random.PRNGKey(0)) for b in batches]
    texts, lengths = runner.complete(params, examples, batch_size=4)
    assert texts == want[0][0] + want[1][0][:1]
    np.testing.assert_array_equal(lengths, np.concatenate([want[0][1], want[1][1][:1]]))
    assert any(texts) and len(set(texts)) > 1  # the tiny model says something, not always one

    key = jax.random.key(3)  # sampled: batch b keyed fold_in(key, b)
    want = [_direct(runner.eval_sampler, params, b, jax.random.fold_in(key, i), temperature=0.7,
                    top_p=0.9) for i, b in enumerate(batches)]
    texts, lengths = runner.complete(params, examples, batch_size=4, rng=key, temperature=0.7,
                                     top_p=0.9)
    assert texts == want[0][0] + want[1][0][:1]
    np.testing.assert_array_equal(lengths, np.concatenate([want[0][1], want[1][1][:1]]))
    with pytest.raises(ValueError, match="need an rng"):
        runner.complete(params, examples, batch_size=4, temperature=0.7)


def test_score_rows_are_the_examples_prompts_and_completions(tiny):
    """A row-wise logprob_fn shows which prompt and completion each row of `score` holds."""
    runner = LMRunner(tiny[0], TOK, TASK, mesh=make_mesh(1), prompt_len=P, max_new_tokens=24)
    examples = TASK.examples("test", 0, 5)
    fn_calls = []

    def logprob_fn(params, seq):
        fn_calls.append(seq.prompt.shape[0])
        return seq.completion * 1000.0 + seq.prompt[:, -1:] + params  # [rows, 24]

    def want(completions):
        prompt = TOK.encode_batch([e.prompt for e in examples], P)[0]
        ids, mask = TOK.encode_batch(completions, 24, side="right", add_eos=True)
        return ids * 1000.0 + prompt[:, -1:] + 0.5, mask.astype(np.float32)

    logp, mask = runner.score(0.5, examples, logprob_fn=logprob_fn)  # the solutions, 1 batch
    assert fn_calls == [5]
    for got, ref in zip((logp, mask), want([TASK.solution(e) for e in examples]), strict=True):
        np.testing.assert_array_equal(got, ref)
    texts = ["<answer>1</answer>", "x", "", "<answer>22</answer>", "y"]
    logp, mask = runner.score(0.5, examples, texts, logprob_fn=logprob_fn, batch_size=2)
    assert fn_calls[1:] == [2, 2, 2]
    for got, ref in zip((logp, mask), want(texts), strict=True):
        np.testing.assert_array_equal(got, ref)
    with pytest.raises(ValueError, match="completions for"):
        runner.score(0.5, examples, texts[:2], logprob_fn=logprob_fn)


def test_score_without_eos_cuts_each_text_to_max_new_tokens(tiny):
    """eos=False: the completion ids are the text's own tokens (no EOS), at most N of them."""
    runner = LMRunner(tiny[0], TOK, TASK, mesh=make_mesh(1), prompt_len=P, max_new_tokens=N)
    examples = TASK.examples("test", 0, 3)
    texts = ["ab", "", "abcdefghij"]  # 2 tokens, none, and 10 > N = 6 (cut)

    def logprob_fn(params, seq):
        return seq.completion.astype(jnp.float32)

    logp, mask = runner.score(None, examples, texts, logprob_fn=logprob_fn, eos=False)
    for row, text in enumerate(texts):
        ids = TOK.encode(text)[:N]  # a byte tokenizer: one token per character
        assert mask[row].tolist() == [1.0] * len(ids) + [0.0] * (N - len(ids))
        assert logp[row, : len(ids)].tolist() == ids
        assert TOK.eos_id not in logp[row, : len(ids)]
    assert mask.sum(axis=1).tolist() == [2, 0, N]


def test_score_defaults_to_the_causal_models_exact_log_probs(tiny):
    """Without logprob_fn: log softmax of one full forward over [prompt | completion], read at
    the positions that predict each completion token (no EOS here), as a direct reference."""
    model, params, _ = tiny
    runner = LMRunner(model, TOK, TASK, mesh=make_mesh(1), prompt_len=P, max_new_tokens=N)
    examples = TASK.examples("test", 0, 3)
    texts = ["<an", "12", "a"]
    logp, mask = runner.score(params, examples, texts, eos=False)
    for row, (ex, text) in enumerate(zip(examples, texts, strict=True)):
        prompt = TOK.encode(ex.prompt)
        ids = TOK.encode(text)
        tokens = jnp.asarray([prompt + ids])
        logits = model.apply(params, tokens)[0][0]  # [T, V], no padding: positions 0..T-1
        ref = jax.nn.log_softmax(logits, -1)[len(prompt) - 1 + np.arange(len(ids)), ids]
        np.testing.assert_allclose(logp[row, : len(ids)], ref, atol=1e-5)
        assert mask[row].sum() == len(ids)


def test_repeat_each_is_item_major():
    assert repeat_each(["a", "b"], 3) == ["a", "a", "a", "b", "b", "b"]
    assert repeat_each([], 2) == [] and repeat_each(["a"], 1) == ["a"]


def test_evaluate_scores_the_greedy_completions_through_verify_batch(tiny):
    model, _, _ = tiny
    examples = TASK.examples("test", 0, 3)
    planned = [TASK.solution(examples[0]), "<answer>-1</answer>", TASK.solution(examples[2])]
    keys = []

    def fake_greedy(params, prompt, prompt_mask, rng):
        keys.append(np.asarray(rng))
        ids, mask = TOK.encode_batch((planned + planned)[: prompt.shape[0]], N + 20,
                                     side="right", add_eos=True)
        return SimpleNamespace(tokens=jnp.asarray(ids), mask=jnp.asarray(mask))

    runner = LMRunner(model, TOK, TASK, mesh=make_mesh(1), prompt_len=P, max_new_tokens=N,
                      greedy_sampler=fake_greedy)
    lengths = [len(TOK.encode(t)) + 1 for t in planned]  # + EOS
    got = runner.evaluate(None, examples, batch_size=4)
    assert got == pytest.approx({"accuracy": 2 / 3, "length": np.mean(lengths),
                                 "reward": 2 / 3})
    np.testing.assert_array_equal(keys[0], np.asarray(jax.random.PRNGKey(0)))

    class Designed:  # a task with a designed reward: "reward" is its mean, not the score's
        def verify_batch(self, texts, exs):
            assert texts == planned and exs == examples
            return Verdicts([1.0, 0.0, 0.5], rewards=[2.0, -1.0, 0.5])

    got = runner.with_task(Designed()).evaluate(None, examples, batch_size=4)
    assert got["accuracy"] == pytest.approx(1 / 3) and got["reward"] == pytest.approx(0.5)
    assert runner.task is TASK  # with_task copies

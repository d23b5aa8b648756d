"""ExIt on GRPO (issue 7, step 3): buffer-driven single-step iterations, embeddings, evaluation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.algorithms.exit import (
    ExItConfig,
    ExItTrainer,
    MultiTurnTrainer,
    evaluate_iterations,
)
from jaxrl_suite.algorithms.grpo import GRPOTrainer
from jaxrl_suite.algorithms.grpo_config import GRPOConfig
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text import make_task
from jaxrl_suite.envs.text.iteration import previous_answer
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.models import CausalLM, LMConfig
from jaxrl_suite.models.sequence import SeqBatch

N = 12  # completion budget


@pytest.fixture(scope="module")
def setup():
    model = CausalLM(LMConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64))
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, 8), np.int32))
    grpo = GRPOTrainer(model, load_tokenizer(), make_task("sort", num_items=3, max_value=9),
                       GRPOConfig(prompts_per_step=4, group_size=4, max_new_tokens=N),
                       mesh=make_mesh(1), prompt_len=96)
    return model, params, grpo


def test_steps_fill_the_buffer_then_extend_its_histories(setup):
    _, params, grpo = setup
    exit_ = ExItTrainer(grpo, ExItConfig(capacity=32, min_size=8, p_select=1.0, p_div=0.5))
    state = exit_.init_state(params, jax.random.PRNGKey(1))
    fresh = exit_.batch(0)
    assert [i for i, _ in fresh] == [0, 1, 2, 3]
    state, m1 = exit_.step(state, fresh)
    assert m1["from_buffer_frac"] == 0.0  # buffer below min_size: the fresh tasks
    assert m1["exit/size"] == 16 and m1["exit/max_turn"] == 1  # every completion entered
    np.testing.assert_array_equal(np.sort(np.asarray(state.buffer.task)[:16]),
                                  np.repeat(np.arange(4), 4))
    examples, tasks, turns, from_buffer, divergent, _ = exit_.select(
        state.buffer, exit_.batch(4), jax.random.PRNGKey(3))
    assert from_buffer.all() and (turns == 1).all() and set(tasks) <= {0, 1, 2, 3}
    for ex, t, d in zip(examples, tasks, divergent, strict=True):
        assert ex.prompt.startswith(grpo.task.example("train", int(t)).prompt + " | prev ")
        assert ex.prompt.endswith("diverge:" if d else "improve:")
    state, m2 = exit_.step(state, exit_.batch(4))
    assert m2["from_buffer_frac"] == 1.0 and m2["batch_mean_turn"] == 1.0
    assert m2["exit/size"] == 32 and m2["exit/max_turn"] == 2 and int(state.step) == 2
    for k in ("loss", "reward", "learnability", "exit/mean_priority", "tokens"):
        assert np.isfinite(m2[k]), k


def test_multi_turn_baseline_revises_each_episode_and_shares_the_final_advantage(setup,
                                                                                monkeypatch):
    _, params, grpo = setup
    calls, updates = [], []
    rollout, update = grpo.rollout, grpo.update

    def spy_rollout(state, examples, **kw):
        calls.append((list(examples), kw.get("group_size")))
        return rollout(state, examples, **kw)

    def spy_update(state, seq, old_logp, rewards, info, **kw):
        updates.append((seq.completion.shape, np.asarray(kw["advantages"]), rewards, info))
        return update(state, seq, old_logp, rewards, info, **kw)

    monkeypatch.setattr(grpo, "rollout", spy_rollout)
    monkeypatch.setattr(grpo, "update", spy_update)
    naive = MultiTurnTrainer(grpo, turns=3)
    state = naive.init_state(params, jax.random.PRNGKey(1))
    examples = naive.batch(0)
    state, m = naive.step(state, examples)
    assert [len(c[0]) for c in calls] == [4, 16, 16] and [c[1] for c in calls] == [None, 1, 1]
    for ex_t in calls[1][0][::4]:
        assert " | prev " in ex_t.prompt
    assert calls[1][0][5].prompt.startswith(examples[1].prompt)  # row j*G + i: task j
    shape, adv, rewards, info = updates[0]
    assert shape == (48, N) and adv.shape == (48,) and rewards.shape == (4, 4)
    np.testing.assert_array_equal(adv[:16], adv[16:32])  # every turn: the episode's advantage
    np.testing.assert_allclose(adv[:16], grpo.group_advantages(rewards), rtol=1e-6)
    assert m["tokens"] == info["tokens"] and np.isfinite(m["loss"])


def test_completion_embeddings_equal_a_direct_unpadded_forward(setup):
    model, params, grpo = setup
    tok = grpo.tokenizer
    prompt, pmask = tok.encode_batch(["sort 3 1 2:", "sort 9 8 7:"], 16)
    comp, cmask = tok.encode_batch(["<answer>1 2", "<a"], 12, side="right")
    seq = SeqBatch(jnp.asarray(prompt), jnp.asarray(pmask), jnp.asarray(comp),
                   jnp.asarray(cmask, jnp.float32))
    got = np.asarray(grpo.completion_embeddings(params, seq))
    for row in range(2):
        p = prompt[row][pmask[row]]
        c = comp[row][cmask[row]]
        tokens = np.concatenate([p, c])[None]
        _, _, h = model.apply(params, jnp.asarray(tokens), return_hidden=True)
        want = np.asarray(h[0, len(p):]).mean(0)
        np.testing.assert_allclose(got[row], want, rtol=2e-4, atol=2e-5)


def test_evaluate_iterations_feeds_each_answer_back(setup, monkeypatch):
    """Each step's prompt shows the previous step's answer and its verifier score (scripted
    completions, so the content is known), and the scores are those of each step's answers."""
    _, params, grpo = setup
    task = grpo.task
    examples = task.examples("test", 0, 3)
    right = [task.solution(e) for e in examples]  # "<answer>a b c</answer>": score 1
    scripted = [
        [right[0], "<answer>9 9 9</answer>", "no tags"],
        ["<answer>0 0 0</answer>", right[1], right[2]],
        [right[0], right[1], "<answer>9 9 9</answer>"],
    ]
    seen = []

    def fake_greedy(p, prompts, *, batch_size, rng=None, temperature=None):
        assert p is params and batch_size == 4 and rng is None and temperature is None
        seen.append([e.prompt for e in prompts])
        texts = scripted[len(seen) - 1]
        return texts, np.array([len(t) for t in texts])

    monkeypatch.setattr(grpo, "complete", fake_greedy)
    scores = evaluate_iterations(grpo, params, examples, steps=3, batch_size=4)
    assert len(seen) == 3 and seen[0] == [e.prompt for e in examples]  # step 1: own prompts
    for t in (1, 2):
        for i, e in enumerate(examples):
            previous = scripted[t - 1][i]
            shown = {right[i]: e.answer, "no tags": "none"}.get(previous, previous[8:-9])
            score = 1.0 if previous == right[i] else task.score(previous, e)
            assert seen[t][i] == (f"{e.prompt} | prev {shown} | score {score:.2f}, "
                                  f"{task.feedback(previous, e)} | improve:"), (t, i)
    assert "prev 9 9 9 |" in seen[1][1] and "prev none |" in seen[1][2]
    assert "score 1.00" in seen[1][0] and "score 1.00" in seen[2][1]
    want = [np.mean([task.score(x, e) for x, e in zip(step, examples, strict=True)])
            for step in scripted]
    np.testing.assert_allclose(scores, want, rtol=1e-6)
    assert want[1] > want[0] and want[2] > 2 / 3  # the scripted answers improve


def test_evaluate_iterations_with_the_model_builds_each_prompt_from_its_last_answer(setup,
                                                                                   monkeypatch):
    _, params, grpo = setup
    examples = grpo.task.examples("test", 0, 3)
    calls, real = [], grpo.complete

    def spy(p, prompts, **kw):
        texts, lengths = real(p, prompts, **kw)
        calls.append(([e.prompt for e in prompts], texts))
        return texts, lengths

    monkeypatch.setattr(grpo, "complete", spy)
    scores = evaluate_iterations(grpo, params, examples, steps=2, batch_size=4)
    (_, first), (prompts, second) = calls
    for e, prev, prompt in zip(examples, first, prompts, strict=True):
        assert prompt.startswith(f"{e.prompt} | prev {previous_answer(prev)} | score "
                                 f"{grpo.task.score(prev, e):.2f}, ")
    want = [np.mean([grpo.task.score(x, e) for x, e in zip(texts, examples, strict=True)])
            for texts in (first, second)]
    np.testing.assert_allclose(scores, want)


def test_evaluate_iterations_sampled_draws_each_step_at_the_temperature(setup, monkeypatch):
    """With a temperature, each step samples one completion per example (`complete` with a key,
    at that temperature, step t keyed fold_in(rng, t)), fed back like the greedy steps."""
    _, params, grpo = setup
    task = grpo.task
    examples = task.examples("test", 0, 3)
    right = [task.solution(e) for e in examples]
    scripted = [[right[0], "no tags", "<answer>9 9 9</answer>"], [right[0], right[1], "no tags"]]
    calls = []

    def fake_sampled(p, prompts, *, batch_size, rng, temperature):
        assert p is params and batch_size == 4
        calls.append(([e.prompt for e in prompts], np.asarray(rng), temperature))
        texts = scripted[len(calls) - 1]
        return texts, np.array([len(t) for t in texts])

    monkeypatch.setattr(grpo, "complete", fake_sampled)
    key = jax.random.PRNGKey(7)
    scores = evaluate_iterations(grpo, params, examples, steps=2, batch_size=4,
                                 temperature=0.7, rng=key)
    assert [c[2] for c in calls] == [0.7, 0.7]
    for t, (_, rng, _) in enumerate(calls):
        np.testing.assert_array_equal(rng, np.asarray(jax.random.fold_in(key, t)))
    assert calls[0][0] == [e.prompt for e in examples] and "score 1.00" in calls[1][0][0]
    want = [np.mean([task.score(x, e) for x, e in zip(step, examples, strict=True)])
            for step in scripted]
    np.testing.assert_allclose(scores, want, rtol=1e-6)
    with pytest.raises(ValueError, match="temperature and rng together"):
        evaluate_iterations(grpo, params, examples, steps=1, batch_size=4, temperature=0.7)

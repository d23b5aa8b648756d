"""The RL recipe of issue 42: dynamic sampling (which groups are kept), the RL lr schedule, the
SFT's Adam moments carried into GRPO, a frozen reference, SFT early stopping."""

import dataclasses

import jax
import numpy as np
import optax
import pytest

from jaxrl_suite.algorithms.dynamic_sampling import informative_groups
from jaxrl_suite.algorithms.grpo import GRPOTrainer
from jaxrl_suite.algorithms.grpo_config import GRPOConfig
from jaxrl_suite.algorithms.loop import fit_resumable
from jaxrl_suite.algorithms.sft import SFTConfig, SFTTrainer
from jaxrl_suite.core.metrics import MetricsLogger, read_metrics
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.core.train import carry_adam_moments
from jaxrl_suite.envs.text import ArithmeticTask
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.models import CausalLM, LMConfig
from jaxrl_suite.models.sequence import SeqBatch
from jaxrl_suite.sampling import repeat_each

B, G, N = 3, 4, 5  # prompts per step, group size, completion tokens
CFG = GRPOConfig(prompts_per_step=B, group_size=G, max_new_tokens=N, lr=1e-2,
                 dynamic_sampling=True, max_draws=3)


@pytest.fixture(scope="module")
def setup():
    model = CausalLM(LMConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32))
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, 8), np.int32))
    return model, params, load_tokenizer(), ArithmeticTask(digits=1)


def make(setup, **changes):
    model, params, tok, task = setup
    return GRPOTrainer(model, tok, task, dataclasses.replace(CFG, **changes),
                       mesh=make_mesh(1), prompt_len=8, ref_params=params)


def test_informative_groups_are_those_whose_rewards_differ():
    rewards = np.array([[1, 1, 1, 1], [0, 0, 0, 0], [0, 1, 0, 0], [0.5, 0.5, 0.5, 0.25]])
    np.testing.assert_array_equal(informative_groups(rewards), [False, False, True, True])


def fake_rollouts(trainer, draws):
    """Replace `trainer.rollout` by one that returns draw d's rewards `draws[d]` [B, G]; each
    row's completion tokens hold (draw, group, sample) so the test can tell where it came from."""
    calls = []

    def rollout(state, examples, *, key=None, group_size=None):
        d = len(calls)
        calls.append((list(examples), key))
        rows = np.array([[d, i // G, i % G, 0, 0] for i in range(B * G)], np.int32)
        seq = SeqBatch(np.zeros((B * G, 8), np.int32), np.ones((B * G, 8), bool), rows,
                       np.ones((B * G, N), np.float32))
        old = np.full((B * G, N), -float(d), np.float32)
        seq, old = jax.device_put((seq, old))
        return seq, old, np.asarray(draws[d], np.float32), {
            "accuracy": float(np.mean(draws[d])), "length": 5.0, "tokens": B * G * 5}

    trainer.rollout = rollout
    return calls


def test_dynamic_sampling_keeps_informative_groups_in_order_until_the_batch_is_full(setup):
    trainer = make(setup)
    same, mixed = [0, 0, 0, 0], [0, 1, 0, 1]
    calls = fake_rollouts(trainer, [[same, mixed, same], [mixed, mixed, same], [mixed] * 3])
    state = trainer.init_state(setup[1], jax.random.PRNGKey(0))
    pool = trainer.batch(0)
    assert len(pool) == B * CFG.max_draws
    seq, old, rewards, info, m = trainer.dynamic_rollout(state, pool)
    assert len(calls) == 2  # full after two draws: the third is not drawn
    assert [c[0] for c in calls] == [pool[:B], pool[B:2 * B]]  # the pool, B prompts a draw
    tags = np.asarray(seq.completion)[::G, :2].tolist()  # (draw, group) of each kept group
    assert tags == [[0, 1], [1, 0], [1, 1]]
    np.testing.assert_array_equal(rewards, [mixed, mixed, mixed])
    np.testing.assert_array_equal(np.asarray(old)[::G, 0], [0.0, -1.0, -1.0])
    np.testing.assert_array_equal(np.asarray(seq.train_mask), np.ones((B * G, N)))
    assert m["draws"] == 2 and m["filled"] == 1.0
    assert m["kept_frac"] == pytest.approx(3 / 6) and m["zero_std_frac"] == pytest.approx(3 / 6)
    assert m["reward"] == pytest.approx(np.mean([same, mixed, same, mixed, mixed, same]))


def test_dynamic_sampling_fills_a_short_batch_with_masked_groups_at_the_cap(setup):
    trainer = make(setup)
    same, ones, mixed = [0, 0, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]
    calls = fake_rollouts(trainer, [[same, same, ones], [same, mixed, same], [ones] * 3])
    state = trainer.init_state(setup[1], jax.random.PRNGKey(0))
    seq, _, rewards, _, m = trainer.dynamic_rollout(state, trainer.batch(0))
    assert len(calls) == 3 and m["draws"] == 3
    assert m["filled"] == pytest.approx(1 / 3) and m["kept_frac"] == pytest.approx(1 / 9)
    tags = np.asarray(seq.completion)[::G, :2].tolist()
    assert tags == [[1, 1], [0, 0], [0, 1]]  # the kept group, then the first spare ones
    np.testing.assert_array_equal(rewards, [mixed, same, same])
    mask = np.asarray(seq.train_mask)
    assert mask[:G].all() and not mask[G:].any()  # the fillers carry no loss term
    # draw 0 uses the step's own key, later draws fold in their index
    key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    assert calls[0][1] is key or np.array_equal(jax.random.key_data(calls[0][1]),
                                                jax.random.key_data(key))
    np.testing.assert_array_equal(jax.random.key_data(calls[2][1]),
                                  jax.random.key_data(jax.random.fold_in(key, 2)))


def test_a_step_with_dynamic_sampling_logs_the_pool_and_trains_on_it(setup):
    trainer = make(setup, max_draws=2)
    state = trainer.init_state(setup[1], jax.random.PRNGKey(3))
    new, m = trainer.step(state, trainer.batch(0))
    for key in ("kept_frac", "draws", "filled", "reward", "zero_std_frac", "loss"):
        assert np.isfinite(m[key]), key
    assert 1 <= m["draws"] <= 2 and int(new.step) == 1


def test_the_reference_params_stay_bit_identical_across_grpo_steps(setup):
    trainer = make(setup, beta=0.04, dynamic_sampling=False)
    before = jax.tree.map(np.array, trainer.ref_params)
    state = trainer.init_state(setup[1], jax.random.PRNGKey(1))
    for n in range(2):
        state, m = trainer.step(state, trainer.batch(B * n))
    assert m["update_norm"] > 0
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: not np.array_equal(a, b),
                                         state.params, before))
    assert any(moved)  # the policy moved ...
    for a, b in zip(jax.tree.leaves(trainer.ref_params), jax.tree.leaves(before), strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)  # ... the reference did not


def test_carried_adam_moments_equal_the_sft_ones_and_the_schedule_restarts(setup):
    model, params, tok, task = setup
    sft = SFTTrainer(model, tok, task, SFTConfig(steps=10, batch_size=4, lr=1e-2),
                     mesh=make_mesh(1), prompt_len=8, max_new_tokens=20)
    sft_state = sft.init_state(params, jax.random.PRNGKey(0))
    for n in range(3):
        sft_state, _ = sft.step(sft_state, sft.batch(4 * n))
    trainer = make(setup, carry_optimizer=True, warmup_steps=5, dynamic_sampling=False)
    with pytest.raises(ValueError, match="sft_opt_state"):
        trainer.init_state(sft_state.params, jax.random.PRNGKey(1))
    state = trainer.init_state(sft_state.params, jax.random.PRNGKey(1),
                               sft_opt_state=sft_state.opt_state)

    def adam(s):
        return [x for x in jax.tree.leaves(s, is_leaf=lambda x: isinstance(
            x, optax.ScaleByAdamState)) if isinstance(x, optax.ScaleByAdamState)][0]

    carried, saved = adam(state.opt_state), adam(sft_state.opt_state)
    assert int(carried.count) == 3
    for a, b in zip(jax.tree.leaves(carried), jax.tree.leaves(saved), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the warm-up schedule's count is GRPO's own: its first update has lr 0
    seq, old_logp, rewards, info = trainer.rollout(state, trainer.batch(0))
    texts = trainer.tokenizer.decode_batch(np.asarray(seq.completion),
                                           np.asarray(seq.completion_mask))
    scores = trainer.task.verify_batch(texts, repeat_each(trainer.batch(0), G)).scores
    np.testing.assert_array_equal(info["correct"], (np.array(scores) == 1.0).reshape(B, G))
    _, m = trainer.update(state, seq, old_logp, rewards, info,
                          advantages=np.linspace(-1.0, 1.0, B * G))
    assert m["update_norm"] == 0.0 and m["grad_norm"] > 0
    with pytest.raises(ValueError, match="one Adam state"):
        carry_adam_moments(trainer.optimizer.init(params), {"no": np.zeros(())})


def test_the_cosine_lr_schedule_warms_up_then_decays_to_a_tenth_at_grpo_steps(setup):
    # With a constant gradient, each Adam update is -lr_t per element (m_hat / sqrt(v_hat) = 1),
    # so the updates read off the schedule: linear from 0 over the warm-up, then a cosine.
    lr, warmup, steps = 1e-2, 2, 10
    trainer = make(setup, lr_schedule="cosine", warmup_steps=warmup, steps=steps)
    params = {"w": np.zeros(3, np.float32)}
    opt_state = trainer.optimizer.init(params)
    got = []
    for _ in range(steps + 1):
        updates, opt_state = trainer.optimizer.update({"w": np.full(3, 0.1, np.float32)},
                                                      opt_state, params)
        got.append(-float(updates["w"][0]))
    t = np.arange(steps + 1)
    cosine = lr / 10 + (lr - lr / 10) * 0.5 * (1 + np.cos(np.pi * (t - warmup) / (steps - warmup)))
    want = np.where(t < warmup, lr * t / warmup, cosine)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-9)
    constant = make(setup, warmup_steps=warmup).optimizer
    opt_state = constant.init(params)
    for _ in range(steps + 1):
        updates, opt_state = constant.update({"w": np.full(3, 0.1, np.float32)}, opt_state,
                                             params)
    assert -float(updates["w"][0]) == pytest.approx(lr, rel=1e-4)  # constant after warm-up
    with pytest.raises(ValueError, match="lr_schedule"):
        dataclasses.replace(CFG, lr_schedule="linear")


class ToyTrainer:
    """A stage whose state is its step count; `batch` is one example."""

    trainable = None

    def batch(self, cursor):
        return [cursor]

    def step(self, state, examples):
        return state.replace(step=state.step + 1), {"loss": 1.0 / (int(state.step) + 1)}


def test_a_stop_from_the_callback_ends_the_stage_and_a_resume_ends_there_too(tmp_path):
    from jaxrl_suite.core.train import ParamState

    init = ParamState(step=np.zeros((), np.int32), params={"w": np.zeros(2, np.float32)},
                      opt_state={"m": np.zeros(2, np.float32)})
    seen = []

    def callback(n, state):
        seen.append(n)
        return {"val": float(n), "stop": n == 3}

    kw = dict(stage="sft", num_steps=10, checkpoint_dir=tmp_path / "ck", save_every=100,
              keep=2, step_offset=0, progress=False, callback=callback)
    with MetricsLogger(tmp_path) as log:
        state = fit_resumable(ToyTrainer(), init, logger=log, resume=False, **kw)
    assert int(state.step) == 3 and seen == [1, 2, 3]
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    assert "stop" not in read_metrics(tmp_path / "metrics.jsonl")[-1]
    with MetricsLogger(tmp_path / "again") as log:
        again = fit_resumable(ToyTrainer(), init, logger=log, resume=True, **kw)
    assert int(again.step) == 3 and seen == [1, 2, 3]  # restored as stopped: no more steps


def test_advantage_sign_negates_the_configured_advantages(setup):
    rewards = np.array([[0.0, 1.0, 1.0, 0.5], [1.0, 0.0, 0.0, 0.0], [0.2, 0.2, 0.2, 0.2]])
    plain = make(setup).group_advantages(rewards)
    np.testing.assert_array_equal(make(setup, advantage_sign=-1).group_advantages(rewards),
                                  -plain)
    assert plain[1] > 0 and plain[4] > 0  # the better completions get positive advantages
    trainer = make(setup)
    control = trainer.negated()  # the same programs, the sign flipped
    np.testing.assert_array_equal(control.group_advantages(rewards), -plain)
    assert control.config.advantage_sign == -1 and trainer.config.advantage_sign == 1
    assert control._update is trainer._update  # nothing compiled again
    np.testing.assert_array_equal(control.negated().group_advantages(rewards), plain)
    with pytest.raises(ValueError, match="advantage_sign"):
        dataclasses.replace(CFG, advantage_sign=2)

"""GRPO as one program (`algorithms.grpo_ondevice`) against the host loop (`GRPOTrainer.step`):
same keys, same config -> the same rollouts, rewards, losses and parameters, with dynamic
sampling and a KL term on; a vmapped sweep's seed equals its single run; the jitted held-out
evaluation equals `LMRunner.evaluate`; unsupported options are one-line errors.

The start is a tiny CausalLM after 40 SFT steps on 1-digit addition, so that groups hold both
right and wrong answers (from a random init every reward is 0 and nothing would be compared).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from jaxrl_suite.algorithms.grpo import GRPOTrainer
from jaxrl_suite.algorithms.grpo_config import GRPOConfig
from jaxrl_suite.algorithms.grpo_ondevice import GRPOProgram, make_grpo_train
from jaxrl_suite.algorithms.sft import SFTConfig, SFTTrainer
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text import ArithmeticTask, make_task
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.models import CausalLM, LMConfig

STEPS = 3
P = 5
CONFIG = GRPOConfig(steps=STEPS, prompts_per_step=4, group_size=4, max_new_tokens=22, lr=3e-3,
                    beta=0.04, dynamic_sampling=True, max_draws=2, clip_eps_high=0.28)
TASK = ArithmeticTask(digits=1)
TOK = load_tokenizer()
MODEL = CausalLM(LMConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=64))


@pytest.fixture(scope="module")
def start():
    mesh = make_mesh(1)
    params = MODEL.init(jax.random.PRNGKey(0), np.zeros((1, 8), np.int32))
    sft = SFTTrainer(MODEL, TOK, TASK, SFTConfig(batch_size=32, lr=1e-2, warmup_steps=2),
                     mesh=mesh, prompt_len=P, max_new_tokens=22)
    state = sft.init_state(params, jax.random.PRNGKey(1))
    for n in range(40):
        state, _ = sft.step(state, sft.batch(32 * n))
    trainer = GRPOTrainer(MODEL, TOK, TASK, CONFIG, mesh=mesh, prompt_len=P,
                          ref_params=state.params)
    return trainer, state.params


@pytest.fixture(scope="module")
def host_run(start):
    trainer, params = start
    state = trainer.init_state(params, jax.random.PRNGKey(7))
    records, cursor = [], 0
    for _ in range(STEPS):
        examples = trainer.batch(cursor)
        state, metrics = trainer.step(state, examples)
        records.append(metrics)
        cursor += len(examples)
    return state, records


@pytest.fixture(scope="module")
def program(start):
    trainer, _ = start
    return GRPOProgram(trainer, eval_examples=TASK.examples("train", 0, 32))


def leaves(params):
    return [np.asarray(x) for x in jax.tree.leaves(params)]


def test_equals_the_host_loop(start, host_run, program):
    _, params = start
    host_state, records = host_run
    state, metrics = program.train_jit(jax.random.PRNGKey(7), params)
    assert int(state.step) == STEPS
    # the start can learn: some groups hold both rewards, and dynamic sampling chose among draws
    assert 0 < np.mean([r["kept_frac"] for r in records]) < 1
    for key in ("reward", "reward_std", "reward_var", "zero_std_frac", "accuracy", "length",
                "tokens", "kept_frac", "draws", "filled", "loss", "pg_loss", "kl", "entropy",
                "grad_norm", "clip_frac"):
        if key not in records[0]:
            continue
        np.testing.assert_allclose(np.asarray(metrics[key]), [r[key] for r in records],
                                   rtol=2e-5, atol=1e-6, err_msg=key)
    # Adam moves each weight by about lr per step; the two programs fuse differently, so allow
    # 1 % of one step (a different algorithm moves weights by whole steps)
    for x, y in zip(leaves(host_state.params), leaves(state.params), strict=True):
        np.testing.assert_allclose(y, x, rtol=0, atol=0.01 * CONFIG.lr)
    moved = max(np.abs(x - y).max() for x, y in zip(leaves(params), leaves(state.params),
                                                    strict=True))
    assert moved > 1e-3  # GRPO did update


def test_sweep_seed_equals_its_single_run(start, program):
    """Two seeds vmapped from one start: each row equals `train` of that seed, and the seeds
    differ."""
    _, params = start
    keys = jax.random.split(jax.random.PRNGKey(3), 2)
    states, metrics = program.sweep(keys, params, params_axis=None)
    single = program.train_jit  # compiled as the sweep is
    for s in range(2):
        state, m = single(keys[s], params)
        np.testing.assert_allclose(np.asarray(metrics["reward"][s]), np.asarray(m["reward"]),
                                   rtol=1e-5, atol=1e-6)
        for x, y in zip(leaves(state.params), leaves(jax.tree.map(lambda t, i=s: t[i],
                                                                  states.params)), strict=True):
            np.testing.assert_allclose(y, x, rtol=0, atol=0.01 * CONFIG.lr)
    assert not np.array_equal(np.asarray(metrics["reward"][0]), np.asarray(metrics["reward"][1]))


def test_a_traced_lr_grid_equals_separate_configs(start, program):
    """A grid of two learning rates as one program: each point equals the program built with
    that config (the first point is the config's own, `program.train_jit`)."""
    trainer, params = start
    keys = jax.random.split(jax.random.PRNGKey(4), 1)
    other = 1e-3
    points, states, metrics = program.sweep_grid(keys, params, {"lr": [CONFIG.lr, other]})
    assert points == [{"lr": CONFIG.lr}, {"lr": other}]
    separate = GRPOTrainer(MODEL, TOK, TASK, dataclasses.replace(CONFIG, lr=other),
                           mesh=make_mesh(1), prompt_len=P, ref_params=trainer.ref_params)
    runs = [program.train_jit(keys[0], params),
            GRPOProgram(separate).train_jit(keys[0], params)]
    for g, (state, m) in enumerate(runs):
        np.testing.assert_allclose(np.asarray(metrics["loss"][g, 0]), np.asarray(m["loss"]),
                                   rtol=1e-4, atol=1e-6)
        for x, y in zip(leaves(state.params), leaves(jax.tree.map(lambda t, g=g: t[g, 0],
                                                                  states.params)), strict=True):
            np.testing.assert_allclose(y, x, rtol=0, atol=0.01 * points[g]["lr"])
    assert not np.allclose(leaves(runs[0][0].params)[0], leaves(runs[1][0].params)[0])


def test_hparams_refuses_unknown_names_and_an_untraceable_beta(start):
    _, params = start
    program = GRPOProgram(GRPOTrainer(MODEL, TOK, TASK, dataclasses.replace(CONFIG, beta=0.0),
                                      mesh=make_mesh(1), prompt_len=P))
    with pytest.raises(ValueError, match="unknown GRPO hyperparameter"):
        program.hparams(mu=2.0)
    with pytest.raises(ValueError, match="grpo.beta > 0"):
        program.hparams(beta=0.1)
    # with beta = 0 a traced lr leaves the KL term out (no reference log-probs): it traces
    shapes = jax.eval_shape(lambda k, h: program.train(k, params, h), jax.random.PRNGKey(0),
                            program.hparams(lr=1e-3))
    assert shapes[1]["loss"].shape == (STEPS,)


def test_evaluate_equals_the_runner(start, host_run, program):
    trainer, _ = start
    params = host_run[0].params
    want = trainer.evaluate(params, TASK.examples("train", 0, 32), batch_size=32)["accuracy"]
    got = float(jax.jit(program.evaluate)(params))
    assert got == pytest.approx(want, abs=1e-7) and 0 < want < 1


@pytest.mark.parametrize("change, match", [
    ({"tis": True}, "grpo.tis=True"),
    ({"entropy_reg": "siren"}, "siren"),
    ({"rollout": dataclasses.replace(CONFIG.rollout, engine="continuous", slots=16)},
     "rollout.engine"),
])
def test_refuses_what_it_does_not_run(change, match):
    trainer = GRPOTrainer(MODEL, TOK, TASK, dataclasses.replace(CONFIG, beta=0.0, **change),
                          mesh=make_mesh(1), prompt_len=P)
    with pytest.raises(ValueError, match=match):
        GRPOProgram(trainer)


def test_refuses_a_task_without_token_verifier():
    with pytest.raises(ValueError, match="token verifier"):
        make_grpo_train(dataclasses.replace(CONFIG, beta=0.0), make_task("countdown", graded=True),
                        model=MODEL, tokenizer=TOK, prompt_len=24)


def test_sweep_splits_seeds_over_a_mesh(run_on_host_devices):
    """4 seeds on a 4-device mesh (seed axis over "data") equal the same sweep on one device,
    and each device holds one seed's state."""
    run_on_host_devices("""
import dataclasses, jax, numpy as np
from jaxrl_suite.algorithms.grpo import GRPOTrainer
from jaxrl_suite.algorithms.grpo_config import GRPOConfig
from jaxrl_suite.algorithms.grpo_ondevice import GRPOProgram
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text import ArithmeticTask
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.models import CausalLM, LMConfig
model = CausalLM(LMConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32))
params = model.init(jax.random.PRNGKey(0), np.zeros((1, 8), np.int32))
# rewards of a random init are all 0: the KL to another init is what moves the params
cfg = GRPOConfig(steps=2, prompts_per_step=2, group_size=2, max_new_tokens=4, lr=1e-2, beta=1.0)
ref = model.init(jax.random.PRNGKey(5), np.zeros((1, 8), np.int32))
trainer = GRPOTrainer(model, load_tokenizer(), ArithmeticTask(digits=1), cfg,
                      mesh=make_mesh(1), prompt_len=5, ref_params=ref)
program = GRPOProgram(trainer)
keys = jax.random.split(jax.random.PRNGKey(1), 4)
one, m1 = program.sweep(keys, params, params_axis=None)
mesh = make_mesh(4)
split, m4 = program.sweep(keys, params, mesh=mesh, params_axis=None)
leaf = jax.tree.leaves(split.params)[0]
assert len(leaf.sharding.device_set) == 4 and leaf.addressable_shards[0].data.shape[0] == 1
for x, y in zip(jax.tree.leaves(one.params), jax.tree.leaves(split.params)):  # 1 % of a step
    np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=0, atol=0.01 * cfg.lr)
np.testing.assert_allclose(np.asarray(m4["loss"]), np.asarray(m1["loss"]), rtol=1e-5, atol=1e-7)
assert np.abs(np.asarray(leaf[0]) - np.asarray(jax.tree.leaves(params)[0])).max() > 1e-3
print("OK")
""", n=4)

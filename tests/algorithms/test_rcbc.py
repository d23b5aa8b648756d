"""Return-conditioned behaviour cloning: tokens, loss, data collection, policies, evaluation."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.algorithms.rcbc import (
    PolicyConfig,
    RCBCConfig,
    SeqPolicy,
    bc_loss,
    collect,
    dataset_tokens,
    evaluate,
    make_train,
    popgym_task,
    tmaze_task,
    token_dim,
)
from jaxrl_suite.envs.popgym import make_popgym
from jaxrl_suite.envs.tmaze import DOWN, RIGHT, UP
from jaxrl_suite.models.elmur import ELMURConfig

SMALL = ELMURConfig(d_model=16, n_layers=2, n_heads=2, d_ff=32, mem_slots=2, segment_len=4,
                    pre_norm=False, detach_memory=False)


def test_dataset_tokens_hold_return_to_go_and_previous_action():
    rng = np.random.default_rng(0)
    data = {"obs": jnp.asarray(rng.normal(size=(2, 5, 3)), jnp.float32),
            "reward": jnp.asarray(rng.normal(size=(2, 5)), jnp.float32),
            "action": jnp.asarray(rng.integers(0, 4, size=(2, 5)), jnp.int32)}
    tok = np.asarray(dataset_tokens(data, num_actions=4, return_scale=2.0))
    assert tok.shape == (2, 5, 3 + 1 + 4)
    r = np.asarray(data["reward"])
    for b in range(2):
        for t in range(5):
            np.testing.assert_allclose(tok[b, t, :3], np.asarray(data["obs"])[b, t])
            np.testing.assert_allclose(tok[b, t, 3], r[b, t:].sum() / 2.0, rtol=1e-5, atol=1e-6)
            expect = np.zeros(4)
            if t > 0:
                expect[int(data["action"][b, t - 1])] = 1.0
            np.testing.assert_array_equal(tok[b, t, 4:], expect)


def test_bc_loss_is_the_masked_mean_nll_and_accuracy():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 3, 4)).astype(np.float32)
    actions = rng.integers(0, 4, size=(2, 3))
    mask = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    loss, acc = bc_loss(jnp.asarray(logits), jnp.asarray(actions), jnp.asarray(mask))
    nll, hits = [], []
    for b, t in zip(*np.nonzero(mask), strict=True):
        z = logits[b, t]
        nll.append(np.log(np.exp(z - z.max()).sum()) + z.max() - z[actions[b, t]])
        hits.append(z.argmax() == actions[b, t])
    np.testing.assert_allclose(float(loss), np.mean(nll), rtol=1e-5)
    np.testing.assert_allclose(float(acc), np.mean(hits))


def test_tmaze_oracle_data_walk_right_then_turn_to_the_cue():
    task = tmaze_task(3, 9, segment_len=4)
    assert task.horizon == 12  # 9 + 2 rounded up to a multiple of 4
    data = jax.jit(lambda k: collect(task, k, 16, eps_max=0.0))(jax.random.key(0))
    np.testing.assert_allclose(np.asarray(data["return"]), 1.0)
    for obs, act, mask in zip(np.asarray(data["obs"]), np.asarray(data["action"]),
                              np.asarray(data["mask"]), strict=True):
        steps = int(mask.sum())  # corridor length L + 1 (the turn)
        assert 4 <= steps <= 10 and mask[:steps].all() and not mask[steps:].any()
        np.testing.assert_array_equal(act[: steps - 1], RIGHT)
        cue = obs[0, 1]
        assert act[steps - 1] == (UP if cue > 0 else DOWN)
        assert obs[steps - 1, 2] == 1.0  # the junction flag at the turn


@pytest.mark.parametrize("name", ["RepeatPrevious", "CountRecall", "StatelessCartPole"])
def test_popgym_oracles_earn_the_best_return_and_noise_lowers_it(name):
    task = popgym_task(name, "easy", segment_len=8)
    clean = jax.jit(lambda k: collect(task, k, 8, eps_max=0.0))(jax.random.key(0))
    np.testing.assert_allclose(np.asarray(clean["return"]), 1.0, atol=1e-4)
    noisy = jax.jit(lambda k: collect(task, k, 32, eps_max=1.0))(jax.random.key(1))
    assert float(noisy["return"].mean()) < 0.9


@pytest.mark.parametrize("arch", ["elmur", "transformer", "gru"])
def test_step_by_step_logits_equal_the_teacher_forced_ones(arch):
    policy = SeqPolicy(PolicyConfig(arch=arch, elmur=SMALL, gru_hidden=16), in_dim=6,
                       num_actions=3)
    params = policy.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (2, 12, 6))
    key = jax.random.key(2)
    full = policy.logits(params, x, key)

    def body(carry, x_t):
        logits, carry = policy.step(params, carry, x_t)
        return carry, logits

    _, steps = jax.lax.scan(body, policy.init_carry(key, 2), jnp.swapaxes(x, 0, 1))
    np.testing.assert_allclose(np.swapaxes(np.asarray(steps), 0, 1), np.asarray(full),
                               atol=2e-5, rtol=1e-4)


def test_only_elmur_carries_information_across_segments():
    x = jax.random.normal(jax.random.key(1), (1, 8, 6))
    x2 = x.at[0, 0].add(3.0)  # change a token of the first segment (segment_len = 4)
    changed = {}
    for arch in ("elmur", "transformer"):
        policy = SeqPolicy(PolicyConfig(arch=arch, elmur=SMALL), in_dim=6, num_actions=3)
        params = policy.init(jax.random.key(0))
        a = policy.logits(params, x, jax.random.key(2))[0, 4:]
        b = policy.logits(params, x2, jax.random.key(2))[0, 4:]
        changed[arch] = float(jnp.abs(a - b).max())
    assert changed["transformer"] == 0.0
    assert changed["elmur"] > 1e-4


def test_train_is_vmappable_and_lowers_the_loss():
    task = tmaze_task(1, 10, segment_len=4)
    cfg = RCBCConfig(num_episodes=32, batch_size=8, num_updates=60, log_every=20, lr=3e-3)
    train, policy = make_train(cfg, PolicyConfig(arch="elmur", elmur=SMALL), task)
    assert isinstance(policy, SeqPolicy) and policy.cfg.arch == "elmur"
    params, metrics = jax.jit(jax.vmap(train))(jax.random.split(jax.random.key(0), 2))
    loss = np.asarray(metrics["loss"])
    assert loss.shape == (2, 3)
    np.testing.assert_array_equal(np.asarray(metrics["nonfinite"]), 0)  # [2, 3] blocks
    assert (loss[:, -1] < 0.5 * loss[:, 0]).all(), loss
    np.testing.assert_allclose(np.asarray(metrics["data_return"]), 1.0)
    assert jax.tree.leaves(params)[0].shape[0] == 2


def test_evaluate_matches_a_python_loop():
    env, env_params = make_popgym("RepeatPrevious", "easy")
    task = popgym_task("RepeatPrevious", "easy", segment_len=4)
    policy = SeqPolicy(PolicyConfig(arch="gru", gru_hidden=8), token_dim(task), 4)
    params = policy.init(jax.random.key(0))
    key = jax.random.key(3)
    out = jax.jit(lambda p: evaluate(policy, p, env, env_params, key, 2, 60, 1.0))(params)
    # Reference: the same keys, one Python step at a time.
    k_reset, k_carry, k = jax.random.split(key, 3)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_reset, 2), env_params)
    carry, prev = policy.init_carry(k_carry, 2), -np.ones(2, int)
    rtg, ret, alive, length = np.ones(2), np.zeros(2), np.ones(2, bool), np.zeros(2, int)
    step = jax.jit(policy.step)
    for _ in range(60):
        k, _k_act, k_step = jax.random.split(k, 3)
        onehot = np.eye(4)[np.maximum(prev, 0)] * (prev >= 0)[:, None]
        x = jnp.asarray(np.concatenate([np.asarray(obs), rtg[:, None], onehot], 1), jnp.float32)
        logits, carry = step(params, carry, x)
        a = np.asarray(logits.argmax(-1))
        obs, state, r, term, trunc, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(k_step, 2), state, jnp.asarray(a), env_params)
        r = np.where(alive, np.asarray(r), 0.0)
        ret, rtg, length = ret + r, rtg - r, length + alive
        alive = alive & ~np.asarray(term | trunc)
        prev = a
        if not alive.any():
            break
    np.testing.assert_array_equal(np.asarray(out["length"]), length)
    assert (length == 51).all()  # RepeatPrevious easy: 52 cards, 51 steps
    np.testing.assert_allclose(np.asarray(out["return"]), ret, atol=1e-5)


def test_bad_settings_raise_one_line_errors():
    with pytest.raises(ValueError, match="log_every"):
        RCBCConfig(num_updates=10, log_every=3)
    with pytest.raises(ValueError, match="eps_max"):
        RCBCConfig(eps_max=1.5)
    with pytest.raises(ValueError, match="policy.arch"):
        SeqPolicy(PolicyConfig(arch="lstm"), 4, 2)
    task = dataclasses.replace(tmaze_task(1, 10, segment_len=4), horizon=13)
    with pytest.raises(ValueError, match="multiple of the segment length"):
        make_train(RCBCConfig(), PolicyConfig(elmur=SMALL), task)
    with pytest.raises(ValueError, match="min_length"):
        tmaze_task(5, 2, segment_len=4)


MESH_SCRIPT = """
import jax, numpy as np
assert jax.device_count() == 4, jax.devices()
from jaxrl_suite.algorithms.rcbc import PolicyConfig, RCBCConfig, tmaze_task, train_seeds
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.models.elmur import ELMURConfig
ecfg = ELMURConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, mem_slots=2, segment_len=4)
cfg = RCBCConfig(num_episodes=8, batch_size=4, num_updates=4, log_every=2)
task = tmaze_task(1, 6, 4)
_, plain = train_seeds(cfg, PolicyConfig(elmur=ecfg), task, 4)
params, sharded = train_seeds(cfg, PolicyConfig(elmur=ecfg), task, 4, mesh=make_mesh())
assert len(sharded["loss"].sharding.device_set) == 4, sharded["loss"].sharding
np.testing.assert_allclose(sharded["loss"], plain["loss"], rtol=2e-4)
print("OK")
"""


def test_seeds_split_over_a_four_device_mesh(run_on_host_devices):
    run_on_host_devices(MESH_SCRIPT, 4)


def test_gru_init_is_orthogonal_without_lapack_qr():
    # A batched LAPACK QR under vmap over seeds can deadlock XLA:CPU's pool on 2 cores.
    policy = SeqPolicy(PolicyConfig(arch="gru", gru_hidden=8), in_dim=5, num_actions=3)
    keys = jax.random.split(jax.random.key(0), 2)
    jaxpr = str(jax.make_jaxpr(jax.vmap(policy.init))(keys))
    assert not re.search(r"\bqr\b|geqrf|householder", jaxpr)
    core = policy.init(keys[0])["core"]["params"]
    for name in ("hr", "hz", "hn"):
        w = np.asarray(core[name]["kernel"])
        np.testing.assert_allclose(w.T @ w, np.eye(8), atol=1e-5)


def test_every_arch_is_a_registered_sequence_core():
    from jaxrl_suite.algorithms.rcbc import ARCHS, SEQUENCE_CORES
    from jaxrl_suite.core.registry import UnknownNameError

    assert set(SEQUENCE_CORES) == set(ARCHS)
    with pytest.raises(UnknownNameError, match="unknown policy.arch 'lstm'; known: elmur, gru"):
        SEQUENCE_CORES.get("lstm")

"""GRPO with the entropy regularisers and the high-entropy-only update wired through the config."""

import dataclasses

import jax
import numpy as np
import pytest

from jaxrl_suite.algorithms.grpo import UNSET_ANCHOR, GRPOTrainer
from jaxrl_suite.algorithms.grpo_config import GRPOConfig
from jaxrl_suite.core.checkpoint import Checkpointer
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text import ArithmeticTask
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.models import CausalLM, LMConfig

BASE = GRPOConfig(prompts_per_step=2, group_size=4, max_new_tokens=6, lr=1e-3)


@pytest.fixture(scope="module")
def setup():
    model = CausalLM(LMConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32))
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, 8), np.int32))
    return model, params, load_tokenizer(), ArithmeticTask(digits=1)


def one_step(setup, cfg, anchor_from_policy=False):
    model, params, tok, task = setup
    trainer = GRPOTrainer(model, tok, task, cfg, mesh=make_mesh(1), prompt_len=8)
    state = trainer.init_state(params, jax.random.PRNGKey(1))
    anchor = None
    if anchor_from_policy:
        anchor = trainer.measure_anchor(state, trainer.batch(0))
        state = trainer.init_state(params, jax.random.PRNGKey(1), anchor=anchor)
    _, metrics = trainer.step(state, trainer.batch(0))
    return metrics, anchor


def test_naive_bonus_adds_minus_coef_times_the_entropy(setup):
    m, _ = one_step(setup, dataclasses.replace(BASE, entropy_reg="naive", entropy_coef=0.05))
    assert m["entropy"] > 0
    assert m["entropy_reg"] == pytest.approx(-0.05 * m["entropy"], rel=1e-5)


def test_siren_logs_its_metrics_and_a_fixed_anchor_sets_the_penalty(setup):
    cfg = dataclasses.replace(BASE, entropy_reg="siren", entropy_coef=2.0, siren_anchor=0.1,
                              siren_top_p=0.9, siren_quantile=0.5)
    m, _ = one_step(setup, cfg)
    assert m["anchor"] == pytest.approx(0.1)
    assert 0.0 < m["masked_fraction"] <= 0.55  # tokens at or above the median entropy
    assert m["siren_entropy"] >= m["top_p_entropy"] * 0.999  # the peak tokens' mean is higher
    assert m["entropy_reg"] == pytest.approx(2.0 * (m["siren_entropy"] - 0.1) ** 2, rel=1e-5)


def test_anchor_measured_on_the_same_rollout_gives_zero_penalty(setup):
    cfg = dataclasses.replace(BASE, entropy_reg="siren", entropy_coef=1.0)
    m, anchor = one_step(setup, cfg, anchor_from_policy=True)
    assert anchor > 0 and m["anchor"] == pytest.approx(anchor)
    assert m["siren_entropy"] == pytest.approx(anchor, rel=1e-5)
    assert m["entropy_reg"] == pytest.approx(0.0, abs=1e-8)


def test_unset_siren_anchor_is_measured_on_the_initial_policys_first_batch(setup):
    model, params, tok, task = setup
    cfg = dataclasses.replace(BASE, entropy_reg="siren", entropy_coef=1.0)
    trainer = GRPOTrainer(model, tok, task, cfg, mesh=make_mesh(1), prompt_len=8)
    state = trainer.init_state(params, jax.random.PRNGKey(1))
    given = trainer.init_state(params, jax.random.PRNGKey(1), anchor=0.5)  # same params and key
    measured = trainer.measure_anchor(given, trainer.batch(0))
    assert measured > 0 and float(state.anchor) == np.float32(measured)
    assert float(given.anchor) == 0.5  # a given anchor is kept


def test_the_anchor_lives_in_the_checkpointed_state_not_on_the_trainer(setup, tmp_path):
    model, params, tok, task = setup
    cfg = dataclasses.replace(BASE, entropy_reg="siren", entropy_coef=1.0, siren_anchor=0.25)
    trainer = GRPOTrainer(model, tok, task, cfg, mesh=make_mesh(1), prompt_len=8)
    state = trainer.init_state(params, jax.random.PRNGKey(1))
    assert float(state.anchor) == 0.25  # the config's anchor
    measured = trainer.measure_anchor(state, trainer.batch(0))
    assert measured > 0 and not hasattr(trainer, "anchor")  # measuring changes nothing
    assert float(state.anchor) == 0.25
    state = trainer.init_state(params, jax.random.PRNGKey(1), anchor=measured)
    state, m = trainer.step(state, trainer.batch(0))
    assert m["anchor"] == pytest.approx(measured) and float(state.anchor) == np.float32(measured)
    ckpt = Checkpointer(tmp_path / "ckpt")
    ckpt.save(1, state, force=True)
    restored, _ = ckpt.restore(trainer.init_state(params, jax.random.PRNGKey(1)))
    ckpt.close()
    assert type(restored) is type(state) and float(restored.anchor) == float(state.anchor)
    assert int(restored.step) == 1


def test_siren_without_an_anchor_is_a_clear_error(setup):
    model, params, tok, task = setup
    cfg = dataclasses.replace(BASE, entropy_reg="siren", entropy_coef=1.0)
    trainer = GRPOTrainer(model, tok, task, cfg, mesh=make_mesh(1), prompt_len=8)
    state = trainer.init_state(params, jax.random.PRNGKey(1), anchor=UNSET_ANCHOR)  # never set
    with pytest.raises(ValueError, match="siren_anchor"):
        trainer.step(state, trainer.batch(0))


def test_high_entropy_only_keeps_the_top_fraction_of_tokens(setup):
    m, _ = one_step(setup, dataclasses.replace(BASE, high_entropy_quantile=0.8))
    assert 0.15 <= m["pg_token_frac"] <= 0.35


@pytest.mark.parametrize("field, value", [("siren_quantile", 1.5),
                                          ("high_entropy_quantile", -0.1),
                                          ("siren_top_p", 0.0)])
def test_bad_entropy_settings_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(BASE, **{field: value})

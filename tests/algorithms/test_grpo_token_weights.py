"""Per-token weights through the trainer: `GRPOTrainer.update(..., token_weights=)` reaches the
policy loss (`GRPOBatch.token_weights` -> `losses.objective.grpo_objective` -> `grpo_loss`).

One tiny CausalLM and one rollout (4 prompts x 4 completions of 6 tokens) with spread rewards;
beta = 0 and no entropy regulariser, so the pg term is the whole loss. AdamW's first step is
about lr * sign(grad), so parameters are compared at a tolerance of a small share of lr.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxrl_suite.algorithms.grpo import GRPOTrainer
from jaxrl_suite.algorithms.grpo_config import GRPOConfig
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text import ArithmeticTask
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.models import CausalLM, LMConfig

LR = 1e-2
CONFIG = GRPOConfig(prompts_per_step=4, group_size=4, max_new_tokens=6, lr=LR,
                    loss_type="dapo", clip_eps_high=0.28)


@pytest.fixture(scope="module")
def rollout():
    model = CausalLM(LMConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=64))
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, 8), np.int32))
    trainer = GRPOTrainer(model, load_tokenizer(), ArithmeticTask(digits=1), CONFIG,
                          mesh=make_mesh(1), prompt_len=8)
    state = trainer.init_state(params, jax.random.PRNGKey(1))
    seq, old_logp, rewards, info = trainer.rollout(state, trainer.batch(0))
    rewards = np.random.RandomState(0).rand(*rewards.shape).astype(np.float32)
    return trainer, state, (seq, old_logp, rewards, info)


def leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves(state.params)]


def test_unit_weights_give_the_unweighted_update(rollout):
    trainer, state, args = rollout
    plain, m_plain = trainer.update(state, *args)
    ones, m_ones = trainer.update(state, *args, token_weights=np.ones((16, 6), np.float32))
    for x, y in zip(leaves(plain), leaves(ones), strict=True):
        np.testing.assert_array_equal(y, x)
    assert m_ones["loss"] == m_plain["loss"] and m_ones["grad_norm"] == m_plain["grad_norm"]


def test_zero_weights_give_the_update_with_those_tokens_masked_out(rollout):
    trainer, state, (seq, old_logp, rewards, info) = rollout
    mask = np.asarray(seq.completion_mask)
    weights = np.ones_like(mask)
    weights[:, 2:] = 0.0  # only the first two tokens of each completion train
    weights[1::2, 1] = 0.0
    assert 0 < (mask * weights).sum() < mask.sum()
    plain, m_p = trainer.update(state, seq, old_logp, rewards, info)
    weighted, m_w = trainer.update(state, seq, old_logp, rewards, info, token_weights=weights)
    masked, m_m = trainer.update(state, seq._replace(loss_mask=mask * weights), old_logp,
                                 rewards, info)
    np.testing.assert_allclose(m_w["pg_loss"], m_m["pg_loss"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(m_w["grad_norm"], m_m["grad_norm"], rtol=1e-5)
    for x, y in zip(leaves(masked), leaves(weighted), strict=True):
        np.testing.assert_allclose(y, x, rtol=0, atol=0.05 * LR)
    # the weights did change the update
    assert max(np.abs(x - y).max() for x, y in zip(leaves(plain), leaves(weighted),
                                                    strict=True)) > 0.5 * LR
    assert abs(m_w["grad_norm"] - m_p["grad_norm"]) > 1e-4

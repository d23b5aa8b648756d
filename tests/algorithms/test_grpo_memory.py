"""Issue 17's trainer memory options give the update of the plain trainers.

One tiny CausalLM (d_model 32, 1 layer), one rollout shape (4 prompts x 4 completions of 6
tokens) shared by every trainer: gradient micro-batches (grpo.memory.train_micro_batch),
chunked log-probs (logprob_chunk 4: a full chunk and a remainder of 2), log-prob row
micro-batches, TIS with a bf16 rollout sampler (grpo.rollout.dtype) in chunks, and the SFT step
likewise. AdamW's first step is about lr * sign(grad), so parameters are compared at a
tolerance of a small share of lr.
"""

import dataclasses

import jax
import numpy as np
import pytest

from jaxrl_suite.algorithms.grpo import GRPOTrainer
from jaxrl_suite.algorithms.grpo_config import GRPOConfig, MemoryConfig
from jaxrl_suite.algorithms.sft import SFTConfig, SFTTrainer
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text import ArithmeticTask
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.models import CausalLM, LMConfig
from jaxrl_suite.sampling.engines import EngineOptions

LR = 1e-2
BASE = GRPOConfig(prompts_per_step=4, group_size=4, max_new_tokens=6, lr=LR, beta=0.1,
                  entropy_reg="naive", entropy_coef=0.05)
TIMING = ("tokens_per_s", "update_time", "gen_time")


@pytest.fixture(scope="module")
def setup():
    model = CausalLM(LMConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=64))
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, 8), np.int32))
    return model, params, load_tokenizer(), ArithmeticTask(digits=1)


def make(setup, **changes):
    model, params, tok, task = setup
    trainer = GRPOTrainer(model, tok, task, dataclasses.replace(BASE, **changes),
                          mesh=make_mesh(1), prompt_len=8, ref_params=params)
    return trainer, trainer.init_state(params, jax.random.PRNGKey(1))


@pytest.fixture(scope="module")
def plain(setup):
    """The plain trainer, one float32 rollout with spread rewards, and its update."""
    trainer, state = make(setup)
    seq, old_logp, rewards, info = trainer.rollout(state, trainer.batch(0))
    rewards = np.random.RandomState(0).rand(*rewards.shape).astype(np.float32)
    rollout = (seq, old_logp, rewards, info)
    return trainer, state, rollout, trainer.update(state, *rollout)


def assert_same_update(a, b, metrics=True):
    (sa, ma), (sb, mb) = a, b
    for key in ("loss", "grad_norm", "pg_loss", "kl", "entropy") if metrics else ("grad_norm",):
        np.testing.assert_allclose(mb[key], ma[key], rtol=2e-5, atol=1e-6, err_msg=key)
    for x, y in zip(jax.tree.leaves(sa.params), jax.tree.leaves(sb.params), strict=True):
        np.testing.assert_allclose(y, x, rtol=0, atol=0.05 * LR)


def test_chunked_logprobs_and_micro_batches_give_the_plain_update(setup, plain):
    # logprob_chunk: no [B, T, V] logits; train_micro_batch: 4 micro-batches of 4 rows (the
    # naive entropy bonus and the token-mean metrics rescaled to the batch's token mean);
    # logprob_micro_batch: the reference log-probs 8 rows at a time.
    trainer, state, rollout, expected = plain
    other, _ = make(setup, memory=MemoryConfig(logprob_chunk=4, train_micro_batch=4,
                                               logprob_micro_batch=8))
    seq = rollout[0]
    np.testing.assert_allclose(other._logp(trainer.ref_params, seq),
                               trainer._logp(trainer.ref_params, seq), rtol=1e-5, atol=1e-6)
    got = other.update(state, *rollout)
    assert_same_update(expected, got)
    assert {k for k in got[1] if k not in TIMING} == {k for k in expected[1] if k not in TIMING}


@pytest.fixture(scope="module")
def tis(setup):
    return make(setup, tis=True, rollout=EngineOptions(dtype="bfloat16"),
                memory=MemoryConfig(rollout_micro_batch=8))


def test_tis_with_an_equal_precision_sampler_is_the_plain_update(plain, tis):
    # On the float32 rollout the trainer's recomputed old log-probs equal the sampler's up to
    # rounding, so w == 1 and the update is the plain one.
    _, state, rollout, expected = plain
    trainer, _ = tis
    got = trainer.update(state, *rollout)
    assert abs(got[1]["tis_weight"] - 1.0) < 1e-4 and got[1]["tis_capped_frac"] == 0.0
    assert_same_update(expected, got)


def test_a_bf16_sampler_in_chunks_is_corrected_by_tis(plain, tis):
    # The bf16 sampler runs the same params in two chunks of 8 rows (one compiled program);
    # its log-probs differ from the float32 trainer's, and TIS weighs the tokens by the ratio.
    _, state, _, _ = plain
    trainer, _ = tis
    assert trainer.sampler.model.config.dtype == "bfloat16"
    seq, old_logp, rewards, info = trainer.rollout(state, trainer.batch(0))
    assert old_logp.shape == (16, 6) and seq.completion.shape == (16, 6)
    assert trainer.sampler._generate._cache_size() == 1
    mask = np.asarray(seq.completion_mask) > 0
    train_logp = np.asarray(trainer._logp(state.params, seq))
    gap = np.abs(train_logp - np.asarray(old_logp))[mask]
    assert 0 < gap.max() < 0.5
    rewards = np.random.RandomState(0).rand(*rewards.shape).astype(np.float32)
    _, m = trainer.update(state, seq, old_logp, rewards, info)
    assert np.isfinite(m["loss"]) and m["finite"]
    assert 0.5 < m["tis_weight"] < 1.5 and 0.0 <= m["tis_capped_frac"] < 0.5


def test_sft_step_with_chunks_and_micro_batches_is_the_plain_step(setup):
    model, params, tok, task = setup
    steps = []
    for changes in ({}, {"logprob_chunk": 5, "train_micro_batch": 2}):
        cfg = SFTConfig(batch_size=8, lr=LR, warmup_steps=0, **changes)
        trainer = SFTTrainer(model, tok, task, cfg, mesh=make_mesh(1), prompt_len=8,
                             max_new_tokens=24)
        state = trainer.init_state(params, jax.random.PRNGKey(1))
        steps.append(trainer.step(state, trainer.batch(0)))
    (_, ma), (_, mb) = steps
    np.testing.assert_allclose(mb["tokens"], ma["tokens"])
    np.testing.assert_allclose(mb["nll"], ma["nll"], rtol=1e-5)
    assert_same_update(*steps, metrics=False)


def test_row_counts_must_divide_the_batch():
    with pytest.raises(ValueError,
                       match=r"grpo.memory.train_micro_batch=6 does not divide the 16 rows"):
        dataclasses.replace(BASE, memory=MemoryConfig(train_micro_batch=6))
    with pytest.raises(ValueError,
                       match=r"grpo.memory.rollout_micro_batch=3 does not divide the 16"):
        dataclasses.replace(BASE, memory=MemoryConfig(rollout_micro_batch=3))
    with pytest.raises(ValueError, match=r"sft.train_micro_batch=3 does not divide the 8 rows"):
        SFTConfig(batch_size=8, train_micro_batch=3)
    with pytest.raises(ValueError, match="grpo.rollout.dtype"):
        dataclasses.replace(BASE, rollout=EngineOptions(dtype="float16"))


def test_a_regulariser_that_needs_the_logits_cannot_be_chunked(monkeypatch):
    from jaxrl_suite.losses import REGULARIZERS
    from jaxrl_suite.losses.siren import regularizer_from_entropies

    monkeypatch.setitem(REGULARIZERS._entries, "logit_reg", lambda logits, mask, **kw: (0.0, {}))
    dataclasses.replace(BASE, entropy_reg="logit_reg")  # fine on the full logits
    with pytest.raises(ValueError, match=r"grpo.entropy_reg='logit_reg' needs the full logits: "
                                         r"set grpo.memory.logprob_chunk=0"):
        dataclasses.replace(BASE, entropy_reg="logit_reg", memory=MemoryConfig(logprob_chunk=4))
    with pytest.raises(ValueError, match="'logit_reg' needs the full logits"):
        regularizer_from_entropies("logit_reg", None, None, None, coef=0.0, quantile=0.8,
                                   anchor=0.0)


@pytest.mark.parametrize("changes", [
    dict(memory=MemoryConfig(rollout_micro_batch=4)),
    dict(rollout=EngineOptions(engine="continuous", slots=4, schedule="lpt"))])
def test_rollout_chunks_and_engines_draw_the_same_completions(setup, plain, changes):
    # Each row's key is derived from its (prompt, sample) index: sampling the rollout in chunks
    # of 4 rows, or in 4 continuously refilled slots, gives the plain rollout's completions.
    trainer, state, (seq, old_logp, _, _), _ = plain
    other, _ = make(setup, **changes)
    got_seq, got_logp, _, _ = other.rollout(state, other.batch(0))
    np.testing.assert_array_equal(got_seq.completion, seq.completion)
    np.testing.assert_array_equal(got_seq.completion_mask, seq.completion_mask)
    np.testing.assert_allclose(got_logp, old_logp, atol=1e-5)
    _, stats = other.sampler_metrics(state, got_seq, np.zeros((4, 4), np.float32))
    if "rollout" in changes:
        assert stats["rollout_slots"] == 4 and stats["rollout_decode_steps"] >= 5

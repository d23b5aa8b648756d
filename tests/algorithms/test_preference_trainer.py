"""algorithms.preference: DPO / ORPO on pairs of completions (ReST-DPO).

One tiny CausalLM (d_model 32, 1 layer) and one batch shape (8 pairs, prompts of 8 tokens,
completions of 20) for both trainers: DPO with the full logits, ORPO with chunked log-probs
(logprob_chunk 6: three chunks and a remainder of 2). Each trainer runs STEPS updates on the same
fixed pair set once (module-scoped), and the tests read that run.
"""

import math

import jax
import numpy as np
import pytest

from jaxrl_suite.algorithms.preference import (
    PreferenceConfig,
    PreferencePair,
    PreferenceTrainer,
)
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text import make_task
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.losses import dpo_loss, orpo_loss, token_logprobs
from jaxrl_suite.models import CausalLM, LMConfig
from jaxrl_suite.models.sequence import completion_logits

B, P, N = 8, 8, 20  # pairs per step, prompt length, completion budget
STEPS = 5
MODEL = CausalLM(LMConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=64))
CONFIGS = {
    "dpo": PreferenceConfig(loss="dpo", beta=0.1, lr=1e-2, batch_size=B, steps=STEPS),
    "orpo": PreferenceConfig(loss="orpo", lam=1.0, lr=1e-2, batch_size=B, steps=STEPS,
                             logprob_chunk=6),
}


@pytest.fixture(scope="module")
def setup():
    model = MODEL
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, P), np.int32))
    task = make_task("arithmetic", digits=1)
    pairs = []
    for i, ex in enumerate(task.examples("train", 0, B)):
        # near misses (a wrong sum) and malformed answers (no tags), as a sampler would give
        wrong = f"<answer>{int(ex.answer) + 1}</answer>" if i % 2 else ex.answer
        pairs.append(PreferencePair(ex, task.solution(ex), wrong))
    return model, params, load_tokenizer(), task, pairs


def train(setup, loss: str):
    """(trainer, states [STEPS + 1], metrics [STEPS]): the same batch every step, so each
    step's metrics are those of the batch under the params before it."""
    model, params, tok, task, pairs = setup
    trainer = PreferenceTrainer(model, tok, task, CONFIGS[loss], mesh=make_mesh(1),
                                prompt_len=P, max_new_tokens=N, ref_params=params, pairs=pairs)
    states = [trainer.init_state(params, jax.random.PRNGKey(1))]
    history = []
    for cursor in range(0, STEPS * B, B):
        state, metrics = trainer.step(states[-1], trainer.batch(cursor))
        states.append(state)
        history.append({k: float(v) for k, v in metrics.items()})
    return trainer, states, history


@pytest.fixture(scope="module")
def dpo(setup):
    return train(setup, "dpo")


@pytest.fixture(scope="module")
def orpo(setup):
    return train(setup, "orpo")


@pytest.fixture(params=sorted(CONFIGS))
def run(request):
    return request.getfixturevalue(request.param)


@jax.jit
def hand_logps(params, chosen, rejected):
    """Token log-probs [B, N] of chosen and rejected, each batch its own full forward."""
    return tuple(token_logprobs(completion_logits(MODEL, params, s), s.completion)
                 for s in (chosen, rejected))


def test_dpo_loss_is_log_2_at_the_reference(dpo):
    # policy = reference: every implicit reward is 0 (up to rounding between the two forwards)
    _, _, history = dpo
    first = history[0]
    np.testing.assert_allclose(first["loss"], math.log(2.0), rtol=1e-6)
    np.testing.assert_allclose(first["dpo_margin"], 0.0, atol=1e-6)
    np.testing.assert_allclose(first["dpo_chosen_reward"], 0.0, atol=1e-6)
    np.testing.assert_allclose(first["dpo_rejected_reward"], 0.0, atol=1e-6)


def test_steps_raise_the_margin_and_lower_the_loss(run):
    trainer, states, history = run
    prefix = trainer.config.loss
    margin = "dpo_margin" if prefix == "dpo" else "orpo_log_odds_margin"
    first, last = history[0], history[-1]
    assert last["loss"] < first["loss"]
    assert np.all(np.diff([m[margin] for m in history]) > 0)  # rises at every step
    assert last[f"{prefix}_accuracy"] > first[f"{prefix}_accuracy"]
    assert all(m["finite"] for m in history)
    assert int(states[-1].step) == STEPS
    assert history[0]["tokens"] == float(sum(
        mask.sum() for mask in (s.completion_mask for s in trainer.pair_batch(trainer.batch(0)))))
    assert trainer._update._cache_size() == 1  # one compile for the whole run


def test_step_loss_equals_the_loss_by_hand(run, setup):
    # The last step's loss, at the params before it (trained: margins are not 0), recomputed
    # with separate full-logit forwards of chosen and rejected and the loss function itself.
    trainer, states, history = run
    _, params, _, _, pairs = setup
    chosen, rejected = trainer.pair_batch(pairs)
    logp_w, logp_l = hand_logps(states[-2].params, chosen, rejected)
    if trainer.config.loss == "dpo":
        ref_w, ref_l = hand_logps(params, chosen, rejected)
        loss, metrics = dpo_loss(logp_w, chosen.completion_mask, logp_l, rejected.completion_mask,
                                 ref_w, ref_l, beta=trainer.config.beta)
        assert abs(float(metrics["dpo_margin"])) > 1e-3
    else:
        loss, metrics = orpo_loss(logp_w, chosen.completion_mask, logp_l,
                                  rejected.completion_mask, lam=trainer.config.lam)
    for name, value in metrics.items():
        np.testing.assert_allclose(history[-1][name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(history[-1]["loss"], loss, rtol=1e-5, atol=1e-6)


def test_batch_is_deterministic_and_cyclic(run, setup):
    trainer, _, _ = run
    pairs = setup[-1]
    assert trainer.batch(0) == pairs
    assert trainer.batch(3) == pairs[3:] + pairs[:3]
    assert trainer.batch(3 + 2 * B) == trainer.batch(3)


def test_bad_configs_are_one_line_errors(setup):
    model, _, tok, task, _ = setup
    with pytest.raises(ValueError, match=r"^preference.loss must be one of \['dpo', 'orpo'\], "
                                         r"got 'ipo'$"):
        PreferenceConfig(loss="ipo")
    with pytest.raises(ValueError, match=r"^preference.loss='dpo' needs reference params"):
        PreferenceTrainer(model, tok, task, PreferenceConfig(), mesh=make_mesh(1),
                          prompt_len=P, max_new_tokens=N)
    with pytest.raises(ValueError, match="'preference.beta' must be > 0, got 0.0"):
        PreferenceConfig(beta=0.0)
    for make in (lambda: PreferenceConfig(loss="ipo"), lambda: PreferenceConfig(beta=-1.0)):
        with pytest.raises(ValueError) as err:
            make()
        assert "\n" not in str(err.value)
    # ORPO needs no reference model
    PreferenceTrainer(model, tok, task, PreferenceConfig(loss="orpo"), mesh=make_mesh(1),
                      prompt_len=P, max_new_tokens=N)


def test_completions_cut_at_max_new_tokens_keep_their_tokens(dpo):
    """A sample that filled max_new_tokens without EOS is encoded as sampled (no EOS added);
    a shorter one gets its EOS."""
    trainer = dpo[0]
    n, tok = trainer.max_new_tokens, trainer.tokenizer
    long_text, short = "7" * (n + 5), "12"
    ids, mask = trainer._encode_completions([long_text, short])
    assert ids.shape == (2, n) and mask[0].sum() == n and tok.eos_id not in ids[0]
    assert list(ids[1, :3]) == tok.encode(short) + [tok.eos_id] and mask[1].sum() == 3

"""GRPO through the registries: it learns, each variant is picked by name, mu is one scan.

One tiny CausalLM and one batch shape (4 prompts x 8 completions of 6 tokens) for every trainer
here. The task is trivially easy and its reward dense: the share of a completion's characters
that are ASCII letters or digits (about 0.15 under the random initial policy), so a rollout's
groups have spread and every estimator sees non-zero advantages.
"""

import copy
import dataclasses

import jax
import numpy as np
import pytest

from jaxrl_suite.algorithms.grpo import GRPOTrainer
from jaxrl_suite.algorithms.grpo_config import GRPOConfig
from jaxrl_suite.core.config import ConfigError, from_dict
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text import ArithmeticTask
from jaxrl_suite.envs.text.base import Verdicts
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.losses import ADVANTAGES, POLICY_LOSSES, REGULARIZERS
from jaxrl_suite.models import CausalLM, LMConfig

N = 6  # completion tokens
BASE = GRPOConfig(prompts_per_step=4, group_size=8, max_new_tokens=N, lr=5e-2)


@dataclasses.dataclass(frozen=True)
class AlnumTask(ArithmeticTask):
    """Arithmetic prompts; reward = share of the N completion characters that are alphanumeric."""

    def score(self, completion, ex):
        return sum(ch.isascii() and ch.isalnum() for ch in completion) / N


@pytest.fixture(scope="module")
def setup():
    model = CausalLM(LMConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32))
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, 8), np.int32))
    return model, params, load_tokenizer(), AlnumTask(digits=1)


def make(setup, **changes):
    model, params, tok, task = setup
    trainer = GRPOTrainer(model, tok, task, dataclasses.replace(BASE, **changes),
                          mesh=make_mesh(1), prompt_len=8)
    return trainer, trainer.init_state(params, jax.random.PRNGKey(1))


@pytest.fixture(scope="module")
def grpo(setup):
    return make(setup)


def mean_reward(trainer, state, rollouts=4):
    """Mean reward of `rollouts` fixed-key rollouts on held-out prompts (the training shape)."""
    b = BASE.prompts_per_step
    return float(np.mean([
        trainer.rollout(state, trainer.task.examples("test", b * k, b),
                        key=jax.random.PRNGKey(100 + k))[2].mean() for k in range(rollouts)]))


def test_grpo_raises_the_mean_reward_in_six_steps(grpo):
    # GRPO against its control, the same six steps with the advantages negated (same rollout
    # keys). Measured before issue 18's per-sequence keys: 0.151 -> 0.232 (negated: -> 0.098);
    # with them: 0.150 -> 0.189 (negated: -> 0.039).
    trainer, start = grpo
    before = mean_reward(trainer, start)
    after = {}
    for sign in (1.0, -1.0):
        state = start
        for n in range(6):
            seq, old_logp, rewards, info = trainer.rollout(
                state, trainer.batch(BASE.prompts_per_step * n))
            state, m = trainer.update(state, seq, old_logp, rewards, info,
                                      advantages=sign * trainer.group_advantages(rewards))
            assert np.isfinite(m["loss"]) and m["grad_norm"] > 0
        after[sign] = mean_reward(trainer, state)
        assert int(state.step) == 6
    assert 0.1 < before < 0.22
    assert after[1.0] > before, (before, after)  # GRPO raises the mean reward ...
    assert after[1.0] > after[-1.0] + 0.05, (before, after)  # ... by its gradient's direction


def test_mu_inner_steps_are_one_scan_with_averaged_metrics(setup, grpo):
    # mu = 2 on one rollout equals two mu = 1 updates on it; the metrics are the mean of the two
    # steps' (not the last one's), and `step` counts one GRPO iteration.
    trainer, state = grpo
    trainer2, state2 = make(setup, mu=2)
    examples = trainer.batch(0)
    rollout = trainer.rollout(state, examples)
    np.testing.assert_array_equal(trainer2.rollout(state2, examples)[2], rollout[2])
    s, m_a = trainer.update(state, *rollout)
    s, m_b = trainer.update(s, *rollout)
    s2, m2 = trainer2.update(state2, *rollout)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6),
                 s.params, s2.params)
    assert int(s2.step) == 1 and int(s.step) == 2
    for k in ("loss", "pg_loss", "ratio", "grad_norm", "entropy"):
        np.testing.assert_allclose(m2[k], (m_a[k] + m_b[k]) / 2, rtol=1e-4, atol=1e-7, err_msg=k)
    assert m_a["ratio"] != m_b["ratio"]  # the second inner step is off-policy


@pytest.mark.parametrize("field, value, registry", [
    ("policy_loss", "ppo", POLICY_LOSSES), ("advantage", "gae", ADVANTAGES),
    ("entropy_reg", "max_ent", REGULARIZERS)])
def test_an_unknown_name_is_a_one_line_error_listing_the_valid_ones(field, value, registry):
    with pytest.raises(ConfigError) as err:
        from_dict(GRPOConfig, {field: value})
    message = str(err.value)
    assert "\n" not in message and f"{field}: unknown" in message and repr(value) in message
    assert all(name in message for name in registry.names()), message


def test_every_advantage_name_reaches_the_trainer(setup, grpo):
    trainer, state = grpo
    rewards = trainer.rollout(state, trainer.batch(0))[2]  # [B, G]
    assert rewards.std(axis=1).min() > 0
    got = {}
    for name in ADVANTAGES:
        t, _ = make(setup, advantage=name)
        got[name] = t.group_advantages(rewards)
        want = ADVANTAGES.get(name)(rewards, scale=BASE.adv_scale, eps=BASE.adv_eps)
        np.testing.assert_allclose(got[name], np.asarray(want).reshape(-1), rtol=1e-6)
    r = rewards.astype(np.float64)
    np.testing.assert_allclose(got["rloo"], (8 / 7 * (r - r.mean(1, keepdims=True))).ravel(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["reinforce_pp"],
                               ((r - r.mean()) / (r.std(ddof=1) + 1e-4)).ravel(), rtol=1e-5)
    for name in POLICY_LOSSES:
        assert make(setup, policy_loss=name)[0].config.policy_loss == name


def test_gspo_step_with_rloo_clips_sequences_at_the_papers_range(setup):
    # mu = 2: the second inner step is off-policy; GSPO's range (3e-4, 4e-4) clips sequences
    # whose length-normalised ratio moved more than that.
    trainer, state = make(setup, policy_loss="gspo", advantage="rloo", clip_eps=3e-4,
                          clip_eps_high=4e-4, mu=2)
    state, m = trainer.step(state, trainer.batch(0))
    assert m["finite"] and int(state.step) == 1 and m["grad_norm"] > 0
    assert 0 < m["clip_frac"] < 0.5 and m["ratio"] != 1.0


def test_cispo_step_with_reinforce_pp_is_the_weighted_log_prob(setup):
    # mu = 1, on-policy: the weight is 1, so pg_loss = -sum(A * logp * m) / sum(m) (dapo), with
    # A the batch-normalised rewards and logp the sampler's log-probs (equal up to float noise).
    trainer, state = make(setup, policy_loss="cispo", advantage="reinforce_pp", clip_eps=1.0,
                          clip_eps_high=0.28, loss_type="dapo")
    seq, old_logp, rewards, info = trainer.rollout(state, trainer.batch(0))
    new, m = trainer.update(state, seq, old_logp, rewards, info)
    r = rewards.astype(np.float64).ravel()
    adv = (r - r.mean()) / (r.std(ddof=1) + 1e-4)  # [B*G]
    mask, logp = np.asarray(seq.completion_mask), np.asarray(old_logp, np.float64)
    want = -(adv[:, None] * np.where(mask > 0, logp, 0.0)).sum() / mask.sum()
    assert m["pg_loss"] == pytest.approx(want, rel=1e-4)
    assert m["clip_frac"] == 0.0 and m["ratio"] == pytest.approx(1.0, abs=1e-5)
    assert int(new.step) == 1 and m["grad_norm"] > 0


@dataclasses.dataclass(frozen=True)
class DesignedRewardTask(AlnumTask):
    """A task with its own training reward (Verdicts.rewards) and logged components: reward =
    10 * alnum share - 3, labelled by whether the completion starts with a digit."""

    def verify_batch(self, completions, examples):
        scores = [self.score(c, e) for c, e in zip(completions, examples, strict=True)]
        return Verdicts(scores, ["digit" if c[:1].isdigit() else "other" for c in completions],
                        rewards=[10 * s - 3 for s in scores],
                        components={"alnum": scores, "const": [1.0] * len(scores)})


def test_a_designed_reward_replaces_score_plus_format_and_its_components_are_logged(grpo):
    trainer, state = grpo
    task = DesignedRewardTask(digits=1)
    designed = trainer.with_task(task)
    examples = trainer.batch(0)
    key = jax.random.PRNGKey(7)
    seq, _, plain, _ = trainer.rollout(state, examples, key=key)
    seq2, old_logp, rewards, info = designed.rollout(state, examples, key=key)
    np.testing.assert_array_equal(seq.completion, seq2.completion)  # the same samples
    np.testing.assert_allclose(rewards, 10 * plain - 3, rtol=1e-5, atol=1e-5)
    assert info["reward_alnum"] == pytest.approx(plain.mean(), abs=1e-6)
    assert info["reward_const"] == 1.0
    digit = info.get("outcome_digit", 0.0)
    assert digit + info.get("outcome_other", 0.0) == pytest.approx(1.0)
    want = 0.0 if digit in (0.0, 1.0) else -(digit * np.log2(digit)
                                             + (1 - digit) * np.log2(1 - digit))
    assert info["outcome_entropy"] == pytest.approx(want)
    _, m = designed.update(state, seq2, old_logp, rewards, info)
    assert m["reward"] == pytest.approx(rewards.mean())
    assert (m["reward_alnum"], m["outcome_entropy"]) == (info["reward_alnum"],
                                                         info["outcome_entropy"])
    assert "collapse" not in m  # grpo.collapse_entropy = 0: the guard is off


def test_the_collapse_guard_warns_once_from_the_verdict_in_the_state(grpo, capsys):
    trainer, state = grpo
    # the guard reads grpo.collapse_entropy on the host: a copy with it on shares the update
    guarded = copy.copy(trainer)
    guarded.config = dataclasses.replace(trainer.config, collapse_entropy=0.5)
    seq, old_logp, rewards, info = trainer.rollout(state, trainer.batch(0))
    low = dict(info, outcome_entropy=0.1)  # below 0.5 bits: a collapse
    assert not state.collapsed
    s1, m1 = guarded.update(state, seq, old_logp, rewards, low)
    assert m1["collapse"] == 1.0 and s1.collapsed and capsys.readouterr().out.count("WARNING") == 1
    s2, _ = guarded.update(s1, seq, old_logp, rewards, low)  # still collapsed: no new warning
    assert s2.collapsed and "WARNING" not in capsys.readouterr().out
    guarded.update(state, seq, old_logp, rewards, low)  # from a state before it: warns again
    assert capsys.readouterr().out.count("WARNING") == 1
    s3, m3 = guarded.update(s2, seq, old_logp, rewards, dict(info, outcome_entropy=0.9))
    assert m3["collapse"] == 0.0 and not s3.collapsed

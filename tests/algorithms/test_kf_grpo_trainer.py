"""KF-GRPO's trainer (algorithms/kf_grpo.py) around a stub GRPO trainer whose rollouts answer by
a fixed rule per view (the contrast views built from the same videos, the rewards handed to the
update equal the reward equation with the saliency computed here), and the learned selector on a
tiny VLM: its forward pass equals the runner's own scoring of the chosen frames' prompts."""

import dataclasses
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.algorithms.kf_grpo import (
    KFGRPOConfig,
    KFGRPOTrainer,
    SelectorConfig,
    SelectorTrainer,
)
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.envs.vision import VideoQATask, uniform_frames, with_frames
from jaxrl_suite.models import VisionConfig, VisionLM, VLMConfig
from jaxrl_suite.sampling import LMRunner, repeat_each
from jaxrl_suite.sampling.keyframes import frame_saliency, saliency_mass, soft_topk

G = 4


class StubGRPO:
    """Rollouts whose texts follow a rule per view: ordered prompt 0 right on even rows, prompt
    1 always right; shuffled frames always wrong; uniform frames right on prompt 0 only."""

    config = SimpleNamespace(group_size=G, dynamic_sampling=False)

    def __init__(self, task):
        self.task, self.calls = task, []

    def use_sampler_state(self, state):
        pass

    def rollout(self, state, examples, *, group_size=None, key=None):
        g = group_size or G
        rows = repeat_each(examples, g)
        self.calls.append((list(examples), g))
        texts = []
        for j, ex in enumerate(rows):
            p, frames = j // g, ex.meta.frames
            if list(frames) != sorted(frames):
                right = False  # shuffled
            elif list(frames) == list(uniform_frames(32, 4)):
                right = p == 0
            else:
                right = p == 1 or j % 2 == 0
            texts.append(f"<answer>{ex.answer if right else 'none'}</answer>")
        v = self.task.verify_batch(texts, rows)
        rewards = np.array(v.rewards).reshape(-1, g)
        correct = (np.array(v.scores) == 1.0).reshape(-1, g)
        info = {"tokens": len(rows), "accuracy": 0.0, "length": 1.0, "correct": correct}
        return SimpleNamespace(), None, rewards, info

    def group_advantages(self, rewards):
        return (rewards - rewards.mean(axis=1, keepdims=True)).reshape(-1)

    def update(self, state, seq, old_logp, rewards, info, *, advantages=None, t0=None):
        self.seen = (rewards, advantages)
        return state, {"reward": float(rewards.mean()), "tokens": info["tokens"],
                       "gen_time": 1.0}


def test_kf_grpo_step_wires_the_reward():
    task = VideoQATask(frames="oracle")
    examples = [task.example("train", i) for i in (0, 2)]  # content and count: evidence
    stub = StubGRPO(task)
    state = SimpleNamespace(rng=jax.random.key_data(jax.random.key(0)), step=0)
    _, metrics = KFGRPOTrainer(stub, KFGRPOConfig(contrast_group=2)).step(state, examples)
    (ordered, g0), (mixed, g1), (uniform, g2) = stub.calls
    assert (g0, g1, g2) == (G, 2, 2) and ordered == examples
    for ex, m, u in zip(examples, mixed, uniform, strict=True):
        assert sorted(m.meta.frames) == list(ex.meta.frames) != list(m.meta.frames)
        assert m.meta.video == u.meta.video == ex.meta.video
        assert u.meta.frames == tuple(uniform_frames(32, 4))
    base = np.array([[1.5, 0.5, 1.5, 0.5], [1.5] * 4])  # accuracy + 0.5 format
    m1 = saliency_mass(frame_saliency(examples[1].meta.video.render()),
                       examples[1].meta.frames, 4)
    # prompt 0: p 0.5 < q = max(0, 1) + 1/8, no bonus; prompt 1: p 1 >= max(0, 0) + 1/8
    want = base + np.array([[0.0] * 4, [0.3 * m1] * 4])
    rewards, advantages = stub.seen
    np.testing.assert_allclose(rewards, want, atol=1e-6)
    np.testing.assert_allclose(advantages, stub.group_advantages(want), atol=1e-6)
    assert metrics["gate_rate"] == 0.5 and metrics["ordered_accuracy"] == 0.75
    assert metrics["shuffled_accuracy"] == 0.0 and metrics["uniform_accuracy"] == 0.5
    assert metrics["base_reward"] == pytest.approx(base.mean())
    assert metrics["bonus"] == pytest.approx((want - base).mean())
    # T-GRPO: the shuffled view alone, no saliency
    stub = StubGRPO(task)
    KFGRPOTrainer(stub, KFGRPOConfig(views=("shuffled",), contrast_group=2, ratio=0.8,
                                     margin=0.0, saliency=False)).step(state, examples)
    np.testing.assert_allclose(stub.seen[0], base + 0.3 * np.array([[1, 0, 1, 0], [1] * 4]))
    with pytest.raises(ValueError, match="views"):
        KFGRPOConfig(views=("shuffled", "shuffled"))
    stub.config = SimpleNamespace(group_size=G, dynamic_sampling=True)
    with pytest.raises(ValueError, match="dynamic_sampling"):
        KFGRPOTrainer(stub)


CONFIG = VLMConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_len=256,
                   mrope_section=(2, 3, 3),
                   vision=VisionConfig(embed_dim=16, depth=1, n_heads=2, mlp_ratio=2,
                                       out_dim=32))


def test_selector_forward_is_the_chosen_frames_prompt():
    model = VisionLM(CONFIG)
    vlm = model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    runner = LMRunner(model, load_tokenizer(), VideoQATask(), mesh=make_mesh(1), prompt_len=192,
                      max_new_tokens=34)
    sel = SelectorTrainer(runner, dataclasses.replace(SelectorConfig(), batch_size=2), k=4)
    scorer, opt = sel.init(jax.random.key(1))
    examples = runner.task.examples("train", 0, 2)
    feats, frames, seq = sel.inputs(examples)
    key = jax.random.key(2)
    new, _, loss = sel._step(scorer, opt, vlm, feats, frames, seq, key)
    # the straight-through forward picks the hard top-k of logits + the same Gumbel noise
    w = soft_topk(sel.scorer.apply(scorer, feats), 4, key)
    shown = [with_frames(ex, np.argmax(np.asarray(wb), axis=1))
             for ex, wb in zip(examples, w, strict=True)]
    logp, mask = runner.score(vlm, shown)
    assert float(loss) == pytest.approx(-(logp * mask).sum() / mask.sum(), rel=1e-4)
    assert all(list(s.meta.frames) == sorted(s.meta.frames) for s in shown)
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), new, scorer))
    assert max(moved) > 0  # the answer loss reaches the scorer
    pick = sel.select(scorer)(examples[0].meta.video)
    assert len(pick) == 4 and list(pick) == sorted(pick)

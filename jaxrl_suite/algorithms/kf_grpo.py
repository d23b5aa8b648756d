"""KF-GRPO and the learned keyframe selector (ChronoForge-RL, our reconstruction).

KF-GRPO (`rewards.kf_grpo`, `KFGRPOTrainer`): GRPO on video questions whose
reward adds a saliency-scaled bonus for correct rollouts on the chosen frames in temporal order
when they beat contrast views of the same question: the same frames shuffled (temporal order)
and k uniform frames (frame content). The contrast rollouts are sampled and scored, never
trained on; the update is GRPO's on the ordered rollouts with advantages from the new rewards
(`GRPOTrainer.update(advantages=)`). With views ("shuffled",), no saliency and
`rewards.kf_grpo.T_GRPO`'s constants it is Video-R1's T-GRPO.

The differentiable keyframe selection (`SelectorTrainer`): a `sampling.keyframes.FrameScorer`
over per-frame features (`scorer_features`) gives logits; `soft_topk` turns them into k
straight-through one-hot rows W [k, T] in temporal order; the prompt's image slots take
W @ (every frame's patches) (patchify is affine, so this is the patchified mix of frames, and
exactly the chosen frames in the forward pass); the loss is the frozen VLM's answer NLL
(`losses.sft_loss` of the solution tokens). Only the scorer trains. At test time the k largest
logits (no noise) choose the frames (`SelectorTrainer.select`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Annotated

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_suite.algorithms.grpo import GRPOTrainer, GRPOTrainState
from jaxrl_suite.core.config import Count, NonNegative, Positive, Range, check_fields
from jaxrl_suite.core.parallel import shard_batch
from jaxrl_suite.envs.text import Example
from jaxrl_suite.envs.vision.video import Video, shuffled, uniform_frames, with_frames
from jaxrl_suite.losses import token_logprobs
from jaxrl_suite.losses.sft import sft_loss
from jaxrl_suite.models.sequence import completion_logits
from jaxrl_suite.models.vision import patchify
from jaxrl_suite.rewards.kf_grpo import contrast_gate, kf_grpo_rewards
from jaxrl_suite.sampling.keyframes import (
    FrameScorer,
    frame_saliency,
    saliency_mass,
    scorer_features,
    soft_topk,
)
from jaxrl_suite.sampling.runner import LMRunner

VIEWS = ("shuffled", "uniform")


@dataclasses.dataclass(frozen=True)
class KFGRPOConfig:
    """KF-GRPO's contrast (module docstring; `rewards.kf_grpo` has the equation)."""

    views: tuple[str, ...] = VIEWS  # contrast views: "shuffled" (order), "uniform" (content)
    contrast_group: Count = 4  # rollouts per prompt and view (Video-R1: G / 2)
    bonus: NonNegative = 0.3  # the bonus of a correct ordered rollout (Video-R1's 0.3)
    ratio: Positive = 1.0  # gate: p >= ratio * q + margin (T-GRPO: 0.8, 0)
    margin: Annotated[float, Range(ge=-1.0, le=1.0)] = 0.125  # accuracies lie in [0, 1]
    saliency: bool = True  # scale the bonus by the chosen frames' saliency mass (False: 1)

    def __post_init__(self):
        check_fields(self, "kf_grpo.")
        if not self.views or not set(self.views) <= set(VIEWS) or len(set(self.views)) < len(
                self.views):
            raise ValueError(f"kf_grpo.views must be distinct names from {list(VIEWS)}, got "
                             f"{list(self.views)}")


def contrast_view(view: str, examples: Sequence[Example], rng: np.random.Generator
                  ) -> list[Example]:
    """The examples as contrast `view` shows them: frames shuffled (`video.shuffled`) or k
    uniform frames (`video.with_frames`)."""
    if view == "shuffled":
        return [shuffled(e, rng) for e in examples]
    return [with_frames(e, uniform_frames(e.meta.video.frames, len(e.meta.scenes)))
            for e in examples]


class KFGRPOTrainer:
    """GRPO with KF-GRPO's contrastive, saliency-weighted reward; follows the `fit` protocol
    (`init_state`, `batch`, `step`) around a `GRPOTrainer` on a video task."""

    def __init__(self, grpo: GRPOTrainer, config: KFGRPOConfig = KFGRPOConfig()):
        if grpo.config.dynamic_sampling:
            raise ValueError("KF-GRPO: grpo.dynamic_sampling is not supported (the contrast "
                             "views are drawn for the step's prompts)")
        self.grpo, self.config = grpo, config

    def init_state(self, params, rng, **kw) -> GRPOTrainState:
        return self.grpo.init_state(params, rng, **kw)

    def batch(self, cursor: int) -> list[Example]:
        return self.grpo.batch(cursor)

    def step(self, state: GRPOTrainState, examples: Sequence[Example]):
        grpo, c = self.grpo, self.config
        t0 = time.perf_counter()
        grpo.use_sampler_state(state)
        key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
        seq, old_logp, rewards, info = grpo.rollout(state, examples, key=jax.random.fold_in(
            key, 0))
        correct = info.pop("correct")
        t_contrast = time.perf_counter()
        rng = np.random.default_rng([int(jax.random.randint(jax.random.fold_in(key, 99), (), 0,
                                                            2**31 - 1))])
        contrasts, tokens = {}, 0
        for j, view in enumerate(c.views):
            shown = contrast_view(view, examples, rng)
            _, _, _, vinfo = grpo.rollout(state, shown, group_size=c.contrast_group,
                                          key=jax.random.fold_in(key, 1 + j))
            contrasts[view] = vinfo["correct"]
            tokens += vinfo["tokens"]
        t_contrast = time.perf_counter() - t_contrast
        m = np.array([saliency_mass(frame_saliency(e.meta.video.render()), e.meta.frames,
                                    len(e.meta.scenes)) for e in examples],
                     np.float32) if c.saliency else np.ones(len(examples))
        new = np.asarray(kf_grpo_rewards(rewards, correct, list(contrasts.values()), m,
                                         bonus=c.bonus, ratio=c.ratio, margin=c.margin))
        gate = np.asarray(contrast_gate(correct, list(contrasts.values()), ratio=c.ratio,
                                        margin=c.margin))
        info = dict(info, gen_time=time.perf_counter() - t0)
        state, metrics = grpo.update(state, seq, old_logp, new, info,
                                     advantages=grpo.group_advantages(new), t0=t0)
        metrics.update(base_reward=float(rewards.mean()), gate_rate=float(gate.mean()),
                       saliency=float(m.mean()), bonus=float((new - rewards).mean()),
                       contrast_tokens=float(tokens), contrast_time=t_contrast,
                       ordered_accuracy=float(correct.mean()),
                       **{f"{v}_accuracy": float(x.mean()) for v, x in contrasts.items()})
        return state, metrics


@dataclasses.dataclass(frozen=True)
class SelectorConfig:
    """The learned selector's training (`SelectorTrainer`)."""

    steps: Count = 200  # Adam steps on the answer NLL
    batch_size: Count = 16  # questions per step
    lr: Positive = 3e-3
    tau: Positive = 0.5  # soft_topk's temperature
    hidden: Count = 32  # FrameScorer's width

    def __post_init__(self):
        check_fields(self, "selector.")


class SelectorTrainer:
    """Trains a `FrameScorer` end to end through `soft_topk` and a frozen VLM (module
    docstring). `runner` is an `LMRunner` of the VLM on the video task (its prompts show k
    frames); `select(params)` returns the hard top-k selector for `VideoQATask.with_selector`."""

    def __init__(self, runner: LMRunner, config: SelectorConfig, k: int):
        self.runner, self.config, self.k = runner, config, k
        self.scorer = FrameScorer(hidden=config.hidden)
        self.optimizer = optax.adam(config.lr)
        model, vis = runner.model, runner.model.config.vision

        def loss(scorer_params, vlm_params, feats, frames, seq, key):
            w = soft_topk(self.scorer.apply(scorer_params, feats), k, key, tau=config.tau)
            patches = jnp.einsum("bkt,btpd->bkpd", w, frames)  # [B, k, P, D]
            seq = seq._replace(images=seq.images._replace(patches=patches))
            logp = token_logprobs(completion_logits(model, vlm_params, seq), seq.completion)
            return sft_loss(logp, seq.train_mask)[0]

        def step(scorer_params, opt_state, vlm_params, feats, frames, seq, key):
            value, grads = jax.value_and_grad(loss)(scorer_params, vlm_params, feats, frames,
                                                    seq, key)
            updates, opt_state = self.optimizer.update(grads, opt_state, scorer_params)
            return optax.apply_updates(scorer_params, updates), opt_state, value

        self._step = jax.jit(step)
        self._logits = jax.jit(self.scorer.apply)
        self._patch_dim = vis.patch_dim

    def inputs(self, examples: Sequence[Example]):
        """Host arrays of a batch: scorer features [B, T, F], every frame's patches [B, T, P, D]
        and the k-frame prompts with their solutions (`SeqBatch`)."""
        videos = [e.meta.video.render() for e in examples]
        feats = np.stack([scorer_features(v) for v in videos])
        vis = self.runner.model.config.vision
        frames = np.stack([patchify(v, vis)[0].reshape(len(v), -1, self._patch_dim)
                           for v in videos])
        return feats, frames, self.runner.solution_batch(examples)

    def init(self, key) -> tuple:
        """(scorer params, optimizer state) for videos of the task's frame count."""
        t = self.runner.task.num_frames
        feats = np.zeros((1, t, scorer_features(np.zeros((t, 8, 8, 3), np.uint8)).shape[1]),
                         np.float32)
        params = self.scorer.init(key, feats)
        return params, self.optimizer.init(params)

    def fit(self, vlm_params, key, *, start: int = 0, log=None) -> tuple:
        """`config.steps` steps on training questions start, start + batch_size, ...; returns
        (scorer params, [loss per step]). `log(step, loss)` is called after each step."""
        c, task, mesh = self.config, self.runner.task, self.runner.mesh
        params, opt_state = self.init(jax.random.fold_in(key, 0))
        losses = []
        for i in range(c.steps):
            examples = task.examples("train", start + i * c.batch_size, c.batch_size)
            feats, frames, seq = shard_batch(self.inputs(examples), mesh)
            params, opt_state, value = self._step(params, opt_state, vlm_params, feats, frames,
                                                  seq, jax.random.fold_in(key, i + 1))
            losses.append(float(value))
            if log is not None:
                log(i + 1, losses[-1])
        return params, losses

    def select(self, scorer_params):
        """video -> the k frames (ascending) with the largest scorer logits."""
        def choose(video: Video) -> tuple[int, ...]:
            logits = np.asarray(self._logits(scorer_params, scorer_features(video.render())))
            return tuple(sorted(int(t) for t in np.argsort(-logits, kind="stable")[: self.k]))
        return choose


__all__ = ["VIEWS", "KFGRPOConfig", "KFGRPOTrainer", "SelectorConfig", "SelectorTrainer",
           "contrast_view"]

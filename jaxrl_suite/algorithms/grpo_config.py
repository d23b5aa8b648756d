"""GRPO's config (`grpo` section of an LM experiment's YAML) and the typed parts the trainer
builds from it: `objective_hparams` (the loss fields, for `losses.objective.grpo_objective`) and
`rollout_config` (the rollout engine and its options, for `sampling.engines.make_engine`).

The loss, optimisation and sampling settings are `grpo.` keys; the rollout engine and its
options are the `grpo.rollout` section (`sampling.engines.EngineOptions`: `grpo.rollout.engine`,
`grpo.rollout.slots`, ...) and the memory knobs the `grpo.memory` section (`MemoryConfig`:
`grpo.memory.logprob_chunk`, ...), each checked with one-line errors naming the key. The keys
these had when they were flat (`grpo.sampler`, `grpo.logprob_chunk`, ...) are still read, with a
FutureWarning (`GRPOConfig.MOVED`, `core.config.from_dict`). The trainer is `algorithms.grpo`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Annotated, ClassVar, Literal

import optax

from jaxrl_suite.core.config import (
    Count,
    NonNegative,
    NonNegativeInt,
    Positive,
    Probability,
    Range,
    UnitInterval,
    check_divides,
    check_fields,
)
from jaxrl_suite.core.registry import UnknownNameError
from jaxrl_suite.core.train import make_optimizer, micro_batch_count
from jaxrl_suite.losses import ADVANTAGES, POLICY_LOSSES, REGULARIZERS
from jaxrl_suite.losses.objective import ObjectiveHParams
from jaxrl_suite.losses.siren import as_regularizer, per_token_regularizers
from jaxrl_suite.sampling.engines import EngineOptions, RolloutConfig


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
    """The memory knobs of a GRPO step (issue 17; the `grpo.memory` section), all off by
    default. Row counts refer to the B*G rows of a rollout; each must divide them (0 = all rows
    at once), and on a mesh be a multiple of its batch shards (data x fsdp)."""

    rollout_micro_batch: NonNegativeInt = 0  # rows per sampler call (one program for all)
    logprob_micro_batch: NonNegativeInt = 0  # rows per reference / TIS log-prob call
    # Rows per gradient micro-batch (gradients accumulated, core.train.make_train_step): the
    # same update for every loss_type, except that the batch quantiles (high_entropy_quantile,
    # SIREN's peak-entropy quantile) and SIREN's squared penalty are taken per micro-batch.
    train_micro_batch: NonNegativeInt = 0
    logprob_chunk: NonNegativeInt = 0  # positions per output-projection chunk (0: full)

    def __post_init__(self):
        check_fields(self, "grpo.memory.")  # the Ranges declared above

    def check_rows(self, rows: int, *, shards: int = 1) -> None:
        """Each row count divides the `rows` of a rollout and is a multiple of the mesh's batch
        `shards` (one-line errors naming the grpo.memory. key)."""
        check_divides(self, "grpo.memory", rows, "rollout_micro_batch", "logprob_micro_batch",
                      "train_micro_batch", shards=shards)


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """Every GRPO knob (the `grpo` section): the rollout engine and its options in
    `grpo.rollout` (`sampling.engines.EngineOptions`; issue 18), the memory knobs in
    `grpo.memory` (`MemoryConfig`); an option of one engine set on another is a config error."""

    # The keys of the flat section before issue 44, read at their new places with a warning.
    MOVED: ClassVar[Mapping[str, str]] = {
        "sampler": "rollout.engine", "sampler_dtype": "rollout.dtype",
        **{name: f"rollout.{name}" for name in (
            "slots", "refill", "schedule", "draft_k", "drafter_layers", "drafter_d_model",
            "drafter_lr", "drafter_steps", "drafter_reward_tau")},
        **{name: f"memory.{name}" for name in (
            "rollout_micro_batch", "logprob_micro_batch", "train_micro_batch", "logprob_chunk")}}

    steps: Count = 100  # GRPO iterations (one batch of prompts each)
    prompts_per_step: Count = 16  # B: distinct prompts per iteration
    group_size: Annotated[int, Range(ge=2)] = 8  # G: completions per prompt
    max_new_tokens: Count = 24  # N: completion budget (EOS ends a completion earlier)
    temperature: Positive = 1.0  # sampling temperature (log-probs taken at the same one)
    top_k: NonNegativeInt = 0  # sample from the k most likely tokens (0 = off)
    top_p: UnitInterval = 1.0  # nucleus sampling mass (1.0 = off)
    rollout: EngineOptions = EngineOptions()  # the rollout engine and its options
    memory: MemoryConfig = MemoryConfig()  # micro-batches and log-prob chunks
    lr: NonNegative = 1e-4  # peak AdamW learning rate
    warmup_steps: NonNegativeInt = 0  # linear warm-up steps from 0 to lr
    lr_schedule: Literal["constant", "cosine"] = "constant"  # after the warm-up: constant, or a
    # cosine decay to lr / 10 at grpo.steps
    # Start AdamW from the SFT optimizer's moments (mu, nu and their bias-correction count) rather
    # than from zeros: `GRPOTrainer.init_state(..., sft_opt_state=)`; the lr schedule (warm-up
    # included) still starts at step 0.
    carry_optimizer: bool = False
    max_grad_norm: Positive = 1.0  # global-norm gradient clipping
    mu: Count = 1  # inner updates per batch, against the stored old log-probs (one step each)
    # Dynamic sampling (DAPO, arXiv 2503.14476): a group whose G rewards are all equal has zero
    # advantage and no gradient. With it on, each step draws rollouts of prompts_per_step prompts
    # at a time, up to max_draws of them (`GRPOTrainer.batch` hands the step max_draws x
    # prompts_per_step prompts), and keeps the groups whose rewards are not all equal until
    # prompts_per_step are kept; if the cap leaves the batch short, the free places hold
    # all-equal groups with their loss mask zeroed (no term in any loss). Logged: kept_frac (the
    # kept share of the drawn groups), draws (rollouts drawn this step), filled (the share of the
    # batch that carries a gradient). reward / accuracy / zero_std_frac describe every drawn group.
    dynamic_sampling: bool = False
    max_draws: Count = 4
    # Policy loss, by name in losses.POLICY_LOSSES: "grpo" (token ratio), "gspo" (sequence ratio;
    # its paper uses clip_eps=3e-4, clip_eps_high=4e-4), "cispo" (clipped detached IS weight
    # times logp; its paper sets no lower clip, e.g. clip_eps=1.0, and loss_type "dapo").
    policy_loss: str = "grpo"
    clip_eps: NonNegative = 0.2  # ratio clip range below 1
    clip_eps_high: NonNegative | None = None  # range above 1 (DAPO clip-higher); None: clip_eps
    beta: NonNegative = 0.0  # weight of the k3 KL to the frozen reference (the SFT model)
    # Token aggregation (losses.grpo): "dapo" (a token mean over the batch; TRL's default),
    # "grpo" (a mean per sequence, then over sequences: short completions weigh more per token),
    # "dr_grpo" (a sum over a constant N per sequence), "bnpo".
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo"] = "dapo"
    # Advantage estimator, by name in losses.ADVANTAGES: "group" (GRPO, scaled by adv_scale),
    # "rloo" (leave-one-out mean, no std), "reinforce_pp" (batch-normalised rewards),
    # "reinforce_pp_baseline" (group mean subtracted, then batch-normalised).
    advantage: str = "group"
    adv_scale: Literal["group", "batch", "none"] = "group"  # std normalisation of "group"
    adv_eps: NonNegative = 1e-4  # added to the std in advantage normalisation
    # -1 negates the advantages: the control that shows an update pushes the right way (the
    # reward should then fall). 1 is GRPO.
    advantage_sign: Literal[1, -1] = 1
    format_weight: NonNegative = 0.0  # weight of the <answer>…</answer> format reward
    # Entropy regulariser, by name in losses.REGULARIZERS: "none"; "naive" adds -coef * H (full
    # vocabulary, all tokens); "siren" adds coef * (H_bar - anchor)^2 on the top-p entropy of the
    # peak-entropy tokens. SIREN's anchor lives in the train state: `siren_anchor` if set, else
    # measured on the initial policy by `GRPOTrainer.init_state` (or given to it: `anchor=`).
    entropy_reg: str = "none"
    entropy_coef: NonNegative = 0.0
    siren_top_p: UnitInterval = 0.9
    siren_quantile: Probability = 0.8  # regularise the tokens at or above this entropy quantile
    siren_anchor: NonNegative | None = None  # an entropy (nats), >= 0
    # High-entropy-only policy gradient ("80/20", TRL's top_entropy_quantile = 1 - this): keep the
    # pg term of the tokens at or above this entropy quantile of the batch; None = every token.
    high_entropy_quantile: Probability | None = None
    # Truncated importance sampling (Yao et al. 2025; verl's TIS): the old log-probs are
    # recomputed by the trainer's model and each token's pg term is weighted by
    # min(exp(logp_train_old - logp_sampler), tis_cap) (losses.policy.tis_weight).
    tis: bool = False
    tis_cap: Positive = 2.0
    # Reward-hacking guard: with a task that labels its completions (Verdicts.outcomes, e.g. the
    # predicted class), a step whose label entropy over the batch (bits) falls below this is
    # logged as collapse=1 with a warning (0 = off; rewards.composite.collapse_report sums them).
    collapse_entropy: NonNegative = 0.0

    def __post_init__(self):
        check_fields(self, "grpo.")  # the Ranges declared above
        if self.advantage_sign not in (1, -1):
            raise ValueError(f"grpo.advantage_sign must be 1 or -1, got {self.advantage_sign}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"grpo.lr_schedule must be one of {list(LR_SCHEDULES)}, got "
                             f"{self.lr_schedule!r}")
        self.memory.check_rows(self.prompts_per_step * self.group_size)
        for name, registry in (("policy_loss", POLICY_LOSSES), ("advantage", ADVANTAGES),
                               ("entropy_reg", REGULARIZERS)):
            try:
                registry.get(getattr(self, name))
            except UnknownNameError as e:
                raise ValueError(f"{name}: {e}") from None
        if self.memory.logprob_chunk and \
                as_regularizer(REGULARIZERS.get(self.entropy_reg)).needs_logits:
            raise ValueError(f"grpo.entropy_reg={self.entropy_reg!r} needs the full logits: set "
                             f"grpo.memory.logprob_chunk=0 (chunked: "
                             f"{', '.join(per_token_regularizers())})")
        rollout_config(self)  # one-line errors for the rollout engine's options


def objective_hparams(c: GRPOConfig) -> ObjectiveHParams:
    """The loss fields of `c` that `losses.objective.grpo_objective` takes (the policy loss, its
    clip range, KL weight and aggregation, the entropy regulariser, the high-entropy mask, TIS's
    cap), and the gradient micro-batches of a rollout (`grpo.memory.train_micro_batch`)."""
    return ObjectiveHParams(
        policy_loss=c.policy_loss, clip_eps=c.clip_eps, clip_eps_high=c.clip_eps_high,
        beta=c.beta, loss_type=c.loss_type, entropy_reg=c.entropy_reg,
        entropy_coef=c.entropy_coef, siren_top_p=c.siren_top_p, siren_quantile=c.siren_quantile,
        high_entropy_quantile=c.high_entropy_quantile, tis_cap=c.tis_cap,
        micro_batches=micro_batch_count(c.prompts_per_step * c.group_size,
                                        c.memory.train_micro_batch))


def grpo_optimizer(c: GRPOConfig, lr=None) -> optax.GradientTransformation:
    """GRPO's AdamW (`core.train.make_optimizer`: grpo.warmup_steps, grpo.max_grad_norm, and the
    cosine decay over grpo.steps when grpo.lr_schedule is "cosine") at peak `lr` (default
    grpo.lr; a traced value gives the same optimizer-state structure)."""
    return make_optimizer(c.lr if lr is None else lr, warmup_steps=c.warmup_steps,
                          max_grad_norm=c.max_grad_norm,
                          total_steps=c.steps if c.lr_schedule == "cosine" else 0)


def check_scorer_config(c: GRPOConfig, sampler) -> None:
    """The GRPO options that need the causal LM's exact log-probs or logits, refused with a
    log-prob scorer (one-line errors naming the key)."""
    if sampler is None:
        raise ValueError("a GRPOTrainer with a scorer needs its rollout sampler (sampler=), "
                         "e.g. a sampling.diffusion.DiffusionSampler")
    for key, off in (("memory.logprob_chunk", 0), ("entropy_reg", "none"),
                     ("high_entropy_quantile", None), ("tis", False), ("rollout.dtype", None),
                     ("memory.train_micro_batch", 0), ("memory.logprob_micro_batch", 0),
                     ("memory.rollout_micro_batch", 0), ("rollout.engine", "static")):
        value = functools.reduce(getattr, key.split("."), c)
        if value != off:
            raise ValueError(f"grpo.{key}={value!r} does not apply with a log-prob scorer (a "
                             f"diffusion LM's): set it to {off!r}")


LR_SCHEDULES = ("constant", "cosine")  # grpo.lr_schedule


def rollout_config(c: GRPOConfig) -> RolloutConfig:
    """The rollout engine's config (`sampling.engines`) from a GRPOConfig's `grpo.rollout`
    section, sampling settings and `grpo.memory.rollout_micro_batch`; checks them (one-line
    errors naming those keys)."""
    return RolloutConfig(**{f.name: getattr(c.rollout, f.name)
                            for f in dataclasses.fields(EngineOptions)},
                         max_new_tokens=c.max_new_tokens, temperature=c.temperature,
                         top_k=c.top_k, top_p=c.top_p,
                         rollout_micro_batch=c.memory.rollout_micro_batch)


__all__ = ["LR_SCHEDULES", "GRPOConfig", "MemoryConfig", "check_scorer_config", "grpo_optimizer",
           "objective_hparams", "rollout_config"]

"""Advantage estimators from the rewards of G completions per prompt, registered by name.

Every entry of `ADVANTAGES` has one signature, `fn(rewards [B, G], *, scale, eps) -> [B, G]`
(an entry that needs no std scaling ignores `scale`), so a config picks one by name
(`grpo.advantage`). Rewards are one scalar per completion; the advantage is shared by all of the
completion's tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax.numpy as jnp

from jaxrl_suite.core.registry import Registry
from jaxrl_suite.losses.common import check_rank

AdvantageFn = Callable[..., chex.Array]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")


def _check_rewards(rewards: chex.Array) -> chex.Array:
    """Validated rewards [B, G] in at least float32."""
    check_rank("rewards", rewards, 2)
    if rewards.shape[1] < 2:
        raise ValueError(
            f"rewards must hold G >= 2 completions per prompt, got shape {rewards.shape}"
        )
    rewards = jnp.asarray(rewards)
    return rewards.astype(jnp.promote_types(rewards.dtype, jnp.float32))  # [B, G]


def _group_std(rewards: chex.Array) -> chex.Array:
    return jnp.std(rewards, axis=1, ddof=1, keepdims=True)  # [B, 1]


def _batch_std(rewards: chex.Array) -> chex.Array:
    return jnp.std(rewards, ddof=1)  # []


# scale name -> std used as the advantage denominator (None: no scaling).
ADVANTAGE_SCALES: Registry[Callable[[chex.Array], chex.Array] | None] = Registry("scale")
ADVANTAGE_SCALES.register("group", _group_std)
ADVANTAGE_SCALES.register("batch", _batch_std)
ADVANTAGE_SCALES.register("none", lambda rewards: None)


@ADVANTAGES.register("group")
def group_advantages(rewards: chex.Array, *, scale: str = "group", eps: float = 1e-4) -> chex.Array:
    """Group-relative advantages: each reward minus its group's mean, optionally scaled.

        A_ij = (r_ij - mean_j r_ij) / (s + eps)

    with s, by `scale`:
      "group": std_j r_ij, the std of prompt i's group (ddof=1, as TRL and tunix)   [GRPO]
      "batch": std of all B*G rewards (ddof=1)
      "none":  no division at all, A_ij = r_ij - mean_j r_ij                     [Dr. GRPO]

    GRPO: arXiv 2402.03300. Dr. GRPO (drops the std, which biases towards easy and hard
    prompts): arXiv 2503.20783.

    Args:
      rewards: [B, G] rewards of G completions for each of B prompts.
      scale: "group", "batch" or "none" (static).
      eps: added to the std before dividing; a constant group gives zeros, not NaN.

    Returns:
      [B, G] advantages, in at least float32.

    Raises:
      ValueError: `rewards` is not rank 2, G < 2, or `scale` is unknown.
    """
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"unknown scale {scale!r}; valid options: "
                         f"{', '.join(map(repr, ADVANTAGE_SCALES.names()))}")
    rewards = _check_rewards(rewards)  # [B, G]
    centered = rewards - jnp.mean(rewards, axis=1, keepdims=True)  # [B, G]
    std = ADVANTAGE_SCALES.get(scale)(rewards)  # None: no scaling
    if std is None:
        return centered
    return centered / (std + eps)  # [B, G]


@ADVANTAGES.register("rloo")
def rloo_advantages(rewards: chex.Array, *, scale: str = "group", eps: float = 1e-4) -> chex.Array:
    """REINFORCE leave-one-out: each reward minus the mean of the other G - 1 in its group.

        A_ij = r_ij - 1/(G-1) sum_{k != j} r_ik  =  G/(G-1) (r_ij - mean_k r_ik)

    No std scaling (`scale` and `eps` are ignored). Kool et al., "Buy 4 REINFORCE samples, get a
    baseline for free!" (2019); Ahmadian et al., "Back to Basics", arXiv 2402.14740.

    Args:
      rewards: [B, G] rewards, G >= 2.

    Returns:
      [B, G] advantages, in at least float32.
    """
    rewards = _check_rewards(rewards)  # [B, G]
    g = rewards.shape[1]
    centered = rewards - jnp.mean(rewards, axis=1, keepdims=True)  # [B, G]
    return centered * (g / (g - 1))  # the second form: a constant group gives exact zeros


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp_advantages(
    rewards: chex.Array, *, scale: str = "group", eps: float = 1e-4
) -> chex.Array:
    """REINFORCE++: rewards normalised over the whole batch, no per-prompt baseline.

        A_ij = (r_ij - mean_B r) / (std_B r + eps)       (mean and std over all B*G rewards)

    Hu et al., REINFORCE++, arXiv 2501.03262 (the k >= 1 variant, global advantage
    normalisation). The paper's return also subtracts a per-token KL penalty; here the reward is
    one scalar per completion and a KL term, if any, sits in the loss (`grpo.beta`). Statistics
    are over the B*G sequences (OpenRLHF takes them over the batch's tokens, which weights each
    sequence by its length). std uses ddof=1; `scale` is ignored.

    Args:
      rewards: [B, G] rewards, G >= 2.
      eps: added to the std; a constant batch gives zeros.

    Returns:
      [B, G] advantages, in at least float32.
    """
    rewards = _check_rewards(rewards)  # [B, G]
    return (rewards - jnp.mean(rewards)) / (jnp.std(rewards, ddof=1) + eps)


@ADVANTAGES.register("reinforce_pp_baseline")
def reinforce_pp_baseline_advantages(
    rewards: chex.Array, *, scale: str = "group", eps: float = 1e-4
) -> chex.Array:
    """REINFORCE++ with baseline: subtract the group mean, then normalise over the whole batch.

        c_ij = r_ij - mean_j r_ij
        A_ij = (c_ij - mean_B c) / (std_B c + eps)       (mean and std over all B*G values)

    Hu et al., arXiv 2501.03262 ("REINFORCE++ w/ baseline", the group-sampling variant for
    reasoning tasks). Unlike GRPO's "batch" scale, the std is that of the centred rewards, so
    the spread between prompts' means does not enter it. std uses ddof=1; `scale` is ignored.

    Args:
      rewards: [B, G] rewards, G >= 2.
      eps: added to the std; constant groups give zeros.

    Returns:
      [B, G] advantages, in at least float32.
    """
    rewards = _check_rewards(rewards)  # [B, G]
    centered = rewards - jnp.mean(rewards, axis=1, keepdims=True)  # [B, G]
    return (centered - jnp.mean(centered)) / (jnp.std(centered, ddof=1) + eps)


__all__ = [
    "ADVANTAGES",
    "group_advantages",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
]

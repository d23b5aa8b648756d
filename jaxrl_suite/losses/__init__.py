"""Losses and advantage estimators: pure functions of arrays returning (scalar, metrics)."""

from jaxrl_suite.losses.common import masked_mean, token_entropy, token_logprobs
from jaxrl_suite.losses.grpo import group_advantages, grpo_loss

__all__ = [
    "group_advantages",
    "grpo_loss",
    "masked_mean",
    "token_entropy",
    "token_logprobs",
]

"""Losses and advantage estimators: pure functions of arrays returning (scalar, metrics).

Registries (picked by name in a config): `POLICY_LOSSES` (grpo, gspo, cispo), `ADVANTAGES`
(group, rloo, reinforce_pp, reinforce_pp_baseline), `REGULARIZERS` (none, naive, siren) and
`ESTIMATORS` (a diffusion LM's token log-prob estimators: coupled, single, full) and
`W2S_LOSSES` (weak-to-strong student losses: xent, logconf, product). GRPO's whole objective
(policy loss, high-entropy mask, TIS, entropy regulariser, micro-batch rescale) is
`grpo_objective(TokenStats, ObjectiveBatch, ObjectiveHParams)` (`losses.objective`).
"""

from jaxrl_suite.losses.advantages import (
    ADVANTAGES,
    group_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from jaxrl_suite.losses.chunked import (
    chunked_logprobs_and_entropy,
    chunked_token_map,
    logprobs_and_entropy,
    project_logits,
)
from jaxrl_suite.losses.common import masked_mean, token_entropy, token_logprobs
from jaxrl_suite.losses.coupled_grpo import ESTIMATORS, coupled_logprobs
from jaxrl_suite.losses.diffusion import masked_diffusion_loss
from jaxrl_suite.losses.distill import kd_loss, reward_weights
from jaxrl_suite.losses.grpo import (
    POLICY_LOSSES,
    cispo_loss,
    cispo_surrogate,
    compose_policy_loss,
    grpo_loss,
    gspo_loss,
    ppo_surrogate,
)
from jaxrl_suite.losses.objective import (
    ObjectiveBatch,
    ObjectiveHParams,
    TokenStats,
    grpo_objective,
)
from jaxrl_suite.losses.policy import aggregate, clipped_surrogate, importance_ratio, k3_kl
from jaxrl_suite.losses.preference import dpo_loss, orpo_loss
from jaxrl_suite.losses.siren import REGULARIZERS, EntropyRegularizer, register_regularizer
from jaxrl_suite.losses.w2s import (
    W2S_LOSSES,
    logconf_loss,
    performance_gap_recovered,
    product_loss,
    xent_w2s_loss,
)

__all__ = [
    "ADVANTAGES",
    "ESTIMATORS",
    "POLICY_LOSSES",
    "REGULARIZERS",
    "W2S_LOSSES",
    "EntropyRegularizer",
    "ObjectiveBatch",
    "ObjectiveHParams",
    "TokenStats",
    "aggregate",
    "chunked_logprobs_and_entropy",
    "chunked_token_map",
    "cispo_loss",
    "cispo_surrogate",
    "clipped_surrogate",
    "compose_policy_loss",
    "coupled_logprobs",
    "dpo_loss",
    "group_advantages",
    "grpo_objective",
    "grpo_loss",
    "gspo_loss",
    "importance_ratio",
    "k3_kl",
    "kd_loss",
    "logconf_loss",
    "logprobs_and_entropy",
    "masked_diffusion_loss",
    "masked_mean",
    "orpo_loss",
    "performance_gap_recovered",
    "ppo_surrogate",
    "product_loss",
    "project_logits",
    "register_regularizer",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "reward_weights",
    "rloo_advantages",
    "token_entropy",
    "token_logprobs",
    "xent_w2s_loss",
]

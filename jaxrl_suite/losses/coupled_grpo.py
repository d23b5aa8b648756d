"""Token log-prob estimators of a masked-diffusion LM for policy gradients (coupled-GRPO).

A masked-diffusion LM has no exact token log-probability of a completion; an RL ratio needs an
estimate. Each estimator corrupts the completion a few ways ("passes"), runs the model once per
pass, and combines the log-probs log p_theta(x_0^i | prompt, x_pass) of the clean tokens at the
masked positions into a per-token estimate [B, N]. All are pure functions of arrays; the model
forward lives in `algorithms.diffusion.DiffusionScorer`.

coupled (DiffuCoder, arXiv 2506.20639, sec. 4; apple/ml-diffucoder `coupled_grpo.py`):
    one t ~ U(0.2, 0.8) per call, r_i ~ U(0, 1) per token, three passes:
      1. every completion token masked;
      2. tokens with r_i < t masked;
      3. the complement, r_i >= t, masked;
    logp_i = 1/2 [ logp^(1)_i + ( logp^(2)_i / t        if r_i < t
                                  logp^(3)_i / (1 - t)  otherwise ) ]
    The complementary pair scores every token exactly once (the authors' `selective_log_softmax`
    with weights [1, 1/t, 1/(1-t)]). Note the scale this gives: the pair term of a token is
    logp/t with probability t or logp/(1-t) otherwise, about 2 logp on average, so a coupled
    token estimate is about (logp_full + 2 logp) / 2, larger in magnitude than the single and
    full estimates; a log-ratio under it moves by up to 1/t times the change of a pass's
    log-prob. This is the authors' weighting, kept as written.
single (d1-style, arXiv 2504.12216, one random mask):
    one pass with tokens r_i < t masked; logp_i = logp_i / t on those tokens, 0 elsewhere
    (an unmasked token has no estimate, so its ratio is 1 and it carries no gradient).
full (the fully masked pass alone; d1's one-step estimate without its prompt masking):
    logp_i = logp^(1)_i, deterministic.

The prompt is never masked. The same key gives the same masks, so the old, reference and
current log-probs of one GRPO inner iteration share its mask seed (`GRPOTrainer` with a scorer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxrl_suite.core.registry import Registry
from jaxrl_suite.losses.common import check_rank, check_shape

T_MIN, T_MAX = 0.2, 0.8  # the authors' mask-ratio range (`random.uniform(0.2, 0.8)`)


class Estimator(NamedTuple):
    """A log-prob estimator: `passes` corrupted copies per draw.

    noise(key, completion [B, N], mask_id) -> (noisy [passes, B, N] int32, aux)
    combine(logp [passes, B, N], aux) -> [B, N] per-token log-prob estimate
    """

    passes: int
    noise: Callable[..., tuple[jax.Array, Any]]
    combine: Callable[[jax.Array, Any], jax.Array]
    stochastic: bool = True


ESTIMATORS: Registry[Estimator] = Registry("log-prob estimator")


def coupled_masks(key: jax.Array, shape: tuple[int, int], *, t_min: float = T_MIN,
                  t_max: float = T_MAX) -> tuple[jax.Array, jax.Array]:
    """(in_first [B, N] bool: r < t, the tokens pass 2 masks; t [] float32 ~ U(t_min, t_max))."""
    k_t, k_r = jax.random.split(key)
    t = jax.random.uniform(k_t, (), minval=t_min, maxval=t_max)
    return jax.random.uniform(k_r, shape) < t, t


def coupled_logprobs(logp_full: chex.Array, logp_first: chex.Array, logp_second: chex.Array,
                     in_first: chex.Array, t: chex.Array) -> jax.Array:
    """The coupled per-token estimate [B, N]:

        1/2 [ logp_full + where(in_first, logp_first / t, logp_second / (1 - t)) ]

    logp_full, logp_first, logp_second: [B, N] log-probs of the clean tokens under the fully
    masked pass, the pass masking `in_first` (r < t) and the pass masking its complement."""
    check_rank("logp_full", logp_full, 2)
    for name, x in (("logp_first", logp_first), ("logp_second", logp_second),
                    ("in_first", in_first)):
        check_shape(name, x, logp_full.shape)
    pair = jnp.where(in_first, logp_first / t, logp_second / (1.0 - t))
    return 0.5 * (logp_full + pair)


def single_mask_logprobs(logp: chex.Array, masked: chex.Array, t: chex.Array) -> jax.Array:
    """The one-random-mask estimate [B, N]: logp / t where masked, 0 elsewhere."""
    check_shape("masked", masked, jnp.shape(logp))
    return jnp.where(masked, logp / t, 0.0)


def _masked_copy(completion, where, mask_id):
    return jnp.where(where, mask_id, completion).astype(jnp.int32)


def _coupled_noise(key, completion, mask_id):
    in_first, t = coupled_masks(key, completion.shape)
    noisy = jnp.stack([jnp.full_like(completion, mask_id),
                       _masked_copy(completion, in_first, mask_id),
                       _masked_copy(completion, ~in_first, mask_id)]).astype(jnp.int32)
    return noisy, (in_first, t)


def _single_noise(key, completion, mask_id):
    masked, t = coupled_masks(key, completion.shape)
    return _masked_copy(completion, masked, mask_id)[None], (masked, t)


def _full_noise(key, completion, mask_id):
    return jnp.full_like(completion, mask_id)[None].astype(jnp.int32), None


ESTIMATORS.register("coupled", Estimator(
    3, _coupled_noise, lambda lp, aux: coupled_logprobs(lp[0], lp[1], lp[2], *aux)))
ESTIMATORS.register("single", Estimator(
    1, _single_noise, lambda lp, aux: single_mask_logprobs(lp[0], *aux)))
ESTIMATORS.register("full", Estimator(1, _full_noise, lambda lp, aux: lp[0], stochastic=False))


__all__ = ["ESTIMATORS", "Estimator", "T_MAX", "T_MIN", "coupled_logprobs", "coupled_masks",
           "single_mask_logprobs"]

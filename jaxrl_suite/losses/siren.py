"""Entropy regularisers for RL with verifiable rewards: SIREN and the naive entropy bonus.

SIREN (selective entropy regularisation, arXiv 2509.25133) counters entropy collapse without the
explosion that a bonus on the full-vocabulary entropy of every token causes. It regularises only
(1) the entropy of the top-p nucleus, (2) at the peak-entropy tokens of the batch, and (3) towards
an anchor (self-anchored form) rather than upwards without bound:

    H_p(t)  = - sum_{v in N_p(t)} q_v log q_v,    q_v = pi(v | t) / sum_{u in N_p(t)} pi(u | t)
    M(t)    = m(t) * [H_p(t) > Quantile_{m}(H_p, quantile)]
    H_bar   = sum_t M(t) H_p(t) / sum_t M(t)
    R_SIREN = coef * (H_bar - anchor)^2

with N_p(t) the nucleus (the fewest most probable tokens whose probability reaches p), m the mask
of valid completion tokens and the quantile taken over the valid tokens of the batch. The peak
tokens are those strictly above the quantile, as in the authors' code (`x > lower_bound`): H_p is
exactly 0 wherever the top token alone reaches p, which in a confident policy is most tokens, and
with ">=" a zero quantile would select every token. (The authors take the quantile per response;
we take it over the batch, as TRL's high-entropy mask does.) The baseline
is the naive bonus R_naive = - coef * sum_t m(t) H(t) / sum_t m(t), with H the full-vocabulary
entropy (`losses.common.token_entropy`). Both are added to the policy loss. All functions are
pure, jit-compatible array code.

The nucleus follows the usual top-p definition (the token that crosses p is included; at least
one token). The authors' verl code keeps the tokens whose cumulative probability, themselves
included, is <= p, which drops the crossing token; with p = 1 both are the full distribution.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp

from jaxrl_suite.core.registry import Registry
from jaxrl_suite.losses.common import check_rank, token_entropy

# Entropy regularisers added to the policy loss, picked by `grpo.entropy_reg`. Each entry is an
# `EntropyRegularizer`: a function of per-token statistics,
#   fn(stats {name: [N, T]}, mask [N, T], *, coef, top_p, quantile, anchor) -> (penalty, metrics)
# (it ignores the hyperparameters it does not use; `metrics` holds what the trainer logs beside
# the policy loss's: "entropy_reg", the penalty, plus the entry's own), with the statistics it
# `needs` (`STATISTICS`). Calling an entry on the full logits computes them there:
#   reg(logits [N, T, V], mask [N, T], *, coef, top_p, quantile, anchor) -> (penalty, metrics)
# A new regulariser is one function and one `register_regularizer` line.
REGULARIZERS: Registry[EntropyRegularizer] = Registry("entropy regulariser")

# The per-token statistics a regulariser may need: "entropy" (full-vocabulary, with its
# gradient), "top_p_entropy" (`top_p_entropy` at the `top_p` hyperparameter, with its gradient),
# "logits" ([N, T, V] themselves: such an entry cannot run on chunked log-probs).
STATISTICS = ("entropy", "top_p_entropy", "logits")


def top_p_entropy(logits: chex.Array, *, p: float = 0.9) -> chex.Array:
    """Entropy of the top-p nucleus, renormalised: [N, T, V] -> [N, T].

    The nucleus holds the most probable tokens up to and including the one at which the
    cumulative probability reaches `p` (all tokens for p >= 1)."""
    check_rank("logits", logits, 3)
    if not 0.0 < p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {p}")
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    sorted_logp = -jnp.sort(-logp, axis=-1)  # descending
    probs = jnp.exp(sorted_logp)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass of the more probable tokens
    keep = (before < p) if p < 1.0 else jnp.ones_like(before, bool)
    keep = keep.at[..., 0].set(True)
    log_z = jax.nn.logsumexp(jnp.where(keep, sorted_logp, -jnp.inf), axis=-1, keepdims=True)
    logq = sorted_logp - log_z
    return -jnp.sum(jnp.where(keep, jnp.exp(logq) * logq, 0.0), axis=-1)


def _masked_mean(x: chex.Array, mask: chex.Array) -> chex.Array:
    mask = mask.astype(jnp.float32)
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def peak_entropy_mask(
    entropy: chex.Array, mask: chex.Array, *, quantile: float, strict: bool = False
) -> chex.Array:
    """Valid tokens whose entropy is at or above (`strict`: strictly above) the `quantile` of the
    valid tokens' entropies.

    The quantile uses linear interpolation (numpy's default, as torch.quantile in TRL's
    `get_high_entropy_mask`, which keeps ">="): with n valid tokens of distinct entropies it keeps
    n - ceil(quantile * (n - 1)) of them (one fewer when `strict` and the quantile lands on a
    token). `strict` drops the ties at the threshold, e.g. the many exact zeros of a top-p
    entropy. Returns a float mask of `mask`'s shape."""
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    valid = mask > 0
    threshold = jnp.nanquantile(jnp.where(valid, entropy, jnp.nan), quantile)
    above = entropy > threshold if strict else entropy >= threshold
    return (valid & above).astype(jnp.float32)


def siren_regularizer(
    logits: chex.Array,
    mask: chex.Array,
    *,
    top_p: float = 0.9,
    quantile: float = 0.8,
    anchor: chex.Array | float,
    coef: float,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """SIREN's self-anchored regulariser coef * (H_bar - anchor)^2 (module docstring).

    Args:
      logits: [N, T, V] policy logits of the completion tokens.
      mask: [N, T] valid completion tokens.
      top_p: nucleus mass p of the top-p entropy.
      quantile: only tokens strictly above this top-p entropy quantile of the batch are
        regularised.
      anchor: target entropy (a scalar, no gradient); the trainer takes it from the initial
        policy's H_bar unless it is set.
      coef: weight of the penalty.

    Returns:
      (penalty, metrics) with metrics `entropy` (full, mean over valid tokens), `top_p_entropy`
      (mean over valid tokens), `siren_entropy` (H_bar), `masked_fraction` (regularised share of
      the valid tokens) and `anchor`.
    """
    return siren_from_entropies(top_p_entropy(logits, p=top_p), token_entropy(logits), mask,
                                quantile=quantile, anchor=anchor, coef=coef)


def siren_from_entropies(
    h_p: chex.Array,
    entropy: chex.Array,
    mask: chex.Array,
    *,
    quantile: float = 0.8,
    anchor: chex.Array | float,
    coef: float,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """`siren_regularizer` from the per-token entropies instead of the logits.

        M = m * [H_p > Quantile_m(H_p, quantile)],  H_bar = sum M H_p / sum M,
        R = coef * (H_bar - anchor)^2

    h_p [N, T] is `top_p_entropy(logits)` (with its gradient), entropy [N, T] the full
    `token_entropy(logits)` (a metric only); both are per-token, so a trainer may compute them
    chunk by chunk (`losses.chunked.chunked_token_map`). Returns what `siren_regularizer` does.
    """
    peak = peak_entropy_mask(jax.lax.stop_gradient(h_p), mask, quantile=quantile, strict=True)
    h_bar = _masked_mean(h_p, peak)
    anchor = jax.lax.stop_gradient(jnp.asarray(anchor, jnp.float32))
    penalty = coef * (h_bar - anchor) ** 2
    metrics = {
        "entropy": jax.lax.stop_gradient(_masked_mean(entropy, mask)),
        "top_p_entropy": jax.lax.stop_gradient(_masked_mean(h_p, mask)),
        "siren_entropy": jax.lax.stop_gradient(h_bar),
        "masked_fraction": jnp.sum(peak) / jnp.maximum(jnp.sum(mask > 0), 1),
        "anchor": anchor,
    }
    return penalty, metrics


@dataclasses.dataclass(frozen=True)
class EntropyRegularizer:
    """A `REGULARIZERS` entry: `fn` over the per-token statistics it `needs` (of `STATISTICS`).

    `token_mean`: the penalty is a token mean over the batch (the naive bonus), so a gradient
    micro-batch of a per-sequence loss rescales it by its share of the batch's tokens, as the
    token-mean metrics (`losses.objective.grpo_objective`); a penalty that is not (SIREN's square
    of a mean) is taken per micro-batch. Called on the full logits, it is `fn` on the statistics
    computed from them (`statistics_from_logits`)."""

    fn: Callable[..., tuple[chex.Array, dict[str, chex.Array]]]
    needs: tuple[str, ...] = ()
    token_mean: bool = False

    def __post_init__(self):
        unknown = [n for n in self.needs if n not in STATISTICS]
        if unknown:
            raise ValueError(f"unknown statistics {unknown}; known: {', '.join(STATISTICS)}")

    @property
    def needs_logits(self) -> bool:
        return "logits" in self.needs

    def __call__(self, logits, mask, *, coef, top_p, quantile, anchor):
        stats = statistics_from_logits(logits, self.needs, top_p=top_p)
        return self.fn(stats, mask, coef=coef, top_p=top_p, quantile=quantile, anchor=anchor)


def statistics_from_logits(logits: chex.Array, needs, *, top_p: float) -> dict[str, chex.Array]:
    """The per-token statistics `needs` (of `STATISTICS`), from the full logits [N, T, V], in
    the order named: "entropy" `token_entropy`, "top_p_entropy" `top_p_entropy(p=top_p)`."""
    compute = {"entropy": token_entropy, "logits": lambda x: x,
               "top_p_entropy": lambda x: top_p_entropy(x, p=top_p)}
    return {name: compute[name](logits) for name in needs}


def as_regularizer(entry) -> EntropyRegularizer:
    """A `REGULARIZERS` entry as an `EntropyRegularizer`: itself, or a plain function of the
    logits, `entry(logits, mask, **hyperparams)`, wrapped as one that needs them."""
    if isinstance(entry, EntropyRegularizer):
        return entry
    return EntropyRegularizer(lambda stats, mask, **kw: entry(stats["logits"], mask, **kw),
                              needs=("logits",))


def register_regularizer(name: str, *, needs: tuple[str, ...], token_mean: bool = False):
    """Decorator: registers `fn(stats, mask, *, coef, top_p, quantile, anchor)` in
    `REGULARIZERS` under `name`, needing the statistics `needs` (see `EntropyRegularizer`)."""
    def decorator(fn):
        REGULARIZERS.register(name, EntropyRegularizer(fn, tuple(needs), token_mean))
        return fn

    return decorator


def per_token_regularizers() -> list[str]:
    """The `REGULARIZERS` entries that work from per-token statistics (so chunk by chunk,
    without the full logits); the others need the logits."""
    return [n for n in REGULARIZERS if not as_regularizer(REGULARIZERS.get(n)).needs_logits]


def regularizer_from_entropies(
    name: str, entropy: chex.Array, h_p: chex.Array | None, mask: chex.Array, *, coef: float,
    quantile: float, anchor: chex.Array | float, top_p: float = 0.9,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """The `REGULARIZERS` entry `name` from per-token entropies: entropy [N, T] the
    full-vocabulary entropy with its gradient, h_p [N, T] the top-p entropy (None when the
    entry does not need it). An entry that needs the full logits is refused."""
    entry = as_regularizer(REGULARIZERS.get(name))
    if entry.needs_logits:
        raise ValueError(f"entropy regulariser {name!r} needs the full logits; the per-token "
                         f"ones are {', '.join(per_token_regularizers())}")
    stats = {"entropy": entropy, "top_p_entropy": h_p}
    return entry.fn({n: stats[n] for n in entry.needs}, mask, coef=coef, top_p=top_p,
                    quantile=quantile, anchor=anchor)


def naive_entropy_bonus(
    logits: chex.Array, mask: chex.Array, *, coef: float
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """The baseline bonus -coef * mean full-vocabulary entropy over the valid tokens.

    Returns (bonus, {"entropy": mean entropy}); add `bonus` to the loss being minimised."""
    h = _masked_mean(token_entropy(logits), mask)
    return -coef * h, {"entropy": jax.lax.stop_gradient(h)}


@register_regularizer("none", needs=())
def no_entropy_reg(stats, mask, *, coef, top_p, quantile, anchor):
    """No regulariser: a zero penalty and no metrics."""
    del stats, mask, coef, top_p, quantile, anchor
    return jnp.zeros((), jnp.float32), {}


@register_regularizer("naive", needs=("entropy",), token_mean=True)
def naive_entropy_reg(stats, mask, *, coef, top_p, quantile, anchor):
    """The baseline bonus -coef * mean_m H over the valid tokens, as `naive_entropy_bonus`, with
    the full entropy's gradient (top_p, quantile, anchor unused)."""
    del top_p, quantile, anchor
    bonus = -coef * _masked_mean(stats["entropy"], mask)
    return bonus, {"entropy_reg": bonus}


@register_regularizer("siren", needs=("entropy", "top_p_entropy"))
def siren_entropy_reg(stats, mask, *, coef, top_p, quantile, anchor):
    """`siren_from_entropies`, coef * (H_bar - anchor)^2 on the top-p entropies, with its
    metrics except the full entropy (which the trainer logs for every regulariser)."""
    del top_p
    penalty, metrics = siren_from_entropies(stats["top_p_entropy"], stats["entropy"], mask,
                                            quantile=quantile, anchor=anchor, coef=coef)
    return penalty, {"entropy_reg": penalty,
                     **{k: v for k, v in metrics.items() if k != "entropy"}}


__all__ = [
    "REGULARIZERS",
    "STATISTICS",
    "EntropyRegularizer",
    "as_regularizer",
    "naive_entropy_bonus",
    "naive_entropy_reg",
    "no_entropy_reg",
    "peak_entropy_mask",
    "per_token_regularizers",
    "register_regularizer",
    "regularizer_from_entropies",
    "siren_entropy_reg",
    "siren_from_entropies",
    "siren_regularizer",
    "statistics_from_logits",
    "top_p_entropy",
]

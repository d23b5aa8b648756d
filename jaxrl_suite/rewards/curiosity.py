"""The step value of COS(M+O)S: curiosity (moderate surprisal) minus a coherence penalty.

COS(M+O)S (Materzok 2025, arXiv 2501.17104) guides MCTS over plot steps with a step-level value
that rewards moderate surprisal of a step under the policy (neither the most predictable
continuation nor noise) and penalises incoherence. For a step x_j (one sentence) after the
story so far x_<j:

    surprisal   s_j = -(1 / |x_j|) * sum_{t in x_j} log pi(t | x_<j, earlier tokens of x_j)
                     (mean negative log-prob per token of the step, nats)
    curiosity   C(s) = exp(-(s - target)^2 / (2 * width^2))        in (0, 1], 1 at s = target
                     (a Gaussian inverted-U; `target` and `width` are config fields)
    step value  v_j = C(s_j) - penalty * n_j                        n_j = contradictions of x_j
                     (counted by the world's checker, `envs.text.story`)

With penalty >= 1 no incoherent step is worth more than a coherent one (v <= 0 < C). The value model
(a `ValueLM`, sigmoid head) regresses targets in [0, 1], so values are mapped by

    unit(v) = (clip(v, -1, 1) + 1) / 2

and a plot's return is the mean of unit(v_j) over its K steps. Everything here is a pure
function of arrays (numpy on the host: the search runs there); the log-probs come from the
caller's forward pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from jaxrl_suite.core.config import NonNegative, Positive, check_fields


@dataclasses.dataclass(frozen=True)
class CuriosityConfig:
    target: NonNegative = 0.2  # surprisal (nats per token) at which curiosity peaks
    width: Positive = 0.1  # the Gaussian's standard deviation, nats per token
    penalty: NonNegative = 1.0  # value lost per contradiction (a magnitude, subtracted)

    def __post_init__(self):
        check_fields(self, "curiosity.")  # the Ranges declared above


def step_surprisal(token_logp: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """s_j = -mean(token_logp[a_j:b_j]) for each span (a_j, b_j) of token positions; an empty
    span (a missing step) gives nan. token_logp [T] -> [len(spans)]."""
    token_logp = np.asarray(token_logp, np.float64)
    out = np.full(len(spans), np.nan)
    for j, (a, b) in enumerate(spans):
        if b > a:
            out[j] = -float(np.mean(token_logp[a:b]))
    return out


def curiosity(surprisal, target: float, width: float) -> np.ndarray:
    """C(s) = exp(-(s - target)^2 / (2 width^2)) elementwise; nan (no step) gives 0."""
    s = np.asarray(surprisal, np.float64)
    c = np.exp(-np.square(s - target) / (2.0 * width * width))
    return np.where(np.isnan(s), 0.0, c)


def step_value(surprisal, contradictions, config: CuriosityConfig) -> np.ndarray:
    """v_j = C(s_j) - penalty * n_j (module docstring); surprisal, contradictions [K] -> [K]."""
    n = np.asarray(contradictions, np.float64)
    return curiosity(surprisal, config.target, config.width) - config.penalty * n


def unit(value) -> np.ndarray:
    """(clip(v, -1, 1) + 1) / 2: a step value as a value-model target in [0, 1]."""
    return (np.clip(np.asarray(value, np.float64), -1.0, 1.0) + 1.0) / 2.0


def plot_return(surprisal, contradictions, config: CuriosityConfig) -> float:
    """The mean of unit(v_j) over a plot's K steps: what the search backs up."""
    return float(np.mean(unit(step_value(surprisal, contradictions, config))))


def step_spans(encode: Callable[[str], list[int]], lines: Sequence[str],
               max_len: int) -> list[tuple[int, int]]:
    """Token positions [a_j, b_j) of each line of the plot "\\n".join(lines) (the newline before a
    line belongs to no span; an empty line has an empty span), clipped to `max_len` tokens.
    `encode` is the tokenizer's; exact for a byte tokenizer and any prefix-consistent one."""
    out, text = [], ""
    for j, line in enumerate(lines):
        start = len(encode(text + ("\n" if j else ""))) if text or j else 0
        text = text + ("\n" if j else "") + line
        end = len(encode(text)) if line else start
        out.append((min(start, max_len), min(end, max_len)))
    return out


def plot_score(token_logp, spans: Sequence[tuple[int, int]], contradictions,
               config: CuriosityConfig) -> dict:
    """A plot's K steps scored from its token log-probs [T] (`step_spans`) and the checker's
    contradictions n_j [K]: {"surprisal": s_j, "contradictions": n_j, "values": v_j = C(s_j) -
    penalty * n_j, "return": mean_j unit(v_j)} (module docstring)."""
    s = step_surprisal(token_logp, list(spans))
    v = step_value(s, contradictions, config)
    return {"surprisal": s, "contradictions": list(contradictions), "values": v,
            "return": float(np.mean(unit(v)))}


def mixed_target(step_unit: float | None, backed_up: float, step_weight: float) -> float:
    """The value model's target for a node: w * unit(v) of the step that made it plus (1 - w) *
    the search's backed-up return below it; the root (no step) takes the backed-up return."""
    if step_unit is None:
        return float(backed_up)
    return float(step_weight * step_unit + (1.0 - step_weight) * backed_up)


__all__ = ["CuriosityConfig", "curiosity", "mixed_target", "plot_return", "plot_score",
           "step_spans", "step_surprisal", "step_value", "unit"]

"""Auto-think rewards (SpatialTree, arXiv 2512.20617): think where reasoning helps, answer
directly where it only hurts perception.

SpatialTree reports that naive RLVR which encourages thinking everywhere helps its reasoning
levels (L3 simulation, L4 agentic) and hurts L1 perception, and that auto-think (no thinking on
perception, thinking on the higher levels) improves every level. No training code is public;
the two rules here are this project's readings, as rewards added to correctness:

  by level (`level_mode_term`, `auto_think_level_rewards`): the level fixes the mode,
      r = c + penalty * m,  m = -1 if (level in direct_levels and thinks)
                              or (level in think_levels and not thinks), else 0;
      defaults think_levels = (3, 4), direct_levels = (1,): thinking on L1 costs `penalty`,
      skipping it on L3 / L4 costs `penalty`, and L2 is free either way. With
      think_levels = (1, 2, 3, 4) and direct_levels = () it is the naive think-everywhere rule;
      with think_levels = () and direct_levels = (1, 2, 3, 4) the no-think control (thinking
      costs `penalty` on every level).
  by a per-item no-think probe (`auto_think_probe_rewards`): the model picks its mode and its
      own group decides: within a group of G samples of one prompt,
      r_j = c_j - penalty * thinks_j * 1[exists k: not thinks_k and c_k = 1],
      i.e. a thinking sample pays `penalty` iff a no-think sample of the same group is right.

`thinks` is read from the completion (`is_thinking`): the text after its first "<think>", up to
the first "</think>" or the end, holds a non-space character. So "<think></think><answer>..."
is a direct answer and an unclosed "<think>..." (cut off mid-thought) is thinking.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jaxrl_suite.rewards.r1zero import THINK_CLOSE, THINK_OPEN

LEVELS = (1, 2, 3, 4)
THINK_LEVELS = (3, 4)  # levels where the by-level rule requires thinking
DIRECT_LEVELS = (1,)  # levels where it penalises thinking


def is_thinking(completion: str) -> bool:
    """Whether the completion thinks (module docstring): non-space text after its first
    "<think>", up to the first "</think>" after it or the end."""
    start = completion.find(THINK_OPEN)
    if start < 0:
        return False
    start += len(THINK_OPEN)
    end = completion.find(THINK_CLOSE, start)
    span = completion[start:] if end < 0 else completion[start:end]
    return not span.isspace() and span != ""


def level_mode_term(thinking, levels, *, think_levels: Sequence[int] = THINK_LEVELS,
                    direct_levels: Sequence[int] = DIRECT_LEVELS) -> np.ndarray:
    """m in {-1, 0}, float [N]: -1 where the mode breaks the level's rule (thinking on a direct
    level, no thinking on a think level), else 0.

    Args:
      thinking: bool [N], whether each completion thinks.
      levels: int [N], each item's level in 1..4.
    """
    thinking = np.asarray(thinking, dtype=bool)
    levels = np.asarray(levels)
    if thinking.shape != levels.shape or thinking.ndim != 1:
        raise ValueError(f"thinking and levels must be equal 1-d shapes, got {thinking.shape} "
                         f"and {levels.shape}")
    if not np.isin(levels, LEVELS).all():
        raise ValueError(f"levels must be in {list(LEVELS)}, got {sorted(set(levels.tolist()))}")
    if set(think_levels) & set(direct_levels):
        raise ValueError(f"think_levels {tuple(think_levels)} and direct_levels "
                         f"{tuple(direct_levels)} overlap")
    wrong = (np.isin(levels, direct_levels) & thinking) | (np.isin(levels, think_levels)
                                                            & ~thinking)
    return -wrong.astype(np.float64)


def auto_think_level_rewards(correct, thinking, levels, *, penalty: float = 0.5,
                             think_levels: Sequence[int] = THINK_LEVELS,
                             direct_levels: Sequence[int] = DIRECT_LEVELS) -> np.ndarray:
    """Auto-think by level: r = c + penalty * m (m = `level_mode_term`), float [N].

    Args:
      correct: float [N], correctness in [0, 1].
      thinking: bool [N]; levels: int [N] in 1..4.
      penalty: what breaking the level's mode rule costs.
    """
    correct = np.asarray(correct, dtype=np.float64)
    m = level_mode_term(thinking, levels, think_levels=think_levels, direct_levels=direct_levels)
    if correct.shape != m.shape:
        raise ValueError(f"correct must have shape {m.shape}, got {correct.shape}")
    return correct + penalty * m


def auto_think_probe_rewards(correct, thinking, *, penalty: float = 0.5) -> np.ndarray:
    """Auto-think by a per-item no-think probe, float [B, G]:
    r_bj = c_bj - penalty * thinks_bj * 1[exists k: not thinks_bk and c_bk = 1].

    Args:
      correct: float [B, G], correctness in [0, 1] of G samples per prompt (1.0 = right).
      thinking: bool [B, G], whether each sample thinks.
      penalty: what a thinking sample pays when a direct sample of its group is right.
    """
    correct = np.asarray(correct, dtype=np.float64)
    thinking = np.asarray(thinking, dtype=bool)
    if correct.ndim != 2 or correct.shape != thinking.shape:
        raise ValueError(f"correct and thinking must be equal [B, G] shapes, got "
                         f"{correct.shape} and {thinking.shape}")
    probe_right = ((correct == 1.0) & ~thinking).any(axis=1, keepdims=True)  # [B, 1]
    return correct - penalty * (thinking & probe_right)


__all__ = [
    "DIRECT_LEVELS",
    "LEVELS",
    "THINK_LEVELS",
    "auto_think_level_rewards",
    "auto_think_probe_rewards",
    "is_thinking",
    "level_mode_term",
]

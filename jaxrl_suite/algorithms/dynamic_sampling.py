"""DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476), shared by every GRPO trainer: a
group whose G rewards are all equal has zero group-relative advantage and no gradient, so a step
draws rollouts until it holds `prompts_per_step` groups whose rewards differ (or a cap of draws
is spent), filling any free places with all-equal groups whose loss mask the trainer zeroes.
Host-side and pure: rewards in, choices and metrics out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def informative_groups(rewards) -> np.ndarray:
    """[B] bool: the groups of rewards [B, G] whose G rewards are not all equal, the ones a
    group-relative advantage gives a gradient (DAPO's dynamic-sampling filter)."""
    rewards = np.asarray(rewards)
    return np.any(rewards != rewards[:, :1], axis=1)


def select_groups(draws: Sequence[np.ndarray], b: int) -> tuple[list[tuple[int, int]], int]:
    """DAPO's dynamic-sampling choice over the rewards [B_d, G] of successive draws: the
    (draw, group) of the first `b` groups whose rewards are not all equal, in draw order, then
    (when fewer are found) the first all-equal groups to fill the batch. Returns (chosen, filled):
    the `b` places, of which the first `filled` hold informative groups."""
    kept, spare = [], []
    for d, rewards in enumerate(draws):
        for i, informative in enumerate(informative_groups(rewards)):
            (kept if informative else spare).append((d, i))
    filled = min(len(kept), b)
    return kept[:b] + spare[: b - filled], filled


def draw_until_full(draw: Callable[[int], tuple[Any, np.ndarray]], max_draws: int, b: int):
    """Dynamic sampling's loop, shared by every trainer: `draw(d) -> (payload, rewards [B, G])`
    for d = 0, 1, ... until `b` groups whose rewards differ have been drawn or `max_draws` draws
    are spent. Returns (payloads, rewards per draw, chosen, filled), the last two
    `select_groups`'s."""
    payloads, draws = [], []
    for d in range(max_draws):
        payload, rewards = draw(d)
        payloads.append(payload)
        draws.append(np.asarray(rewards))
        if informative_groups(np.concatenate(draws)).sum() >= b:
            break
    return payloads, draws, *select_groups(draws, b)


def pool_metrics(draws: Sequence[np.ndarray], filled: int, b: int) -> dict[str, float]:
    """Dynamic sampling's metrics over every drawn group: kept_frac, draws, filled (the share
    of the batch's groups that carry a gradient), reward, reward_std, zero_std_frac."""
    pool = np.concatenate(draws)  # [draws * B, G]
    std = pool.std(axis=1)
    return {"kept_frac": float(np.mean(std > 0)), "draws": float(len(draws)),
            "filled": filled / b, "reward": float(pool.mean()),
            "reward_std": float(std.mean()), "zero_std_frac": float(np.mean(std == 0))}


__all__ = ["draw_until_full", "informative_groups", "pool_metrics", "select_groups"]

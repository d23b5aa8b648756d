"""DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476), shared by every GRPO trainer: a
group whose G rewards are all equal has zero group-relative advantage and no gradient, so a step
draws rollouts until it holds `prompts_per_step` groups whose rewards differ (or a cap of draws
is spent), filling any free places with all-equal groups whose loss mask the trainer zeroes.
Host-side and pure: rewards in, choices and metrics out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxrl_suite.core.parallel import gather_rows, host_local, process_rows, shard_batch
from jaxrl_suite.models.sequence import SeqBatch


def informative_groups(rewards):
    """[..., B] bool: the groups of rewards [..., B, G] whose G rewards are not all equal, the
    ones a group-relative advantage gives a gradient (DAPO's dynamic-sampling filter). Numpy in,
    numpy out; a JAX array (a traced one too: `algorithms.grpo_ondevice`) gives a JAX array."""
    rewards = rewards if isinstance(rewards, jax.Array) else np.asarray(rewards)
    return (rewards != rewards[..., :1]).any(axis=-1)


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


def dynamic_rollout(rollout: Callable, examples: Sequence, key: jax.Array, *, b: int, g: int,
                    mesh):
    """Dynamic sampling over the pool `examples` (max_draws x B prompts): `rollout(prompts,
    key) -> (SeqBatch, old_logp, rewards [B, G], info)` of B prompts at a time (draw d with key
    fold_in(key, d); draw 0 with `key` itself), keeping the groups whose rewards are not all
    equal (`informative_groups`) until B are kept or the pool is spent. Free places are filled
    with all-equal groups whose loss mask is zeroed. Returns the rollout's four outputs for the
    B kept groups (placed on `mesh` like a rollout's), and the pool's metrics (kept_frac,
    draws, filled; reward, reward_std, zero_std_frac and accuracy over every drawn group)."""

    def draw(d):
        seq, old_logp, rewards, info = rollout(examples[d * b : (d + 1) * b],
                                               key if d == 0 else jax.random.fold_in(key, d))
        if seq.images is not None:
            raise ValueError("grpo.dynamic_sampling does not take image prompts yet (a "
                             "vision-language policy): set it false")
        rows = [gather_rows(host_local(x)) for x in (*seq[:4], old_logp)]  # host, global
        return (rows, info), rewards

    out, drawn, chosen, filled = draw_until_full(draw, len(examples) // b, b)
    rows, infos = [o[0] for o in out], [o[1] for o in out]
    cols = [np.concatenate([rows[d][j][i * g : (i + 1) * g] for d, i in chosen])
            for j in range(5)]
    loss_mask = cols[3] * np.repeat(np.arange(b) < filled, g)[:, None].astype(np.float32)
    local = process_rows(b * g)
    seq = SeqBatch(*shard_batch(tuple(x[local] for x in (*cols[:4], loss_mask)), mesh))
    old_logp = shard_batch(cols[4][local], mesh)
    rewards = np.stack([drawn[d][i] for d, i in chosen])  # [B, G]
    info = {**infos[0], "accuracy": float(np.mean([i["accuracy"] for i in infos])),
            "length": float(np.mean([i["length"] for i in infos])),
            "tokens": int(sum(i["tokens"] for i in infos))}
    metrics = {**pool_metrics(drawn, filled, b), "accuracy": info["accuracy"]}
    return seq, old_logp, rewards, info, metrics


__all__ = ["draw_until_full", "dynamic_rollout", "informative_groups", "pool_metrics",
           "select_groups"]

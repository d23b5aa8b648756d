"""Length-aware scheduling of a rollout's sequences over a fixed number of decode slots
(Infinite Sampling, Wang et al., arXiv 2506.22950), on the host, in numpy.

A rollout of R sequences (B prompts x G samples) is decoded by `ContinuousSampler` in M slots
(M <= R: the KV cache holds M rows). Which sequence a slot takes next is a queue order over the
R rows, fixed before decoding from predicted completion lengths:

  prediction   `LengthPredictor`: an exponential moving average of each prompt's completion
               lengths in earlier rollouts (prompt id = a hash of its tokens), with a fallback to
               the mean over every prompt seen (the task mean), or N/2 before any rollout.
  rounds       (naive micro sampling groups) the queue is cut into rounds of M rows; a round
               starts when every row of the previous one is done, so its cost in decode steps is
               the longest length in it, and a rollout costs sum over rounds of max length (a row
               that ends with its first token takes no slot).
               `order="fifo"` keeps the rollout's order (the paper's naive micro-groups).
               Sorting by predicted length, then cutting (`order="lpt"` or "sjf"), minimises
               that sum exactly for the predicted lengths: the round that holds the longest
               sequence costs its length whatever else it holds, so filling it with the next
               M - 1 longest can only lower the rest (an exchange argument, by induction). This
               replaces the paper's FPTAS, which approximates the same partition.
  continuous   a slot is refilled as soon as its sequence ends (EOS or N tokens), with the next
               sequence of the queue, from any group; decode steps = the makespan of list
               scheduling on M machines.
               `order="fifo"`: the rollout's order;
               `order="sjf"`: shortest predicted first (the paper's runtime refill rule; it
               minimises the mean completion time, not the makespan);
               `order="lpt"`: longest predicted first (Graham's LPT list scheduling, makespan
               <= (4/3 - 1/(3M)) x optimal when the predictions are exact).

`decode_steps` simulates both refill modes in numpy: it is the reference the jitted loop's step
count is tested against, and what `benchmarks/bench_rollout.py` compares with it.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

ORDERS = ("fifo", "sjf", "lpt")
REFILLS = ("continuous", "rounds")


def prompt_ids(prompt: np.ndarray, prompt_mask: np.ndarray) -> list[int]:
    """A stable id per row [B]: the CRC32 of its real (unmasked) prompt tokens."""
    prompt, prompt_mask = np.asarray(prompt), np.asarray(prompt_mask, bool)
    return [zlib.crc32(np.ascontiguousarray(row[m], np.int32).tobytes())
            for row, m in zip(prompt, prompt_mask, strict=True)]


class LengthPredictor:
    """Per-prompt exponential moving average of completion lengths.

    predict(ids) -> [B] float: for a prompt seen before, its EMA
        L_hat <- decay * L_hat + (1 - decay) * mean(lengths of its rows in the latest rollout);
    for a new prompt, the mean over every completion seen so far (the task mean), or `default`
    (N / 2 for the samplers) before any.
    """

    def __init__(self, *, decay: float = 0.5, default: float = 0.0):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"LengthPredictor decay must be in [0, 1), got {decay}")
        self.decay, self.default = decay, float(default)
        self.ema: dict[int, float] = {}
        self._total, self._count = 0.0, 0

    @property
    def task_mean(self) -> float:
        return self._total / self._count if self._count else self.default

    def predict(self, ids: Sequence[int]) -> np.ndarray:
        fallback = self.task_mean
        return np.array([self.ema.get(i, fallback) for i in ids], np.float64)

    def update(self, ids: Sequence[int], lengths: np.ndarray) -> None:
        lengths = np.asarray(lengths, np.float64)
        by_id: dict[int, list[float]] = {}
        for i, n in zip(ids, lengths, strict=True):
            by_id.setdefault(i, []).append(float(n))
        for i, ns in by_id.items():
            mean = float(np.mean(ns))
            self.ema[i] = mean if i not in self.ema else (
                self.decay * self.ema[i] + (1.0 - self.decay) * mean)
        self._total += float(lengths.sum())
        self._count += lengths.size


def queue_order(predicted: np.ndarray, order: str) -> np.ndarray:
    """The refill queue [R] int32 (row indices) for predicted lengths [R]: "fifo" the rows in
    order, "sjf" ascending and "lpt" descending predicted length (stable: ties keep row order,
    so a group's rows stay together)."""
    predicted = np.asarray(predicted)
    if order == "fifo":
        return np.arange(predicted.size, dtype=np.int32)
    if order == "sjf":
        return np.argsort(predicted, kind="stable").astype(np.int32)
    if order == "lpt":
        return np.argsort(-predicted, kind="stable").astype(np.int32)
    raise ValueError(f"order must be one of {ORDERS}, got {order!r}")


def decode_steps(lengths: np.ndarray, queue: np.ndarray, slots: int, refill: str) -> int:
    """Decode steps to produce completions of `lengths` [R] (tokens, >= 1 each) in `slots`
    slots, taking rows in `queue` order. A row's first token comes from its prefill, so a row
    of length L occupies its slot for L - 1 decode steps.

    rounds: sum over rounds of max(L) - 1, a round being the next `slots` queue rows with
    L > 1 (with the L = 1 rows among them, which end with their prefill and take no slot).
    continuous: list scheduling; a slot freed after a step is refilled before the next one
    (an L = 1 row frees its slot at once).
    """
    lengths = np.asarray(lengths)[np.asarray(queue)]
    if refill == "rounds":
        steps, queue_pos = 0, 0
        while queue_pos < lengths.size:  # one round: the next `slots` rows that need a slot
            occupied, longest = 0, 0
            while occupied < slots and queue_pos < lengths.size:
                n = lengths[queue_pos] - 1
                queue_pos += 1
                occupied += n > 0
                longest = max(longest, n)
            steps += longest
        return int(steps)
    if refill != "continuous":
        raise ValueError(f"refill must be one of {REFILLS}, got {refill!r}")
    remaining = np.zeros(slots, np.int64)  # decode steps left per slot
    queue_pos, steps = 0, 0
    while True:
        for s in range(slots):  # refill every free slot (rows that end at once leave it free)
            while remaining[s] == 0 and queue_pos < lengths.size:
                remaining[s] = lengths[queue_pos] - 1
                queue_pos += 1
        if not remaining.any():
            return steps
        steps += 1
        remaining = np.maximum(remaining - 1, 0)


__all__ = ["ORDERS", "REFILLS", "LengthPredictor", "decode_steps", "prompt_ids", "queue_order"]

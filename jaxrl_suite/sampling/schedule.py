"""Length-aware scheduling of a rollout's sequences over a fixed number of decode slots
(Infinite Sampling, Wang et al., arXiv 2506.22950), on the host, in numpy.

A rollout of R sequences (B prompts x G samples) is decoded by `ContinuousSampler` in M slots
(M <= R: the KV cache holds M rows). Which sequence a slot takes next is a queue order over the
R rows, fixed before decoding from predicted completion lengths:

  prediction   `LengthPredictor`: an exponential moving average of each prompt's completion
               lengths in earlier rollouts (prompt id = a hash of its tokens), with a fallback to
               the mean over every prompt seen (the task mean), or N/2 before any rollout. What it
               has learned is a `LengthTable` of arrays, checkpointed in the train state.
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
from typing import NamedTuple

import numpy as np

ORDERS = ("fifo", "sjf", "lpt")
REFILLS = ("continuous", "rounds")


def prompt_ids(prompt: np.ndarray, prompt_mask: np.ndarray) -> list[int]:
    """A stable id per row [B]: the CRC32 of its real (unmasked) prompt tokens."""
    prompt, prompt_mask = np.asarray(prompt), np.asarray(prompt_mask, bool)
    return [zlib.crc32(np.ascontiguousarray(row[m], np.int32).tobytes())
            for row, m in zip(prompt, prompt_mask, strict=True)]


class LengthTable(NamedTuple):
    """What a `LengthPredictor` has learned, as host arrays of fixed shapes, so a train state
    holds it and a checkpoint restores it into a fresh one's structure (`ContinuousSampler`'s
    `learning_state`). Slots fill in the order prompts are first seen; -1 marks a free one."""

    ids: np.ndarray  # [capacity] int64: prompt ids (`prompt_ids`), -1 = free
    ema: np.ndarray  # [capacity] float64: each prompt's EMA of completion lengths
    total: np.ndarray  # float64 scalar: the sum of every completion length seen
    count: np.ndarray  # int64 scalar: how many completions


class LengthPredictor:
    """Per-prompt exponential moving average of completion lengths, over a `LengthTable`.

    table = predictor.init()
    predicted = predictor.predict(table, ids)           # [B] float64
    table = predictor.update(table, ids, lengths)       # a new table; the old one is unchanged

    predict: for a prompt seen before, its EMA
        L_hat <- decay * L_hat + (1 - decay) * mean(lengths of its rows in the latest rollout);
    for a new prompt, the mean over every completion seen so far (the task mean), or `default`
    (N / 2 for the samplers) before any. The table holds `capacity` prompts; an update that
    would see more raises (a run's distinct prompts: at most steps x prompts per step).
    """

    def __init__(self, *, decay: float = 0.5, default: float = 0.0, capacity: int = 1 << 16):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"LengthPredictor decay must be in [0, 1), got {decay}")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"LengthPredictor capacity must be a positive int, got {capacity!r}")
        self.decay, self.default, self.capacity = decay, float(default), capacity

    def init(self) -> LengthTable:
        """The table of a predictor that has seen nothing."""
        return LengthTable(np.full(self.capacity, -1, np.int64),
                           np.zeros(self.capacity, np.float64), np.asarray(0.0, np.float64),
                           np.asarray(0, np.int64))

    def task_mean(self, table: LengthTable) -> float:
        """The mean of every completion length in `table` (`default` before any)."""
        count = int(table.count)
        return float(table.total) / count if count else self.default

    @staticmethod
    def _index(table: LengthTable) -> dict[int, int]:
        """prompt id -> its slot in the table."""
        n = int(np.count_nonzero(table.ids >= 0))
        return {i: j for j, i in enumerate(table.ids[:n].tolist())}

    def predict(self, table: LengthTable, ids: Sequence[int]) -> np.ndarray:
        """Predicted completion lengths [B] float64 of prompts `ids` (see the class docstring)."""
        index, fallback = self._index(table), self.task_mean(table)
        return np.array([table.ema[index[i]] if i in index else fallback for i in ids],
                        np.float64)

    def update(self, table: LengthTable, ids: Sequence[int], lengths: np.ndarray
               ) -> LengthTable:
        """`table` after a rollout whose rows [B] have prompt `ids` and completion `lengths`."""
        lengths = np.asarray(lengths, np.float64)
        by_id: dict[int, list[float]] = {}
        for i, n in zip(ids, lengths, strict=True):
            by_id.setdefault(int(i), []).append(float(n))
        index = self._index(table)
        size = len(index)
        new = sum(i not in index for i in by_id)
        if size + new > self.capacity:
            raise ValueError(f"LengthPredictor: {size + new} distinct prompts exceed its capacity "
                             f"{self.capacity}; build it with a larger capacity "
                             f"(ContinuousSampler(predictor=LengthPredictor(capacity=...)))")
        table_ids, ema = table.ids.copy(), table.ema.copy()
        for i, ns in by_id.items():
            mean = float(np.mean(ns))
            if i in index:
                j = index[i]
                ema[j] = self.decay * ema[j] + (1.0 - self.decay) * mean
            else:
                table_ids[size], ema[size] = i, mean
                size += 1
        return LengthTable(table_ids, ema, np.asarray(float(table.total) + float(lengths.sum()),
                                                      np.float64),
                           np.asarray(int(table.count) + lengths.size, np.int64))


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


__all__ = ["ORDERS", "REFILLS", "LengthPredictor", "LengthTable", "decode_steps", "prompt_ids",
           "queue_order"]

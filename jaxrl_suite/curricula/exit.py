"""ExIt: Exploratory Iteration (Jiang, Lupu and Bachrach, "Bootstrapping Task Spaces for
Self-Improvement", arXiv 2509.04575): the task buffer, its sampling and the diversity bonus.

ExIt trains on single self-improvement steps only. A step starts either from a fresh task (turn 0)
or from a *partial history* kept in a buffer: a task together with a previous attempt (its tokens
and its score), from which the model is asked for an improved answer. Every response a rollout
produces is a new partial history, one turn deeper. The buffer keeps the entries worth expanding:

    learnability(G returns r_1..r_G) = Var_i[ r_hat_i ],  r_hat = (r - min r) / (max r - min r)
                                                              (0 when all returns are equal)

the variance of the min-max normalised returns of the GRPO group that last expanded the entry.
Sampling (per batch element): with probability p_select, and once the buffer holds at least
`min_size` entries, an entry is drawn rank-weighted by priority,

    P(i) = h_i^(1/T) / sum_j h_j^(1/T),   h_i = 1 / rank(priority_i)   (rank 1 = highest)

otherwise a fresh task at turn 0. With probability p_div the step is *self-divergent*: the prompt
asks for an improvement that takes a significantly different approach. New entries fill empty
slots; when the buffer is full an entry replaces the lowest-priority one if its priority is higher.

Diversity bonus: the advantages of successful responses (A > 0) are multiplied by their
range-normalised embedding distance to the group centroid,

    d_i = || e_i - mean_j e_j ||,   b_i = (d_i - min d) / (max d - min d)   (1 when all equal)
    A_i <- b_i * A_i   if A_i > 0,   else A_i

with e_i the policy's mean-pooled final hidden states of response i.

Everything is a pure function of fixed-shape arrays (jit-able); the state is an `ExItState`
pytree. Text (prompts, feedback) is built on the host from the stored tokens.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_suite.losses.common import check_rank


class ExItState(NamedTuple):
    task: jax.Array  # [C] int32: index of the task (problem) the entry belongs to
    turn: jax.Array  # [C] int32: how many attempts the history holds (>= 1 in the buffer)
    response: jax.Array  # [C, R] int32: tokens of the latest attempt (padded)
    response_len: jax.Array  # [C] int32: its valid length
    score: jax.Array  # [C] float32: the verifier's score of the latest attempt
    priority: jax.Array  # [C] float32: learnability when last expanded
    valid: jax.Array  # [C] bool: the slot holds an entry
    stamp: jax.Array  # [C] int32: insertion counter (older entries lose ties on eviction)
    count: jax.Array  # int32 scalar: entries inserted so far


class ExItBatch(NamedTuple):
    from_buffer: jax.Array  # [n] bool: start from a buffer entry (else a fresh task, turn 0)
    index: jax.Array  # [n] int32: the buffer slot (meaningful where from_buffer)
    divergent: jax.Array  # [n] bool: ask for a significantly different approach


def learnability(returns: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Variance of the min-max normalised returns of one group, [..., G] -> [...].

    `mask` [..., G] selects the valid group members (all if None). 0 when the returns are all
    equal (nothing to learn from the group)."""
    returns = jnp.asarray(returns, jnp.float32)
    mask = jnp.ones_like(returns, bool) if mask is None else jnp.asarray(mask, bool)
    big = jnp.finfo(jnp.float32).max
    lo = jnp.min(jnp.where(mask, returns, big), axis=-1, keepdims=True)
    hi = jnp.max(jnp.where(mask, returns, -big), axis=-1, keepdims=True)
    span = hi - lo
    norm = jnp.where(span > 0, (returns - lo) / jnp.where(span > 0, span, 1.0), 0.0)
    m = mask.astype(jnp.float32)
    n = jnp.maximum(m.sum(-1, keepdims=True), 1.0)
    mean = (norm * m).sum(-1, keepdims=True) / n
    return (((norm - mean) ** 2) * m).sum(-1) / n[..., 0]


def rank_weights(priority: jax.Array, valid: jax.Array, temperature: float = 1.0) -> jax.Array:
    """Sampling probabilities h_i^(1/T) / sum_j h_j^(1/T), h_i = 1/rank_i over the valid slots.

    Ranks count from 1 at the highest priority; ties are ranked by slot order. [C] -> [C]; zero
    on invalid slots (all zero if no slot is valid)."""
    if temperature <= 0:
        raise ValueError(f"rank temperature must be > 0, got {temperature}")
    key = jnp.where(valid, priority, -jnp.inf)
    order = jnp.argsort(-key, stable=True)  # slots by decreasing priority
    ranks = jnp.empty_like(order).at[order].set(jnp.arange(1, order.shape[0] + 1))
    h = jnp.where(valid, (1.0 / ranks.astype(jnp.float32)) ** (1.0 / temperature), 0.0)
    return h / jnp.maximum(h.sum(), 1e-30)


def diversity_bonus(embeddings: jax.Array, advantages: jax.Array,
                    mask: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """ExIt's multiplicative diversity bonus for one group.

    embeddings [G, D] (the policy's mean-pooled final hidden states), advantages [G], mask [G]
    (valid members; all if None). Returns (advantages with A_i > 0 scaled by b_i, {"bonus": b
    [G]}), b the range-normalised distance to the centroid of the valid members (1 when every
    distance is equal, so a degenerate group is left unchanged)."""
    check_rank("embeddings", embeddings, 2)
    check_rank("advantages", advantages, 1)
    mask = jnp.ones(advantages.shape, bool) if mask is None else jnp.asarray(mask, bool)
    m = mask.astype(embeddings.dtype)[:, None]
    centroid = (embeddings * m).sum(0) / jnp.maximum(m.sum(), 1.0)
    d = jnp.linalg.norm(embeddings - centroid, axis=-1)
    big = jnp.finfo(d.dtype).max
    lo, hi = jnp.min(jnp.where(mask, d, big)), jnp.max(jnp.where(mask, d, -big))
    span = hi - lo
    bonus = jnp.where(span > 1e-12, (d - lo) / jnp.where(span > 1e-12, span, 1.0), 1.0)
    bonus = jnp.where(mask, bonus, 1.0)
    return jnp.where(advantages > 0, bonus * advantages, advantages), {"bonus": bonus}


@dataclasses.dataclass(frozen=True, eq=False)
class ExItBuffer:
    """The ExIt task buffer; the defaults are the paper's (p_select 0.5, p_div 0.1, 1024, 64)."""

    capacity: int = 1024
    response_len: int = 64  # R: tokens stored per attempt
    p_select: float = 0.5
    p_div: float = 0.1
    min_size: int = 64  # sample from the buffer only once it holds this many entries
    rank_temperature: float = 1.0

    def __post_init__(self):
        for name in ("capacity", "response_len", "min_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("p_select", "p_div"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.rank_temperature <= 0:
            raise ValueError(f"rank_temperature must be > 0, got {self.rank_temperature}")

    def init(self) -> ExItState:
        c, r = self.capacity, self.response_len
        zi = jnp.zeros((c,), jnp.int32)
        return ExItState(task=zi, turn=zi, response=jnp.zeros((c, r), jnp.int32),
                         response_len=zi, score=jnp.zeros((c,), jnp.float32),
                         priority=jnp.zeros((c,), jnp.float32), valid=jnp.zeros((c,), bool),
                         stamp=zi, count=jnp.zeros((), jnp.int32))

    def size(self, state: ExItState) -> jax.Array:
        return state.valid.sum().astype(jnp.int32)

    def sample(self, state: ExItState, key: jax.Array, n: int) -> ExItBatch:
        """How each of `n` batch elements starts (pure: the state is unchanged)."""
        k_sel, k_idx, k_div = jax.random.split(key, 3)
        ready = self.size(state) >= self.min_size
        from_buffer = ready & (jax.random.uniform(k_sel, (n,)) < self.p_select)
        p = rank_weights(state.priority, state.valid, self.rank_temperature)
        index = jax.random.choice(k_idx, self.capacity, (n,), replace=True, p=p)
        divergent = jax.random.uniform(k_div, (n,)) < self.p_div
        return ExItBatch(from_buffer, index.astype(jnp.int32), divergent)

    def update_priority(self, state: ExItState, index: jax.Array, priority: jax.Array,
                        mask: jax.Array) -> ExItState:
        """Sets the priority of the expanded entries index [n] (where mask [n]) to priority [n]
        (the learnability of the group that expanded them)."""
        idx = jnp.where(mask, index, self.capacity)  # out of range: dropped
        return state._replace(priority=state.priority.at[idx].set(priority, mode="drop"))

    def insert(self, state: ExItState, task: jax.Array, turn: jax.Array, response: jax.Array,
               response_len: jax.Array, score: jax.Array, priority: jax.Array,
               mask: jax.Array) -> ExItState:
        """Adds the new partial histories where mask [M]: task, turn, response_len, score,
        priority [M], response [M, R]. Each fills an empty slot, or, in a full buffer, replaces
        the lowest-priority entry (the oldest among equals) if its own priority is higher."""
        response = jnp.asarray(response, jnp.int32)
        check_rank("response", response, 2)
        if response.shape[1] != self.response_len:
            raise ValueError(f"response must be [M, {self.response_len}] tokens, got "
                             f"{response.shape}")

        def one(s: ExItState, new):
            t, tn, resp, rlen, sc, pr, ok = new
            empty = ~s.valid
            # the slot to use: the first empty one, else the lowest (priority, stamp)
            victim = jnp.lexsort((s.stamp, s.priority))[0]
            slot = jnp.where(empty.any(), jnp.argmax(empty), victim)
            do = ok & (empty.any() | (pr > s.priority[victim]))
            slot = jnp.where(do, slot, self.capacity)  # out of range: dropped

            def put(arr, v):
                return arr.at[slot].set(v, mode="drop")

            return ExItState(task=put(s.task, t), turn=put(s.turn, tn),
                             response=put(s.response, resp), response_len=put(s.response_len,
                                                                             rlen),
                             score=put(s.score, sc), priority=put(s.priority, pr),
                             valid=put(s.valid, True), stamp=put(s.stamp, s.count),
                             count=s.count + do.astype(jnp.int32)), None

        new = (jnp.asarray(task, jnp.int32), jnp.asarray(turn, jnp.int32),
               jnp.asarray(response, jnp.int32), jnp.asarray(response_len, jnp.int32),
               jnp.asarray(score, jnp.float32), jnp.asarray(priority, jnp.float32),
               jnp.asarray(mask, bool))
        state, _ = jax.lax.scan(one, state, new)
        return state

    def metrics(self, state: ExItState) -> dict[str, jax.Array]:
        v = state.valid
        n = jnp.maximum(v.sum(), 1)
        return {"exit/size": v.sum(),
                "exit/mean_priority": jnp.where(v, state.priority, 0.0).sum() / n,
                "exit/mean_turn": jnp.where(v, state.turn, 0).sum() / n,
                "exit/max_turn": jnp.max(jnp.where(v, state.turn, 0)),
                "exit/mean_score": jnp.where(v, state.score, 0.0).sum() / n}


__all__ = ["ExItBatch", "ExItBuffer", "ExItState", "diversity_bonus", "learnability",
           "rank_weights"]

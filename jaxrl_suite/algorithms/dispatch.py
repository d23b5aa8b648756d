"""Dispatchers: how many tool-use episodes share one LM, the tools and the verifier.

An episode runs init -> (LM step -> tool)* -> LM step -> reward (`agent.EpisodeRunner` holds each
stage's logic). Two schedules, after SkyRL-Agent (arXiv 2511.16108; NovaSky-AI/SkyRL,
skyrl-agent/skyrl_agent/dispatcher/dispatchers.py):

- `async_batch`, the naive baseline: the episodes run in batches of `concurrency`; every stage
  is a barrier: all inits, then LM steps on every unfinished episode of the batch, each waiting
  for all of the batch's tool calls of the previous turn, then all rewards.
- `async_pipeline`: the stages are decoupled. Up to `concurrency` episodes are in flight; a
  finished episode's place goes at once to the next. Init, tool and reward jobs run
  concurrently on their executors (`ToolExecutor`: a process pool by default, Ray at scale);
  the LM stage batches whichever episodes are ready, up to `lm_batch` rows, while the others'
  tools run.

Concurrency model (our choice): threads, not asyncio. The LM stage is one blocking jitted call
on the driver thread, which also runs the event loop; the executors' futures report back
through a queue (bounded by the episodes in flight), so all episode state changes on one
thread. Every LM call is padded to a power of two of rows between `min_lm_batch` and
`lm_batch` (copies of a real row), so each size compiles once.

Both dispatchers give every episode the same completions whatever the schedule: turn t of
episode u is sampled as sequence u * max_turns + t of the sampler's per-sequence keys.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from jaxrl_suite.algorithms.executors import (
    LocalToolExecutor,
    RayToolExecutor,
    ToolExecutor,
    make_executor,
)

if TYPE_CHECKING:  # annotations only: algorithms.agent imports this module
    from jaxrl_suite.algorithms.agent import Episode, EpisodeRunner


class Latency:
    """Simulated latencies (seconds) of the init, tool and reward stages, drawn per job from a
    log-normal distribution: exp(N(log(median), sigma^2)), heavy-tailed for sigma ~ 1 (remote
    sandboxes and services). `median` 0 disables a stage's delay. Deterministic in `seed`."""

    def __init__(self, tool_median: float = 0.0, *, sigma: float = 1.0,
                 init_median: float = 0.0, reward_median: float = 0.0, seed: int = 0):
        self.medians = {"init": init_median, "tool": tool_median, "reward": reward_median}
        self.sigma = sigma
        self._rng = np.random.default_rng(seed)

    def draw(self, stage: str) -> float:
        median = self.medians[stage]
        return float(median * np.exp(self.sigma * self._rng.standard_normal())) if median else 0.0

    def describe(self) -> str:
        parts = [f"{k} median {v * 1e3:.0f} ms" for k, v in self.medians.items() if v]
        return (", ".join(parts) + f", log-normal sigma {self.sigma}") if parts else "none"


def delayed(delay: float, fn: Callable, *args):
    """`fn(*args)` after sleeping `delay` seconds: the benchmarks' simulated latency of a remote
    tool or reward service (module-level, so it pickles into a process pool)."""
    if delay > 0:
        time.sleep(delay)
    return fn(*args)


def lm_rows(n: int, min_rows: int, max_rows: int) -> int:
    """The padded row count of an LM call on n episodes: the next power of two >= n, at least
    `min_rows`, at most `max_rows` (so the shapes, and the compiles, are few)."""
    rows = max(min_rows, 1 << max(n - 1, 0).bit_length())
    return max(n, min(rows, max_rows))


def _submit(executor: ToolExecutor, job: tuple, delay: float):
    fn, *args = job
    return executor.submit(delayed, delay, fn, *args) if delay else executor.submit(fn, *args)


def async_batch(runner: EpisodeRunner, episodes: Sequence[Episode], executor: ToolExecutor,
                reward_executor: ToolExecutor | None = None, *, concurrency: int,
                lm_batch: int | None = None, min_lm_batch: int = 1,
                latency: Latency | None = None) -> list[Episode]:
    """The naive schedule: batches of `concurrency` episodes, each stage a barrier (module
    docstring). Returns `episodes`, finished (pending "done")."""
    reward_executor = reward_executor or executor
    lm_batch = lm_batch or concurrency
    delay = latency.draw if latency else (lambda stage: 0.0)
    for start in range(0, len(episodes), concurrency):
        chunk = list(episodes[start : start + concurrency])
        inits = [_submit(executor, runner.init_call(ep), delay("init")) for ep in chunk]
        for ep, f in zip(chunk, inits, strict=True):
            runner.on_init(ep, f.result())
        while True:
            ready = [ep for ep in chunk if ep.pending == "lm"]
            if not ready:
                break
            for i in range(0, len(ready), lm_batch):
                part = ready[i : i + lm_batch]
                runner.lm_step(part, lm_rows(len(part), min_lm_batch, lm_batch))
            calls = [ep for ep in ready if ep.pending == "tool"]
            futures = [_submit(executor, runner.tool_call(ep), delay("tool")) for ep in calls]
            for ep, f in zip(calls, futures, strict=True):
                runner.on_tool(ep, f.result())
        futures = [_submit(reward_executor, runner.reward_call(ep), delay("reward"))
                   for ep in chunk]
        for ep, f in zip(chunk, futures, strict=True):
            runner.on_reward(ep, f.result())
    return list(episodes)


def async_pipeline(runner: EpisodeRunner, episodes: Sequence[Episode], executor: ToolExecutor,
                   reward_executor: ToolExecutor | None = None, *, concurrency: int,
                   lm_batch: int | None = None, min_lm_batch: int = 1,
                   latency: Latency | None = None) -> list[Episode]:
    """The pipelined schedule (module docstring): at most `concurrency` episodes in flight, the
    LM batching whichever are ready (up to `lm_batch`) while tools and rewards run. Returns
    `episodes`, finished. An executor job that raises stops the run with its exception."""
    reward_executor = reward_executor or executor
    lm_batch = lm_batch or concurrency
    delay = latency.draw if latency else (lambda stage: 0.0)
    events: queue.Queue = queue.Queue(maxsize=2 * concurrency + 1)  # <= 1 job per episode
    waiting = list(episodes)[::-1]  # admitted from the end: episode order
    ready: list[Episode] = []
    in_flight = finished = 0

    def submit(stage: str, ep: Episode, ex: ToolExecutor, job: tuple) -> None:
        future = _submit(ex, job, delay(stage))
        future.add_done_callback(lambda f: events.put((stage, ep, f)))

    def admit() -> None:
        nonlocal in_flight
        while waiting and in_flight < concurrency:
            ep = waiting.pop()
            in_flight += 1
            submit("init", ep, executor, runner.init_call(ep))

    handlers: dict[str, Callable] = {"init": runner.on_init, "tool": runner.on_tool,
                                     "reward": runner.on_reward}
    admit()
    while finished < len(episodes):
        # Take every finished job (block for one only when the LM has nothing to do).
        block = not ready
        while True:
            try:
                stage, ep, future = events.get(block=block)
            except queue.Empty:
                break
            block = False
            handlers[stage](ep, future.result())
            if stage == "reward":
                finished += 1
                in_flight -= 1
                admit()
            elif ep.pending == "lm":
                ready.append(ep)
            elif ep.pending == "reward":
                submit("reward", ep, reward_executor, runner.reward_call(ep))
        if not ready:
            continue
        batch, ready = ready[:lm_batch], ready[lm_batch:]
        runner.lm_step(batch, lm_rows(len(batch), min_lm_batch, lm_batch))
        for ep in batch:
            if ep.pending == "tool":
                submit("tool", ep, executor, runner.tool_call(ep))
            elif ep.pending == "reward":
                submit("reward", ep, reward_executor, runner.reward_call(ep))
            else:  # an error observation: straight back to the LM
                ready.append(ep)
    return list(episodes)


DISPATCH: dict[str, Callable] = {"batch": async_batch, "pipeline": async_pipeline}

__all__ = [
    "DISPATCH",
    "Latency",
    "LocalToolExecutor",
    "RayToolExecutor",
    "ToolExecutor",
    "async_batch",
    "async_pipeline",
    "lm_rows",
    "make_executor",
]

"""Executors that run tool calls and rewards concurrently for the agent dispatchers.

A `ToolExecutor` is the small part of `concurrent.futures.Executor` the dispatchers use:
`submit(fn, *args, **kwargs)` returns a `concurrent.futures.Future`, `shutdown()` releases the
workers, and `workers` says how many calls run at once. Submitted functions must be picklable
(module-level), e.g. `envs.text.tools.run_tool`, which never raises and returns a `ToolOutput`:

    with make_executor("process", workers=4) as ex:
        futures = [ex.submit(run_tool, name, args, context) for name, args, context in calls]
        outputs = [f.result() for f in futures]

Implementations:

- `LocalToolExecutor` (the default): a process pool on this machine. Its workers are started
  with the "forkserver" method ("spawn" where there is none), never "fork": the trainer's process
  runs JAX/XLA threads, and a forked copy of a multi-threaded process can deadlock. `kind="thread"`
  gives a thread pool instead, for cheap tools (and tests).
- `RayToolExecutor`: each call is a Ray task, so tools and rewards can run on a cluster's CPUs.
  Needs the `[agents]` extra (`pip install 'jaxrl_suite[agents]'`).
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

EXECUTOR_KINDS = ("process", "thread", "ray")


@runtime_checkable
class ToolExecutor(Protocol):
    """What the dispatchers need from an executor (both implementations are context managers
    whose `__exit__` calls `shutdown()`)."""

    workers: int

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        """Runs fn(*args, **kwargs) on a worker; the Future holds its result or exception."""
        ...

    def shutdown(self) -> None:
        """Waits for the submitted calls and releases the workers; later submits raise."""
        ...


def _start_method() -> str:
    """forkserver where the platform has it (Linux, macOS), otherwise spawn; never fork."""
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def _preload(modules: tuple[str, ...]) -> None:
    """A worker's initializer: imports `modules` before it takes any call."""
    for name in modules:
        importlib.import_module(name)


def _worker_pid(delay: float) -> int:
    """warm()'s task: holds the worker for `delay` seconds, so that the tasks of one round
    spread over the workers, and returns its pid."""
    time.sleep(delay)
    return os.getpid()


class LocalToolExecutor:
    """A pool of `workers` processes (kind="process", the default) or threads (kind="thread").

    Processes are started with forkserver (spawn where there is none), not fork, since the
    parent runs JAX threads. A worker imports what a call's pickled function needs on its first
    call (`run_tool` imports the tool registry, about a second); `preload` names modules each
    worker imports when it starts, and `warm()` waits until every worker has started, so that
    this start-up cost is paid before anything is timed. With kind="thread" calls run in this
    process (no pickling, no start-up cost) and `preload` modules are imported here at once.
    """

    def __init__(self, workers: int = 2, *, kind: str = "process",
                 preload: Sequence[str] = ()) -> None:
        if workers < 1:
            raise ValueError(f"LocalToolExecutor needs workers >= 1, got {workers}")
        self.workers = int(workers)
        self.kind = kind
        modules = tuple(preload)
        # how worker processes start: "forkserver" or "spawn"; None for threads
        self.start_method: str | None = None
        if kind == "process":
            self.start_method = _start_method()
            self._pool: cf.Executor = cf.ProcessPoolExecutor(
                max_workers=self.workers, mp_context=mp.get_context(self.start_method),
                initializer=_preload if modules else None, initargs=(modules,))
        elif kind == "thread":
            _preload(modules)
            self._pool = cf.ThreadPoolExecutor(max_workers=self.workers,
                                               thread_name_prefix="tool-executor")
        else:
            raise ValueError(f"LocalToolExecutor kind must be 'process' or 'thread', got {kind!r}")

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        return self._pool.submit(fn, *args, **kwargs)

    def warm(self, timeout: float = 120.0) -> set[int]:
        """Starts every worker (their imports included) and returns their pids (this process's
        pid for threads). Raises TimeoutError if they are not all up within `timeout` seconds."""
        if self.kind == "thread":
            return {self.submit(_worker_pid, 0.0).result(timeout)}
        deadline = time.monotonic() + timeout
        seen: set[int] = set()
        while len(seen) < self.workers:  # a round's tasks can all go to the workers already up
            futures = [self.submit(_worker_pid, 0.05) for _ in range(self.workers)]
            for future in futures:
                seen.add(future.result(timeout=max(deadline - time.monotonic(), 0.0)))
            if len(seen) < self.workers and time.monotonic() > deadline:
                raise TimeoutError(f"only {len(seen)} of {self.workers} workers started "
                                   f"within {timeout} s")
        return seen

    def shutdown(self, *, wait: bool = True, cancel_futures: bool = False) -> None:
        """Releases the workers (idempotent); `wait`/`cancel_futures` as in
        `concurrent.futures.Executor.shutdown`."""
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)

    def __enter__(self) -> LocalToolExecutor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"LocalToolExecutor(workers={self.workers}, kind={self.kind!r})"


def _call(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """The Ray task: runs fn(*args, **kwargs) on a Ray worker (fn travels by cloudpickle)."""
    return fn(*args, **kwargs)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise ImportError("RayToolExecutor needs Ray: pip install 'jaxrl_suite[agents]'") from e
    return ray


def _starts_local(address: str | None) -> bool:
    """Whether ray.init(address=address) starts a new local instance (RAY_ADDRESS, when set,
    stands in for a missing address)."""
    return address is None and not os.environ.get("RAY_ADDRESS")


class RayToolExecutor:
    """Runs each call as a Ray task (one CPU each) and returns `ObjectRef.future()`, a
    `concurrent.futures.Future`; an exception the call raises is re-raised by `result()` as an
    instance of its own class (Ray's `RayTaskError` mixed in).

    If Ray is already initialized in this process the executor uses that instance (whatever
    `address` says) and `shutdown()` leaves it running. Otherwise it calls
    `ray.init(address=address, num_cpus=num_cpus, include_dashboard=False, **init_kwargs)`,
    owns that instance and stops it (`ray.shutdown()`) on `shutdown()`:

    - `RayToolExecutor()` starts a local Ray instance on this machine (`num_cpus`: how many of
      its CPUs Ray uses; default all).
    - `RayToolExecutor(address="auto")` joins the running cluster this node belongs to: one
      started with `ray start --head` on the head node and `ray start --address=<head>:6379`
      on the others (`RAY_ADDRESS` also names it). `num_cpus` must then be None.
    - `RayToolExecutor(address="ray://host:10001")` connects from outside the cluster through
      Ray Client (the head's client server port, 10001 by default).

    On a cluster the submitted functions and their modules must be importable on the workers
    (install the package there or pass `init_kwargs={"runtime_env": {...}}`). `workers` is the
    cluster's CPU count when the executor was made (`ray.cluster_resources()["CPU"]`).
    """

    def __init__(self, *, address: str | None = None, num_cpus: int | None = None,
                 init_kwargs: dict | None = None) -> None:
        ray = _import_ray()
        self._ray = ray
        self.owns_ray = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"address": address, "num_cpus": num_cpus}
            if _starts_local(address):  # an option only a new local instance takes
                kwargs["include_dashboard"] = False
            kwargs.update(init_kwargs or {})
            ray.init(**kwargs)
            self.owns_ray = True
        self._remote = ray.remote(num_cpus=1)(_call)
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._closed = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        if self._closed:
            raise RuntimeError("cannot submit to a RayToolExecutor after shutdown()")
        return self._remote.remote(fn, args, kwargs).future()

    def shutdown(self) -> None:
        """Stops the Ray instance if this executor started it (idempotent); calls submitted
        before may still be running when Ray is left up."""
        if self._closed:
            return
        self._closed = True
        if self.owns_ray and self._ray.is_initialized():
            self._ray.shutdown()

    def __enter__(self) -> RayToolExecutor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"RayToolExecutor(workers={self.workers}, owns_ray={self.owns_ray})"


def make_executor(kind: str, workers: int = 2, **kwargs: Any) -> ToolExecutor:
    """The executor of `kind`: "process" or "thread" (a `LocalToolExecutor` of `workers`), or
    "ray" (a `RayToolExecutor`; `kwargs` go to it, and `workers` is the `num_cpus` of a local
    Ray instance it starts, ignored when it joins a cluster or a running instance)."""
    if kind in ("process", "thread"):
        return LocalToolExecutor(workers, kind=kind, **kwargs)
    if kind == "ray":
        if _starts_local(kwargs.get("address")) and "num_cpus" not in kwargs:
            kwargs["num_cpus"] = workers
        return RayToolExecutor(**kwargs)
    raise ValueError(f"unknown executor kind {kind!r}; expected one of {', '.join(EXECUTOR_KINDS)}")


__all__ = [
    "EXECUTOR_KINDS",
    "LocalToolExecutor",
    "RayToolExecutor",
    "ToolExecutor",
    "make_executor",
]

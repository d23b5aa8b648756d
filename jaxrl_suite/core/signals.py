"""Ending a run on a signal without losing work: Ctrl-C (SIGINT) and SIGTERM.

A cluster scheduler ends a job with SIGTERM and, some seconds later, SIGKILL. Inside
`stop_on_sigterm()` a SIGTERM only sets a flag; the training loop (`algorithms.loop.fit`, the
classic-control chunk loop) checks `sigterm_received()` after each step, writes a checkpoint of
that step and raises `Terminated`, and the CLI ends with one line and the command that resumes.
Ctrl-C raises `KeyboardInterrupt` where the program stands (a step may be half done), so the
run resumes from its last periodic checkpoint; the CLI reports that in one line too.

Single-process only: in a multi-process job the processes could receive the signal at
different steps and would not agree on the checkpoint, so there SIGTERM keeps its default
(the job resumes from its last periodic checkpoint).
"""

from __future__ import annotations

import contextlib
import signal
import threading

_received = threading.Event()


class Terminated(KeyboardInterrupt):
    """Raised by a training loop after it checkpointed the current step on SIGTERM; the
    message names the stage, step and checkpoint directory."""


def sigterm_received() -> bool:
    """Whether a SIGTERM arrived inside `stop_on_sigterm()` (the loops' check)."""
    return _received.is_set()


@contextlib.contextmanager
def stop_on_sigterm(enabled: bool = True):
    """While active (`enabled`: a single-process run; main thread), SIGTERM sets the flag
    `sigterm_received` instead of ending the process; the previous handler is restored on exit.
    It does not touch JAX (a multi-process job must initialise jax.distributed first)."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: _received.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _received.clear()


__all__ = ["Terminated", "sigterm_received", "stop_on_sigterm"]

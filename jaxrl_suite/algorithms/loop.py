"""The host loop shared by every stage: batch -> jitted step -> log -> checkpoint.

A trainer provides `batch(cursor) -> examples` (deterministic in the cursor) and
`step(state, examples) -> (state, metrics)`. The loop keeps the data cursor beside the state in the
checkpoint, so a resumed run sees exactly the batches the uninterrupted run would have seen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
from tqdm.auto import tqdm

from jaxrl_suite.core.checkpoint import Checkpointer
from jaxrl_suite.core.metrics import MetricsLogger
from jaxrl_suite.core.signals import Terminated, sigterm_received
from jaxrl_suite.core.train import NonFiniteError, TrainState


def fit(
    trainer,
    state: TrainState,
    *,
    stage: str,
    num_steps: int,
    cursor: int,
    checkpointer: Checkpointer,
    logger: MetricsLogger,
    step_offset: int = 0,
    meta: dict | None = None,
    progress: bool = True,
    postfix: Sequence[str] = ("loss",),
    callback: Callable[[int, TrainState], dict] | None = None,
) -> tuple[TrainState, int]:
    """Run `trainer` from `state.step` to `num_steps`; returns (state, cursor).

    Each step's record is logged as `{"step": step_offset + n, "stage": stage, ...}` (n counts from
    1). `callback(n, state)` may return extra fields for the record (e.g. a periodic evaluation);
    a true "stop" field among them ends the stage after step n (early stopping): that step is
    checkpointed with `stopped: true` in its meta, so a resumed run ends there too.
    A non-finite update raises `NonFiniteError` before anything is saved, so the last good
    checkpoint stays the latest one. After a SIGTERM (inside `core.signals.stop_on_sigterm`) the
    step in progress is finished, checkpointed, and `Terminated` raised.
    """
    meta = dict(meta or {})
    start = int(state.step)
    bar = tqdm(total=num_steps, initial=start, desc=stage, leave=False,
               disable=not progress or jax.process_index() != 0)
    for n in range(start + 1, num_steps + 1):
        examples = trainer.batch(cursor)
        state, metrics = trainer.step(state, examples)
        metrics = {k: float(v) for k, v in metrics.items()}
        if not metrics.pop("finite", 1.0):
            latest = checkpointer.latest_step()
            kept = (f"the last good checkpoint ({stage} step {latest}) is kept"
                    if latest is not None else f"no {stage} checkpoint had been written")
            raise NonFiniteError(
                f"non-finite loss, gradient or update at {stage} step {n}; {kept} in "
                f"{checkpointer.directory}"
            )
        cursor += len(examples)
        if callback is not None:
            metrics.update(callback(n, state))
        stop = bool(metrics.pop("stop", False))
        logger.log({"step": step_offset + n, "stage": stage, **metrics})
        try:
            save_or_stop(checkpointer, n, state, {**meta, "cursor": cursor, "stopped": stop},
                         stage=stage, force=n == num_steps or stop)
        except Terminated:
            bar.close()
            raise
        bar.update(1)
        bar.set_postfix({k: f"{metrics[k]:.3g}" for k in postfix if k in metrics})
        if stop:
            break
    bar.close()
    checkpointer.wait()
    return state, cursor


def save_or_stop(checkpointer: Checkpointer, n: int, state, meta: dict, *, stage: str,
                 force: bool) -> None:
    """Checkpoint step `n` (on the checkpointer's interval, or `force`); after a scheduler's
    SIGTERM (`core.signals`) the step is saved at once and `Terminated` raised: every stage's
    loop (`fit`, `LMStudy.fit_seeds`) ends a step this way."""
    term = sigterm_received()
    checkpointer.save(n, state, meta, force=force or term)
    if term:
        checkpointer.wait()
        raise Terminated(f"{stage} step {n} checkpointed in {checkpointer.directory}")


def fit_resumable(
    trainer,
    init: TrainState,
    *,
    stage: str,
    num_steps: int,
    checkpoint_dir,
    logger: MetricsLogger,
    save_every: int,
    keep: int,
    resume: bool,
    step_offset: int = 0,
    progress: bool = True,
    postfix: Sequence[str] = ("loss",),
    callback: Callable[[int, TrainState], dict] | None = None,
    cursor: int = 0,
) -> TrainState:
    """`fit` with its own checkpoints: with `resume`, continue from the latest checkpoint in
    `checkpoint_dir` (state and data cursor); otherwise start from `init` at data `cursor`
    (e.g. where the stage that made `init` stopped reading). A finished stage
    resumes as its final state at once, and so does a stage that a callback stopped early
    (`fit`). Logs to `logger` (see `core.study.open_run_log` for a
    resumed log); returns the final state. The one resume mechanism of every LM run. A trainer
    with a `trainable` predicate (a LoRA run) checkpoints only those params (`Checkpointer`)."""
    ckpt = Checkpointer(checkpoint_dir, save_every=save_every, keep=keep,
                        trainable=getattr(trainer, "trainable", None))
    state = init
    try:
        if resume and ckpt.latest_step() is not None:
            state, meta = ckpt.restore(init)
            cursor = meta["cursor"]
            if meta.get("stopped"):
                return state
        state, _ = fit(trainer, state, stage=stage, num_steps=num_steps, cursor=cursor,
                       checkpointer=ckpt, logger=logger, step_offset=step_offset,
                       progress=progress, postfix=postfix, callback=callback)
    finally:
        ckpt.close()
    return state

"""Checkpoints through orbax-checkpoint: the train-state pytree plus a JSON side record.

The state pytree (params, optimizer state, RNG key, step) is saved with `StandardSave`; host-side
data such as the data cursor and the run stage go in a JSON `meta` item, so a resumed run continues
exactly where the saved one stood. Orbax writes atomically (a step directory appears only once it is
complete), so a killed run resumes from its last finished save.

Checkpoints are verified on restore: a step that does not read (a truncated or overwritten file)
is reported in one line, moved aside to DIRECTORY.corrupt/STEP (never deleted) and the previous
intact step is restored; if no step reads, `CorruptCheckpointError` (one line). `verify` reads a
step without a template, which is how `core.study` decides whether a finished run's result can
be trusted.

With `trainable` (a predicate on a parameter's "/"-joined path, as `core.train.make_train_step`
takes; a LoRA run's `models.lora.is_adapter`) only the trained part of the state is written: its
params are the selected subtree (the adapters), beside the optimizer state, step and key. The
frozen rest is not saved; `restore` takes it from the template, which the trainer builds from the
same base params, so the restored state equals the saved one.
"""

from __future__ import annotations

import contextlib
import gc
import shutil
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxrl_suite.core.train import merge_params, split_params


class CheckpointNotFoundError(FileNotFoundError):
    """No checkpoint where one was asked for; the message is one line naming the directory."""


class CorruptCheckpointError(CheckpointNotFoundError):
    """No checkpoint that reads where one was asked for; one line naming the directory."""


def _first_line(e: BaseException) -> str:
    line = (str(e).strip().splitlines() or [""])[0].split(" See full TensorStore")[0]
    return f"{type(e).__name__}: {line[:160]}"


def _as_array_leaves(tree):
    # orbax wants array leaves, not Python or numpy scalars.
    return jax.tree.map(lambda x: np.asarray(x) if not isinstance(x, jax.Array) else x, tree)


def verify_tree(directory: str | Path) -> str | None:
    """Check every checkpoint series under `directory` (each folder with numbered step
    folders, e.g. a run's sft/ and grpo/): its latest step must read in full. None if all do
    (or there is none), else the first one-line reason."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    for d in sorted([directory, *(p for p in directory.rglob("*") if p.is_dir())]):
        if any(c.is_dir() and c.name.isdigit() for c in d.iterdir()):
            ckpt = Checkpointer(d)
            try:
                problem = ckpt.verify()
            finally:
                ckpt.close()
            if problem is not None:
                return problem
    return None


@contextlib.contextmanager
def _quiet_failed_reads():
    """A failed orbax read leaves the other arrays' read coroutines with exceptions nobody
    retrieves; Python prints each as a traceback when it is collected. Collect them here, with
    those reports dropped (the failure itself is reported in one line by the caller)."""
    hook = sys.unraisablehook
    sys.unraisablehook = lambda u: None if "coroutine" in repr(u.object) else hook(u)
    try:
        yield
    finally:
        gc.collect()
        sys.unraisablehook = hook


class Checkpointer:
    """Save every `save_every` steps and keep the last `keep` checkpoints under `directory`."""

    def __init__(self, directory: str | Path, *, save_every: int = 1, keep: int = 3,
                 trainable=None):
        self.directory = Path(directory).absolute()
        self.trainable = trainable  # None: the whole state; else only these params (see above)
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep, save_interval_steps=max(save_every, 1), create=True
            ),
        )

    def save(self, step: int, state: Any, meta: dict | None = None, *, force: bool = False) -> bool:
        """Save at `step` if it falls on the interval (or `force`); returns whether it saved."""
        if self.trainable is not None:
            state = state.replace(params=split_params(state.params, self.trainable)[0])
        saved = self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(_as_array_leaves(state)),
                meta=ocp.args.JsonSave(meta or {}),
            ),
            force=force,
        )
        return bool(saved)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def _read(self, step: int, template: Any = None):
        """Read `step` in full (into `template`'s structure, or as saved); raises if it does
        not read."""
        state = ocp.args.StandardRestore(None if template is None else
                                         _as_array_leaves(template))
        with _quiet_failed_reads():
            return self._manager.restore(step, args=ocp.args.Composite(
                state=state, meta=ocp.args.JsonRestore()))

    def verify(self, step: int | None = None) -> str | None:
        """Read `step` (default: latest) in full, without a template; None if it reads, else
        a one-line reason."""
        self._manager.wait_until_finished()
        step = self.latest_step() if step is None else step
        if step is None:
            return f"no checkpoint in {self.directory}"
        try:
            self._read(step)
        except Exception as e:  # orbax / tensorstore / json: any failure to read
            return f"step {step} in {self.directory} does not read ({_first_line(e)})"
        return None

    def _newest_readable(self, template: Any = None):
        """(step, what it read) for the newest step that reads in full, None if there is no
        checkpoint. Newer steps that do not read are reported in one line and moved aside
        (see the module docstring); `CorruptCheckpointError` if none reads. One read per step."""
        self._manager.wait_until_finished()
        bad, reason = [], ""
        for step in sorted(self._manager.all_steps(), reverse=True):
            try:
                out = self._read(step, template)
                break
            except Exception as e:  # orbax / tensorstore / json: any failure to read
                bad.append(step)
                reason = reason or (f"step {step} in {self.directory} does not read "
                                    f"({_first_line(e)})")  # the newest step's
        else:
            if not bad:
                return None
            raise CorruptCheckpointError(f"no checkpoint in {self.directory} reads (steps "
                                         f"{sorted(bad)}; the newest: {reason})")
        if bad:
            moved = self._move_aside(bad)
            if jax.process_index() == 0:
                print(f"jaxrl-suite: checkpoint {reason}; moved to {moved}, using step {step}",
                      file=sys.stderr)
        return step, out

    def latest_intact_step(self) -> int | None:
        """The newest step that reads in full (see `_newest_readable`), None if none."""
        found = self._newest_readable()
        return None if found is None else found[0]

    def restore(self, template: Any, step: int | None = None) -> tuple[Any, dict]:
        """Restore `(state, meta)` at `step` (default: the newest step that reads, see
        `_newest_readable`) into the structure of `template` (with `trainable`, the params not
        saved are `template`'s)."""
        frozen = None
        if self.trainable is not None:
            train, frozen = split_params(template.params, self.trainable)
            template = template.replace(params=train)
        if step is None:
            found = self._newest_readable(template)
            if found is None:
                raise CheckpointNotFoundError(f"no checkpoint found in {self.directory}")
            out = found[1]
        else:
            self._manager.wait_until_finished()
            if step not in self._manager.all_steps():
                raise CheckpointNotFoundError(f"no checkpoint found in {self.directory}")
            out = self._read(step, template)
        state = out["state"]
        if frozen is not None:
            state = state.replace(params=merge_params(state.params, frozen))
        return state, dict(out["meta"] or {})

    def _move_aside(self, steps: list[int]) -> Path:
        """Move unreadable step directories to DIRECTORY.corrupt/STEP (process 0), so that the
        resumed run saves those steps afresh; returns DIRECTORY.corrupt."""
        dest = self.directory.with_name(self.directory.name + ".corrupt")
        if jax.process_index() == 0:
            for s in steps:
                target, n = dest / str(s), 1
                while target.exists():
                    target, n = dest / f"{s}-{n}", n + 1
                target.parent.mkdir(parents=True, exist_ok=True)
                (self.directory / str(s)).rename(target)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("jaxrl_suite: corrupt checkpoint moved")
        self._manager.reload()
        return dest

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def save_tree(directory: str | Path, tree: Any, meta: dict | None = None) -> None:
    """`tree` (params, a finished state) as the one checkpoint (step 0) under `directory`,
    replacing any there (e.g. one a unit killed after its save, before its result, left): the
    product of a finished unit of work, not a run to resume."""
    if Path(directory).exists() and jax.process_index() == 0:
        shutil.rmtree(directory)
    ckpt = Checkpointer(directory, keep=1)
    try:
        ckpt.save(0, tree, meta, force=True)
    finally:
        ckpt.close()


def load_tree(directory: str | Path, template: Any) -> Any:
    """The tree `save_tree` wrote under `directory`, in the structure of `template`; a missing
    checkpoint is a one-line `CheckpointNotFoundError`."""
    ckpt = Checkpointer(directory, keep=1)
    try:
        return ckpt.restore(template)[0]
    finally:
        ckpt.close()

"""Checkpoints through orbax-checkpoint: the train-state pytree plus a JSON side record.

The state pytree (params, optimizer state, RNG key, step) is saved with `StandardSave`; host-side
data such as the data cursor and the run stage go in a JSON `meta` item, so a resumed run continues
exactly where the saved one stood. Orbax writes atomically (a step directory appears only once it is
complete), so a killed run resumes from its last finished save.

With `trainable` (a predicate on a parameter's "/"-joined path, as `core.train.make_train_step`
takes; a LoRA run's `models.lora.is_adapter`) only the trained part of the state is written: its
params are the selected subtree (the adapters), beside the optimizer state, step and key. The
frozen rest is not saved; `restore` takes it from the template, which the trainer builds from the
same base params, so the restored state equals the saved one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxrl_suite.core.train import merge_params, split_params


class CheckpointNotFoundError(FileNotFoundError):
    """No checkpoint where one was asked for; the message is one line naming the directory."""


def _as_array_leaves(tree):
    # orbax wants array leaves, not Python or numpy scalars.
    return jax.tree.map(lambda x: np.asarray(x) if not isinstance(x, jax.Array) else x, tree)


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

    def restore(self, template: Any, step: int | None = None) -> tuple[Any, dict]:
        """Restore `(state, meta)` at `step` (default: latest) into the structure of `template`
        (with `trainable`, the params not saved are `template`'s)."""
        frozen = None
        if self.trainable is not None:
            train, frozen = split_params(template.params, self.trainable)
            template = template.replace(params=train)
        self._manager.wait_until_finished()
        step = self.latest_step() if step is None else step
        if step is None or step not in self._manager.all_steps():
            raise CheckpointNotFoundError(f"no checkpoint found in {self.directory}")
        out = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(_as_array_leaves(template)),
                meta=ocp.args.JsonRestore(),
            ),
        )
        state = out["state"]
        if frozen is not None:
            state = state.replace(params=merge_params(state.params, frozen))
        return state, dict(out["meta"] or {})

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

"""The one generic `train_step(state, batch) -> (state, metrics)` that every algorithm reuses.

Algorithms differ only in their loss function and their data (STYLE habit 5). The step logs the L2
norms of the gradients, parameters and updates, and it refuses non-finite updates: if the loss, a
gradient or the update is NaN/inf, the old state is returned unchanged with
`metrics["finite"] == False`, and the host loop raises `NonFiniteError` before anything is
checkpointed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax


class NonFiniteError(FloatingPointError):
    """Training produced a non-finite loss, gradient or update; the message is one line."""


@flax.struct.dataclass
class TrainState:
    """Everything a resumed run needs, as one pytree."""

    step: jax.Array  # int32 scalar: updates applied so far
    params: Any
    opt_state: Any
    rng: jax.Array  # raw uint32 key data (jax.random.key_data), so orbax can save it


def init_train_state(params, optimizer: optax.GradientTransformation, rng) -> TrainState:
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        rng=rng if rng.dtype == jnp.uint32 else jax.random.key_data(rng),
    )


def make_optimizer(
    lr: float, *, warmup_steps: int = 0, total_steps: int = 0, weight_decay: float = 0.0,
    max_grad_norm: float = 1.0, b2: float = 0.999,
) -> optax.GradientTransformation:
    """AdamW with global-norm clipping; linear warm-up then cosine decay when `total_steps > 0`."""
    if total_steps > 0:
        schedule = optax.warmup_cosine_decay_schedule(
            0.0, lr, max(warmup_steps, 1), max(total_steps, warmup_steps + 1), end_value=lr * 0.1
        )
    elif warmup_steps > 0:
        schedule = optax.linear_schedule(0.0, lr, warmup_steps)
    else:
        schedule = lr
    return optax.chain(
        optax.clip_by_global_norm(max_grad_norm),
        optax.adamw(schedule, b2=b2, weight_decay=weight_decay),
    )


LossFn = Callable[[Any, Any], tuple[jax.Array, dict]]


def make_train_step(loss_fn: LossFn, optimizer: optax.GradientTransformation):
    """`loss_fn(params, batch) -> (loss, metrics)` -> un-jitted `step(state, batch)`.

    Jit the result yourself (with the shardings of your mesh); it is a pure function.
    """

    def step(state: TrainState, batch) -> tuple[TrainState, dict]:
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        grad_norm = optax.tree.norm(grads)
        update_norm = optax.tree.norm(updates)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(update_norm)
        new = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
        new = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, state)
        metrics = dict(
            metrics,
            loss=loss,
            grad_norm=grad_norm,
            param_norm=optax.tree.norm(params),
            update_norm=update_norm,
            finite=finite,
        )
        return new, metrics

    return step

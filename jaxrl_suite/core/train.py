"""One update step for every algorithm: `apply_gradients`, and `make_train_step` built on it.

`apply_gradients(state, grads, tx) -> (state, metrics)` is the one place where an optimizer
update is applied (STYLE habit 5). It is pure, so it runs inside `lax.scan` (the classic-control
trainers call it once per minibatch) as well as in a host loop (`make_train_step`, SFT/GRPO). It
logs the L2 norms of the gradients, parameters and updates, and it refuses non-finite updates: if
the loss, a gradient or the update is NaN/inf, the old state is returned unchanged (its `step`
does not advance) with `metrics["finite"] == False`.

What a refused update means:
- in a host loop (`make_train_step`, SFT/GRPO), the state is returned unchanged and the loop
  raises `NonFiniteError` before anything is checkpointed;
- in a fully jitted loop (PPO, OPPO, IQL, BC, the preference reward model, RC-BC) nothing can be
  raised, so the run halts instead: a refused update leaves the parameters as they were
  (`keep="params"`) and the optimizer state is not rolled back, so after a non-finite gradient
  every later update is refused too and the run ends at its last finite parameters (whose
  evaluation stays finite). The step counters count the updates tried. Each trainer returns the
  metric `nonfinite`, the number of refused updates, so `metrics["nonfinite"].sum() > 0` marks
  a broken run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

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


@flax.struct.dataclass
class ParamState:
    """What one optimizer updates: the smallest state `apply_gradients` takes."""

    step: jax.Array  # int32 scalar: updates applied so far (tried, with keep="params")
    params: Any
    opt_state: Any


def init_param_state(params, optimizer: optax.GradientTransformation) -> ParamState:
    return ParamState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params))


class TrainAndAgent(NamedTuple):
    """What a classic-control `make_train` returns: the pure `train` function and the agent
    object behind it (its networks, `init`, `evaluate`, `act` ...), e.g.
    `train, ppo = ppo.make_train(config)`."""

    train: Callable
    agent: Any


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


def keep_finite(new, old, finite: jax.Array):
    """`new` where the scalar bool `finite` holds, else `old`, leaf by leaf (the guard)."""
    return jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)


KEEP = ("state", "params")  # what a refused update of `apply_gradients` leaves unchanged


def apply_gradients(state, grads, tx: optax.GradientTransformation, *,
                    loss: jax.Array | None = None,
                    keep: str = "state") -> tuple[Any, dict[str, jax.Array]]:
    """One optimizer update of `state` (any pytree dataclass with `step`, `params` and
    `opt_state` fields and `.replace`: `TrainState`, `ParamState`, ...), guarded.

        updates, opt_state' = tx.update(grads, opt_state, params)
        params' = params + updates,  step' = step + 1

    The update is applied only if `grads`, `updates` (and `loss`, when given) are finite.
    Otherwise it is refused, and `keep` says what stays as it was: "state" (the default) the
    whole state, returned unchanged; "params" only `params`, while `step` and the optimizer
    state still advance (`step` then counts the updates tried), so after a non-finite gradient
    (non-finite moments) every later update is refused too and a loop halts at its last finite
    parameters. The jitted classic-control trainers use "params": under `vmap` the guard's
    choice is made per seed, and selecting the optimizer state or the step per seed changes how
    XLA fuses the update, and with it the last bits of every finite run; selecting only the
    parameters leaves those bits as they were. Every other field of `state` is passed through.

    Returns (state, metrics) with metrics `grad_norm`, `param_norm` (of params', computed before
    the guard), `update_norm` (global L2 norms) and `finite` (a bool scalar).
    """
    if keep not in KEEP:
        raise ValueError(f"apply_gradients: keep must be one of {list(KEEP)}, got {keep!r}")
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    grad_norm = optax.tree.norm(grads)
    update_norm = optax.tree.norm(updates)
    finite = jnp.isfinite(grad_norm) & jnp.isfinite(update_norm)
    if loss is not None:
        finite = jnp.isfinite(loss) & finite
    metrics = {"grad_norm": grad_norm, "param_norm": optax.tree.norm(params),
               "update_norm": update_norm, "finite": finite}
    if keep == "params":
        params = keep_finite(params, state.params, finite)
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics
    new = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return keep_finite(new, state, finite), metrics


def make_train_step(loss_fn: LossFn, optimizer: optax.GradientTransformation):
    """`loss_fn(params, batch) -> (loss, metrics)` -> un-jitted `step(state, batch)`.

    The step is `apply_gradients` of the loss's gradients; its metrics are the loss's, `loss` and
    those of `apply_gradients`. Jit the result yourself (with the shardings of your mesh); it is
    a pure function.
    """

    def step(state: TrainState, batch) -> tuple[TrainState, dict]:
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
        new, update_metrics = apply_gradients(state, grads, optimizer, loss=loss)
        return new, dict(metrics, loss=loss, **update_metrics)

    return step

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
from flax import traverse_util


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


def init_train_state(params, optimizer: optax.GradientTransformation, rng, *,
                     trainable: Callable[[str], bool] | None = None) -> TrainState:
    """The initial state; with `trainable` (see `make_train_step`) the optimizer state covers only
    the selected leaves (a LoRA run: the adapters), while `params` is the full tree."""
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params if trainable is None else
                                 split_params(params, trainable)[0]),
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
                    loss: jax.Array | None = None, keep: str = "state",
                    norms: bool = True) -> tuple[Any, dict[str, jax.Array]]:
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
    the guard), `update_norm` (global L2 norms) and `finite` (a bool scalar). With
    `norms=False` only `update_norm` and `finite` are computed, and the guard tests `updates`
    (and `loss`) alone: a non-finite gradient gives a non-finite update through optax's
    clipping, scaling and Adam-family transforms, and for a small network in a jitted loop
    (PPO's minibatches) the two other norms cost a few per cent of the step.
    """
    if keep not in KEEP:
        raise ValueError(f"apply_gradients: keep must be one of {list(KEEP)}, got {keep!r}")
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    update_norm = optax.tree.norm(updates)
    finite = jnp.isfinite(update_norm)
    metrics = {"update_norm": update_norm}
    if norms:
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(grad_norm) & finite
        metrics = {"grad_norm": grad_norm, "param_norm": optax.tree.norm(params), **metrics}
    if loss is not None:
        finite = jnp.isfinite(loss) & finite
    metrics["finite"] = finite
    if keep == "params":
        params = keep_finite(params, state.params, finite)
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics
    new = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return keep_finite(new, state, finite), metrics


def make_train_step(loss_fn: LossFn, optimizer: optax.GradientTransformation, *,
                    micro_batches: int = 1, weight_fn: Callable[[Any], jax.Array] | None = None,
                    sum_metrics: tuple[str, ...] = (),
                    trainable: Callable[[str], bool] | None = None):
    """`loss_fn(params, batch) -> (loss, metrics)` -> un-jitted `step(state, batch)`.

    The step is `apply_gradients` of the loss's gradients; its metrics are the loss's, `loss` and
    those of `apply_gradients`. Jit the result yourself (with the shardings of your mesh); it is
    a pure function.

    Gradient accumulation (`micro_batches` = k > 1): the batch's row leaves (`split_rows`) are
    split into k interleaved micro-batches b_j (rows j, j+k, j+2k, ..., so that each spans every
    data shard of a row-sharded batch; other leaves are passed whole), and one `lax.scan` sums

        loss = sum_j w_j L(b_j) / W,   grad = sum_j w_j grad L(b_j) / W,   W = sum_j w_j

    (metrics likewise, except those named in `sum_metrics`, which are summed), with w_j =
    `weight_fn(b_j)` (None: 1). Only one micro-batch's activations are live at a time. The
    result equals the full-batch step when L(batch) = sum_j w_j L(b_j) / W, e.g. w_j = 1 for a
    mean over rows (GRPO's per-sequence mean, Dr. GRPO's constant normaliser) and w_j = the
    micro-batch's token count for a token mean (DAPO, SFT); a loss that is not such a mean
    (a batch quantile, a square of a mean) becomes the weighted mean of its micro-batch values.
    W = 0 (every weight zero) gives zero loss and gradients. k = 1 is the plain step.

    `trainable` (a predicate on a leaf's "/"-joined path, e.g. `models.lora.is_adapter`) trains
    only the leaves it selects: `state.params` stays the full tree, the rest is closed over as a
    constant (no gradient is computed for it) and comes back bit-identical, and `state.opt_state`
    must be the optimizer's state of the selected subtree (`init_train_state(..., trainable=)`).
    The update metrics (`grad_norm`, `param_norm`, `update_norm`) are those of the subtree.
    """
    if not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches must be a positive int, got {micro_batches!r}")
    if trainable is not None:
        return _train_subtree(loss_fn, trainable, lambda fn: make_train_step(
            fn, optimizer, micro_batches=micro_batches, weight_fn=weight_fn,
            sum_metrics=sum_metrics))
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    if micro_batches == 1:
        def step(state: TrainState, batch) -> tuple[TrainState, dict]:
            (loss, metrics), grads = grad_fn(state.params, batch)
            new, update_metrics = apply_gradients(state, grads, optimizer, loss=loss)
            return new, dict(metrics, loss=loss, **update_metrics)

        return step

    k = micro_batches

    def accumulated(params, batch):
        micro, join = split_rows(batch, k)  # micro: [k, B/k, ...] row leaves
        first = join(jax.tree.map(lambda x: x[0], micro))
        (_, metric_shape), _ = jax.eval_shape(grad_fn, params, first)

        def body(carry, xs):
            b = join(xs)
            (loss, metrics), grads = grad_fn(params, b)
            w = jnp.ones((), jnp.float32) if weight_fn is None else jnp.asarray(
                weight_fn(b), jnp.float32)
            acc = dict(metrics, loss=loss)
            scaled = {n: v if n in sum_metrics else w * v for n, v in acc.items()}
            g = jax.tree.map(lambda a, x: a + (w * x).astype(a.dtype), carry[0], grads)
            m = jax.tree.map(lambda a, x: a + x.astype(a.dtype), carry[1], scaled)
            return (g, m, carry[2] + w), None

        zeros_m = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                               dict(metric_shape, loss=jax.ShapeDtypeStruct((), jnp.float32)))
        init = (jax.tree.map(jnp.zeros_like, params), zeros_m, jnp.zeros((), jnp.float32))
        (g, m, total), _ = jax.lax.scan(body, init, micro)
        total = jnp.where(total > 0, total, 1.0)
        grads = jax.tree.map(lambda x: (x / total).astype(x.dtype), g)
        m = {n: v if n in sum_metrics else (v / total).astype(v.dtype) for n, v in m.items()}
        return m.pop("loss"), m, grads

    def step(state: TrainState, batch) -> tuple[TrainState, dict]:
        loss, metrics, grads = accumulated(state.params, batch)
        new, update_metrics = apply_gradients(state, grads, optimizer, loss=loss)
        return new, dict(metrics, loss=loss, **update_metrics)

    return step


def split_params(params, trainable: Callable[[str], bool]):
    """(selected, rest): two nested-dict trees holding the leaves whose "/"-joined path
    `trainable` accepts, and the others (each without the emptied branches)."""
    flat = traverse_util.flatten_dict(params, sep="/")
    pick = {k: v for k, v in flat.items() if trainable(k)}
    rest = {k: v for k, v in flat.items() if k not in pick}
    return traverse_util.unflatten_dict(pick, sep="/"), traverse_util.unflatten_dict(rest, sep="/")


def merge_params(a, b):
    """The union of two nested-dict trees with disjoint leaves (the inverse of `split_params`)."""
    flat = traverse_util.flatten_dict(a, sep="/")
    other = traverse_util.flatten_dict(b, sep="/")
    both = set(flat) & set(other)
    if both:
        raise ValueError(f"merge_params: leaf '{min(both)}' is in both trees")
    return traverse_util.unflatten_dict({**flat, **other}, sep="/")


def _train_subtree(loss_fn: LossFn, trainable, make_step):
    """A step that differentiates and updates only `split_params(params, trainable)[0]`."""

    def step(state, batch):
        train, frozen = split_params(state.params, trainable)
        inner = make_step(lambda p, b: loss_fn(merge_params(p, frozen), b))
        new, metrics = inner(state.replace(params=train), batch)
        return new.replace(params=merge_params(new.params, frozen)), metrics

    return step


def split_rows(batch, k: int):
    """Split a batch's row leaves into k interleaved chunks, for `lax.scan` / `lax.map`.

    The row leaves are those with a leading axis of the batch's row count B (the leading size
    of its first leaf of rank >= 1); chunk j holds rows j, j+k, j+2k, ... (reshape [B/k, k, ...]
    and swap the two axes), so when the rows are split over data shards (B/k a multiple of the
    shards) every chunk spans all of them. Returns (chunks, join): `chunks` is the tuple of row
    leaves, each [k, B/k, ...]; `join(one)` rebuilds a batch from one chunk's leaves (each
    [B/k, ...]) and the other leaves, passed whole. `merge_rows` inverts the split of a result.
    """
    leaves, treedef = jax.tree.flatten(batch)
    ranked = [x for x in leaves if jnp.ndim(x) >= 1]
    if not ranked:
        raise ValueError("split_rows: the batch has no leaf with a leading row axis")
    rows = jnp.shape(ranked[0])[0]
    if rows % k:
        raise ValueError(f"split_rows: {k} chunks do not divide the {rows} rows of the batch")
    is_row = [jnp.ndim(x) >= 1 and jnp.shape(x)[0] == rows for x in leaves]
    chunks = tuple(jnp.swapaxes(jnp.reshape(x, (rows // k, k, *jnp.shape(x)[1:])), 0, 1)
                   for x, r in zip(leaves, is_row, strict=True) if r)

    def join(one):
        it = iter(one)
        return jax.tree.unflatten(
            treedef, [next(it) if r else x for x, r in zip(leaves, is_row, strict=True)])

    return chunks, join


def merge_rows(tree):
    """Inverse of `split_rows` for a result [k, B/k, ...] per leaf: back to [B, ...] rows."""
    return jax.tree.map(
        lambda x: jnp.swapaxes(x, 0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:]), tree)


def map_rows(fn: Callable, batch, chunk: int):
    """`fn(batch)` computed `chunk` rows at a time with `lax.map` (0 or all rows: one call).

    Chunks are interleaved as in `split_rows`; `fn`'s outputs must be per-row arrays [rows, ...]
    of its input chunk, and are returned in the batch's row order."""
    leaves = [x for x in jax.tree.leaves(batch) if jnp.ndim(x) >= 1]
    rows = jnp.shape(leaves[0])[0]
    if chunk <= 0 or chunk >= rows:
        return fn(batch)
    if rows % chunk:
        raise ValueError(f"map_rows: chunk={chunk} does not divide the {rows} rows of the batch")
    chunks, join = split_rows(batch, rows // chunk)
    return merge_rows(jax.lax.map(lambda xs: fn(join(xs)), chunks))


def micro_batch_count(rows: int, micro: int) -> int:
    """Gradient micro-batches of a batch of `rows` rows at `micro` rows each (0 = one)."""
    return rows // micro if micro else 1


def carry_adam_moments(fresh, saved):
    """The optimizer state `fresh` with its Adam state (`optax.ScaleByAdamState`: count, mu,
    nu) replaced by the one in `saved`, another optimizer's state over the same params (e.g. the
    SFT's, whose schedule differs). Everything else in `fresh` (the lr schedule's count) is kept.
    Both must hold exactly one Adam state."""
    def is_adam(x):
        return isinstance(x, optax.ScaleByAdamState)

    found = [x for x in jax.tree.leaves(saved, is_leaf=is_adam) if is_adam(x)]
    targets = [x for x in jax.tree.leaves(fresh, is_leaf=is_adam) if is_adam(x)]
    if len(found) != 1 or len(targets) != 1:
        raise ValueError(f"carry_adam_moments: each optimizer state must hold one Adam state; "
                         f"found {len(targets)} (fresh) and {len(found)} (saved)")
    if jax.tree.structure(found[0]) != jax.tree.structure(targets[0]):
        raise ValueError("carry_adam_moments: the two Adam states cover different params")
    return jax.tree.map(lambda x: found[0] if is_adam(x) else x, fresh, is_leaf=is_adam)

"""Weak-to-strong generalisation losses: a strong student trained on a weak model's labels.

Burns et al. 2023, "Weak-to-Strong Generalization: Eliciting Strong Capabilities With Weak
Supervision", arXiv:2312.09390. A weak supervisor labels a binary task with soft labels
y [B, 2]; a stronger student is fine-tuned on them. The naive student (`xent_w2s_loss`) imitates
the labels, errors included; the paper's auxiliary confidence loss (`logconf_loss`) mixes in
the student's own thresholded predictions so that it can disagree with the supervisor;
`product_loss` (the authors' code) trains on the normalised product of the two.
`performance_gap_recovered` is the paper's PGR metric.

Every entry of `W2S_LOSSES` has one signature,
`fn(logits [B, 2], labels [B, 2], step_frac, **hyperparameters) -> (loss [], metrics)`, with
step_frac = step / n_steps in [0, 1] (a traced scalar is fine), so a config picks one by name.
The losses are pure, jit- and vmap-compatible functions of arrays, computed in at least float32.
"""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import xlogy

from jaxrl_suite.core.registry import Registry
from jaxrl_suite.losses.common import check_rank, check_shape

W2SLoss = Callable[..., tuple[chex.Array, dict[str, chex.Array]]]
W2S_LOSSES: Registry[W2SLoss] = Registry("w2s loss")


def _check_inputs(logits: chex.Array, labels: chex.Array, step_frac: chex.Array,
                  n_classes: int | None = None):
    """Validated (logits [B, K], labels [B, K], step_frac []) in at least float32."""
    check_rank("logits", logits, 2)
    if n_classes is not None:
        check_shape("logits", logits, (logits.shape[0], n_classes))
    check_shape("labels", labels, logits.shape)
    check_rank("step_frac", step_frac, 0)
    dtype = jnp.promote_types(jnp.result_type(logits), jnp.float32)
    return (jnp.asarray(logits, dtype), jnp.asarray(labels, dtype),
            jnp.asarray(step_frac, dtype))


def _check_range(name: str, x, low: float, high: float = float("inf")) -> None:
    """ValueError for a concrete x outside [low, high] (a tracer passes)."""
    if not isinstance(x, jax.core.Tracer) and not low <= float(x) <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {x}")


def _soft_xent(logits: chex.Array, target: chex.Array) -> chex.Array:
    """Batch mean of -sum_k target_k log softmax(logits)_k (torch's cross_entropy with
    probability targets, reduction 'mean')."""
    log_p = jax.nn.log_softmax(logits, axis=-1)  # [B, K]
    return -jnp.mean(jnp.sum(target * log_p, axis=-1))


def _agreement(a: chex.Array, b: chex.Array) -> chex.Array:
    """Share of rows whose argmaxes agree (ties go to the first class)."""
    return jnp.mean(jnp.argmax(a, axis=-1) == jnp.argmax(b, axis=-1))


def _metrics(loss, logits, labels) -> dict[str, chex.Array]:
    return {
        "loss": jax.lax.stop_gradient(loss),
        "student_agreement": _agreement(jax.lax.stop_gradient(logits), labels),
    }


@W2S_LOSSES.register("xent")
def xent_w2s_loss(
    logits: chex.Array, labels: chex.Array, step_frac: float | chex.Array = 0.0
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """The naive weak-to-strong student: cross-entropy to the weak labels.

        loss = -1/B sum_b sum_k y_bk log softmax(z_b)_k

    (Burns et al. 2023, arXiv:2312.09390, the baseline; the authors' `xent_loss`.) The labels
    may be soft (the weak model's probabilities) or one-hot.

    Args:
      logits: [B, K] student logits z (K = 2 in the paper; any K >= 2 works here).
      labels: [B, K] weak labels y, rows summing to 1.
      step_frac: [] training progress; unused, taken for the registry's common signature.

    Returns:
      (loss [], metrics) with metrics
        loss:              the loss;
        student_agreement: share of rows where argmax z equals argmax y.
    """
    logits, labels, _ = _check_inputs(logits, labels, step_frac)
    loss = _soft_xent(logits, labels)
    return loss, _metrics(loss, logits, labels)


def _authors_ramp(step_frac: chex.Array, warmup_frac: float | chex.Array) -> chex.Array:
    return jnp.where(step_frac <= warmup_frac, step_frac, 1.0)


def _linear_ramp(step_frac: chex.Array, warmup_frac: float | chex.Array) -> chex.Array:
    safe = jnp.where(warmup_frac > 0, warmup_frac, 1.0)
    return jnp.where(step_frac >= warmup_frac, 1.0, step_frac / safe)


# ramp name -> fn(step_frac, warmup_frac) -> the multiplier of aux_coef.
_RAMPS: Registry[Callable[[chex.Array, float | chex.Array], chex.Array]] = Registry(
    "logconf ramp")
_RAMPS.register("authors", _authors_ramp)
_RAMPS.register("linear", _linear_ramp)


@W2S_LOSSES.register("logconf")
def logconf_loss(
    logits: chex.Array,
    labels: chex.Array,
    step_frac: float | chex.Array,
    *,
    aux_coef: float | chex.Array = 0.5,
    warmup_frac: float | chex.Array = 0.1,
    ramp: str = "authors",
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """The auxiliary confidence loss: cross-entropy to a mix of the weak labels and the
    student's own thresholded (hardened) predictions.

    With p = softmax(z) [B, 2] and m = mean_b y_b [2] (the weak labels' class balance),

        t       = quantile_{linear}(p[:, 0], m_1)                     (threshold, no gradient)
        h_b     = [1, 0] if p_b0 >= t else [0, 1]                     (hard labels, no gradient)
        target  = (1 - c) y + c h
        loss    = -1/B sum_b sum_k target_bk log p_bk

    Burns et al. 2023, arXiv:2312.09390: L_conf = (1 - a) CE(f, f_w) + a CE(f, f_t), which is
    the CE to the mixed target above, written as the authors' `logconf_loss_fn`
    (weak_to_strong/loss.py). Threshold direction: a row is hardened to class 1 when its p_b0
    is BELOW the m_1-quantile of p[:, 0], i.e. the ~m_1 * B rows least confident in class 0
    (most confident in class 1) become class 1, so the hard labels keep the weak labels' share
    of class 1. The quantile interpolates linearly (torch.quantile's and jnp.quantile's
    default). As in the authors' code, `>=` puts the row equal to t in class 0: with m_1 = 1
    (all weak labels class 1) t = max p_b0 and that one row is still class 0; with m_1 = 0
    every row is class 0.

    The coefficient c ramps up with step_frac by `ramp`:
      "authors": c = aux_coef * (step_frac if step_frac <= warmup_frac else 1), the authors'
                 code verbatim. It rises to aux_coef * warmup_frac (0.05 with the defaults) at
                 step_frac = warmup_frac and then JUMPS to aux_coef (0.5).
      "linear":  c = aux_coef * min(step_frac / warmup_frac, 1), a linear warm-up to aux_coef
                 with no jump (warmup_frac = 0: c = aux_coef throughout).
    The gradient is that of the cross-entropy with the target held fixed: (p - target) / B.

    Args:
      logits: [B, 2] student logits z.
      labels: [B, 2] soft (or one-hot) weak labels y, rows summing to 1.
      step_frac: [] training progress step / n_steps.
      aux_coef: a in [0, 1], the final weight of the student's hard labels.
      warmup_frac: >= 0, the share of training over which c ramps up.
      ramp: "authors" or "linear" (static).

    Returns:
      (loss [], metrics) with metrics
        loss:              the loss;
        aux_coef:          c, the coefficient used this step;
        threshold:         t;
        strong_agreement:  share of rows where argmax h equals argmax y;
        student_agreement: share of rows where argmax z equals argmax y.
    """
    logits, labels, step_frac = _check_inputs(logits, labels, step_frac, n_classes=2)
    _check_range("aux_coef", aux_coef, 0.0, 1.0)
    _check_range("warmup_frac", warmup_frac, 0.0)
    coef = aux_coef * _RAMPS.get(ramp)(step_frac, warmup_frac)  # []

    preds = jax.nn.softmax(jax.lax.stop_gradient(logits), axis=-1)  # [B, 2]
    mean_weak = jnp.mean(labels, axis=0)  # [2]
    threshold = jnp.quantile(preds[:, 0], mean_weak[1])  # []
    is_zero = preds[:, 0] >= threshold  # [B]
    hard = jnp.stack([is_zero, ~is_zero], axis=-1).astype(logits.dtype)  # [B, 2]
    target = labels * (1.0 - coef) + hard * coef  # [B, 2]
    loss = _soft_xent(logits, target)
    metrics = _metrics(loss, logits, labels)
    metrics.update(aux_coef=coef, threshold=threshold,
                   strong_agreement=_agreement(hard, labels))
    return loss, metrics


@W2S_LOSSES.register("product")
def product_loss(
    logits: chex.Array,
    labels: chex.Array,
    step_frac: float | chex.Array = 0.0,
    *,
    alpha: float | chex.Array = 1.0,
    beta: float | chex.Array = 1.0,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """Cross-entropy to the normalised product of the weak labels and the student's predictions.

        target_b = p_b^beta * y_b^alpha / sum_k p_bk^beta y_bk^alpha     (no gradient)
        loss     = -1/B sum_b sum_k target_bk log p_bk,     p = softmax(z)

    The authors' `product_loss_fn` (weak_to_strong/loss.py, code released with Burns et al.
    2023, arXiv:2312.09390): alpha weighs the weak model, beta the strong one. The product is
    taken in log space (beta log p + alpha log y, 0 * log 0 := 0), so a saturated softmax does
    not give 0 / 0; a row whose product is 0 everywhere (p and y with disjoint support) still
    has no target.

    Args:
      logits: [B, K] student logits z (K = 2 in the paper).
      labels: [B, K] weak labels y, rows summing to 1.
      step_frac: [] training progress; unused (the authors' warmup_frac is unused too).
      alpha: >= 0, the exponent of the weak labels.
      beta: >= 0, the exponent of the student's probabilities.

    Returns:
      (loss [], metrics) with metrics
        loss:              the loss;
        student_agreement: share of rows where argmax z equals argmax y.
    """
    logits, labels, _ = _check_inputs(logits, labels, step_frac)
    _check_range("alpha", alpha, 0.0)
    _check_range("beta", beta, 0.0)
    log_p = jax.nn.log_softmax(jax.lax.stop_gradient(logits), axis=-1)  # [B, K]
    target = jax.nn.softmax(beta * log_p + xlogy(alpha, labels), axis=-1)  # [B, K]
    loss = _soft_xent(logits, target)
    return loss, _metrics(loss, logits, labels)


def performance_gap_recovered(acc_w2s, acc_weak, acc_ceiling) -> np.ndarray | float:
    """Performance gap recovered (PGR, Burns et al. 2023, arXiv:2312.09390):

        PGR = (acc_w2s - acc_weak) / (acc_ceiling - acc_weak)

    1 when the weak-to-strong student matches the strong ceiling (trained on ground truth), 0
    when it is no better than its weak supervisor; it can leave [0, 1]. Elementwise over
    broadcast inputs (e.g. [S] accuracies of S seeds), in float64 numpy, outside jit.

    Args:
      acc_w2s: accuracy of the student trained on weak labels (any metric: higher is better).
      acc_weak: accuracy of the weak supervisor.
      acc_ceiling: accuracy of the strong model trained on ground truth.

    Returns:
      PGR with the inputs' broadcast shape (a numpy float64 scalar for scalars), NaN where
      acc_ceiling == acc_weak (no gap to recover: PGR is undefined, not 0 or inf).
    """
    acc_w2s, acc_weak, acc_ceiling = (np.asarray(a, np.float64)
                                      for a in (acc_w2s, acc_weak, acc_ceiling))
    num, den = np.broadcast_arrays(acc_w2s - acc_weak, acc_ceiling - acc_weak)
    out = np.full(num.shape, np.nan)
    np.divide(num, den, out=out, where=den != 0)
    return out[()]


__all__ = [
    "W2S_LOSSES",
    "logconf_loss",
    "performance_gap_recovered",
    "product_loss",
    "xent_w2s_loss",
]

"""Keyframe selection for video QA: Temporal Apex Distillation (TAD) and a differentiable top-k.

ChronoForge-RL's abstract names the stages of its keyframe selection only: variation scoring,
inflection detection and prioritised distillation, plus a differentiable keyframe selection. The
paper has no public code; what follows is OUR reconstruction, with the equations we chose. A video
is a uint8 array [T, H, W, C]. The videos' distractors (a global brightness flicker, a camera jump,
a smooth drift whose speed ramps up, pixel noise) must not be selected; the events (an object that
flashes, appears, vanishes or jumps) must.

Stage 0, features (`frame_features`): f_t = x_t / 255 - median_{pixels}(x_t / 255), per channel.
    Subtracting each frame's median cancels an additive brightness change (flicker) exactly where
    no pixel clips.

Stage 1, variation scoring (`variation_scores`): s_0 = 0 and, for t >= 1,

    s_t = min_{|dy|, |dx| <= m} mean_{(y, x) in overlap} |f_t[y, x] - f_{t-1}[y - dy, x - dx]|

    the mean absolute change from the previous frame after the best global translation within m
    pixels (a camera jump of at most m pixels scores about like a still frame).

Stage 2, inflection detection (`trend_residual`, `inflection_points`): an apex is a departure
    from the local trend of s, not a large value (the drift's score ramps up, which is no
    event). Over the measured scores s_1..s_{T-1} (s_0 = 0 is no measurement): remove the robust
    global line (Theil-Sen: slope b = median_{i<j} (s_j - s_i) / (j - i), intercept
    a = median(s_t - b t)), d_t = s_t - a - b t, then the running median of d over a window of w
    frames (centred; shifted inwards at the ends so that it always holds w frames),

        r_t = d_t - median(d_{t-w//2} .. d_{t+w//2}),   r_0 = 0,

    and t >= 1 is an apex iff r_t > median(r) + z * 1.4826 * MAD(r) (over r_1..r_{T-1}) and
    r_t > rel_height * median(s_1..s_{T-1}) (a floor where r is almost constant). r = 0 on any
    straight line (a constant, a ramp); a spike of height h, of one or two frames (a flash's
    change in and its change back out), on a line has r = h at both of its frames, at the ends
    too.

Stage 3, prioritised distillation (`prioritized_select`): the apexes are grouped into runs whose
    consecutive members are less than min_gap frames apart (one event's change in and out); a
    run [a, b] is distilled to one frame with the run's highest score: the frame of a-1..b most
    different from frame a-2, the last one before the change (by the variation's motion-
    compensated distance), i.e. the frame showing the new content: a flash itself, not the frame
    after it, even when only the change back out was detected. The runs by score,
    highest first, give up to k frames; the remaining slots go to the frames farthest from every
    chosen frame (farthest-point coverage). With no apex at all: the k segment centres
    (`envs.vision.video.uniform_frames`). With min_gap = 1 every apex is its own run.

`tad_select` runs the three stages on a video; `saliency_mass` is the share of the k largest
scores that a selection captures.

Differentiable selection (`soft_topk`): a Gumbel top-k with the relaxed successive softmax
(Plötz & Roth 2018; Xie & Ermon 2019): with y = logits + Gumbel noise, alpha_1 = y,

    p_j = softmax(alpha_j / tau),   alpha_{j+1} = alpha_j + log(max(1 - p_j, 1e-20)),

p_j relaxes the one-hot of the j-th largest y. Rows are put in temporal order of the hard top-k,
and with hard=True the forward value is exactly the one-hots (straight-through estimator).
`FrameScorer` is a small linen MLP that turns per-frame features (`scorer_features`: scores,
trend residual and a 4x4 pooled thumbnail) with their neighbours' into the logits.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.envs.vision.video import uniform_frames

_MAD_TO_STD = 1.4826  # MAD * 1.4826 estimates a normal distribution's standard deviation
_POOL = 4  # scorer_features pools each frame to _POOL x _POOL cells


def frame_features(frames) -> np.ndarray:
    """Frames with each frame's per-channel median removed, float32 [T, H, W, C].

        f_t[y, x, c] = x_t[y, x, c] - median_{y', x'} x_t[y', x', c],   x = frames / 255

    uint8 frames are divided by 255; float frames are taken as already in [0, 1]. An additive
    brightness change of a whole frame (x_t + b, no pixel clipped) leaves f_t unchanged."""
    frames = np.asarray(frames)
    if frames.ndim != 4:
        raise ValueError(f"frames must be [T, H, W, C], got shape {frames.shape}")
    if frames.dtype == np.uint8:
        x = frames.astype(np.float64) / 255.0
    elif np.issubdtype(frames.dtype, np.floating):
        x = frames.astype(np.float64)
    else:
        raise ValueError(f"frames must be uint8 or float, got dtype {frames.dtype}")
    return (x - np.median(x, axis=(1, 2), keepdims=True)).astype(np.float32)


def variation_scores(features, *, max_shift: int = 0) -> np.ndarray:
    """Motion-compensated change of each frame from the previous one, float64 [T].

        s_0 = 0,
        s_t = min_{|dy|, |dx| <= max_shift} mean_{overlap} |f_t[y, x] - f_{t-1}[y - dy, x - dx]|

    the mean running over the pixels (and channels) where both terms are defined. features are
    images [T, H, W, C] or vectors [T, D] (then max_shift must be 0, the mean runs over D)."""
    f = np.asarray(features, np.float64)
    if f.ndim not in (2, 4) or f.shape[0] < 1:
        raise ValueError(f"features must be [T, H, W, C] or [T, D] with T >= 1, got {f.shape}")
    if not isinstance(max_shift, int | np.integer) or max_shift < 0:
        raise ValueError(f"max_shift must be an int >= 0, got {max_shift!r}")
    scores = np.zeros(f.shape[0], np.float64)
    if f.shape[0] == 1:
        return scores
    if f.ndim == 2:
        if max_shift != 0:
            raise ValueError(f"max_shift must be 0 for vector features [T, D], got {max_shift}")
        scores[1:] = np.abs(f[1:] - f[:-1]).mean(axis=1)
        return scores
    h, w = f.shape[1:3]
    if max_shift >= min(h, w):
        raise ValueError(f"max_shift must be < the frame size {min(h, w)}, got {max_shift}")
    cur, prev = f[1:], f[:-1]
    best = np.full(f.shape[0] - 1, np.inf)
    for dy in range(-max_shift, max_shift + 1):
        for dx in range(-max_shift, max_shift + 1):
            # f_t[y, x] for y in [max(0, dy), h + min(0, dy)) against f_{t-1}[y - dy, x - dx]
            a = cur[:, max(0, dy):h + min(0, dy), max(0, dx):w + min(0, dx)]
            b = prev[:, max(0, -dy):h - max(0, dy), max(0, -dx):w - max(0, dx)]
            best = np.minimum(best, np.abs(a - b).mean(axis=(1, 2, 3)))
    scores[1:] = best
    return scores


def trend_residual(scores, *, window: int = 7) -> np.ndarray:
    """Departure of each score from its local trend, float64 [T] (stage 2 of the module
    docstring): r_0 = 0 and, over s_1..s_{T-1}, d = s - (Theil-Sen line), r_t = d_t - the running
    median of d over `window` frames (odd; shifted inwards at the ends). All zeros when T < 4."""
    s = np.asarray(scores, np.float64)
    if s.ndim != 1:
        raise ValueError(f"scores must be 1-D [T], got shape {s.shape}")
    if window < 1 or window % 2 == 0:
        raise ValueError(f"window must be an odd number >= 1, got {window}")
    r = np.zeros_like(s)
    if s.shape[0] < 4:
        return r
    y = s[1:]
    t = np.arange(y.shape[0], dtype=np.float64)
    i, j = np.triu_indices(y.shape[0], k=1)
    slope = np.median((y[j] - y[i]) / (j - i))
    d = y - (np.median(y - slope * t) + slope * t)
    w = min(window, d.shape[0])
    windows = np.lib.stride_tricks.sliding_window_view(d, w)  # [n - w + 1, w]
    start = np.clip(np.arange(d.shape[0]) - w // 2, 0, d.shape[0] - w)  # shifted in at the ends
    r[1:] = d - np.median(windows, axis=1)[start]
    return r


def inflection_points(scores, *, z: float = 3.0, rel_height: float = 0.25,
                      window: int = 7) -> np.ndarray:
    """Apexes of a score series, int64 ascending: the frames t >= 1 whose `trend_residual` r_t
    exceeds median(r) + z * 1.4826 * median(|r - median(r)|) (over r_1..r_{T-1}) and
    rel_height * median(s_1..s_{T-1}) (and 0). A constant or linearly ramping series has none;
    so has any series with T < 4."""
    s = np.asarray(scores, np.float64)
    if s.ndim != 1:
        raise ValueError(f"scores must be 1-D [T], got shape {s.shape}")
    if not np.all(np.isfinite(s)):
        raise ValueError("scores must be finite")
    if not np.isfinite(z) or z < 0:
        raise ValueError(f"z must be finite and >= 0, got {z}")
    if s.shape[0] < 4:
        return np.zeros(0, np.int64)
    r = trend_residual(s, window=window)
    med = np.median(r[1:])
    threshold = med + z * _MAD_TO_STD * np.median(np.abs(r[1:] - med))
    ok = (r > threshold) & (r > max(rel_height * np.median(s[1:]), 1e-12))
    ok[0] = False
    return np.flatnonzero(ok).astype(np.int64)


def _distance(features: np.ndarray, a: int, b: int, max_shift: int) -> float:
    """`variation_scores`' motion-compensated distance between frames a and b."""
    return float(variation_scores(features[[a, b]], max_shift=max_shift)[1])


def prioritized_select(scores, peaks, k: int, *, min_gap: int = 1, features=None,
                       max_shift: int = 0) -> np.ndarray:
    """k distinct frames, int64 ascending: the apex runs distilled to a frame each, by score,
    then coverage.

    The distinct peaks, ascending, are cut into runs wherever two neighbours are >= min_gap
    apart. A run [a, b] stands for one frame with the largest score of its members: with
    `features` ([T, ...], as `variation_scores` takes them), the frame f of max(a-1, 1)..b that
    maximises the distance (`variation_scores` with max_shift) from frame max(a-2, 0) (the
    first such frame on ties); without, its first frame a. Runs are taken by score, descending
    (ties: the earlier run), up to k (a frame two runs share counts once). Then, while fewer
    than k are chosen, add argmax_t min_u |t - u| over all frames (ties: the earliest). With no
    peak: `envs.vision.video.uniform_frames(T, k)`."""
    s = np.asarray(scores, np.float64)
    if s.ndim != 1:
        raise ValueError(f"scores must be 1-D [T], got shape {s.shape}")
    n = s.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k must lie in [1, T={n}], got {k}")
    if min_gap < 1:
        raise ValueError(f"min_gap must be >= 1, got {min_gap}")
    peaks = np.unique(np.asarray(peaks, np.int64).reshape(-1))
    if peaks.size and (peaks[0] < 0 or peaks[-1] >= n):
        raise ValueError(f"peaks must be frame indices in [0, {n}), got {peaks.tolist()}")
    if features is not None and len(features) != n:
        raise ValueError(f"features must have one row per frame ({n}), got {len(features)}")
    if not peaks.size:
        return uniform_frames(n, k)
    runs = np.split(peaks, np.flatnonzero(np.diff(peaks) >= min_gap) + 1)
    best = np.array([s[r].max() for r in runs])
    firsts = np.array([r[0] for r in runs])
    chosen: list[int] = []
    for i in np.lexsort((firsts, -best)):
        a, b = int(runs[i][0]), int(runs[i][-1])
        t = a
        if features is not None:
            ref, span = max(a - 2, 0), range(max(a - 1, 1), b + 1)
            t = max(span, key=lambda f: (_distance(features, ref, f, max_shift), -f))
        if t not in chosen:
            chosen.append(t)
        if len(chosen) == k:
            break
    frames = np.arange(n)
    dist = np.min(np.abs(frames[:, None] - np.asarray(chosen)[None, :]), axis=1)
    while len(chosen) < k:
        t = int(np.argmax(dist))  # the first maximum: the earliest frame on ties
        chosen.append(t)
        dist = np.minimum(dist, np.abs(frames - t))
    return np.sort(np.asarray(chosen, np.int64))


def tad_select(frames, k: int, *, max_shift: int = 3, z: float = 3.0,
               min_gap: int = 3) -> np.ndarray:
    """Temporal Apex Distillation on a video [T, H, W, C]: k keyframes, int64 ascending.

        f = frame_features(frames),  s = variation_scores(f, max_shift),
        prioritized_select(trend_residual(s), inflection_points(s, z), k, min_gap, f)"""
    f = frame_features(frames)
    s = variation_scores(f, max_shift=max_shift)
    return prioritized_select(trend_residual(s), inflection_points(s, z=z), k, min_gap=min_gap,
                              features=f, max_shift=max_shift)


KEYFRAME_SELECTORS = ("raw_diff", "variation", "inflection", "tad")  # `select_keyframes`'s


def frame_saliency(frames, *, max_shift: int = 3) -> np.ndarray:
    """Each frame's saliency, float64 [T]: its TAD variation score, variation_scores(
    frame_features(frames), max_shift) (>= 0)."""
    return variation_scores(frame_features(frames), max_shift=max_shift)


def select_keyframes(frames, selector: str, k: int) -> np.ndarray:
    """k frames of a video [T, H, W, C], int64 ascending, by one of KEYFRAME_SELECTORS (TAD's stages
    alone and together, for their ablation):

        raw_diff    the k largest raw pixel changes, variation_scores(frames / 255)
        variation   the k largest `frame_saliency` scores (stage 1)
        inflection  the apexes of the saliency by score, each its own run, then coverage
                    (stages 1-2: prioritized_select with min_gap = 1, no distillation)
        tad         `tad_select` (stages 1-3)"""
    if selector == "tad":
        return tad_select(frames, k)
    if selector == "raw_diff":
        s = variation_scores(np.asarray(frames, np.float32) / 255.0)
    elif selector in ("variation", "inflection"):
        s = frame_saliency(frames)
    else:
        raise ValueError(f"select_keyframes: selector must be one of "
                         f"{list(KEYFRAME_SELECTORS)}, got {selector!r}")
    if selector == "inflection":
        return prioritized_select(s, inflection_points(s), k, min_gap=1)
    return np.sort(np.argsort(-s, kind="stable")[:k]).astype(np.int64)


def saliency_mass(scores, chosen, k: int) -> float:
    """Share of the k largest scores that the chosen frames capture, in [0, 1].

        sum_{t in chosen} s_t / sum_{k largest} s_t   (1.0 when the k largest sum to 0)

    scores must be >= 0 and chosen at most k distinct frames."""
    s = np.asarray(scores, np.float64)
    if s.ndim != 1 or np.any(s < 0) or not np.all(np.isfinite(s)):
        raise ValueError("scores must be 1-D, finite and >= 0")
    if not 1 <= k <= s.shape[0]:
        raise ValueError(f"k must lie in [1, T={s.shape[0]}], got {k}")
    chosen = np.asarray(chosen, np.int64).reshape(-1)
    if (chosen.size > k or np.unique(chosen).size != chosen.size
            or np.any((chosen < 0) | (chosen >= s.shape[0]))):
        raise ValueError(f"chosen must be at most k={k} distinct frame indices, got {chosen}")
    best = np.sort(s)[::-1][:k].sum()
    if best == 0:
        return 1.0
    return float(np.clip(s[chosen].sum() / best, 0.0, 1.0))


def soft_topk(logits, k: int, key, *, tau: float = 0.5, hard: bool = True) -> jax.Array:
    """Gumbel top-k relaxation: weights [..., k, T], slot j's weights over the T frames.

        y = logits + Gumbel noise (none when key is None),   alpha_1 = y,
        p_j = softmax(alpha_j / tau),   alpha_{j+1} = alpha_j + log(max(1 - p_j, 1e-20))

    p_j relaxes the one-hot of the j-th largest y. The rows are permuted into the temporal order
    of the hard top-k (the k largest y, ascending frame index); hard=True returns
    h + (p - stop_gradient(p)) with h those one-hots (forward exactly h, gradient of p), hard=False
    p. k, tau and hard are static under jit. The log clip at 1e-20 (a step of -46) separates the
    slots only while the spread of y stays well under 46, as for logits of moderate size."""
    logits = jnp.asarray(logits)
    if logits.ndim < 1:
        raise ValueError(f"logits must be [..., T], got shape {logits.shape}")
    n = logits.shape[-1]
    if not 1 <= k <= n:
        raise ValueError(f"k must lie in [1, T={n}], got {k}")
    if not tau > 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    if not jnp.issubdtype(logits.dtype, jnp.floating):
        logits = logits.astype(jnp.float32)
    y = logits if key is None else logits + jax.random.gumbel(key, logits.shape, logits.dtype)
    alpha, rows = y, []
    for _ in range(k):
        p = jax.nn.softmax(alpha / tau, axis=-1)
        rows.append(p)
        alpha = alpha + jnp.log(jnp.clip(1.0 - p, 1e-20, None))
    soft = jnp.stack(rows, axis=-2)  # [..., k, T], row j ~ the j-th largest y
    _, idx = jax.lax.top_k(jax.lax.stop_gradient(y), k)  # [..., k], by y descending
    order = jnp.argsort(idx, axis=-1)
    idx = jnp.take_along_axis(idx, order, axis=-1)
    soft = jnp.take_along_axis(soft, order[..., None], axis=-2)
    if not hard:
        return soft
    one_hot = jax.nn.one_hot(idx, n, dtype=soft.dtype)
    return one_hot + (soft - jax.lax.stop_gradient(soft))


class FrameScorer(nn.Module):
    """Per-frame keyframe logits from frame features with temporal context.

        g_t = [x_{t-1}, x_t, x_{t+1}]  (zeros past either end),
        logit_t = Dense(1)(gelu(Dense(hidden)(g_t)))

    features [..., T, F] -> logits [..., T]."""

    hidden: int = 32

    @nn.compact
    def __call__(self, features: jax.Array) -> jax.Array:
        x = jnp.asarray(features)
        pad = jnp.zeros_like(x[..., :1, :])
        prev = jnp.concatenate([pad, x[..., :-1, :]], axis=-2)
        nxt = jnp.concatenate([x[..., 1:, :], pad], axis=-2)
        g = jnp.concatenate([prev, x, nxt], axis=-1)
        h = nn.gelu(nn.Dense(self.hidden, name="hidden")(g))
        return nn.Dense(1, name="logit")(h)[..., 0]


def scorer_features(frames) -> np.ndarray:
    """Per-frame inputs of `FrameScorer`, float32 [T, 3 + 16 C]:

        [s_t, s_{t+1} (0 past the end), r_t, f_t average-pooled to 4 x 4 cells (flattened)]

    with f = frame_features(frames), s = variation_scores(f, max_shift=3), r = trend_residual(s).
    H and W must be multiples of 4."""
    f = frame_features(frames)
    t, h, w, ch = f.shape
    if h % _POOL or w % _POOL:
        raise ValueError(f"frames' height and width must be multiples of {_POOL}, got {h}x{w}")
    s = variation_scores(f, max_shift=3)
    s_next = np.append(s[1:], 0.0)
    pooled = f.reshape(t, _POOL, h // _POOL, _POOL, w // _POOL, ch).mean(axis=(2, 4))
    cols = [s[:, None], s_next[:, None], trend_residual(s)[:, None], pooled.reshape(t, -1)]
    return np.concatenate(cols, axis=1).astype(np.float32)


__all__ = ["KEYFRAME_SELECTORS", "FrameScorer", "frame_features", "frame_saliency",
           "inflection_points", "prioritized_select", "saliency_mass", "scorer_features",
           "select_keyframes", "soft_topk", "tad_select", "trend_residual", "variation_scores"]

"""Keyframe selection (TAD): scores against a direct double loop, the apex detector, the greedy
distillation and soft_topk against hand-worked cases, and the pipeline on a synthetic video."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.envs.vision.video import uniform_frames
from jaxrl_suite.sampling.keyframes import (
    FrameScorer,
    frame_features,
    inflection_points,
    prioritized_select,
    saliency_mass,
    scorer_features,
    select_keyframes,
    soft_topk,
    tad_select,
    trend_residual,
    variation_scores,
)


def loop_variation_scores(f, max_shift):
    """s_t as the definition reads: for each shift, |f_t[y, x] - f_{t-1}[y-dy, x-dx]| averaged
    over the (y, x) where both pixels exist, then the smallest over the shifts."""
    t_len, h, w, ch = f.shape
    out = [0.0]
    for t in range(1, t_len):
        best = np.inf
        for dy in range(-max_shift, max_shift + 1):
            for dx in range(-max_shift, max_shift + 1):
                total, count = 0.0, 0
                for y in range(h):
                    for x in range(w):
                        if 0 <= y - dy < h and 0 <= x - dx < w:
                            for c in range(ch):
                                prev = float(f[t - 1, y - dy, x - dx, c])
                                total += abs(float(f[t, y, x, c]) - prev)
                                count += 1
                best = min(best, total / count)
        out.append(best)
    return np.array(out)


@pytest.mark.parametrize("max_shift", [0, 1, 2])
def test_variation_scores_match_a_double_loop(max_shift):
    f = np.random.default_rng(max_shift).normal(size=(3, 4, 5, 2)).astype(np.float32)
    got = variation_scores(f, max_shift=max_shift)
    assert got.dtype == np.float64 and got.shape == (3,)
    np.testing.assert_allclose(got, loop_variation_scores(f, max_shift), rtol=1e-12, atol=1e-12)


def test_variation_scores_of_vectors_and_bad_arguments():
    v = np.array([[0.0, 1.0, 2.0], [1.0, 1.0, 0.0], [1.0, 4.0, 0.0]])
    np.testing.assert_allclose(variation_scores(v), [0.0, 1.0, 1.0])  # (1+0+2)/3, (0+3+0)/3
    np.testing.assert_array_equal(variation_scores(v[:1]), [0.0])
    with pytest.raises(ValueError, match="max_shift"):
        variation_scores(v, max_shift=1)
    with pytest.raises(ValueError, match="max_shift"):
        variation_scores(np.zeros((2, 3, 3, 1)), max_shift=3)  # no overlap left
    with pytest.raises(ValueError, match="max_shift"):
        variation_scores(np.zeros((2, 3, 3, 1)), max_shift=-1)
    with pytest.raises(ValueError, match="features"):
        variation_scores(np.zeros((2, 3, 3)))


def test_a_translated_frame_scores_zero_within_max_shift():
    rng = np.random.default_rng(0)
    f0 = rng.normal(size=(12, 12, 3))
    dy, dx = 2, -1
    f1 = rng.normal(size=(12, 12, 3))  # new content where the shifted frame has none
    f1[dy:, :dx] = f0[:-dy, -dx:]  # f1[y, x] = f0[y - dy, x - dx]
    f = np.stack([f0, f1])
    assert variation_scores(f, max_shift=2)[1] == 0.0
    assert variation_scores(f, max_shift=3)[1] == 0.0
    assert variation_scores(f, max_shift=1)[1] > 0.1
    assert variation_scores(f, max_shift=0)[1] > 0.1


def test_frame_features_cancel_an_additive_brightness_change():
    rng = np.random.default_rng(1)
    x = rng.uniform(0.0, 0.8, size=(1, 6, 7, 3)).astype(np.float32)
    f = frame_features(np.concatenate([x, x + 0.1]))
    assert f.dtype == np.float32 and f.shape == (2, 6, 7, 3)
    np.testing.assert_allclose(f[1], f[0], atol=1e-6)
    np.testing.assert_allclose(np.median(f, axis=(1, 2)), 0.0, atol=1e-7)
    u = rng.integers(0, 200, size=(1, 6, 6, 3)).astype(np.uint8)
    fu = frame_features(np.concatenate([u, u + 25]))
    np.testing.assert_allclose(fu[1], fu[0], atol=1e-6)
    np.testing.assert_allclose(fu[0], u[0] / 255 - np.median(u[0] / 255, axis=(0, 1)), atol=1e-6)
    with pytest.raises(ValueError, match="frames"):
        frame_features(u[0])
    with pytest.raises(ValueError, match="frames"):
        frame_features(u.astype(np.int32))


def test_trend_residual_hand_case():
    # s_1..s_5 = [1, 2, 3, 4, 10]: Theil-Sen slope = median of the 10 pair slopes
    # (1, 1, 1, 3, 1, 1, 4, 1, 7, 6)/... -> pairs (i<j): 1,1,1,3 | 1,1,4 | 1,7 | 6 -> median 1;
    # intercept median(s - t) over t = 0..4 = median(1, 1, 1, 1, 6) = 1; d = [0, 0, 0, 0, 5];
    # window 3: medians of [0,0,0] (shifted in), [0,0,0], [0,0,0], [0,0,5], [0,0,5] (shifted in)
    np.testing.assert_allclose(trend_residual([0.0, 1, 2, 3, 4, 10], window=3),
                               [0, 0, 0, 0, 0, 5], atol=1e-12)
    assert not trend_residual(3.0 + 0.5 * np.arange(20)).any()  # a line: none
    np.testing.assert_array_equal(trend_residual([0.0, 1.0, 5.0]), [0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="window"):
        trend_residual(np.zeros(8), window=4)


def test_inflection_points_ignore_constants_and_ramps():
    assert inflection_points(np.full(32, 0.7)).size == 0
    assert inflection_points(0.37 * np.arange(32)).size == 0
    # s_0 = 0 by definition in variation_scores: a flat video after it has no apex at frame 1
    assert inflection_points(np.r_[0.0, np.full(31, 0.5)]).size == 0
    assert inflection_points(np.r_[0.0, 0.2 + 0.03 * np.arange(31) ** 1.5]).size == 0  # smooth
    assert inflection_points([0.0, 0.0, 5.0]).size == 0  # T < 4: too short for a trend


def test_inflection_points_find_spikes():
    ramp = 0.1 * np.arange(32)
    ramp[13] += 1.0
    np.testing.assert_array_equal(inflection_points(ramp), [13])
    flat = np.r_[0.0, np.full(31, 0.5)]
    last = flat.copy()
    last[-1] += 1.0
    np.testing.assert_array_equal(inflection_points(last), [31])
    first = flat.copy()
    first[1] += 1.0
    np.testing.assert_array_equal(inflection_points(first), [1])
    pair = ramp.copy()  # a one-frame flash: the change in and the change out, both found
    pair[14] += 1.0
    np.testing.assert_array_equal(inflection_points(pair), [13, 14])
    tiny = flat.copy()  # r is 0 but at one frame: the height floor (0.25 * median s) holds
    tiny[9] += 0.1
    assert inflection_points(tiny).size == 0
    tiny[9] += 0.1
    np.testing.assert_array_equal(inflection_points(tiny), [9])
    for seed in range(5):
        rng = np.random.default_rng(seed)
        noisy = 0.5 + 0.01 * rng.normal(size=32)
        noisy[0] = 0.0
        noisy[20] += 1.0
        found = inflection_points(noisy)
        assert 20 in found and len(found) <= 2, (seed, found)
        assert found.dtype == np.int64 and np.all(np.diff(found) > 0)
    with pytest.raises(ValueError, match="scores"):
        inflection_points(np.zeros((4, 2)))
    with pytest.raises(ValueError, match="z"):
        inflection_points(np.zeros(8), z=-1.0)


def test_prioritized_select_hand_cases():
    s = np.zeros(32)
    s[[5, 6, 20]] = [1.0, 0.8, 0.9]
    # min_gap=2: runs {5, 6} (score 1.0, stands for 5) and {20}. Fill: the farthest frame from
    # {5, 20} is 31 (11 away); then from {5, 20, 31}: 12 and 13 are both 7 away, the earlier wins.
    np.testing.assert_array_equal(prioritized_select(s, [20, 6, 5], 4, min_gap=2), [5, 12, 20, 31])
    # min_gap=1: every peak its own run; the fill from {5, 6, 20} is 31
    np.testing.assert_array_equal(prioritized_select(s, [5, 6, 20], 4), [5, 6, 20, 31])
    np.testing.assert_array_equal(prioritized_select(s, [5, 6, 20], 2), [5, 20])
    np.testing.assert_array_equal(prioritized_select(s, [5, 5, 6], 2, min_gap=1), [5, 6])
    # a run's score is its best member's: {19, 20} (0.9) beats {5} (0.7) when k = 1
    s2 = np.zeros(32)
    s2[[5, 19, 20]] = [0.7, 0.2, 0.9]
    np.testing.assert_array_equal(prioritized_select(s2, [5, 19, 20], 1, min_gap=3), [19])
    tie = np.zeros(10)
    tie[[2, 7]] = 1.0
    np.testing.assert_array_equal(prioritized_select(tie, [7, 2], 1), [2])  # tie: earlier frame
    # fill from {0}: 9 (9 away); from {0, 9}: 4 and 5 both 4 away, the earlier wins
    np.testing.assert_array_equal(prioritized_select(np.ones(10), [0], 3), [0, 4, 9])
    np.testing.assert_array_equal(prioritized_select(s, [], 4), uniform_frames(32, 4))
    with pytest.raises(ValueError, match="k"):
        prioritized_select(s, [5], 33)
    with pytest.raises(ValueError, match="k"):
        prioritized_select(s, [5], 0)
    with pytest.raises(ValueError, match="peaks"):
        prioritized_select(s, [32], 2)
    with pytest.raises(ValueError, match="features"):
        prioritized_select(s, [5], 2, features=np.zeros((31, 2)))


def test_prioritized_select_distills_a_run_to_its_new_content():
    # vector features: frames 0..9 at 0, a flash at frame 4 (value 1), a step to 2 at frame 7
    f = np.zeros((10, 1))
    f[4], f[7:] = 1.0, 2.0
    s = np.ones(10)
    # run {5} (only the change back out was found): frames 4..5 against frame 3 -> 4 (|1 - 0|)
    np.testing.assert_array_equal(prioritized_select(s, [5], 1, features=f), [4])
    # run {4, 5} (in and out): frames 3..5 against frame 2 -> 4
    np.testing.assert_array_equal(prioritized_select(s, [4, 5], 1, min_gap=2, features=f), [4])
    # run {7}: frames 6..7 against 5 -> 7 (the first frame after the step); without features: 7
    np.testing.assert_array_equal(prioritized_select(s, [7], 1, features=f), [7])
    np.testing.assert_array_equal(prioritized_select(s, [5], 1), [5])


def test_saliency_mass_hand_case():
    s = [0.0, 5.0, 1.0, 3.0, 0.0, 2.0]
    assert saliency_mass(s, [1, 5], 2) == pytest.approx(7 / 8)  # the 2 largest sum to 8
    assert saliency_mass(s, [1, 3], 2) == 1.0
    assert saliency_mass(s, [], 2) == 0.0
    assert saliency_mass(np.zeros(6), [0, 1], 2) == 1.0
    with pytest.raises(ValueError, match="chosen"):
        saliency_mass(s, [1, 1], 2)
    with pytest.raises(ValueError, match="chosen"):
        saliency_mass(s, [1, 2, 3], 2)


def synthetic_video(seed, T=32, S=24, flash=17, jump=10, flicker=24):
    """A textured scene seen by a camera that jumps 2 px at `jump`; a red bar drifts right at a
    speed that ramps up (anti-aliased, so the frame difference grows smoothly); a square flashes
    green at frames flash and flash + 1; frame `flicker` is 20 grey levels brighter; pixel noise."""
    rng = np.random.default_rng(seed)
    pad = S + 8
    background = rng.uniform(60, 140, (pad, pad, 3))
    cols = np.arange(pad)
    frames, left = [], 2.0
    for t in range(T):
        scene = background.copy()
        left += 0.03 * t
        cover = np.clip(np.minimum(cols + 1, left + 8) - np.maximum(cols, left), 0, 1)[:, None]
        scene[4:10] = scene[4:10] * (1 - cover) + cover * np.array([200, 40, 40])
        scene[16:20, 16:20] = [40, 220, 40] if flash <= t < flash + 2 else [40, 40, 200]
        off = 2 if t >= jump else 0
        img = scene[off:off + S, 1 + off:1 + off + S] + (20 if t == flicker else 0)
        frames.append(np.clip(img + rng.normal(0, 2, img.shape), 0, 255))
    return np.asarray(frames).round().astype(np.uint8)


def test_tad_finds_the_flash_and_ignores_the_distractors():
    video = synthetic_video(0)
    s = variation_scores(frame_features(video), max_shift=3)
    assert s[31] > s[2]  # the drift makes the raw score ramp up
    np.testing.assert_array_equal(inflection_points(s), [17, 19])  # the flash's onset and end
    chosen = tad_select(video, 4)  # min_gap 3: one run, distilled to a flash frame
    assert {17, 18} & set(chosen.tolist()) and 19 not in chosen
    assert not {10, 24, 25} & set(chosen.tolist())
    # each distractor stage matters: without the shift search the camera jump is an apex, without
    # the median the flicker is
    assert 10 in inflection_points(variation_scores(frame_features(video)))
    raw = variation_scores(video / 255.0, max_shift=3)
    assert {24, 25} & set(inflection_points(raw).tolist())


def test_soft_topk_hand_case_of_the_relaxation():
    # tau = 1, no noise, y = log[1, 2, 3]: p_1 = [1, 2, 3] / 6 relaxes the largest (frame 2);
    # p_2 ~ y_i (1 - p_1i) = [5, 8, 9] / 6, i.e. [5, 8, 9] / 22, relaxes frame 1. In temporal
    # order (frames 1, 2) the rows are p_2, p_1.
    logits = jnp.log(jnp.array([1.0, 2.0, 3.0]))
    soft = soft_topk(logits, 2, None, tau=1.0, hard=False)
    np.testing.assert_allclose(soft, [[5 / 22, 8 / 22, 9 / 22], [1 / 6, 2 / 6, 3 / 6]], atol=1e-6)
    hard = soft_topk(logits, 2, None, tau=1.0)
    np.testing.assert_array_equal(hard, [[0, 1, 0], [0, 0, 1]])


def test_soft_topk_properties():
    logits = jnp.array([0.3, 2.0, -1.0, 1.5, 0.9, 3.0])
    eye = np.eye(6)
    np.testing.assert_array_equal(soft_topk(logits, 3, None), eye[[1, 3, 5]])
    cold = soft_topk(logits, 3, None, tau=0.01, hard=False)
    np.testing.assert_allclose(cold, eye[[1, 3, 5]], atol=1e-3)
    key = jax.random.PRNGKey(3)
    y = np.asarray(logits + jax.random.gumbel(key, logits.shape))
    top = np.sort(np.argsort(-y)[:3])
    out = soft_topk(logits, 3, key)
    assert out.shape == (3, 6)
    np.testing.assert_array_equal(out, eye[top])  # forward: exactly the one-hots
    soft = soft_topk(logits, 3, key, hard=False)
    np.testing.assert_allclose(soft.sum(-1), 1.0, atol=1e-6)
    w = jnp.asarray(np.random.default_rng(0).normal(size=(3, 6)), jnp.float32)
    grad = jax.grad(lambda z: jnp.sum(soft_topk(z, 3, key) * w))(logits)
    assert np.all(np.isfinite(grad)) and np.abs(grad).max() > 1e-4
    batch = jnp.stack([logits, -logits])
    out = soft_topk(batch, 3, None)
    assert out.shape == (2, 3, 6)
    np.testing.assert_array_equal(out[1], soft_topk(-logits, 3, None))
    jitted = jax.jit(soft_topk, static_argnames=("k", "tau", "hard"))
    np.testing.assert_allclose(jitted(logits, k=3, key=key, hard=False), soft, atol=1e-6)
    with pytest.raises(ValueError, match="k"):
        soft_topk(logits, 7, None)


def test_frame_scorer_uses_the_neighbours():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 8, 5)), jnp.float32)
    model = FrameScorer(hidden=16)
    params = model.init(jax.random.PRNGKey(0), x)
    out = model.apply(params, x)
    assert out.shape == (2, 8)
    changed = model.apply(params, x.at[0, 4].add(1.0))
    moved = np.abs(np.asarray(changed - out)) > 1e-6
    assert moved[0, [3, 4, 5]].all()  # frame 4 and its neighbours see the change
    assert not moved[0, [0, 1, 2, 6, 7]].any() and not moved[1].any()


def test_scorer_features():
    frames = np.random.default_rng(0).integers(0, 256, size=(6, 8, 12, 3)).astype(np.uint8)
    feats = scorer_features(frames)
    assert feats.shape == (6, 3 + 16 * 3) and feats.dtype == np.float32
    f = frame_features(frames)
    s = variation_scores(f, max_shift=3)
    np.testing.assert_allclose(feats[:, 0], s, rtol=1e-6)
    np.testing.assert_allclose(feats[:, 1], np.r_[s[1:], 0.0], rtol=1e-6)
    np.testing.assert_allclose(feats[:, 3:6], f[:, 0:2, 0:3].mean(axis=(1, 2)), atol=1e-6)
    np.testing.assert_allclose(feats[:, -3:], f[:, 6:8, 9:12].mean(axis=(1, 2)), atol=1e-6)
    with pytest.raises(ValueError, match="multiples"):
        scorer_features(frames[:, :6])


def test_select_ablates_the_stages():
    video = synthetic_video(0)
    np.testing.assert_array_equal(select_keyframes(video, "tad", 4), tad_select(video, 4))
    s = variation_scores(frame_features(video), max_shift=3)
    # variation: the 4 largest scores, sorted; raw_diff: the same on raw pixels, no shift search
    pick = lambda rule: select_keyframes(video, rule, 4)
    np.testing.assert_array_equal(pick("variation"), np.sort(np.argsort(-s)[:4]))
    raw = variation_scores(video / 255.0)
    np.testing.assert_array_equal(pick("raw_diff"), np.sort(np.argsort(-raw)[:4]))
    assert {10} & set(pick("raw_diff").tolist())  # the camera jump wins raw change
    # inflection: both apexes (the flash's change in and out) kept, the rest by coverage
    assert {17, 19} <= set(select_keyframes(video, "inflection", 4).tolist())
    with pytest.raises(ValueError, match="selector"):
        select_keyframes(video, "oracle", 4)

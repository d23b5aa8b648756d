"""rewards.curiosity: the COS(M+O)S step value on hand-worked cases, with math.exp written out
as the reference for the Gaussian curiosity."""

import math
import warnings

import numpy as np
import pytest

from jaxrl_suite.rewards.curiosity import (
    CuriosityConfig,
    curiosity,
    mixed_target,
    plot_return,
    plot_score,
    step_spans,
    step_surprisal,
    step_value,
    unit,
)

NAN = float("nan")


def test_step_surprisal_is_the_mean_negative_logp_of_each_span():
    logp = np.array([-0.1, -0.3, -0.2, -1.0, 0.0, -0.6])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an empty span is nan without a mean-of-empty warning
        got = step_surprisal(logp, [(0, 2), (2, 3), (3, 3), (3, 6), (5, 2), (0, 6)])
    np.testing.assert_allclose(got, [0.2, 0.2, NAN, (1.0 + 0.0 + 0.6) / 3, NAN, 2.2 / 6])
    assert got.shape == (6,) and got.dtype == np.float64
    assert step_surprisal(logp, []).shape == (0,)
    np.testing.assert_allclose(step_surprisal([-1, -2], [(0, 2)]), [1.5])  # ints, a list


def _bytes(text: str) -> list[int]:
    return list(text.encode())


def test_step_spans_cover_each_line_of_a_byte_plot():
    lines = ["Mira goes to the mill.", "", "Ode meets Tam."]
    spans = step_spans(_bytes, lines, 30)
    text = "\n".join(lines).encode()
    assert text[spans[0][0]:spans[0][1]] == b"Mira goes to the mill."
    assert spans[1][0] == spans[1][1]  # a missing line has no tokens
    assert spans[2][0] == min(30, len("Mira goes to the mill.\n\n"))
    assert spans[2][1] == 30  # clipped to max_len
    assert np.all(np.diff([s for sp in spans for s in sp]) >= 0)
    wide = step_spans(_bytes, lines, 100)  # unclipped: the last line's bytes exactly
    assert text[wide[2][0]:wide[2][1]] == b"Ode meets Tam." and wide[2][1] == len(text)
    assert step_spans(_bytes, ["ab", "c"], 100) == [(0, 2), (3, 4)]  # the "\n" is in none


def test_plot_score_by_hand():
    logp = np.array([-0.1, -0.3, 0.0, -0.2, -0.2])  # "ab\ncd"-like: spans (0, 2), (3, 5)
    cfg = CuriosityConfig(target=0.2, width=0.1, penalty=1.0)
    got = plot_score(logp, [(0, 2), (3, 5), (5, 5)], [0, 2, 0], cfg)
    np.testing.assert_allclose(got["surprisal"], [0.2, 0.2, NAN])
    v = [1.0, 1.0 - 2.0, 0.0]  # C(target) = 1; two contradictions; a missing step: C = 0
    np.testing.assert_allclose(got["values"], v)
    assert got["contradictions"] == [0, 2, 0]
    assert got["return"] == pytest.approx((1.0 + 0.0 + 0.5) / 3)  # unit: 1, 0, 1/2


@pytest.mark.parametrize("s, target, width, expected", [
    (0.2, 0.2, 0.1, 1.0),
    (0.3, 0.2, 0.1, math.exp(-0.5)),
    (0.1, 0.2, 0.1, math.exp(-0.5)),  # symmetric
    (0.4, 0.2, 0.1, math.exp(-2.0)),
    (0.0, 0.2, 0.1, math.exp(-2.0)),
    (1.0, 0.5, 0.25, math.exp(-(0.5 ** 2) / (2 * 0.25 ** 2))),
    (3.0, 0.2, 0.1, math.exp(-(2.8 ** 2) / 0.02)),
    (NAN, 0.2, 0.1, 0.0),  # no step
    (math.inf, 0.2, 0.1, 0.0),
])
def test_curiosity(s, target, width, expected):
    assert float(curiosity(s, target, width)) == pytest.approx(expected, rel=1e-12, abs=1e-300)


def test_curiosity_is_elementwise():
    got = curiosity(np.array([0.2, 0.3, NAN, 0.1]), 0.2, 0.1)
    np.testing.assert_allclose(got, [1.0, math.exp(-0.5), 0.0, math.exp(-0.5)], rtol=1e-12)
    assert got.shape == (4,)


@pytest.mark.parametrize("s, n, penalty, expected", [
    ([0.2, 0.3, NAN, 0.2], [0, 0, 0, 2], 1.0, [1.0, math.exp(-0.5), 0.0, -1.0]),
    ([0.2, 0.4], [3, 1], 0.5, [1.0 - 1.5, math.exp(-2.0) - 0.5]),
    ([0.2, NAN], [5, 1], 0.0, [1.0, 0.0]),  # no penalty: contradictions are free
])
def test_step_value(s, n, penalty, expected):
    cfg = CuriosityConfig(target=0.2, width=0.1, penalty=penalty)
    np.testing.assert_allclose(step_value(s, n, cfg), expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("v, expected", [
    (-3.0, 0.0), (-1.0, 0.0), (-0.5, 0.25), (0.0, 0.5), (0.5, 0.75), (1.0, 1.0), (7.0, 1.0),
])
def test_unit(v, expected):
    assert float(unit(v)) == expected


def test_unit_is_elementwise():
    np.testing.assert_array_equal(unit([-3, -1, 0, 1]), [0.0, 0.0, 0.5, 1.0])


def test_plot_return_is_the_mean_unit_value():
    cfg = CuriosityConfig()  # target 0.2, width 0.1, penalty 1
    s, n = [0.2, 0.3, NAN, 0.2], [0, 0, 1, 2]
    # values 1, e^-0.5, 0 - 1 (a missing step: nan surprisal, one contradiction), 1 - 2
    expected = (1.0 + (1.0 + math.exp(-0.5)) / 2 + 0.0 + 0.0) / 4
    got = plot_return(s, n, cfg)
    assert isinstance(got, float) and got == pytest.approx(expected, rel=1e-12)
    # with penalty >= 1 an incoherent step (v <= 0) is worth less than a coherent one (v > 0)
    assert plot_return([0.2], [1], cfg) == 0.5
    assert plot_return([0.5], [0], cfg) == pytest.approx(0.5 + math.exp(-4.5) / 2, rel=1e-12)


@pytest.mark.parametrize("step_unit, backed_up, w, expected", [
    (None, 0.4, 0.3, 0.4),  # the root takes the backed-up return
    (0.8, 0.4, 0.25, 0.25 * 0.8 + 0.75 * 0.4),
    (0.0, 0.4, 0.5, 0.2),  # 0.0 is a step unit, not the root
    (0.8, 0.4, 0.0, 0.4),
    (0.8, 0.4, 1.0, 0.8),
])
def test_mixed_target(step_unit, backed_up, w, expected):
    got = mixed_target(step_unit, backed_up, w)
    assert isinstance(got, float) and got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("kwargs", [
    {"width": 0.0}, {"width": -0.1}, {"width": NAN}, {"target": -0.01}, {"target": NAN},
    {"penalty": -1.0}, {"penalty": NAN},
])
def test_config_validation(kwargs):
    with pytest.raises(ValueError):
        CuriosityConfig(**kwargs)


def test_config_defaults_and_edges():
    assert CuriosityConfig() == CuriosityConfig(target=0.2, width=0.1, penalty=1.0)
    CuriosityConfig(target=0.0, width=1e-6, penalty=0.0)

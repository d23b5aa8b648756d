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

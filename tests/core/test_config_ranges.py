"""Every numeric field has a range (issue 43): each float field of every experiment's config
refuses NaN and inf, and each field with a declared non-negative Range refuses a negative
value, in one line that names the field."""

import dataclasses
import typing

import pytest

from jaxrl_suite.core.config import ConfigError, Range, from_dict, load_config
from jaxrl_suite.core.experiment import load_experiments


def _leaves(cls, prefix=""):
    """(dotted name, annotation) of every non-dataclass field of `cls`, nested sections too."""
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from _leaves(tp, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, tp


def _members(tp):
    args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, type(int | None)) \
        else (tp,)
    return [a for a in args if a is not type(None)]


def _base(tp):
    return typing.get_args(tp)[0] if typing.get_origin(tp) is typing.Annotated else tp


def _ranges(tp):
    return [r for a in _members(tp) if typing.get_origin(a) is typing.Annotated
            for r in typing.get_args(a)[1:] if isinstance(r, Range)]


def _nested(name, value):
    out = value
    for part in reversed(name.split(".")):
        out = {part: out}
    return out


EXPERIMENTS = load_experiments()
CASES = [(n, name, tp) for n in EXPERIMENTS.names()
         for name, tp in _leaves(EXPERIMENTS.get(n).config_cls)
         if any(_base(a) in (float, int) for a in _members(tp))]


def test_the_walk_covers_the_lm_and_control_fields():
    names = {(n, f) for n, f, _ in CASES}
    for case in [("grpo_arithmetic", "grpo.lr"), ("grpo_arithmetic", "grpo.beta"),
                 ("grpo_arithmetic", "grpo.top_p"), ("agent_tools", "sft.lr"),
                 ("grpo_arithmetic", "run.keep_checkpoints")]:
        assert case in names, case
    ranged = [c for c in CASES if _ranges(c[2])]
    assert len(ranged) > 200  # the kit's sections, in every LM study


@pytest.mark.parametrize("experiment", EXPERIMENTS.names())
def test_non_finite_and_out_of_range_values_are_refused_by_name(experiment):
    cls = EXPERIMENTS.get(experiment).config_cls
    for _, name, tp in [c for c in CASES if c[0] == experiment]:
        floats = any(_base(a) is float for a in _members(tp))
        bad = ([float("nan"), float("inf"), float("-inf")] if floats else [])
        for r in _ranges(tp):
            if r.lo is not None and r.lo >= 0:
                bad.append(-1 if _base(_members(tp)[0]) is int else -1.0)
        for value in bad:
            with pytest.raises(ConfigError, match=rf"'{name}' must be") as err:
                from_dict(cls, _nested(name, value))
            assert "\n" not in str(err.value)


def test_the_shipped_configs_lie_in_their_ranges():
    for n in EXPERIMENTS.names():
        exp = EXPERIMENTS.get(n)
        load_config(exp.config_cls, exp.default_config())
        load_config(exp.config_cls, exp.default_config(), smoke=True)


def test_a_config_built_in_python_is_checked_too():
    from jaxrl_suite.algorithms.grpo import GRPOConfig

    with pytest.raises(ConfigError, match="'grpo.top_p' must be in \\(0, 1\\], got 5"):
        GRPOConfig(top_p=5.0)
    with pytest.raises(ConfigError, match="'grpo.lr' must be finite"):
        GRPOConfig(lr=float("nan"))

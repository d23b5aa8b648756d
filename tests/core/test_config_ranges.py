"""Every numeric field has a range (issue 43): every numeric field (int or float, optional or
not, and the items of a tuple) of every config dataclass reachable from an experiment's config
declares a Range beside it; each float field refuses NaN and inf, and each field with a declared
non-negative Range refuses a negative value, in one line that names the field, whether the
config comes through the loader or is built in Python (`check_fields` in `__post_init__`)."""

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
    from jaxrl_suite.algorithms.grpo_config import GRPOConfig

    with pytest.raises(ConfigError, match="'grpo.top_p' must be in \\(0, 1\\], got 5"):
        GRPOConfig(top_p=5.0)
    with pytest.raises(ConfigError, match="'grpo.lr' must be finite"):
        GRPOConfig(lr=float("nan"))


def _tuple_item(tp):
    """The item annotation of a `tuple[X, ...]` member of `tp`, else None."""
    for a in _members(tp):
        if typing.get_origin(a) in (tuple, list) and typing.get_args(a):
            return typing.get_args(a)[0]
    return None


def _sections(cfg, out):
    """{config class: an instance}: `cfg` and its nested sections, the first instance of each."""
    out.setdefault(type(cfg), cfg)
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            _sections(value, out)
    return out


# every config class reachable from an experiment's config, with a valid instance (from the
# experiment's shipped config)
INSTANCES: dict = {}
for _n in EXPERIMENTS.names():
    _exp = EXPERIMENTS.get(_n)
    _sections(load_config(_exp.config_cls, _exp.default_config()), INSTANCES)
CLASSES = list(INSTANCES)


def _numeric_fields(cls):
    """(field, annotation, is a tuple item) of every numeric field of `cls` (not nested)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        item = _tuple_item(tp)
        if item is not None and _base(item) in (float, int):
            yield f.name, item, True
        elif any(_base(a) in (float, int) for a in _members(tp)):
            yield f.name, tp, False


def test_every_numeric_field_declares_a_range():
    """An empty `Range()` declares "any finite value": the field was considered."""
    assert len(CLASSES) > 50  # the kit's sections and every experiment's own
    missing = [f"{c.__module__}.{c.__qualname__}.{name}{'[]' if item else ''}"
               for c in CLASSES for name, tp, item in _numeric_fields(c)
               if not _ranges(tp)]
    assert not missing, f"numeric config fields without a Range: {missing}"


def _bad_value(tp):
    """A value outside `tp`'s ranges: NaN for a float, below (or above) the range for an int."""
    if _base(_members(tp)[0]) is float:
        return float("nan")
    for r in _ranges(tp):
        if r.lo is not None:
            return int(r.lo) - 1 if r.ge is not None else int(r.lo)
        if r.hi is not None:
            return int(r.hi) + 1 if r.le is not None else int(r.hi)
    return None


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_a_config_built_in_python_checks_its_ranges(cls):
    """Every config class checks its own fields' Ranges in `__post_init__` (`check_fields`),
    tuple items too: a bad value set in Python is a one-line error that names the field."""
    default = INSTANCES[cls]
    for name, tp, item in _numeric_fields(cls):
        bad = _bad_value(tp)
        if bad is None:
            continue
        value = (bad,) if item else bad
        with pytest.raises(ValueError, match=rf"'[\w.]*\b{name}(\[0\])?' must be") as err:
            dataclasses.replace(default, **{name: value})
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("experiment", EXPERIMENTS.names())
def test_tuple_items_are_checked_by_the_loader(experiment):
    cls = EXPERIMENTS.get(experiment).config_cls
    for name, tp in _leaves(cls):
        item = _tuple_item(tp)
        if item is None or _base(item) not in (float, int):
            continue
        bad = _bad_value(item)
        if bad is None:
            continue
        with pytest.raises(ConfigError, match=rf"'{name}\[0\]' must be") as err:
            from_dict(cls, _nested(name, [bad]))
        assert "\n" not in str(err.value)

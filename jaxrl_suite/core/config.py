"""Frozen, nested dataclass configs loaded from YAML and `--set a.b=value` overrides.

A config is a frozen dataclass whose fields are scalars (int, float, bool, str), optional scalars,
tuples, `Literal[...]` choices or nested config dataclasses. Every value that enters a config is
checked against its field's type; an unknown key or a wrong type raises `ConfigError` with one line
that names the field (levanter / maxtext habit).

    cfg = load_config(MyConfig, "configs/x.yaml", overrides=["grpo.lr=1e-5"], smoke=True)

A YAML file holds a mapping shaped like the dataclass. The reserved top-level key `smoke` holds a
mapping of the same shape that is applied on top when `smoke=True` (the tiny size used by tests).

A key that moved (say `grpo.sampler` to `grpo.rollout.engine`) is declared by its section's class
in `MOVED` ({"sampler": "rollout.engine"}): the loader still reads the old key, at its new place,
with a FutureWarning, so that saved runs keep loading.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union

import yaml

C = TypeVar("C")

SMOKE_KEY = "smoke"


class ConfigError(ValueError):
    """A bad config: unknown key, wrong type or unreadable file. The message is one line."""


class MovedKeyWarning(FutureWarning):
    """A config key given by its old name (`MOVED`); the message is one line naming both."""


@dataclasses.dataclass(frozen=True)
class Range:
    """The allowed values of a numeric config field, declared in its annotation beside it:
    `lr: Annotated[float, Range(gt=0)] = 1e-4`, or one of the aliases below (`Positive`, ...).
    The loader (`from_dict`) and `check_fields` (a config's `__post_init__`) enforce it; every
    float field must also be finite, ranged or not."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None

    def __str__(self) -> str:
        low = f"> {self.gt:g}" if self.gt is not None else (
            f">= {self.ge:g}" if self.ge is not None else "")
        high = f"< {self.hi:g}" if self.lt is not None else (
            f"<= {self.le:g}" if self.le is not None else "")
        if low and high:
            return f"in {'(' if self.gt is not None else '['}{self.lo:g}, {self.hi:g}" + (
                ")" if self.lt is not None else "]")
        return low or high

    @property
    def lo(self):
        return self.gt if self.gt is not None else self.ge

    @property
    def hi(self):
        return self.lt if self.lt is not None else self.le

    def contains(self, x) -> bool:
        return not ((self.gt is not None and not x > self.gt)
                    or (self.ge is not None and not x >= self.ge)
                    or (self.lt is not None and not x < self.lt)
                    or (self.le is not None and not x <= self.le))


Positive = Annotated[float, Range(gt=0)]
NonNegative = Annotated[float, Range(ge=0)]
Probability = Annotated[float, Range(ge=0, le=1)]
UnitInterval = Annotated[float, Range(gt=0, le=1)]  # (0, 1]: a nucleus mass, a target accuracy
Count = Annotated[int, Range(ge=1)]
NonNegativeInt = Annotated[int, Range(ge=0)]
Seed = Annotated[int, Range(ge=0, lt=2**32)]


def _check_value(value: Any, tp: Any, name: str) -> None:
    """`value` (already of type `tp`'s base type) is finite if a float and in `tp`'s Ranges."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config field '{name}' must be finite, got {value}")
    if typing.get_origin(tp) is Annotated and value is not None:
        for rule in typing.get_args(tp)[1:]:
            if isinstance(rule, Range) and not rule.contains(value):
                raise ConfigError(f"config field '{name}' must be {rule}, got {value!r}")


def check_fields(cfg, section: str = "", *, of: type | None = None) -> None:
    """Enforce the declared Ranges (and finiteness) of `cfg`'s own fields, for a config built in
    Python rather than by the loader; call it first in `__post_init__`. Tuples are checked item
    by item; nested dataclasses check themselves. `of`: only the fields of this class (a base
    of `cfg`'s, whose fields are the keys of `section`)."""
    hints = typing.get_type_hints(of or type(cfg), include_extras=True)
    for f in dataclasses.fields(of or cfg):
        tp, value = hints[f.name], getattr(cfg, f.name)
        name = f"{section}{f.name}"
        for arg in _union_args(tp):
            if typing.get_origin(arg) in (tuple, list) and isinstance(value, tuple | list):
                item = (typing.get_args(arg) or (Any,))[0]
                for i, v in enumerate(value):
                    _check_value(v, item, f"{name}[{i}]")
            elif not isinstance(value, tuple | list | dict) and not dataclasses.is_dataclass(value):
                _check_value(value, arg, name)


def check_divides(config, section: str, rows: int, *names: str, shards: int = 1) -> None:
    """Each row-count field (0 = off) divides the `rows` of a batch and is a multiple of the
    mesh's `shards` (so every chunk spans every data shard); one-line errors naming both."""
    for name in names:
        n = getattr(config, name)
        if n and rows % n:
            raise ValueError(f"{section}.{name}={n} does not divide the {rows} rows of a batch")
        if n and n % shards:
            raise ValueError(f"{section}.{name}={n} is not a multiple of the {shards} batch "
                             "shards of the mesh (data x fsdp)")


def _union_args(tp) -> tuple:
    """The members of a union (Optional) annotation, else (tp,); None's type left out."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        return tuple(a for a in typing.get_args(tp) if a is not type(None))
    return (tp,)


def _field_types(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, name: str) -> Any:
    """Check `value` against type `tp` and return it (ints are accepted for float fields)."""
    origin = typing.get_origin(tp)
    if origin is Annotated:  # a base type with its Range(s)
        value = _coerce(value, typing.get_args(tp)[0], name)
        _check_value(value, tp, name)
        return value
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        members = _union_args(tp)
        for arg in members:
            try:
                return _coerce(value, arg, name)
            except ConfigError:
                if len(members) == 1:  # X | None: X's own message (its range, say)
                    raise
        raise ConfigError(f"config field '{name}' expects {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        options = typing.get_args(tp)
        if value not in options:
            raise ConfigError(
                f"config field '{name}' must be one of {', '.join(map(repr, options))}, "
                f"got {value!r}"
            )
        return value
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"config field '{name}' expects a list, got {value!r}")
        args = typing.get_args(tp)
        item_tp = args[0] if args else Any
        return tuple(_coerce(v, item_tp, f"{name}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"config field '{name}' expects a mapping, got {value!r}")
        return from_dict(tp, value, prefix=f"{name}.")
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, str) and _looks_like_float(value):
            return float(value)  # YAML 1.1 reads "1e-5" (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"config field '{name}' expects float, got {value!r}")
        _check_value(float(value), tp, name)  # finite
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config field '{name}' expects int, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config field '{name}' expects bool (true/false), got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"config field '{name}' expects str, got {value!r}")
        return value
    raise ConfigError(f"config field '{name}' has unsupported type {_type_name(tp)}")


def _check_keys(cls, data: dict, prefix: str) -> None:
    valid = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in valid:
            raise ConfigError(
                f"unknown config key '{prefix}{key}'; "
                f"valid keys: {', '.join(prefix + v for v in valid)}"
            )


def _move_keys(cls, data: dict, prefix: str) -> dict:
    """`data` with the old keys that `cls.MOVED` maps ({old key: new dotted key within the
    section}) moved to their new places (a copy; nested sections merged into), one
    `MovedKeyWarning` (a FutureWarning) per key moved; the old and the new key both given is a
    ConfigError."""
    moved: Mapping[str, str] = getattr(cls, "MOVED", {})
    if not any(old in data for old in moved):
        return data
    out = dict(data)
    for old, new in moved.items():
        if old not in out:
            continue
        *path, leaf = new.split(".")
        node = out
        for i, part in enumerate(path):
            sub = node.get(part, {})
            if not isinstance(sub, dict):  # the section given whole (a config object, say)
                section = ".".join(path[: i + 1])
                raise ConfigError(f"config key '{prefix}{old}' (now '{prefix}{new}') and the "
                                  f"section '{prefix}{section}' are both given; set it there")
            node[part] = dict(sub)
            node = node[part]
        if leaf in node:
            raise ConfigError(f"config keys '{prefix}{old}' and '{prefix}{new}' are both given: "
                              f"'{prefix}{old}' is the old name of '{prefix}{new}'; keep only "
                              f"'{prefix}{new}'")
        node[leaf] = out.pop(old)
        warnings.warn(f"config key '{prefix}{old}' is now '{prefix}{new}' (the old key is "
                      f"still read)", MovedKeyWarning, stacklevel=2)
    return out


def from_dict(cls: type[C], data: dict, *, prefix: str = "") -> C:
    """Build `cls` from a (nested) mapping, checking keys and types; missing keys keep defaults.
    A key that `cls` declares moved (`MOVED: ClassVar[Mapping[str, str]]`, old key -> new
    dotted key within the section, e.g. {"sampler": "rollout.engine"}) is read at its new place
    with a FutureWarning (`_move_keys`)."""
    if not isinstance(data, dict):
        raise ConfigError(f"config section '{prefix.rstrip('.') or '<root>'}' must be a mapping")
    data = _move_keys(cls, data, prefix)
    _check_keys(cls, data, prefix)
    types_ = _field_types(cls)
    kwargs = {k: _coerce(v, types_[k], prefix + k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"config section '{prefix.rstrip('.') or '<root>'}': {e}") from None


def to_dict(cfg) -> dict:
    """Nested plain-dict view of a config (tuples become lists), for summary.json and YAML."""

    def conv(v):
        if dataclasses.is_dataclass(v):
            return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, tuple | list):
            return [conv(x) for x in v]
        return v

    return conv(cfg)


MISSING = "<missing>"  # a field one of two configs compared by `config_changes` lacks


def config_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple]:
    """The fields whose values differ between two `to_dict` views, as {"a.b": (old, new)};
    a field only one side has is (MISSING, value) or (value, MISSING)."""

    def flat(d, prefix=""):
        out = {}
        for k, v in d.items():
            if isinstance(v, Mapping):
                out.update(flat(v, f"{prefix}{k}."))
            else:
                out[prefix + k] = v
        return out

    a, b = flat(old), flat(new)
    return {k: (a.get(k, MISSING), b.get(k, MISSING)) for k in sorted(a.keys() | b.keys())
            if a.get(k, MISSING) != b.get(k, MISSING)}


def merge(base: dict, update: dict) -> dict:
    """Recursive dict merge; `update` wins."""
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def parse_override(text: str) -> dict:
    """`"a.b=3"` -> `{"a": {"b": 3}}`; the value is parsed as YAML (`1e-5`, `true`, `[1,2]`)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    node: dict = {}
    cur = node
    parts = key.split(".")
    for p in parts[:-1]:
        cur[p] = {}
        cur = cur[p]
    cur[parts[-1]] = value
    return node


def _looks_like_float(raw: str) -> bool:
    """Whether a YAML string is a float literal ("1e-5"; "nan" and "inf" too, which the float
    field's finiteness check then refuses by name)."""
    try:
        float(raw)
    except ValueError:
        return False
    return True


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:  # name the place: problem_mark is 0-based
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"config file {where} is not valid YAML: {what}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def load_config(
    cls: type[C],
    path: str | Path | None = None,
    overrides: typing.Sequence[str] = (),
    *,
    smoke: bool = False,
) -> C:
    """Dataclass defaults <- YAML file <- its `smoke` section (if `smoke`) <- `overrides`."""
    data: dict = read_yaml(path) if path is not None else {}
    smoke_section = data.pop(SMOKE_KEY, {}) or {}
    if smoke:
        data = merge(data, smoke_section)
    for text in overrides:
        data = merge(data, parse_override(text))
    return from_dict(cls, data)

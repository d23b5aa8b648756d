import dataclasses
from collections.abc import Mapping
from typing import ClassVar, Literal

import pytest

from jaxrl_suite.core.config import (
    ConfigError,
    MovedKeyWarning,
    from_dict,
    load_config,
    parse_override,
    to_dict,
)


@dataclasses.dataclass(frozen=True)
class Inner:
    lr: float = 1e-3
    steps: int = 10
    name: Literal["a", "b"] = "a"
    clip: float | None = None


@dataclasses.dataclass(frozen=True)
class Outer:
    inner: Inner = Inner()
    flag: bool = False
    sizes: tuple[int, ...] = (1, 2)
    label: str = "x"


def test_defaults_and_nested_override(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("inner:\n  steps: 5\n  lr: 1e-4\nsmoke:\n  inner: {steps: 1}\n")
    cfg = load_config(Outer, path, ["inner.name=b", "flag=true", "sizes=[3,4]"])
    assert cfg == Outer(inner=Inner(lr=1e-4, steps=5, name="b"), flag=True, sizes=(3, 4))
    assert load_config(Outer, path, smoke=True).inner.steps == 1
    assert load_config(Outer, path, ["inner.steps=7"], smoke=True).inner.steps == 7


def test_float_field_accepts_int_and_exponent_string():
    assert parse_override("inner.lr=1e-5") == {"inner": {"lr": "1e-5"}}
    assert from_dict(Outer, {"inner": {"lr": "1e-5"}}).inner.lr == 1e-5
    assert from_dict(Outer, {"inner": {"lr": 2}}).inner.lr == 2.0
    assert from_dict(Outer, {"inner": {"clip": 0.3}}).inner.clip == 0.3
    assert from_dict(Outer, {"inner": {"clip": None}}).inner.clip is None


def test_unknown_key_names_key_and_valid_keys():
    with pytest.raises(ConfigError) as e:
        load_config(Outer, None, ["inner.lrr=1"])
    msg = str(e.value)
    assert "'inner.lrr'" in msg and "inner.lr" in msg and "inner.steps" in msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    "override, field",
    [("inner.steps=1.5", "inner.steps"), ("flag=3", "flag"), ("inner.name=c", "inner.name"),
     ("inner.steps=true", "inner.steps"), ("inner=3", "inner"), ("label=[1]", "label")],
)
def test_wrong_type_names_field(override, field):
    with pytest.raises(ConfigError, match=f"'{field}'"):
        load_config(Outer, None, [override])


def test_bad_override_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="key=value"):
        load_config(Outer, None, ["noequals"])
    with pytest.raises(ConfigError, match="not found"):
        load_config(Outer, tmp_path / "missing.yaml")


def test_to_dict_round_trip():
    cfg = Outer(inner=Inner(steps=3), sizes=(5,))
    assert from_dict(Outer, to_dict(cfg)) == cfg


def test_config_changes_names_each_differing_leaf():
    from jaxrl_suite.core.config import MISSING, config_changes

    old = {"a": 1, "b": {"c": [1, 2], "d": "x"}, "gone": 0}
    new = {"a": 1, "b": {"c": [1, 3], "d": "x"}, "added": True}
    assert config_changes(old, new) == {"added": (MISSING, True), "b.c": ([1, 2], [1, 3]),
                                        "gone": (0, MISSING)}
    assert config_changes(new, new) == {}


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path):
    from jaxrl_suite.core.config import read_yaml

    bad = tmp_path / "bad.yaml"
    bad.write_text("grpo:\n  lr: [1, 2\n  steps: 3\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:3:8 is not valid YAML: expected ','") as e:
        read_yaml(bad)
    assert "\n" not in str(e.value)
    bad.write_text("a: 1\n b: 2\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:2:3 is not valid YAML: mapping values"):
        read_yaml(bad)


@dataclasses.dataclass(frozen=True)
class Renamed:
    """A section two of whose keys moved into its `inner` section (`MOVED`)."""

    MOVED: ClassVar[Mapping[str, str]] = {"rate": "inner.lr", "n": "inner.steps"}
    inner: Inner = Inner()
    flag: bool = False


def test_a_moved_key_is_read_at_its_new_place_with_a_warning():
    data = {"rate": 0.5, "n": 3, "inner": {"name": "b"}, "flag": True}
    with pytest.warns(MovedKeyWarning) as caught:  # a FutureWarning
        old = from_dict(Renamed, data, prefix="sec.")
    assert old == from_dict(Renamed, {"inner": {"lr": 0.5, "steps": 3, "name": "b"},
                                      "flag": True}, prefix="sec.")
    assert old == Renamed(inner=Inner(lr=0.5, steps=3, name="b"), flag=True)
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 2 and all("\n" not in m for m in messages)
    assert "'sec.n' is now 'sec.inner.steps'" in messages[0]
    assert "'sec.rate' is now 'sec.inner.lr'" in messages[1]
    assert data == {"rate": 0.5, "n": 3, "inner": {"name": "b"}, "flag": True}  # not mutated
    with pytest.warns(FutureWarning, match="'n' is now 'inner.steps'"):  # an override too
        assert load_config(Renamed, None, ["n=4"]).inner.steps == 4


def test_a_moved_key_and_its_new_key_both_given_is_an_error():
    with pytest.raises(ConfigError) as e:
        from_dict(Renamed, {"rate": 0.5, "inner": {"lr": 0.1}}, prefix="sec.")
    msg = str(e.value)
    assert "'sec.rate'" in msg and "'sec.inner.lr'" in msg and "both given" in msg
    assert "\n" not in msg
    with pytest.raises(ConfigError, match="'rate' .* and the section 'inner' are both given"):
        from_dict(Renamed, {"rate": 0.5, "inner": Inner()})  # the section as a config object
    with pytest.raises(ConfigError, match="unknown config key 'sec.inner.rate'"):
        from_dict(Renamed, {"inner": {"rate": 0.5}}, prefix="sec.")  # only at the section's top
    with pytest.raises(ConfigError, match="unknown config key 'sec.bogus'"), \
            pytest.warns(FutureWarning):
        from_dict(Renamed, {"rate": 0.5, "bogus": 1}, prefix="sec.")


def test_grpo_reads_the_flat_keys_of_a_saved_run():
    """GRPOConfig.MOVED: the keys the grpo section had before the rollout and memory sections
    (issue 44), as a saved run's config.json holds them, give the same config."""
    from jaxrl_suite.algorithms.grpo_config import GRPOConfig, MemoryConfig
    from jaxrl_suite.sampling.engines import EngineOptions

    flat = {"steps": 3, "sampler": "speculative", "draft_k": 2, "drafter_layers": 2,
            "drafter_d_model": 32, "drafter_lr": 0.01, "drafter_steps": 0,
            "drafter_reward_tau": 0.5, "sampler_dtype": "bfloat16", "rollout_micro_batch": 8,
            "logprob_micro_batch": 4, "train_micro_batch": 2, "logprob_chunk": 16}
    nested = {"steps": 3,
              "rollout": {"engine": "speculative", "draft_k": 2, "drafter_layers": 2,
                          "drafter_d_model": 32, "drafter_lr": 0.01, "drafter_steps": 0,
                          "drafter_reward_tau": 0.5, "dtype": "bfloat16"},
              "memory": {"rollout_micro_batch": 8, "logprob_micro_batch": 4,
                         "train_micro_batch": 2, "logprob_chunk": 16}}
    with pytest.warns(FutureWarning) as caught:
        old = from_dict(GRPOConfig, flat, prefix="grpo.")
    assert len(caught) == len(flat) - 1  # every key but steps moved
    assert old == from_dict(GRPOConfig, nested, prefix="grpo.") == GRPOConfig(
        steps=3, rollout=EngineOptions(**nested["rollout"]),
        memory=MemoryConfig(**nested["memory"]))
    continuous = {"sampler": "continuous", "slots": 4, "refill": "rounds", "schedule": "lpt"}
    with pytest.warns(FutureWarning) as caught:
        cfg = from_dict(GRPOConfig, continuous, prefix="grpo.")
    assert "config key 'grpo.sampler' is now 'grpo.rollout.engine'" in str(caught[0].message)
    assert cfg.rollout == EngineOptions(engine="continuous", slots=4, refill="rounds",
                                        schedule="lpt")
    with pytest.raises(ConfigError, match="'grpo.slots' and 'grpo.rollout.slots' are both"):
        from_dict(GRPOConfig, {"slots": 4, "rollout": {"engine": "continuous", "slots": 4}},
                  prefix="grpo.")

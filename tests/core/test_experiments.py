"""Experiments are found through the `jaxrl_suite.experiments` entry points, and each ships its
default YAML config as package data (so a non-editable install runs the same configs)."""

import dataclasses
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

from jaxrl_suite.cli import main
from jaxrl_suite.core.config import ConfigError, load_config
from jaxrl_suite.core.experiment import EXPERIMENTS, Experiment, load_experiments

ROOT = Path(__file__).resolve().parents[2]
NAMES = {"grpo_arithmetic", "carl_generalization", "space_curriculum", "elmur_tmaze",
         "elmur_popgym", "siren_entropy", "oppo_offline_pref", "exit_self_improve",
         "rollout_efficiency", "rest_rl_code", "agent_tools", "cosmos_mcts_orpo",
         "diffucoder_coupled_grpo", "aepo_grounding", "gencls_strategies", "resume_screening",
         "s3_search", "weak_to_strong"}


def test_entry_points_register_every_experiment_with_its_shipped_config():
    experiments = load_experiments()
    assert NAMES <= set(experiments.names())
    for name in NAMES:
        path = Path(experiments.get(name).default_config())
        assert path.name == f"{name}.yaml" and path.is_file()
        load_config(experiments.get(name).config_cls, path, smoke=True)  # the config parses


@dataclasses.dataclass(frozen=True)
class _Cfg:
    x: int = 0


def test_a_missing_default_config_is_one_line_exit_2(tmp_path, capsys):
    exp = Experiment("no_yaml_probe", _Cfg, lambda cfg, opts: {}, config=tmp_path / "gone.yaml")
    with pytest.raises(ConfigError, match="gone.yaml"):
        exp.default_config()
    # registered for this test only: other tests in the worker walk every registered experiment
    EXPERIMENTS.register("no_yaml_probe", exp)
    try:
        assert main(["run", "no_yaml_probe", "--out", str(tmp_path / "o")]) == 2
    finally:
        EXPERIMENTS.unregister("no_yaml_probe")
    err = capsys.readouterr().err.strip()
    assert "default config" in err and "gone.yaml" in err and "\n" not in err
    assert not (tmp_path / "o" / "summary.json").exists()


def test_pyproject_lists_every_package():
    """pyproject.toml lists the packages (the experiments are mapped to another name, which
    setuptools' find cannot do): every folder with an __init__.py is one of them."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in ROOT.glob("jaxrl_suite/**/__init__.py")}
    assert listed == found | {"jaxrl_suite_experiments"}
    assert (ROOT / "experiments" / "__init__.py").is_file()


def test_a_non_editable_install_finds_experiments_and_configs(tmp_path):
    """Build the wheel, install it (no deps) into a folder of its own and, from outside the
    checkout, list the experiments and load grpo_arithmetic's shipped config from there."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "dist"), str(ROOT)], check=True,
                   capture_output=True)
    wheel, = (tmp_path / "dist").glob("jaxrl_suite-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert {f"jaxrl_suite_experiments/configs/{n}.yaml" for n in NAMES} <= set(names)
    assert not any(n.startswith("experiments/") for n in names)  # no top-level `experiments`
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                    "--target", str(site), str(wheel)], check=True, capture_output=True)
    probe = textwrap.dedent("""
        import importlib.util
        import jaxrl_suite, jaxrl_suite_experiments
        assert importlib.util.find_spec("experiments") is None  # no top-level `experiments`
        from jaxrl_suite.cli import main
        from jaxrl_suite.core.config import load_config
        from jaxrl_suite.core.experiment import load_experiments
        exp = load_experiments("grpo_arithmetic").get("grpo_arithmetic")
        cfg = load_config(exp.config_cls, exp.default_config(), smoke=True)
        print(jaxrl_suite.__file__, exp.default_config(), cfg.sft.steps, cfg.run.seeds)
        main(["list"])
    """)
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                         text=True, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin",
                                         "JAX_PLATFORMS": "cpu"}, check=True).stdout
    first = out.splitlines()[0].split()
    assert first[0].startswith(str(site)) and first[1].startswith(str(site))
    assert first[2:] == ["3", "(0,)"]  # the smoke section of the shipped YAML
    assert NAMES <= {line.split()[0] for line in out.splitlines()[1:]}

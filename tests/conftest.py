"""Shared test helpers."""

import os
import pathlib
import socket
import subprocess
import sys

import pytest

# A persistent XLA compilation cache shared by the test processes (xdist workers and the
# subprocesses that tests start inherit it through the environment): tests that build the same
# trainer twice (a straight run and a resumed one, one device and a mesh's reference) compile
# each program once. Most of the suite's time is compilation. The cache is keyed by the program
# and the JAX version, so a stale entry is never used; delete .jax_cache/ to start cold.
_CACHE = pathlib.Path(__file__).resolve().parent.parent / ".jax_cache"
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(_CACHE))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
if "jax" in sys.modules:  # a plugin imported JAX before this file: set the options directly
    import jax

    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture
def run_on_host_devices():
    """`run(script, n=4)`: run a Python script in a fresh process whose CPU backend has n
    devices (the host device count is fixed when JAX starts); asserts it exits 0 and prints OK."""

    def run(script: str, n: int = 4) -> str:
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={n}",
                   JAX_PLATFORMS="cpu")
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
        return proc.stdout

    return run


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a network connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("the test tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)



@pytest.fixture
def figures():
    """{PNG file name: `core.metrics.figure_data` of the figure saved to it} for this test, so
    it can check a plot's axes and series against the data behind it."""
    from jaxrl_suite.core.metrics import record_figures

    with record_figures() as recorded:
        yield recorded


@pytest.fixture(scope="module")
def module_figures():
    """`figures` for a module-scoped fixture's run."""
    from jaxrl_suite.core.metrics import record_figures

    with record_figures() as recorded:
        yield recorded


@pytest.fixture(scope="session")
def hf_parity():
    """`load_hf_parity()` for tests that take it as a fixture."""
    from lm_helpers import load_hf_parity

    return load_hf_parity()


@pytest.fixture(scope="session")
def run_smoke():
    """`run_smoke(experiment, out)`: run `experiment` (an `Experiment`) at --smoke size into
    `out` through the CLI, registering it first when the installed entry points predate it;
    returns (out, its summary.json). Later CLI calls in the session find it registered."""
    return _run_smoke


def _run_smoke(experiment, out: pathlib.Path) -> tuple[pathlib.Path, dict]:
    import json

    from jaxrl_suite.cli import main
    from jaxrl_suite.core.experiment import EXPERIMENTS, load_experiments

    load_experiments()
    if experiment.name not in EXPERIMENTS:
        EXPERIMENTS.register(experiment.name, experiment)
    assert main(["run", experiment.name, "--smoke", "--no-progress", "--out", str(out)]) == 0
    return out, json.loads((out / "summary.json").read_text())

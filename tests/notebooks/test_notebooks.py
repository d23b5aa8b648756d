"""The notebooks in notebooks/: stored without outputs, and they run top to bottom at smoke size.

Each notebook ends with a cell that asserts its results are sane and prints one `NAME=value`
line; the execution test runs it in a fresh ipykernel of this Python (a temporary `python3`
kernelspec pointing at `sys.executable`), in a temporary working directory, with `JAX_PLATFORMS=cpu`
and without `XLA_FLAGS` or `JAXRL_NOTEBOOK_FULL`, and then checks the outputs.

Strip the outputs of notebooks saved with them (what `test_stored_without_outputs` asks for):

    python tests/notebooks/test_notebooks.py            # all of notebooks/*.ipynb, in place
"""

from __future__ import annotations

import copy
import math
import re
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
# notebook -> (name of the value its last cell prints, the range that value must lie in)
EXPECTED = {
    "01_grpo_quickstart.ipynb": ("FINAL_REWARD", 0.0, 1.0),  # mean reward, last 10 GRPO steps
    "02_contextual_rl_sweeps.ipynb": ("FINAL_RETURN", 1.0, 500.0),  # median CartPole return
}
STRIP_COMMAND = "python tests/notebooks/test_notebooks.py"
CELL_TIMEOUT_S = 600


def strip_outputs(nb):
    """A copy of `nb` as it should be stored: no outputs, execution counts or timing metadata."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        for key in ("execution", "collapsed", "scrolled"):
            cell.metadata.pop(key, None)
    return nb


def test_the_expected_notebooks_exist():
    assert sorted(p.name for p in NOTEBOOK_DIR.glob("*.ipynb")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_stored_without_outputs(name):
    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=nbformat.NO_CONVERT)
    nbformat.validate(nb)
    assert nb.nbformat == 4
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", "kernelspec must be python3"
    assert nb == strip_outputs(nb), (
        f"notebooks/{name} is stored with outputs; strip them with `{STRIP_COMMAND}`"
    )


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """Environment for the kernels: a `python3` kernelspec that runs this very interpreter
    (found first on JUPYTER_PATH), IPython's files in a temp dir, and plain single-device JAX."""
    kernelspec = pytest.importorskip("ipykernel.kernelspec")
    prefix = tmp_path_factory.mktemp("jupyter")
    kernelspec.install(kernel_name="python3", prefix=str(prefix))
    env = {
        "JUPYTER_PATH": str(prefix / "share" / "jupyter"),
        "IPYTHONDIR": str(prefix / "ipython"),
        "JAX_PLATFORMS": "cpu",
    }
    return env, ("XLA_FLAGS", "JAXRL_NOTEBOOK_FULL", "MPLBACKEND")


def _stream_text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", [])
                   if o.output_type == "stream" and o.name == "stdout")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_notebook_runs(name, kernel_env, tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    env, unset = kernel_env
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for key in unset:
        monkeypatch.delenv(key, raising=False)
    before = sorted(p.name for p in NOTEBOOK_DIR.iterdir())

    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    n_cells = len(nb.cells)
    # Test-only cell (not in the stored notebook): which interpreter ran the kernel.
    nb.cells.append(nbformat.v4.new_code_cell("import sys\nprint('KERNEL_PREFIX=' + sys.prefix)"))
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError (with the traceback) if a cell fails

    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    assert _stream_text(nb.cells[-1]).strip() == f"KERNEL_PREFIX={sys.prefix}", (
        "the notebook kernel ran another Python than pytest"
    )

    # Every cell that shows a figure produced an inline PNG.
    plot_cells = [c for c in nb.cells[:n_cells] if c.cell_type == "code"
                  and "plt.show()" in c.source]
    assert plot_cells, "the notebook should plot something"
    for cell in plot_cells:
        assert any("image/png" in o.get("data", {}) for o in cell.outputs), (
            f"no inline image from the cell:\n{cell.source[:300]}"
        )

    # The final check cell printed its value, and the value is finite and in range.
    key, low, high = EXPECTED[name]
    found = re.findall(rf"^{key}=(\S+)$", _stream_text(nb.cells[n_cells - 1]), re.M)
    assert len(found) == 1, f"the last cell of {name} should print one {key}=... line"
    value = float(found[0])
    assert math.isfinite(value) and low <= value <= high, f"{key}={value}"

    # Nothing was written next to the notebooks (they write to temp dirs only).
    assert sorted(p.name for p in NOTEBOOK_DIR.iterdir()) == before


if __name__ == "__main__":  # strip outputs in place: python tests/notebooks/test_notebooks.py
    for path in sorted(NOTEBOOK_DIR.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
        stripped = strip_outputs(nb)
        if stripped != nb:
            nbformat.write(stripped, path)
            print(f"stripped {path}")

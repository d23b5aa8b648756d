"""docs/usage.md's runnable examples run as written: every ```bash block right after a line
`<!-- runnable -->` runs, in order, in one fresh directory, and exits 0 (the convention is stated
at the top of docs/usage.md). `jaxrl-suite` there is this interpreter's CLI."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

USAGE = Path(__file__).resolve().parents[2] / "docs" / "usage.md"
MARKER = "<!-- runnable -->"
_FENCE = re.compile(r"^```(\w*)\s*$")


def runnable_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, body) of each fenced block that follows a MARKER line; a marker must be
    followed by a ```bash (or ```sh) block."""
    lines = text.splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        fence = _FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        assert fence and fence.group(1) in ("bash", "sh"), \
            f"docs/usage.md:{i + 1}: {MARKER} must be followed by a ```bash block"
        end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
        blocks.append((i + 3, "\n".join(lines[i + 2:end])))
    return blocks


def test_the_marker_finds_only_marked_shell_blocks():
    text = "\n".join(["```bash", "echo unmarked", "```", MARKER, "```bash", "echo a", "echo b",
                      "```", "", MARKER, "```sh", "true", "```"])
    assert runnable_blocks(text) == [(6, "echo a\necho b"), (12, "true")]
    with pytest.raises(AssertionError, match="must be followed by"):
        runnable_blocks(MARKER + "\n```python\npass\n```")


BLOCKS = runnable_blocks(USAGE.read_text())


def test_usage_md_has_runnable_examples_at_smoke_size():
    assert any("jaxrl-suite plot" in body for _, body in BLOCKS)  # the plot example
    for line, body in BLOCKS:
        for cmd in re.findall(r"jaxrl-suite run [^\n]*", body):
            assert "--smoke" in cmd, f"docs/usage.md:{line}: a runnable run must use --smoke"


def _cli_on_path(root: Path) -> dict:
    """The environment with a `jaxrl-suite` first on PATH that runs this interpreter's CLI."""
    bin_dir = root / "bin"
    bin_dir.mkdir()
    script = bin_dir / "jaxrl-suite"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m jaxrl_suite.cli "$@"\n')
    script.chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                JAX_PLATFORMS="cpu")


def test_runnable_blocks_exit_0(tmp_path):
    """The blocks in order in one directory (a later block may use an earlier one's results), in
    one test so that no xdist worker runs a block without those before it."""
    env = _cli_on_path(tmp_path)
    cwd = tmp_path / "work"
    cwd.mkdir()
    for line, body in BLOCKS:
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (f"docs/usage.md:{line} exited {proc.returncode}:\n"
                                      f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        if "jaxrl-suite plot" in body:  # each plot prints the PNG it wrote
            pngs = [ln for ln in proc.stdout.splitlines() if ln.endswith(".png")]
            assert pngs and all((cwd / p).stat().st_size > 0 for p in pngs)

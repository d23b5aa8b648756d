"""Every experiment's `--smoke` summary, and a leaf-by-leaf comparison of two sets of them.

A refactor that promises "no change in numbers" is checked with it: run the smokes at the
previous commit and at this one, then compare (timings, paths and host facts aside):

    git worktree add /tmp/base HEAD~1
    python /tmp/base/benchmarks/smoke_summaries.py run /tmp/smoke_base   # the base tree's code
    python benchmarks/smoke_summaries.py run /tmp/smoke_new
    python benchmarks/smoke_summaries.py compare /tmp/smoke_base /tmp/smoke_new

`run OUT [NAME...]` writes OUT/NAME/summary.json (all experiments unless names are given; an
experiment whose summary is already there is skipped, so a stopped run goes on). `compare A B`
prints one line per differing leaf and `N/M experiments equal` last; exit 1 if any differs.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

TREE = Path(__file__).resolve().parent.parent  # the source tree this script belongs to

# Leaves that differ between two runs of the same code: wall times, rates, paths, host facts.
VOLATILE = re.compile(
    r"((^|_)(time|seconds|wall|elapsed|duration|date|host|hostname|path|dir|cpu|devices?|version"
    r"|started|finished|throughput|speed|per_s|us_per_step)(_|$)|(_s|_ms)$)", re.I)


def experiment_names() -> list[str]:
    from jaxrl_suite.core.experiment import load_experiments

    return sorted(load_experiments())


def run(out: Path, names: list[str]) -> None:
    """Each experiment's smoke run with this tree's `jaxrl_suite` and this tree's experiments
    (`jaxrl_suite_experiments` is mapped to TREE/experiments by a link on PYTHONPATH, since the
    editable install maps it to the installed checkout's)."""
    shim = Path(tempfile.mkdtemp(prefix="smoke_shim_"))
    (shim / "jaxrl_suite_experiments").symlink_to(TREE / "experiments")
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": f"{TREE}{os.pathsep}{shim}"}
    for name in names or experiment_names():
        dest = out / name
        if (dest / "summary.json").exists():
            continue
        cmd = [sys.executable, "-m", "jaxrl_suite.cli", "run", name, "--smoke", "--no-progress",
               "--out", str(dest)]
        if dest.exists():
            cmd.append("--overwrite")
        print("+", " ".join(cmd), flush=True)
        rc = subprocess.call(cmd, env=env, cwd=TREE)
        if rc:
            print(f"{name}: exit {rc}", flush=True)


def _leaves(x, prefix=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _leaves(v, f"{prefix}/{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _leaves(v, f"{prefix}[{i}]")
    else:
        yield prefix, x


def _equal(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def compare(a_dir: Path, b_dir: Path) -> int:
    names = sorted(p.name for p in a_dir.iterdir() if (p / "summary.json").exists())
    equal = 0
    for name in names:
        b_file = b_dir / name / "summary.json"
        if not b_file.exists():
            print(f"{name}: no summary in {b_dir}")
            continue
        a = dict(_leaves(json.loads((a_dir / name / "summary.json").read_text())))
        b = dict(_leaves(json.loads(b_file.read_text())))
        diffs = [k for k in sorted(set(a) | set(b))
                 if not any(VOLATILE.search(part) for part in k.split("/"))
                 and not _equal(a.get(k), b.get(k))]
        for k in diffs:
            print(f"{name}{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}")
        equal += not diffs
    print(f"{equal}/{len(names)} experiments equal")
    return 0 if equal == len(names) else 1


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("run", "compare"):
        sys.exit(__doc__)
    if sys.argv[1] == "run":
        run(Path(sys.argv[2]).resolve(), sys.argv[3:])
    else:
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))

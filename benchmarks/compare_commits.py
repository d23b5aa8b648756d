"""One benchmark script run alternately from two source trees: is this commit slower?

    git worktree add /tmp/base HEAD~1
    python benchmarks/compare_commits.py --base /tmp/base --pairs 3 \
        --key step_s --key generation_s --key update_s -- benchmarks/bench_grpo.py --steps 5
    python benchmarks/compare_commits.py --base /tmp/base --pairs 3 \
        --key rate:throughput.tokens_per_s --key rate:kv_vs_recompute.kv_tokens_per_s \
        -- benchmarks/bench_sampler.py

Each pair runs the script from the base tree, then from this one (`PYTHONPATH` set to each tree,
so each imports its own `jaxrl_suite`), in fresh processes on the same machine, each writing its
JSON to a temporary `--out`. Per key (a dotted path into that JSON; `rate:` marks a
higher-is-better figure, the others are times) it prints each pair's speed ratio of this tree
over the base (> 1: this tree is faster) and their median last, as `N.NNx`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def _get(result: dict, path: str) -> float:
    for part in path.split("."):
        result = result[part]
    return float(result)


def _run(tree: Path, script: str, args: list[str], out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(tree / script), *args, "--out", str(out)]
    subprocess.run(cmd, env=env, cwd=tree, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", type=Path, required=True, help="the other source tree")
    p.add_argument("--pairs", type=int, default=3, help="base / this-tree pairs")
    p.add_argument("--key", action="append", required=True,
                   help="dotted JSON path of a time (or rate:PATH for a rate); repeatable")
    p.add_argument("script", help="benchmark script, relative to each tree")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments (after --)")
    a = p.parse_args(argv)
    args = [x for x in a.args if x != "--"]
    ratios: dict[str, list[float]] = {k: [] for k in a.key}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.pairs):
            base = _run(a.base.resolve(), a.script, args, Path(tmp) / f"base{i}.json")
            new = _run(HERE, a.script, args, Path(tmp) / f"new{i}.json")
            for key in a.key:
                rate, path = key.startswith("rate:"), key.removeprefix("rate:")
                b, n = _get(base, path), _get(new, path)
                ratios[key].append(n / b if rate else b / n)
            print(f"pair {i + 1}: " + ", ".join(f"{k} {r[-1]:.2f}x" for k, r in ratios.items()),
                  flush=True)
    summary = {k: {"per_pair": r, "median": statistics.median(r)} for k, r in ratios.items()}
    for key, s in summary.items():
        print(f"{a.script} {key}: this tree vs {a.base} (> 1: faster), pairs "
              f"{', '.join(f'{r:.2f}' for r in s['per_pair'])}; median {s['median']:.2f}x")
    return summary


if __name__ == "__main__":
    main()

"""Sandbox throughput: programs per second of `SandboxPool(workers)` against a serial loop.

    python benchmarks/bench_sandbox.py            # 96 programs per run, workers 1, 2, 4, 8
    python benchmarks/bench_sandbox.py --smoke    # 8 programs, workers 1 and 2

The programs are code-task completions: a quarter right, a quarter wrong, a quarter with a
syntax error and a quarter that raises, each against six asserts; every run is the same batch.
The serial loop calls `run_tests` once per program on a one-worker pool (one sandboxed process
at a time); the pools run the batch with `workers` processes at a time. Runs alternate
(serial, pool, serial, pool, ...) and the ratios are medians over the repeats. Each program
costs two interpreter starts, the namespaces and the mounts: the figure is the sandbox's
overhead, which bounds the reward throughput of code RL on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from jaxrl_suite.rewards.sandbox import SandboxPool

TESTS = "".join(f"assert f({x}) == {3 * x + 1}\n" for x in (0, 1, 2, 5, 10, -3))
KINDS = [
    "def f(x):\n    return x * 3 + 1\n",
    "def f(x):\n    return x * 3 - 1\n",
    "def f(x):\n    return x *\n",
    "def f(x):\n    return x / 0\n",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--programs", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--out", type=Path, default=Path("results/bench_sandbox.json"))
    args = ap.parse_args()
    n = args.programs or (8 if args.smoke else 96)
    repeats = args.repeats or (1 if args.smoke else 3)
    workers = [1, 2] if args.smoke else [1, 2, 4, 8]
    programs = [KINDS[i % len(KINDS)] for i in range(n)]
    serial = SandboxPool(1)
    pools = {w: SandboxPool(w) for w in workers}

    def timed(fn):
        start = time.perf_counter()
        results = fn()
        return time.perf_counter() - start, [r.status for r in results]

    expected = None
    serial_s, pool_s = [], {w: [] for w in workers}
    for _ in range(repeats):
        for w in workers:
            t, statuses = timed(lambda: [serial.run([p], TESTS)[0] for p in programs])
            serial_s.append(t)
            t_pool, pool_statuses = timed(lambda w=w: pools[w].run(programs, TESTS))
            pool_s[w].append((t, t_pool))
            expected = expected or statuses
            assert statuses == expected == pool_statuses, "a pool disagreed with the loop"
    rows = []
    serial_rate = n / statistics.median(serial_s)
    print(f"sandbox: {n} programs, {os.cpu_count()} CPU cores, isolation "
          f"{ {k: v for k, v in serial.isolation.items() if v is not False} }")
    print(f"serial loop: {serial_rate:.1f} programs/s")
    print(f"{'workers':>8} {'programs/s':>11} {'vs serial (median of pairs)':>28}")
    for w in workers:
        ratios = [ts / tp for ts, tp in pool_s[w]]
        rate = n / statistics.median(tp for _, tp in pool_s[w])
        rows.append({"workers": w, "programs_per_s": rate, "ratio": statistics.median(ratios),
                     "ratios": ratios})
        print(f"{w:>8} {rate:>11.1f} {statistics.median(ratios):>27.2f}x")
    for p in [serial, *pools.values()]:
        p.close()
    figures = {"programs": n, "serial_programs_per_s": serial_rate, "pools": rows,
               "statuses": {s: expected.count(s) for s in sorted(set(expected))},
               "isolation": serial.isolation, "cpu_count": os.cpu_count()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()

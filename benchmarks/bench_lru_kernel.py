"""ELMUR's LRU memory update: the fused Pallas kernel vs its jax.numpy reference.

    python benchmarks/bench_lru_kernel.py           # B in {64, 1024} x M in {16, 64}, D = 128
    python benchmarks/bench_lru_kernel.py --smoke   # tiny sizes (run by the tests)

On a GPU or TPU it times both and prints the kernel/reference ratio. On CPU the kernel runs in
Pallas interpret mode, which is a correctness check and not a speed path, so only the reference
is timed there. It then times ELMUR's step-by-step inference (`models.elmur.inference_step`, one
token per environment step, default ELMURConfig, batch 1) over T = 1e3 and T = 1e5 steps: the
per-step time ratio should be about 1 (O(1) per step, constant memory).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxrl_suite.kernels.lru_memory import lru_memory_update, lru_memory_update_reference
from jaxrl_suite.models.elmur import ELMUR, ELMURConfig, inference_step, init_step_state


def _elmur_per_step(horizons: list[int]) -> dict[int, float]:
    """Seconds per inference step over `T` steps, one jitted scan per horizon (compile excluded)."""
    cfg = ELMURConfig()
    model = ELMUR(cfg)
    state = init_step_state(cfg, jax.random.key(0), 1)
    params = model.init(jax.random.key(1), state.buffer, state.memories, 0)

    def run(state, n):
        def step(s, t):
            x_t = jnp.sin(0.1 * t + jnp.arange(cfg.d_model, dtype=jnp.float32))[None]
            h, s = inference_step(model, params, s, x_t)
            return s, h[0, 0]

        return jax.lax.scan(step, state, jnp.arange(n, dtype=jnp.float32))

    out = {}
    for n in horizons:
        f = jax.jit(run, static_argnums=1).lower(state, n).compile()
        t0 = time.perf_counter()
        jax.block_until_ready(f(state))
        out[n] = (time.perf_counter() - t0) / n
    return out


def _time(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # compile
    t0 = time.perf_counter()
    for _ in range(repeats):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / repeats


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, nargs="+", default=[64, 1024])
    p.add_argument("--slots", type=int, nargs="+", default=[16, 64])
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--horizons", type=int, nargs=2, default=[1_000, 100_000])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, for tests")
    p.add_argument("--out", type=Path, default=Path("results/bench_lru_kernel.json"))
    a = p.parse_args(argv)
    if a.smoke:
        a.batch, a.slots, a.dim, a.repeats, a.horizons = [4], [4], 8, 2, [32, 320]
    backend = jax.default_backend()
    compiled = backend in ("gpu", "tpu")
    print(f"LRU memory update, D={a.dim}, backend {backend}"
          + ("" if compiled else " (kernel in interpret mode: correctness only, not timed)"))
    rows = []
    for b in a.batch:
        for m in a.slots:
            k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
            vec = jax.random.normal(k1, (b, m, a.dim))
            cand = jax.random.normal(k2, (b, m, a.dim))
            pos = jax.random.randint(k3, (b, m), -1, 1000).astype(jnp.int32)
            anchor = jnp.full((b,), 1000, jnp.int32)
            ref = jax.jit(lambda *x: lru_memory_update_reference(*x))
            t_ref = _time(ref, vec, pos, cand, anchor, repeats=a.repeats)
            row = {"B": b, "M": m, "D": a.dim, "reference_ms": 1e3 * t_ref}
            line = f"  B={b:5d} M={m:3d}: reference {1e3 * t_ref:8.3f} ms"
            if compiled:
                ker = jax.jit(lambda *x: lru_memory_update(*x))
                t_ker = _time(ker, vec, pos, cand, anchor, repeats=a.repeats)
                row |= {"kernel_ms": 1e3 * t_ker, "kernel_over_reference": t_ker / t_ref}
                line += f"  kernel {1e3 * t_ker:8.3f} ms  kernel/reference {t_ker / t_ref:.2f}"
            rows.append(row)
            print(line)
    per_step = _elmur_per_step(a.horizons)
    (t_short, s_short), (t_long, s_long) = per_step.items()
    print(f"  ELMUR inference, one token per step: {1e6 * s_short:.1f} us/step at T={t_short:,}, "
          f"{1e6 * s_long:.1f} us/step at T={t_long:,} -> ratio {s_long / s_short:.2f} "
          "(about 1 = O(1) per step)")
    result = {"backend": backend, "compiled_kernel": compiled, "rows": rows,
              "elmur_us_per_step": {str(k): 1e6 * v for k, v in per_step.items()},
              "elmur_step_ratio": s_long / s_short}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()

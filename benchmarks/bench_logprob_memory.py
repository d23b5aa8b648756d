"""Compiled temporary memory of the log-prob + entropy gradient: full logits vs chunked.

    python benchmarks/bench_logprob_memory.py              # B=1, T=4096, D=1536, V=32000/151936
    python benchmarks/bench_logprob_memory.py --seq 8192 --chunk 512 --dtype bfloat16
    python benchmarks/bench_logprob_memory.py --smoke      # seconds (run by the tests)

For each vocabulary size, the value-and-grad (w.r.t. the hidden states and the output weight)
of sum(logp * a) + sum(entropy * b) is lowered and compiled on abstract inputs
(`jax.ShapeDtypeStruct`, nothing is allocated or run), once on the full [B, T, V] logits
(`losses.common.token_logprobs` / `token_entropy`) and once chunked over T
(`losses.chunked.chunked_logprobs_and_entropy`). The figures are `memory_analysis()` temp
bytes: the compiler's estimate of scratch memory, excluding arguments and outputs.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxrl_suite.losses.chunked import chunked_logprobs_and_entropy, project_logits
from jaxrl_suite.losses.common import token_entropy, token_logprobs


def _full(hidden, weight, targets, *, chunk, transpose_weight, temperature):
    del chunk
    logits = project_logits(hidden, weight, transpose_weight=transpose_weight,
                            temperature=temperature)  # [B, T, V] float32
    return token_logprobs(logits, targets), token_entropy(logits)


def _loss(fn, hidden, weight, targets, a, b, temperature, *, chunk, transpose_weight):
    logp, ent = fn(hidden, weight, targets, chunk=chunk, transpose_weight=transpose_weight,
                   temperature=temperature)
    return jnp.sum(logp * a) + jnp.sum(ent * b)


def _compile(fn, args, *, chunk, transpose_weight):
    """(temp bytes or None, compile seconds) of the jitted value-and-grad of `_loss` with fn."""
    loss = functools.partial(_loss, fn, chunk=chunk, transpose_weight=transpose_weight)
    t0 = time.perf_counter()
    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(*args).compile()
    seconds = time.perf_counter() - t0
    stats = compiled.memory_analysis()
    return (None if stats is None else int(stats.temp_size_in_bytes)), seconds


def _gib(n):
    return "n/a" if n is None else f"{n / 2**30:.3f}"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, nargs="+", default=[32000, 151936])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--d-model", type=int, default=1536, help="width (Qwen2.5-1.5B: 1536)")
    p.add_argument("--chunk", type=int, default=256, help="positions per chunk")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="dtype of the hidden states (the weight is float32, cast as the model)")
    p.add_argument("--untied", action="store_true", help="lm_head kernel [D, V], not [V, D]")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, for tests")
    p.add_argument("--out", type=Path, default=Path("results/bench_logprob_memory.json"))
    a = p.parse_args(argv)
    if a.smoke:
        a.vocab, a.batch, a.seq, a.d_model, a.chunk = [512, 1000], 1, 64, 32, 16

    tied = not a.untied
    s = jax.ShapeDtypeStruct
    rows = []
    print(f"log-prob + entropy value-and-grad, B={a.batch}, T={a.seq}, D={a.d_model}, "
          f"chunk={a.chunk}, hidden {a.dtype}, {'tied [V, D]' if tied else 'lm_head [D, V]'}, "
          f"{jax.default_backend()}")
    print("  temp memory = compiler estimates from memory_analysis() (compiled, not run)")
    print(f"  {'vocab':>8} {'[B,T,V] f32 GiB':>16} {'full GiB':>10} {'chunked GiB':>12} "
          f"{'chunked/full':>13} {'compile s (full, chunked)':>26}")
    for v in a.vocab:
        args = (s((a.batch, a.seq, a.d_model), jnp.dtype(a.dtype)),
                s((v, a.d_model) if tied else (a.d_model, v), jnp.float32),
                s((a.batch, a.seq), jnp.int32), s((a.batch, a.seq), jnp.float32),
                s((a.batch, a.seq), jnp.float32), s((), jnp.float32))
        kw = dict(chunk=a.chunk, transpose_weight=tied)
        full_bytes, full_s = _compile(_full, args, **kw)
        chunked_bytes, chunked_s = _compile(chunked_logprobs_and_entropy, args, **kw)
        logits_bytes = a.batch * a.seq * v * 4
        ratio = None if not full_bytes or chunked_bytes is None else chunked_bytes / full_bytes
        rows.append({"vocab": v, "logits_bytes": logits_bytes, "full_temp_bytes": full_bytes,
                     "chunked_temp_bytes": chunked_bytes, "ratio": ratio,
                     "compile_s": {"full": full_s, "chunked": chunked_s}})
        print(f"  {v:>8} {_gib(logits_bytes):>16} {_gib(full_bytes):>10} "
              f"{_gib(chunked_bytes):>12} {'n/a' if ratio is None else f'{ratio:.3f}':>13} "
              f"{f'{full_s:.1f}, {chunked_s:.1f}':>26}")
    result = {
        "sizes": {"batch": a.batch, "seq": a.seq, "d_model": a.d_model, "chunk": a.chunk,
                  "dtype": a.dtype, "tied": tied},
        "rows": rows, "note": "temp bytes are compiler estimates (memory_analysis), not measured",
        "devices": jax.device_count(), "backend": jax.default_backend(),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()

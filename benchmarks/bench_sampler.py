"""Benchmark the KV-cache sampler against recompute decoding, over position, and for throughput.

    python benchmarks/bench_sampler.py            # full size (about a minute on 2 CPU cores)
    python benchmarks/bench_sampler.py --smoke    # tiny sizes, a few seconds

Figures (each after a warm-up compile; best and median of --repeats timed calls):
  1. KV-cache decoding (`KVCacheSampler`, --new-tokens tokens) vs a jitted loop that runs the
     full forward over the whole fixed [B, P + N] buffer at every step (the naive baseline).
     Every naive step costs the same (fixed shapes), so the baseline is timed over
     --naive-steps steps (--naive-repeats calls) and its tokens/s holds for all N steps.
     Target: ratio >= 5x.
  2. Decode time per step with the cache filled to --pos-short vs --pos-long slots (same
     compiled loop, cache length --pos-long + --pos-steps, cache buffer donated).
     Target: ratio <= 1.5x. The same steps at --pos-long with a per-row cache_index [B] (all
     rows at the same slot; what continuous batching and speculative decoding use) against
     the shared scalar index: the cost of per-row positions.
  3. Sampler throughput at --tp-batch x --tp-new-tokens, prompt --prompt-len, EOS disabled
     so that every token is produced. With --peer tunix, tunix's KV-cache `Sampler` on the same
     shapes, alternately with ours (--pairs A B pairs), and the per-pair ratios
     (`benchmarks/peers/tunix_peer.py`; pip install -e ".[peers]").
The figures are printed as a table and written as JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from jaxrl_suite.models import CausalLM, LMConfig, init_cache
from jaxrl_suite.sampling import KVCacheSampler


def _time(fn, *args, repeats: int) -> tuple[float, float]:
    """Call fn(*args) once to compile, then `repeats` times; returns (best, median) seconds."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def _prompts(batch: int, prompt_len: int, vocab: int, rng):
    """Random full-length prompts [B, P] and an all-True mask."""
    tokens = jax.random.randint(rng, (batch, prompt_len), 2, vocab, jnp.int32)
    return tokens, jnp.ones((batch, prompt_len), bool)


def make_recompute_decode(model: CausalLM, prompt_len: int, new_tokens: int, steps: int):
    """Naive baseline: jit(fn)(params, prompt, prompt_mask, rng) -> buffer [B, P + N].

    Each of `steps` steps runs the full forward over the whole fixed buffer, samples the next
    token from the logits at the last filled slot and writes it.
    """
    size = prompt_len + new_tokens

    @jax.jit
    def run(params, prompt, prompt_mask, rng):
        b = prompt.shape[0]
        buf = jnp.zeros((b, size), jnp.int32).at[:, :prompt_len].set(prompt)
        filled = jnp.zeros((b, size), bool).at[:, :prompt_len].set(prompt_mask)

        def body(i, carry):
            buf, filled = carry
            positions = jnp.maximum(jnp.cumsum(filled, axis=1) - 1, 0)
            logits, _ = model.apply(params, buf, positions, filled)  # [B, S, V]
            last = jax.lax.dynamic_index_in_dim(logits, prompt_len + i - 1, 1, keepdims=False)
            tok = jax.random.categorical(jax.random.fold_in(rng, i), last).astype(jnp.int32)
            slot = prompt_len + i
            buf = jax.lax.dynamic_update_slice(buf, tok[:, None], (0, slot))
            filled = jax.lax.dynamic_update_slice(filled, jnp.ones((b, 1), bool), (0, slot))
            return buf, filled

        return jax.lax.fori_loop(0, steps, body, (buf, filled))[0]

    return run


def make_decode_steps(model: CausalLM, steps: int, per_row: bool = False):
    """jit(fn)(params, cache, start) -> (cache, tokens [B]): `steps` greedy decode steps.

    Slots start..start+steps-1 are written; the cache argument is donated and updated in place.
    per_row passes the slot as a per-row cache_index [B] instead of the shared scalar.
    """

    def run(params, cache, start):
        b = cache.k[0].shape[0]
        key_mask = jnp.ones((b, cache.cache_len), bool)

        def body(i, carry):
            cache, tok = carry
            slot = start + i
            pos = jnp.full((b, 1), slot, jnp.int32)
            index = jnp.full((b,), slot, jnp.int32) if per_row else slot
            logits, cache = model.apply(params, tok[:, None], pos, key_mask, cache, index)
            return cache, jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)

        return jax.lax.fori_loop(0, steps, body, (cache, jnp.zeros((b,), jnp.int32)))

    return jax.jit(run, donate_argnums=1)


_SAMPLERS = {}


def _sampler(model: CausalLM, new_tokens: int):
    """KVCacheSampler with EOS disabled, shared between figures 1 and 3 (one compile per shape)."""
    key = (model.config, new_tokens)
    if key not in _SAMPLERS:
        _SAMPLERS[key] = KVCacheSampler(model, max_new_tokens=new_tokens, eos_id=-1, pad_id=0)
    return _SAMPLERS[key]


def bench_kv_vs_recompute(args, model, params, rng) -> dict:
    """Figure 1: tokens/s of KV-cache generation vs full-buffer recompute decoding."""
    prompt, mask = _prompts(args.batch, args.prompt_len, args.vocab, rng)
    kv = _sampler(model, args.new_tokens)
    kv_best, kv_med = _time(kv, params, prompt, mask, rng, repeats=args.repeats)
    naive = make_recompute_decode(model, args.prompt_len, args.new_tokens, args.naive_steps)
    nv_best, nv_med = _time(naive, params, prompt, mask, rng, repeats=args.naive_repeats)
    kv_tps = args.batch * args.new_tokens / kv_best
    naive_tps = args.batch * args.naive_steps / nv_best
    return {
        "kv_tokens_per_s": kv_tps,
        "kv_seconds_best": kv_best,
        "kv_seconds_median": kv_med,
        "recompute_tokens_per_s": naive_tps,
        "recompute_seconds_best": nv_best,
        "recompute_seconds_median": nv_med,
        "recompute_steps_timed": args.naive_steps,
        "speedup": kv_tps / naive_tps,
        "target_speedup": 5.0,
    }


def bench_position(args, model, params, rng) -> dict:
    """Figure 2: decode time per step from a cache filled to pos_short vs pos_long slots."""
    cache_len = args.pos_long + args.pos_steps
    cfg = model.config
    run = make_decode_steps(model, args.pos_steps)
    run_per_row = make_decode_steps(model, args.pos_steps, per_row=True)
    cache = init_cache(cfg, args.batch, cache_len)  # values do not change the timing
    times = {}
    for name, start, fn in (("short", args.pos_short, run), ("long", args.pos_long, run),
                            ("per_row", args.pos_long, run_per_row)):
        cache, _ = fn(params, cache, jnp.int32(start))  # warm-up / compile
        jax.block_until_ready(cache)
        samples = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            cache, tok = fn(params, cache, jnp.int32(start))
            jax.block_until_ready(tok)
            samples.append(time.perf_counter() - t0)
        times[name] = (min(samples) / args.pos_steps, statistics.median(samples) / args.pos_steps)
    return {
        "cache_len": cache_len,
        "pos_short": args.pos_short,
        "pos_long": args.pos_long,
        "ms_per_step_short": 1e3 * times["short"][0],
        "ms_per_step_long": 1e3 * times["long"][0],
        "ms_per_step_short_median": 1e3 * times["short"][1],
        "ms_per_step_long_median": 1e3 * times["long"][1],
        "ratio": times["long"][0] / times["short"][0],
        "target_ratio": 1.5,
        "ms_per_step_per_row": 1e3 * times["per_row"][0],
        "per_row_ratio": times["per_row"][0] / times["long"][0],
        "compiles": run._cache_size(),
    }


def bench_throughput(args, model, params, rng) -> dict:
    """Figure 3: sampler tokens/s at tp_batch x tp_new_tokens with EOS disabled; with
    `args.peer`, the peer's sampler on the same shapes, alternately (--pairs A B pairs of
    --repeats timed calls each), with the per-pair ratios of the best times."""
    prompt, mask = _prompts(args.tp_batch, args.prompt_len, args.vocab, rng)
    sampler = _sampler(model, args.tp_new_tokens)
    tokens = args.tp_batch * args.tp_new_tokens
    if args.peer:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # as bench_ppo does
        from peers import tunix_peer  # benchmarks/peers/tunix_peer.py

        sizes = tunix_peer.Sizes(layers=args.layers, d_model=args.d_model, heads=args.heads,
                                 kv_heads=args.kv_heads, d_ff=args.d_ff, vocab=args.vocab,
                                 prompt_len=args.prompt_len)
    ours, peer, ratios = [], [], []
    for _ in range(args.pairs if args.peer else 1):
        best, med = _time(sampler, params, prompt, mask, rng, repeats=args.repeats)
        ours.append((best, med))
        if args.peer:
            theirs = min(tunix_peer.sampler_seconds(sizes, args.tp_batch, args.tp_new_tokens,
                                                    args.repeats))
            peer.append(theirs)
            ratios.append(theirs / best)
    best = min(b for b, _ in ours)
    out = {
        "tokens_per_s": tokens / best,
        "tokens_per_s_median": tokens / statistics.median(m for _, m in ours),
        "seconds_best": best,
    }
    if args.peer:
        out[args.peer] = {"tokens_per_s": tokens / min(peer), "ratio_per_pair": ratios,
                          "ratio": statistics.median(ratios)}
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    p.add_argument("--d-ff", type=int, default=None, help="default: 4 * d_model")
    p.add_argument("--vocab", type=int, default=384)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--batch", type=int, default=64, help="batch of figures 1 and 2")
    p.add_argument("--new-tokens", type=int, default=256, help="figure 1")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--naive-steps", type=int, default=4, help="recompute steps timed (fig. 1)")
    p.add_argument("--naive-repeats", type=int, default=2, help="timed recompute calls (fig. 1)")
    p.add_argument("--pos-short", type=int, default=64)
    p.add_argument("--pos-long", type=int, default=512)
    p.add_argument("--pos-steps", type=int, default=32, help="decode steps timed (fig. 2)")
    p.add_argument("--tp-batch", type=int, default=64, help="figure 3")
    p.add_argument("--tp-new-tokens", type=int, default=64, help="figure 3")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peer", choices=["tunix"], default=None,
                   help="figure 3 beside this peer's sampler, alternately")
    p.add_argument("--pairs", type=int, default=3, help="A B pairs with --peer")
    p.add_argument(
        "--out", default=None, help="JSON path (default results/bench_sampler[_smoke].json)"
    )
    p.add_argument("--smoke", action="store_true", help="tiny sizes; runs in seconds")
    args = p.parse_args(argv)
    if args.smoke:
        args.layers, args.d_model, args.heads, args.vocab = 2, 32, 2, 64
        args.batch, args.new_tokens, args.prompt_len, args.naive_steps = 4, 8, 4, 2
        args.pos_short, args.pos_long, args.pos_steps = 8, 24, 4
        args.tp_batch, args.tp_new_tokens, args.repeats = 4, 8, 2  # reuses figure 1's compile
        args.naive_repeats = 2
    args.kv_heads = args.kv_heads or args.heads
    args.d_ff = args.d_ff or 4 * args.d_model
    args.out = args.out or f"results/bench_sampler{'_smoke' if args.smoke else ''}.json"
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    max_len = max(
        args.prompt_len + args.new_tokens,
        args.pos_long + args.pos_steps,
        args.prompt_len + args.tp_new_tokens,
    )
    cfg = LMConfig(
        vocab_size=args.vocab,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
        n_kv_heads=args.kv_heads,
        d_ff=args.d_ff,
        max_len=max_len,
        dtype=args.dtype,
    )
    model = CausalLM(cfg)
    rng = jax.random.key(args.seed)
    params = jax.jit(model.init)(rng, jnp.zeros((1, args.prompt_len), jnp.int32))

    results = {
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "kv_vs_recompute": bench_kv_vs_recompute(args, model, params, rng),
        "position": bench_position(args, model, params, rng),
        "throughput": bench_throughput(args, model, params, rng),
    }
    kv, pos, tp = results["kv_vs_recompute"], results["position"], results["throughput"]
    model_desc = f"{args.layers}x{args.d_model}, vocab {args.vocab}"
    rows = [
        (
            f"1. KV cache, B={args.batch} P={args.prompt_len} N={args.new_tokens} ({model_desc})",
            f"{kv['kv_tokens_per_s']:,.0f} tok/s",
        ),
        (
            f"   recompute full [B, P+N] buffer ({args.naive_steps} steps timed)",
            f"{kv['recompute_tokens_per_s']:,.0f} tok/s",
        ),
        ("   speedup (target >= 5x)", f"{kv['speedup']:,.1f}x"),
        (
            f"2. decode step, cache filled to {args.pos_short} (S={pos['cache_len']})",
            f"{pos['ms_per_step_short']:.3f} ms",
        ),
        (f"   decode step, cache filled to {args.pos_long}", f"{pos['ms_per_step_long']:.3f} ms"),
        ("   ratio long/short (target <= 1.5x)", f"{pos['ratio']:.2f}x"),
        (
            f"   decode step at {args.pos_long}, per-row cache_index [B]",
            f"{pos['ms_per_step_per_row']:.3f} ms",
        ),
        ("   ratio per-row/shared index", f"{pos['per_row_ratio']:.2f}x"),
        (
            f"3. sampler B={args.tp_batch} x N={args.tp_new_tokens}, P={args.prompt_len}",
            f"{tp['tokens_per_s']:,.0f} tok/s",
        ),
    ]
    if args.peer:
        peer = tp[args.peer]
        rows += [(f"   {args.peer}, the same shapes", f"{peer['tokens_per_s']:,.0f} tok/s"),
                 (f"   ours vs {args.peer}: median of the pairs "
                  f"{', '.join(f'{r:.2f}' for r in peer['ratio_per_pair'])}",
                  f"{peer['ratio']:.2f}x")]
    width = max(len(r[0]) for r in rows)
    print(
        f"bench_sampler on {jax.default_backend()} (best of {args.repeats} timed calls; "
        f"recompute: best of {args.naive_repeats})"
    )
    for name, value in rows:
        print(f"{name:<{width}}  {value:>16}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()

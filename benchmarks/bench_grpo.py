"""Tokens/s of one GRPO iteration (generation + update), with its generation/update split.

    python benchmarks/bench_grpo.py           # 4 layers x 128, vocab 384, G=8, 8 prompts, 64 tokens
    python benchmarks/bench_grpo.py --layers 8 --d-model 256 --group-size 16 --prompts 4
    python benchmarks/bench_grpo.py --smoke              # seconds (run by the tests)
    XLA_FLAGS=--xla_force_host_platform_device_count=2 python benchmarks/bench_grpo.py --fsdp 2

The model is freshly initialised, so completions run to (close to) the full length.
`--peer tunix` runs Google tunix's GRPOLearner on the same model shapes, task and batch
(`benchmarks/peers/tunix_peer.py`), alternately with ours (--pairs A B pairs of --steps steps
each), and prints the per-pair step ratios and their median: figures from one run on one
machine, never against numbers measured elsewhere.

The roofline: the machine's matmul rate at the update's shapes ([rows x tokens, d] @ [d, n] for
the projections, the SwiGLU and the head), measured in the same run, against the update's FLOPs
from the compiler (`cost_analysis()` of the update program) and generation's from the model's
shapes; it prints the fraction of that rate each achieves.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.algorithms.grpo import GRPOBatch, GRPOTrainer
from jaxrl_suite.algorithms.grpo_config import GRPOConfig
from jaxrl_suite.core.parallel import make_mesh, shard_batch
from jaxrl_suite.envs.text import make_task
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.models import CausalLM, LMConfig

# Published config.json shapes, for GPU runs (benchmarks/run_gpu.sh) with random weights.
PRESETS = {
    "qwen2.5-0.5b": dict(vocab_size=151936, d_model=896, n_layers=24, n_heads=14, n_kv_heads=2,
                         d_ff=4864, rope_theta=1e6, tie_embeddings=True, qkv_bias=True,
                         max_len=32768),
}

def matmul_rate(shapes: list[tuple[int, int, int]], dtype, repeats: int = 5) -> dict:
    """The machine's matmul rate at `shapes` ([m, k] @ [k, n]), each a jitted dot timed after
    a compile (best of `repeats`): GFLOP/s per shape and over all of them (total FLOPs / total
    time)."""
    per, flops, seconds = {}, 0.0, 0.0
    for m, k, n in shapes:
        a = jnp.ones((m, k), dtype)
        b = jnp.ones((k, n), dtype)
        dot = jax.jit(jnp.dot)
        jax.block_until_ready(dot(a, b))
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(dot(a, b))
            best = min(best, time.perf_counter() - t0)
        per[f"{m}x{k}x{n}"] = 2 * m * k * n / best / 1e9
        flops, seconds = flops + 2 * m * k * n, seconds + best
    return {"gflops_per_s": flops / seconds / 1e9, "per_shape": per}


def roofline(a, cfg, trainer, state, prompt_len: int, gen_s: float, upd_s: float) -> dict:
    """The achieved fraction of the machine's matmul rate: the update's FLOPs from the
    compiler (`cost_analysis()` of the update program on a real batch), generation's from the
    model's shapes (a while loop's cost is not counted by XLA), against `matmul_rate` at the
    update's matmul shapes, measured in this run."""
    seq, old_logp, rewards, _ = trainer.rollout(state, trainer.batch(0))
    adv = shard_batch(np.asarray(trainer.group_advantages(rewards), np.float32), trainer.mesh)
    lowered = jax.jit(trainer.update_fn).lower(state, GRPOBatch(seq, old_logp, None, adv))
    cost = lowered.compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    update_flops = float(cost["flops"])
    rows, total = a.prompts * a.group_size, prompt_len + a.new_tokens
    d, f, v, n_layers = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.n_layers
    kv = cfg.n_kv_heads * (d // cfg.n_heads)
    # per token: q, o (d x d), k, v (d x kv), SwiGLU (3 d x f) per layer, then the head (d x v)
    matmul_params = n_layers * (2 * d * d + 2 * d * kv + 3 * d * f) + d * v
    # every row runs every position (prefill + decode), attending to the whole cache
    gen_flops = rows * total * (2 * matmul_params + 4 * n_layers * d * total)
    m = rows * total
    shapes = sorted({(m, d, d), (m, d, kv), (m, d, f), (m, f, d), (m, d, v)})
    rate = matmul_rate(shapes, cfg.dtype)
    peak = rate["gflops_per_s"] * 1e9
    return {"matmul": rate, "update_gflop": update_flops / 1e9,
            "generation_gflop": gen_flops / 1e9,
            "update_fraction": update_flops / upd_s / peak,
            "generation_fraction": gen_flops / gen_s / peak}


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--d-ff", type=int, default=None, help="SwiGLU width (default 4 x d_model)")
    p.add_argument("--vocab", type=int, default=384)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--new-tokens", type=int, default=64, help="completion length")
    p.add_argument("--mu", type=int, default=1, help="inner updates per step")
    p.add_argument("--beta", type=float, default=0.0, help="KL weight (>0 adds a reference pass)")
    p.add_argument("--steps", type=int, default=5, help="timed steps (after 2 warm-up steps)")
    p.add_argument("--fsdp", type=int, default=1, help="mesh axis fsdp (data: the rest)")
    p.add_argument("--tensor", type=int, default=1, help="mesh axis tensor")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="a published model's shapes (random weights): overrides the sizes")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="compute dtype (params stay float32)")
    p.add_argument("--peer", choices=["tunix"], default=None,
                   help="also run this peer at the same sizes, alternately (pip install "
                        "-e '.[peers]'), and print the per-pair ratios and their median")
    p.add_argument("--pairs", type=int, default=3, help="A B pairs with --peer")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, for tests")
    p.add_argument("--out", type=Path, default=Path("results/bench_grpo.json"))
    a = p.parse_args(argv)
    if a.smoke:
        a.layers, a.d_model, a.heads, a.group_size, a.prompts, a.new_tokens, a.steps = (
            1, 32, 2, 2, 2, 8, 1)

    sizes = dict(vocab_size=a.vocab, d_model=a.d_model, n_layers=a.layers, n_heads=a.heads,
                 n_kv_heads=a.kv_heads or a.heads, d_ff=a.d_ff or 4 * a.d_model)
    cfg = LMConfig(**(PRESETS[a.preset] if a.preset else sizes), dtype=a.dtype)
    a.layers, a.d_model, a.heads, a.vocab = cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.vocab_size
    tokenizer = load_tokenizer()
    task = make_task("arithmetic", digits=3)
    model = CausalLM(cfg)
    prompt_len = 16
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, prompt_len), np.int32))
    grpo_cfg = GRPOConfig(prompts_per_step=a.prompts, group_size=a.group_size,
                          max_new_tokens=a.new_tokens, mu=a.mu, beta=a.beta)
    mesh = make_mesh(fsdp=a.fsdp, tensor=a.tensor)
    trainer = GRPOTrainer(model, tokenizer, task, grpo_cfg, mesh=mesh, prompt_len=prompt_len,
                          ref_params=params)
    state = trainer.init_state(params, jax.random.PRNGKey(1))
    done = 0  # steps run so far: each step takes the next prompts

    def ours(n: int) -> list[dict]:
        """`n` timed steps (the first call also runs 2 untimed ones, which compile)."""
        nonlocal state, done
        out = []
        for _ in range(n + (2 if done == 0 else 0)):
            t0 = time.perf_counter()
            state, m = trainer.step(state, trainer.batch(done * a.prompts))
            dt, done = time.perf_counter() - t0, done + 1
            if done > 2:
                out.append({"step_s": dt, "generation_s": float(m["gen_time"]),
                            "update_s": float(m["update_time"]),
                            "tokens": float(m["length"]) * a.prompts * a.group_size})
        return out

    peer_rows, pairs = [], []
    if a.peer:  # ours and the peer alternately (A B A B ...), the same sizes
        sys.path.insert(0, str(Path(__file__).resolve().parent))  # as bench_ppo does
        from peers import tunix_peer  # benchmarks/peers/tunix_peer.py
        sizes = tunix_peer.Sizes(layers=a.layers, d_model=a.d_model, heads=a.heads,
                                 kv_heads=cfg.n_kv_heads, d_ff=cfg.d_ff, vocab=a.vocab,
                                 prompts=a.prompts, group_size=a.group_size,
                                 new_tokens=a.new_tokens, prompt_len=prompt_len)
        rows = []
        for _ in range(a.pairs):
            mine = ours(a.steps)
            theirs = tunix_peer.grpo_steps(sizes, a.steps)
            rows += mine
            peer_rows += theirs
            pairs.append(_median(theirs, "step_s") / _median(mine, "step_s"))
    else:
        rows = ours(a.steps)
    step_s, gen_s, upd_s, tokens = (_median(rows, k) for k in
                                    ("step_s", "generation_s", "update_s", "tokens"))
    roof = roofline(a, cfg, trainer, state, prompt_len, gen_s, upd_s)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    result = {
        "sizes": {"layers": a.layers, "d_model": a.d_model, "heads": a.heads, "d_ff": cfg.d_ff,
                  "preset": a.preset, "dtype": a.dtype,
                  "vocab": a.vocab, "params": int(n_params), "group_size": a.group_size,
                  "prompts": a.prompts, "new_tokens": a.new_tokens, "mu": a.mu},
        "step_s": step_s, "generation_s": gen_s, "update_s": upd_s,
        "completion_tokens_per_step": tokens, "completion_tokens_per_s": tokens / step_s,
        "devices": jax.device_count(), "backend": jax.default_backend(),
        "mesh": dict(trainer.mesh.shape), "roofline": roof,
    }
    print(f"GRPO step ({n_params / 1e6:.2f}M params, {a.prompts} prompts x G={a.group_size}, "
          f"{a.new_tokens} new tokens, {jax.default_backend()} x{jax.device_count()}, mesh "
          f"{dict(trainer.mesh.shape)})")
    print(f"  step {step_s:.3f} s = generation {gen_s:.3f} s ({gen_s / step_s:.0%}) "
          f"+ update {upd_s:.3f} s ({upd_s / step_s:.0%})")
    print(f"  completion tokens/s {tokens / step_s:,.0f} ({tokens:.0f} tokens per step)")
    rate = roof["matmul"]["gflops_per_s"]
    print(f"  roofline: matmul rate at the update's shapes {rate:.1f} GFLOP/s ("
          + ", ".join(f"{k} {r:.0f}" for k, r in roof["matmul"]["per_shape"].items()) + ")")
    print(f"    update {roof['update_gflop']:.1f} GFLOP (compiler) in {upd_s:.3f} s = "
          f"{roof['update_gflop'] / upd_s:.1f} GFLOP/s, {roof['update_fraction']:.0%} of it")
    print(f"    generation {roof['generation_gflop']:.1f} GFLOP (model shapes) in {gen_s:.3f} s = "
          f"{roof['generation_gflop'] / gen_s:.1f} GFLOP/s, {roof['generation_fraction']:.0%}")
    if a.peer:
        p_step, p_roll, p_upd, p_tok = (_median(peer_rows, k) for k in
                                        ("step_s", "rollout_s", "update_s", "tokens"))
        result[a.peer] = {"step_s": p_step, "rollout_s": p_roll, "update_s": p_upd,
                          "completion_tokens_per_s": p_tok / p_step,
                          "step_ratio_per_pair": pairs, "step_ratio": statistics.median(pairs),
                          "tokens_per_s_ratio": (tokens / step_s) / (p_tok / p_step)}
        print(f"  {a.peer}: step {p_step:.3f} s = rollout {p_roll:.3f} s + update {p_upd:.3f} s;"
              f" completion tokens/s {p_tok / p_step:,.0f}")
        print(f"  ours vs {a.peer}, per step: {statistics.median(pairs):.2f}x (median of the "
              f"pairs {', '.join(f'{r:.2f}' for r in pairs)}); update "
              f"{p_upd / upd_s:.2f}x; tokens/s {result[a.peer]['tokens_per_s_ratio']:.2f}x")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()

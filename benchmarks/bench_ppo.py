"""PPO throughput on CartPole-v1: our jitted PPO vs a Python-loop PPO and a single-file PPO.

    python benchmarks/bench_ppo.py            # PureJaxRL's CartPole settings: 4 envs x 128 steps,
                                              # 5e5 timesteps, 8 seeds
    python benchmarks/bench_ppo.py --smoke    # seconds (run by the tests)

Prints, all measured in this process with identical network and hyperparameters:
- env-steps/s of `make_train` (one jitted program) vs `PythonLoopPPO` (one jitted call per env step
  and per minibatch), as a ratio;
- 8 seeds in one `jit(vmap(train))` vs the same compiled single-seed program run 8 times;
- our PPO vs `make_single_file_train`, a single-file PPO written in PureJaxRL's style (the
  "abstraction tax"; the target is within 5 %).
Times exclude compilation (reported separately); each timed run is repeated and the fastest kept.
With --peer purejaxrl, a PPO in PureJaxRL's structure that shares none of our code
(`benchmarks/peers/purejaxrl_ppo.py`) runs beside ours, alternately (--pairs A B pairs), for one
seed and for --seeds seeds in one jit(vmap); it prints the per-pair ratios and their median.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ppo_baselines import PythonLoopPPO, make_single_file_train  # noqa: E402

from jaxrl_suite.algorithms.ppo import PPOConfig, make_train, seed_keys  # noqa: E402


def _timed(fn, *args, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best, out


def _compile(fn, *args):
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - t0


def _peer_pairs(a, cfg, ours_c, ours_vmapped, key, keys) -> dict:
    """Ours and the peer alternately (A B A B ...): `a.pairs` pairs for one seed, then for the
    vmapped seeds; each ratio is the peer's time over ours in one pair (> 1: ours is faster)."""
    from peers.purejaxrl_ppo import make_train as peer_train  # benchmarks/peers/

    peer = peer_train(cfg)
    # the seeds' parameters initialised one by one (see peers/purejaxrl_ppo.py), then one jit(vmap)
    init = jax.jit(peer.init)
    single = init(key)
    inits = jax.tree.map(lambda *x: jnp.stack(x), *[init(k) for k in keys])
    peer_c, _ = _compile(peer.run, *single)
    peer_vmapped, _ = _compile(jax.vmap(peer.run), *inits)
    out = {}
    for what, mine, theirs, arg, peer_args in (
            ("single", ours_c, peer_c, key, single),
            ("vmap", ours_vmapped, peer_vmapped, keys, inits)):
        t_mine, t_theirs = [], []
        for _ in range(a.pairs):
            t, _ = _timed(mine, arg, repeats=1)
            t_mine.append(t)
            t, (_, returns) = _timed(theirs, *peer_args, repeats=1)
            t_theirs.append(t)
        ratios = [p / m for m, p in zip(t_mine, t_theirs, strict=True)]
        out[what] = {"ours_s": min(t_mine), "peer_s": min(t_theirs), "per_pair": ratios,
                     "ratio": float(np.median(ratios)),
                     "peer_final_return": float(np.mean(np.asarray(returns)[..., -10:]))}
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--timesteps", type=int, default=500_000)
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--num-steps", type=int, default=128)
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--loop-iterations", type=int, default=4,
                   help="iterations timed for the Python-loop baseline (after 1 warm-up)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--peer", choices=["purejaxrl"], default=None,
                   help="also run this peer alternately, 1 seed and --seeds seeds")
    p.add_argument("--pairs", type=int, default=3, help="A B pairs with --peer")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, for tests")
    p.add_argument("--out", type=Path, default=Path("results/bench_ppo.json"))
    a = p.parse_args(argv)
    if a.smoke:
        a.timesteps, a.seeds, a.loop_iterations, a.repeats = 4 * 128 * 4, 2, 1, 1

    cfg = PPOConfig(env="CartPole-v1", num_envs=a.num_envs, num_steps=a.num_steps,
                    total_timesteps=a.timesteps)
    steps_per_seed = cfg.num_updates * cfg.num_envs * cfg.num_steps
    key = jax.random.key(0)
    keys = seed_keys(a.seeds)
    ours, _ = make_train(cfg)
    base = make_single_file_train(cfg)

    ours_c, ours_compile = _compile(ours, key)
    base_c, base_compile = _compile(base, key)
    # Alternate the two so that machine drift hits both alike.
    t_ours, t_base = float("inf"), float("inf")
    for _ in range(a.repeats):
        t, (_, m_ours) = _timed(ours_c, key, repeats=1)
        t_ours = min(t_ours, t)
        t, (_, r_base) = _timed(base_c, key, repeats=1)
        t_base = min(t_base, t)
    ret_ours = float(np.nanmean(np.asarray(m_ours["episode_return"])[-10:]))
    ret_base = float(np.nanmean(np.asarray(r_base)[-10:]))

    vmapped, vmap_compile = _compile(jax.vmap(ours), keys)
    t_vmap, (_, m_vmap) = _timed(vmapped, keys, repeats=a.repeats)
    t_seq, _ = _timed(lambda ks: [ours_c(k) for k in ks], list(keys), repeats=1)
    vmap_returns = np.nanmean(np.asarray(m_vmap["episode_return"])[:, -10:], axis=1)

    loop = PythonLoopPPO(cfg)
    loop.train(0, num_updates=1)  # compile the per-step functions
    t0 = time.perf_counter()
    loop.train(1, num_updates=a.loop_iterations)
    t_loop = time.perf_counter() - t0
    loop_sps = a.loop_iterations * cfg.num_envs * cfg.num_steps / t_loop

    sps_ours = steps_per_seed / t_ours
    result = {
        "config": {"env": cfg.env, "num_envs": cfg.num_envs, "num_steps": cfg.num_steps,
                   "total_timesteps": steps_per_seed, "seeds": a.seeds},
        "ours_s": t_ours, "ours_compile_s": ours_compile, "ours_steps_per_s": sps_ours,
        "ours_final_return": ret_ours,
        "single_file_s": t_base, "single_file_compile_s": base_compile,
        "single_file_final_return": ret_base,
        "abstraction_tax": t_ours / t_base - 1.0,
        "python_loop_steps_per_s": loop_sps, "jit_vs_python_loop": sps_ours / loop_sps,
        "vmap_s": t_vmap, "vmap_compile_s": vmap_compile, "sequential_s": t_seq,
        "vmap_speedup": t_seq / t_vmap, "vmap_steps_per_s": a.seeds * steps_per_seed / t_vmap,
        "vmap_final_returns": vmap_returns.tolist(),
    }
    if a.peer:
        result[a.peer] = _peer_pairs(a, cfg, ours_c, vmapped, key, keys)
    print(f"PPO CartPole-v1, {cfg.num_envs} envs x {cfg.num_steps} steps, {steps_per_seed:,} "
          f"env-steps per seed ({jax.devices()[0].platform})")
    print(f"  ours, 1 seed:         {t_ours:6.2f} s  {sps_ours:>10,.0f} env-steps/s  "
          f"(+{ours_compile:.1f} s compile)  final return {ret_ours:.1f}")
    print(f"  single-file PPO:      {t_base:6.2f} s  {steps_per_seed / t_base:>10,.0f} env-steps/s"
          f"  (+{base_compile:.1f} s compile)  final return {ret_base:.1f}")
    print(f"  abstraction tax:      {100 * result['abstraction_tax']:+.1f} % "
          "(target <= +5 %, issue 25)")
    print(f"  Python-loop PPO:      {loop_sps:>19,.0f} env-steps/s  -> jitted is "
          f"{result['jit_vs_python_loop']:.1f}x faster")
    print(f"  {a.seeds} seeds, jit(vmap): {t_vmap:6.2f} s  {result['vmap_steps_per_s']:>10,.0f} "
          f"env-steps/s  vs {t_seq:.2f} s sequential -> {result['vmap_speedup']:.2f}x  "
          f"(median final return {np.median(vmap_returns):.1f})")
    if a.peer:
        peer = result[a.peer]
        for what, label in (("single", "1 seed"), ("vmap", f"{a.seeds} seeds, jit(vmap)")):
            r = peer[what]
            print(f"  vs {a.peer} ({label}): ours {r['ours_s']:.2f} s, peer {r['peer_s']:.2f} s "
                  f"(final return {r['peer_final_return']:.1f}) -> ours {r['ratio']:.2f}x its "
                  f"speed (median of the pairs {', '.join(f'{x:.2f}' for x in r['per_pair'])})")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()

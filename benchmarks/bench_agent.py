"""Agent dispatchers: trajectories per second of `async_pipeline` against `async_batch`.

    python benchmarks/bench_agent.py            # 16 and 64 concurrent trajectories, 3 pairs
    python benchmarks/bench_agent.py --smoke    # 4 concurrent, tiny model, 1 pair

SkyRL-Agent (arXiv 2511.16108) reports 1.55x from pipelining the stages (init, LM step, tool,
reward) of many trajectories instead of running them as a batch with a barrier per stage.

Set-up: tool-use episodes of the `tool_mix` task (calculator, code_search, run_tests in the
sandbox; 2-3 model turns, 1-2 tool calls each). Every LM step is a real `KVCacheSampler` call of
a CausalLM (random weights) on the episodes' whole contexts, padded to fixed row counts; the
text of each turn is then the scripted expert's (`ScriptedTurns`), so every episode makes its
tool calls whatever the weights. Init, tool and reward jobs add latencies drawn from a
log-normal distribution (the parameters are printed): a remote sandbox or service, which a
thread pool of `concurrency` workers waits on. Both dispatchers run the same episodes with the
same latencies (same seed), alternating (batch, pipeline, batch, ...); each run's figure is
finished trajectories per second, and the ratios are per pair, with their median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.algorithms.agent import AgentConfig, EpisodeRunner
from jaxrl_suite.algorithms.dispatch import Latency, async_batch, async_pipeline, lm_rows
from jaxrl_suite.algorithms.executors import LocalToolExecutor
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text import load_tokenizer, make_task
from jaxrl_suite.models import CausalLM, LMConfig
from jaxrl_suite.sampling import GenerateOutput, KVCacheSampler


class ScriptedTurns:
    """A `Sampler` that pays for a real sampler call and then writes the expert's turn: turn t
    of episode u (sequence u * max_turns + t) is `scripts[u][t]`."""

    def __init__(self, inner, scripts: dict[int, list[str]], tokenizer, max_turns: int):
        self.inner, self.scripts, self.tok, self.max_turns = inner, scripts, tokenizer, max_turns

    def __call__(self, params, prompt, prompt_mask, rng, *, seq_ids=None, **kw):
        out = self.inner(params, prompt, prompt_mask, rng, seq_ids=seq_ids, **kw)
        n = out.tokens.shape[1]
        jax.block_until_ready(out.tokens)
        rows = prompt.shape[0]
        tokens = np.full((rows, n), self.tok.pad_id, np.int32)
        mask = np.zeros((rows, n), np.float32)
        for r, s in enumerate(np.asarray(seq_ids)):
            uid, turn = divmod(int(s), self.max_turns)
            script = self.scripts[uid]
            ids = (self.tok.encode(script[min(turn, len(script) - 1)]) + [self.tok.eos_id])[:n]
            tokens[r, : len(ids)], mask[r, : len(ids)] = ids, 1.0
        return GenerateOutput(jnp.asarray(tokens), jnp.asarray(np.asarray(out.logprobs) * mask),
                              jnp.asarray(mask), jnp.asarray(mask.sum(1).astype(np.int32)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--concurrency", type=int, nargs="+", default=None)
    ap.add_argument("--episodes", type=int, default=None, help="per run (default 2x concurrency)")
    ap.add_argument("--pairs", type=int, default=None)
    ap.add_argument("--tool-median", type=float, default=None, help="seconds")
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=Path("results/bench_agent.json"))
    args = ap.parse_args()
    smoke = args.smoke
    concurrencies = args.concurrency or ([4] if smoke else [16, 64])
    pairs = args.pairs or (1 if smoke else 3)
    tool_median = args.tool_median if args.tool_median is not None else (0.02 if smoke else 0.5)
    latency_kw = dict(sigma=args.sigma, init_median=tool_median / 2,
                      reward_median=tool_median / 2)
    size = dict(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64) if smoke else dict(
        d_model=128, n_layers=2, n_heads=4, n_kv_heads=4, d_ff=512)
    prompt_len, turn_tokens, episode_tokens = 104, 96, 384
    model = CausalLM(LMConfig(max_len=640, **size))
    params = model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
    tok = load_tokenizer()
    task = make_task("tool_mix")
    cfg = AgentConfig(max_turns=4, episode_tokens=episode_tokens, obs_chars=240)
    inner = KVCacheSampler(model, max_new_tokens=turn_tokens, eos_id=tok.eos_id,
                           pad_id=tok.pad_id)
    mesh = make_mesh(1)
    print(f"model {size}, prompt {prompt_len} + episode {episode_tokens} tokens, "
          f"{turn_tokens} tokens per turn; latencies: "
          f"{Latency(tool_median, **latency_kw).describe()}")
    results = {}
    for conc in concurrencies:
        n = args.episodes or 2 * conc
        examples = task.examples("train", 0, n)
        scripts = {u: task.expert_turns(ex) for u, ex in enumerate(examples)}
        sampler = ScriptedTurns(inner, scripts, tok, cfg.max_turns)
        min_rows = min(8, conc)
        shapes = sorted({lm_rows(k, min_rows, conc) for k in range(1, conc + 1)})
        for rows in shapes:  # compile every padded shape before timing
            z = jnp.zeros((rows, prompt_len + episode_tokens), jnp.int32)
            jax.block_until_ready(inner(params, z, z > -1, jax.random.key(0)).tokens)
        with LocalToolExecutor(conc, kind="thread") as pool:
            for ex in examples:  # warm the tools' caches (repo indexes) and the sandbox pool
                task.verify_batch([task.solution(ex)], [ex])
            times = {"batch": [], "pipeline": []}
            steps = {}
            for rep in range(pairs):
                for name, dispatch in (("batch", async_batch), ("pipeline", async_pipeline)):
                    runner = EpisodeRunner(task, tok, sampler, cfg, prompt_len=prompt_len,
                                           mesh=mesh, params_source=lambda: (params, 0))
                    episodes = runner.episodes(examples, 1, 0)
                    t0 = time.perf_counter()
                    dispatch(runner, episodes, pool, pool, concurrency=conc, lm_batch=conc,
                             min_lm_batch=min_rows,
                             latency=Latency(tool_median, seed=rep, **latency_kw))
                    times[name].append(time.perf_counter() - t0)
                    steps[name] = (runner.lm_calls, runner.lm_rows / runner.lm_padded)
                    assert all(ep.score == 1.0 for ep in episodes), "the expert must succeed"
        tps = {k: [n / t for t in v] for k, v in times.items()}
        ratios = [p / b for b, p in zip(tps["batch"], tps["pipeline"], strict=True)]
        results[conc] = {"episodes": n, "traj_per_s": tps, "ratios": ratios,
                         "median_ratio": statistics.median(ratios),
                         "lm_calls": {k: v[0] for k, v in steps.items()},
                         "lm_fill": {k: v[1] for k, v in steps.items()}}
        print(f"concurrency {conc:3d}, {n} trajectories: batch "
              f"{statistics.median(tps['batch']):.2f} traj/s ({steps['batch'][0]} LM calls, "
              f"fill {steps['batch'][1]:.2f}), pipeline {statistics.median(tps['pipeline']):.2f}"
              f" traj/s ({steps['pipeline'][0]} LM calls, fill {steps['pipeline'][1]:.2f}); "
              f"pipeline/batch per pair {', '.join(f'{r:.2f}' for r in ratios)}, median "
              f"{statistics.median(ratios):.2f}x (paper: 1.55x)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"tool_median_s": tool_median, "sigma": args.sigma,
                                    "model": size, "results": results}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

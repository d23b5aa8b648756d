"""The rollout engines side by side: static batching, micro sampling groups, continuous batching
(Infinite Sampling, arXiv 2506.22950) and speculative rollouts (ReSpec, arXiv 2510.26475).

    python benchmarks/bench_rollout.py            # full size (a few minutes on 2 CPU cores)
    python benchmarks/bench_rollout.py --smoke    # seconds (run by the tests)

The policy is the 4 x 128 LM after a short SFT on the count task (`envs/text/count.py`, whose
prompt names the answer's length: completions of 20 to 53 tokens), so completion lengths are
prompt-dependent and learnable, as the length predictor assumes. All figures are ratios from one
run of this process.

1. Memory (compiler estimates, `compiled.memory_analysis()`): the static sampler decoding the
   whole rollout (R = prompts x G rows) against the continuous sampler with --slots cache rows.
   Paper: 21.55 -> 10.64 GB on Qwen3-1.7B (about -50 %).
2. Decode steps and tokens/s of: static (all R rows at once), naive micro-groups (rounds of
   --slots rows, rollout order), length-aware rounds (sorted by predicted length), continuous
   FIFO, SJF and LPT. Each engine samples the same rollout (same key); its first call is a
   warm-up that also teaches its length predictor (an earlier epoch), the timed calls alternate
   engines. Every engine's completions must equal the static sampler's. Paper: > 25 % throughput
   over naive micro-groups, 3,250 -> 1,770 decoding steps.
3. Speculative sampling (a 1 x 64 drafter distilled from the policy): tokens/s against plain
   decoding at batch 1, 8 and 64, with acceptance rates and the draft length the controller
   picks from the measured costs. Paper: up to 4.5x on Qwen 3B-14B GPUs.
4. One GRPO step (rollout + update) with the speculative sampler against the static one.
The figures are printed as tables and written as JSON to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import jax
import numpy as np

from jaxrl_suite.algorithms.grpo import GRPOTrainer
from jaxrl_suite.algorithms.grpo_config import GRPOConfig, rollout_config
from jaxrl_suite.algorithms.sft import SFTConfig, SFTTrainer
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text import make_task
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.models import CausalLM, LMConfig
from jaxrl_suite.sampling import ContinuousSampler, KVCacheSampler
from jaxrl_suite.sampling.engines import EngineOptions, make_engine

ENGINES = {  # name: (refill, order); None = the static sampler
    "static": None,
    "micro-groups": ("rounds", "fifo"),
    "length-aware rounds": ("rounds", "lpt"),
    "continuous FIFO": ("continuous", "fifo"),
    "continuous SJF": ("continuous", "sjf"),
    "continuous LPT": ("continuous", "lpt"),
}


def sampler_memory(model, params, prompt, mask, *, new_tokens: int, slots: int) -> dict:
    """Compiler estimates of the static sampler on all rows and the continuous one on `slots`."""
    common = dict(max_new_tokens=new_tokens, eos_id=1, pad_id=0)
    return {"static": KVCacheSampler(model, **common).compiled_memory(params, prompt, mask),
            "continuous": ContinuousSampler(model, slots=slots, **common).compiled_memory(
                params, prompt, mask)}


def train_policy(model, tok, task, *, steps: int, prompt_len: int, new_tokens: int, seed=0):
    """The benchmark's policy: `steps` SFT steps on the task from a fresh init."""
    mesh = make_mesh(1)
    sft = SFTTrainer(model, tok, task, SFTConfig(steps=steps, batch_size=64, lr=3e-3,
                                                 warmup_steps=min(20, steps)),
                     mesh=mesh, prompt_len=prompt_len, max_new_tokens=new_tokens)
    params = model.init(jax.random.key(seed), np.zeros((1, 4), np.int32))
    state = sft.init_state(params, jax.random.key(seed + 1))
    for i in range(steps):
        state, _ = sft.step(state, sft.batch(i * 64))
    return state.params, sft


def rollout_engines(model, params, prompt, mask, *, new_tokens, slots, repeats, eos_id, pad_id):
    """Section 2: each engine on the same rollout; returns rows of figures."""
    rng = jax.random.key(1)
    common = dict(max_new_tokens=new_tokens, eos_id=eos_id, pad_id=pad_id)
    engines = {}
    for name, spec in ENGINES.items():
        engines[name] = KVCacheSampler(model, **common) if spec is None else ContinuousSampler(
            model, slots=slots, refill=spec[0], order=spec[1], **common)
    ref, outs, times = None, {}, {name: [] for name in engines}
    for sampler in engines.values():  # warm-up: compile, and an earlier epoch's lengths
        jax.block_until_ready(sampler(params, prompt, mask, jax.random.key(0)))
    for _ in range(repeats):  # alternate the engines
        for name, sampler in engines.items():
            t0 = time.perf_counter()
            out = jax.block_until_ready(sampler(params, prompt, mask, rng))
            times[name].append(time.perf_counter() - t0)
            outs[name] = (out, dict(getattr(sampler, "last_stats", {})))
    ref = outs["static"][0]
    lengths = np.asarray(ref.lengths)
    rows = []
    for name, (out, stats) in outs.items():
        t = statistics.median(times[name])
        rows.append({
            "engine": name, "median_s": t, "tokens_per_s": float(lengths.sum()) / t,
            "decode_steps": stats.get("decode_steps", int(lengths.max()) - 1),
            "rows_per_step": slots if name != "static" else len(lengths),
            "identical": bool(np.array_equal(out.tokens, ref.tokens)),
            "max_logprob_diff": float(np.abs(np.asarray(out.logprobs)
                                             - np.asarray(ref.logprobs)).max()),
        })
    return rows, lengths


def warm_drafter(model, params, sft, task, cfg: GRPOConfig, *, steps: int, batch: int = 64):
    """A speculative rollout sampler whose drafter is distilled from `params` for `steps` steps
    on the task's solutions (the SFT data), as `LMStudy.warm_drafter`."""
    sampler = make_engine(model, rollout_config(cfg), sft.tokenizer, rng=jax.random.key(7))
    for i in range(steps):
        examples = task.examples("train", 50_000 + i * batch, batch)
        sampler.distill(params, sft.solution_batch(examples), steps=1)
    return sampler


def speculative_table(spec, params, sft, task, *, batches, ks, repeats):
    """Section 3: tokens/s of plain decoding (k = 0) and speculative decoding at each fixed k
    and at the controller's k, per batch size; the speculative sampler's own programs."""
    rows = []
    for b in batches:
        examples = task.examples("train", 20_000, b)
        prompt, mask = sft.encode_prompts(examples)
        auto_k = spec.choose_k(params, b, prompt.shape[1])
        for k in sorted({0, *ks, auto_k}):
            spec.generate(params, prompt, mask, jax.random.key(0), k=k)  # compile
            times, stats = [], None
            for r in range(repeats):
                t0 = time.perf_counter()
                out, stats = spec.generate(params, prompt, mask, jax.random.key(1 + r), k=k)
                jax.block_until_ready(out.tokens)
                times.append(time.perf_counter() - t0)
            t = statistics.median(times)
            rows.append({"batch": b, "k": k, "auto": k == auto_k, "median_s": t,
                         "tokens_per_s": stats["tokens"] / t, "acceptance": stats["acceptance"],
                         "rounds": stats["rounds"]})
    for r in rows:
        plain = next(x for x in rows if x["batch"] == r["batch"] and x["k"] == 0)
        r["speedup"] = r["tokens_per_s"] / plain["tokens_per_s"]
    return rows


def grpo_steps(model, params, sft, task, spec, cfg: GRPOConfig, *, steps: int):
    """Section 4: GRPO step time (rollout + update + the drafter's KD) with the static and the
    speculative sampler, alternating after two warm-up steps each."""
    trainers = {name: GRPOTrainer(model, sft.tokenizer, task, c, mesh=make_mesh(1),
                                  prompt_len=sft.prompt_len, sampler=sampler)
                for name, c, sampler in (("static", cfg, None),
                                         ("speculative", dataclasses.replace(
                                             cfg, rollout=EngineOptions(engine="speculative")),
                                          spec))}
    states = {n: t.init_state(params, jax.random.key(3)) for n, t in trainers.items()}
    times = {n: [] for n in trainers}
    last = {}
    for i in range(steps + 2):
        for name, trainer in trainers.items():
            t0 = time.perf_counter()
            states[name], metrics = trainer.step(states[name], trainer.batch(i))
            if i >= 2:
                times[name].append(time.perf_counter() - t0)
            last[name] = metrics
    return {n: {"step_s": statistics.median(t), "gen_s": last[n]["gen_time"],
                "reward": last[n]["reward"], "acceptance": last[n].get("rollout_acceptance"),
                "draft_k": last[n].get("rollout_k")} for n, t in times.items()}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=16, help="prompts per rollout")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--slots", type=int, default=32, help="KV-cache rows of the micro engines")
    p.add_argument("--new-tokens", type=int, default=56)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--sft-steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--drafter-d-model", type=int, default=64)
    p.add_argument("--drafter-steps", type=int, default=300, help="KD warm-up steps")
    p.add_argument("--spec-batches", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--spec-ks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--grpo-prompts", type=int, default=8, help="prompts per GRPO step")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, seconds")
    p.add_argument("--out", default="results/bench_rollout.json")
    a = p.parse_args(argv)
    cfg = LMConfig()
    if a.smoke:
        cfg = LMConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64)
        a.prompts, a.group_size, a.slots, a.new_tokens, a.sft_steps, a.repeats = 4, 4, 6, 30, 5, 1
        a.drafter_d_model, a.drafter_steps, a.spec_batches, a.spec_ks = 32, 2, [1, 4], [2]
        a.grpo_prompts = 2
    model, tok = CausalLM(cfg), load_tokenizer()
    task = make_task("count", max_count=4 if a.smoke else 12)
    t0 = time.perf_counter()
    params, sft = train_policy(model, tok, task, steps=a.sft_steps, prompt_len=a.prompt_len,
                               new_tokens=a.new_tokens)
    print(f"policy: {cfg.n_layers} x {cfg.d_model} LM, {a.sft_steps} SFT steps on count "
          f"({time.perf_counter() - t0:.0f} s)")
    examples = task.examples("train", 10_000, a.prompts)
    group = [e for e in examples for _ in range(a.group_size)]
    prompt, mask = sft.encode_prompts(group)
    rows = len(group)
    figures: dict = {"rows": rows, "slots": a.slots, "new_tokens": a.new_tokens}

    mem = sampler_memory(model, params, prompt, mask, new_tokens=a.new_tokens, slots=a.slots)
    figures["memory"] = mem
    ratio = mem["continuous"]["peak"] / mem["static"]["peak"]
    print(f"\n1. sampler memory (compiler estimates, bytes): {rows} rows static vs "
          f"{a.slots} slots continuous")
    for name, m in mem.items():
        print(f"  {name:11} peak {m['peak']:>12,}  temp {m['temp']:>12,}  "
              f"args {m['argument']:>10,}")
    print(f"  ratio continuous / static peak: {ratio:.2f} (paper: 10.64 / 21.55 = 0.49)")

    engine_rows, lengths = rollout_engines(
        model, params, prompt, mask, new_tokens=a.new_tokens, slots=a.slots,
        repeats=a.repeats, eos_id=tok.eos_id, pad_id=tok.pad_id)
    figures["engines"] = engine_rows
    figures["lengths"] = {"min": int(lengths.min()), "mean": float(lengths.mean()),
                          "max": int(lengths.max())}
    base = next(r for r in engine_rows if r["engine"] == "micro-groups")
    print(f"\n2. rollout of {rows} rows ({a.prompts} prompts x G={a.group_size}), completion "
          f"lengths {lengths.min()}-{lengths.max()} (mean {lengths.mean():.1f}) tokens; "
          f"micro engines use {a.slots} slots")
    print(f"  {'engine':20} {'decode steps':>12} {'x rows':>6} {'tok/s':>8} "
          f"{'vs micro-groups':>15} {'identical':>9}")
    for r in engine_rows:
        print(f"  {r['engine']:20} {r['decode_steps']:>12} {r['rows_per_step']:>6} "
              f"{r['tokens_per_s']:>8,.0f} {r['tokens_per_s'] / base['tokens_per_s']:>14.2f}x "
              f"{'yes' if r['identical'] else 'NO':>9}")
    print("  paper: continuous + length-aware > 1.25x naive micro-groups; 3,250 -> 1,770 steps")

    grpo_cfg = GRPOConfig(prompts_per_step=a.grpo_prompts, group_size=a.group_size,
                          max_new_tokens=a.new_tokens, lr=2e-4)
    spec = warm_drafter(model, params, sft, task, dataclasses.replace(
        grpo_cfg, rollout=EngineOptions(engine="speculative", drafter_d_model=a.drafter_d_model)),
        steps=a.drafter_steps)
    spec_rows = speculative_table(spec, params, sft, task, batches=a.spec_batches, ks=a.spec_ks,
                                  repeats=a.repeats)
    figures["speculative"] = spec_rows
    costs = {"target": spec.controller.target_cost, "drafter": spec.controller.draft_cost}
    figures["costs"] = costs
    print(f"\n3. speculative decoding, drafter 1 x {a.drafter_d_model} distilled for "
          f"{a.drafter_steps} steps; measured costs (overhead s, per row-token s): "
          f"target {costs['target'][0]:.2e}, {costs['target'][1]:.2e}; drafter "
          f"{costs['drafter'][0]:.2e}, {costs['drafter'][1]:.2e}")
    print(f"  {'batch':>5} {'k':>3} {'tok/s':>8} {'vs plain':>8} {'acceptance':>10} "
          f"{'rounds':>6}  chosen")
    for r in spec_rows:
        print(f"  {r['batch']:>5} {r['k']:>3} {r['tokens_per_s']:>8,.0f} {r['speedup']:>7.2f}x "
              f"{r['acceptance']:>10.2f} {r['rounds']:>6}  {'<- controller' if r['auto'] else ''}")
    print("  paper: up to 4.5x on Qwen 3B-14B GPUs")

    steps = grpo_steps(model, params, sft, task, spec, grpo_cfg, steps=a.repeats)
    figures["grpo_step"] = steps
    print(f"\n4. GRPO step ({a.grpo_prompts} prompts x G={a.group_size}), median of "
          f"{a.repeats} after 2 warm-up steps")
    for name, r in steps.items():
        extra = "" if r["acceptance"] is None else (
            f", acceptance {r['acceptance']:.2f}, k {r['draft_k']:.0f}")
        print(f"  {name:12} step {r['step_s']:.3f} s (generation {r['gen_s']:.3f} s){extra}")
    ratio = steps["speculative"]["step_s"] / steps["static"]["step_s"]
    print(f"  speculative / static step time: {ratio:.2f}")

    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()

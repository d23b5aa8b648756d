"""S seeds of the main job's GRPO phase as one vmapped program against S host-loop runs.

    python benchmarks/bench_ondevice_grpo.py            # S=8 seeds x 10 GRPO steps, 3 pairs
    python benchmarks/bench_ondevice_grpo.py --seeds 4 --steps 20 --pairs 5
    python benchmarks/bench_ondevice_grpo.py --smoke    # seconds (run by the tests)
    XLA_FLAGS=--xla_force_host_platform_device_count=2 python benchmarks/bench_ondevice_grpo.py
    python benchmarks/bench_ondevice_grpo.py --set model.d_model=32 --set model.n_layers=1 \
        --set model.n_heads=2 --set model.n_kv_heads=2 --set model.d_ff=64   # a tiny model

The config is the main job's (experiments/configs/grpo_arithmetic.yaml: 4 x 128 LM, ByT5
bytes, 16 prompts x G = 8, 22 new tokens, dynamic sampling up to 4 draws), its GRPO phase cut
to --steps steps. The start is its SFT run for --sft-steps steps (seed 0), shared by every
seed, so that rewards vary and dynamic sampling draws as in the job; each seed s runs GRPO
from it with its own key.

Host loop: `GRPOTrainer.step` per step (sample, decode, verify in Python, update), the S
seeds one after another. On device (`algorithms.grpo_ondevice`): the S seeds vmapped in one
jitted program (`GRPOProgram.sweep_fn()`), and for comparison the S seeds one after another
inside one program (`sweep_fn(batch=1)`). All are compiled before timing and timed in turn
(--pairs rounds); the per-round ratios host / device and their medians are printed, the
vmapped one last as `N.NNx`. Also: steps per second of one seed each way, and the
compiler's memory per seed (`compiled.memory_analysis()` of the S-seed and the 1-seed
program). A JSON record goes to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from jaxrl_suite.algorithms.grpo_ondevice import GRPOProgram
from jaxrl_suite.algorithms.lm_study import LMStudy
from jaxrl_suite.core.config import load_config
from jaxrl_suite.core.experiment import RunOptions
from jaxrl_suite_experiments.grpo_arithmetic import Config

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "experiments" / "configs" / "grpo_arithmetic.yaml"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=8, help="S: seeds per sweep")
    p.add_argument("--steps", type=int, default=10, help="GRPO steps per run")
    p.add_argument("--sft-steps", type=int, default=450,
                   help="SFT steps of the shared start (the main job stops at 400-490)")
    p.add_argument("--pairs", type=int, default=3, help="alternating (host, device) pairs")
    p.add_argument("--smoke", action="store_true", help="the job's smoke sizes, 2 seeds")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override of the main job, e.g. model.d_model=32")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "bench_ondevice_grpo.json")
    return p.parse_args(argv)


def memory_per_seed(compiled, seeds: int) -> float:
    """Bytes the compiler plans for a compiled S-seed program (arguments, outputs,
    temporaries), divided by the S seeds."""
    m = compiled.memory_analysis()
    total = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
             - m.alias_size_in_bytes)
    return total / seeds


def main(argv=None) -> dict:
    a = parse_args(argv)
    overrides = [f"grpo.steps={a.steps}", f"sft.steps={a.sft_steps}", "sft.stop_accuracy=null"]
    if a.smoke:
        a.seeds, a.pairs = 2, 1
        overrides = [f"grpo.steps={a.steps}"]
    overrides += a.set
    cfg = load_config(Config, CONFIG, overrides, smoke=a.smoke)
    with tempfile.TemporaryDirectory() as tmp:
        study = LMStudy("bench_ondevice_grpo", cfg, RunOptions(out_dir=Path(tmp)),
                        variants=("grpo",))
        sft = study.sft_trainer()
        state = sft.init_state(study.lm.params, jax.random.PRNGKey(0))
        for n in range(cfg.sft.steps):
            state, _ = sft.step(state, sft.batch(n * cfg.sft.batch_size))
        params = state.params
        trainer = study.grpo_trainer(cfg.grpo, ref_params=params)
    program = GRPOProgram(trainer)
    keys = jax.random.split(jax.random.PRNGKey(1), a.seeds)
    # with several devices, the seed axis is split over the mesh's data axis (the host loop
    # splits each batch over it)
    mesh = study.lm.mesh if jax.device_count() > 1 else None
    vmapped = program.sweep_fn(params_axis=None, mesh=mesh).lower(keys, params).compile()
    # the seeds one after another inside one program (not in the smoke: one compile fewer)
    in_sequence = vmapped if a.smoke else program.sweep_fn(params_axis=None, batch=1, mesh=mesh)

    def host(seeds: int):  # seeds host-loop runs, one after another; their rewards [S, steps]
        rewards = []
        for s in range(seeds):
            st = trainer.init_state(params, keys[s])
            row = []
            for n in range(cfg.grpo.steps):
                st, m = trainer.step(st, trainer.batch(n * program.pool))
                row.append(m["reward"])
            jax.block_until_ready(st.params)
            rewards.append(row)
        return np.array(rewards)

    def timed(fn):
        t0 = time.perf_counter()
        out = fn()
        jax.block_until_ready(out)
        return time.perf_counter() - t0, out

    # compile every program, and check that seed 0 is the same run both ways
    host_rewards = host(1)
    _, (_, metrics) = timed(lambda: vmapped(keys, params))
    if not a.smoke:
        jax.block_until_ready(in_sequence(keys, params))
    same = float(np.abs(np.asarray(metrics["reward"][0]) - host_rewards[0]).max())
    print(f"seed 0 rewards, host vs device: max |diff| {same:.2e}; mean reward per seed "
          f"{np.round(np.asarray(metrics['reward']).mean(1), 3).tolist()}; draws per step "
          f"(max over seeds) {np.asarray(metrics['draws']).max(0).tolist()}", flush=True)

    pairs = []
    for i in range(a.pairs):
        t_host, _ = timed(lambda: host(a.seeds))
        t_vmap, _ = timed(lambda: vmapped(keys, params))
        t_seq, _ = timed(lambda: in_sequence(keys, params))
        pairs.append({"host": t_host, "vmap": t_vmap, "sequence": t_seq})
        print(f"round {i}: {a.seeds} host-loop runs {t_host:.1f} s; one program, seeds vmapped "
              f"{t_vmap:.1f} s ({t_host / t_vmap:.2f}x), seeds in sequence {t_seq:.1f} s "
              f"({t_host / t_seq:.2f}x)", flush=True)
    steps = cfg.grpo.steps
    t_one_host, _ = timed(lambda: host(1))
    mem_s = memory_per_seed(vmapped, a.seeds)
    if a.smoke:  # two programs fewer to compile
        t_one_dev, mem_1 = t_one_host, mem_s
    else:
        jax.block_until_ready(program.train_jit(keys[0], params))
        t_one_dev, _ = timed(lambda: program.train_jit(keys[0], params))
        mem_1 = memory_per_seed(program.sweep_fn(params_axis=None).lower(keys[:1], params)
                                .compile(), 1)
    ratio = {k: [p["host"] / p[k] for p in pairs] for k in ("vmap", "sequence")}
    record = {
        "seeds": a.seeds, "steps": steps, "sft_steps": cfg.sft.steps, "rounds": pairs,
        "ratios": ratio, "median": {k: statistics.median(v) for k, v in ratio.items()},
        "one_seed_steps_per_s": {"host": steps / t_one_host, "device": steps / t_one_dev},
        "memory_per_seed_bytes": {f"S={a.seeds}": mem_s, "S=1": mem_1},
        "seed0_reward_max_abs_diff": same, "overrides": a.set,
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
    }
    print(f"one seed: host loop {steps / t_one_host:.2f} steps/s, on device "
          f"{steps / t_one_dev:.2f} steps/s ({t_one_host / t_one_dev:.2f}x)")
    print(f"memory per seed (compiler): {mem_s / 2**20:.1f} MiB at S={a.seeds}, "
          f"{mem_1 / 2**20:.1f} MiB at S=1")
    print(f"seeds in sequence in one program, median: {record['median']['sequence']:.2f}x")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(record, indent=1))
    print(f"{a.seeds} seeds x {steps} GRPO steps, host loop / vmapped program, median of "
          f"{a.pairs} rounds: {record['median']['vmap']:.2f}x")
    return record


if __name__ == "__main__":
    main()

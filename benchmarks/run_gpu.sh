#!/usr/bin/env bash
# GPU check: the model/sampler/loss tests at full float32 matmul precision, the benchmarks, and
# the main job, on a machine whose python3 already has jax[cuda], flax, optax, orbax, chex and
# transformers (no install step). Figures go to ${OUT:-results/gpu}.
set -uo pipefail
OUT="${OUT:-results/gpu}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" 2>&1 | tee "$OUT/devices.txt"
JAX_DEFAULT_MATMUL_PRECISION=highest python3 -m pytest -q -p no:cacheprovider \
  tests/models tests/sampling tests/losses 2>&1 | tail -n 15 | tee "$OUT/tests.txt"
python3 benchmarks/bench_sampler.py --out "$OUT/bench_sampler.json" 2>&1 | grep -v WARNING
python3 benchmarks/bench_grpo.py --out "$OUT/bench_grpo.json" 2>&1 | grep -v WARNING
# Issue 17: a GRPO step of a Qwen2.5-0.5B-shaped random model in bf16 (cuDNN attention through
# jax.nn.dot_product_attention), 8 prompts x G=8, 64 new tokens: tokens/s.
python3 benchmarks/bench_grpo.py --preset qwen2.5-0.5b --dtype bfloat16 --steps 3 \
  --out "$OUT/bench_grpo_qwen0.5b_bf16.json" 2>&1 | grep -v WARNING
# Issue 18: the rollout engines (static, micro-groups, continuous; speculative at batch 1/8/64
# with the draft length the controller picks from costs measured on the GPU).
python3 benchmarks/bench_rollout.py --out "$OUT/bench_rollout.json" 2>&1 | grep -v WARNING
# Issue 48: 8 seeds of the main job's GRPO phase as one vmapped program vs 8 host-loop runs.
python3 benchmarks/bench_ondevice_grpo.py --out "$OUT/bench_ondevice_grpo.json" 2>&1 | grep -v WARNING
# Issue 47: keyframes (k = 4) against all 32 frames, tokens per video and rollout time.
python3 benchmarks/bench_video.py --out "$OUT/bench_video.json" 2>&1 | grep -v WARNING
python3 -m jaxrl_suite.cli run grpo_arithmetic --no-progress --out "$OUT/grpo_arithmetic" 2>&1 \
  | grep -v WARNING | tail -n 5
cp "$OUT/grpo_arithmetic/summary.json" "$OUT/grpo_arithmetic_summary.json" 2>/dev/null || true
# ELMUR LRU kernel (issue 4): compiled kernel == reference on the accelerator, then its timing.
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_lru_memory.py 2>&1 | tail -n 5 \
  | tee "$OUT/kernel_tests.txt"
python3 benchmarks/bench_lru_kernel.py --out "$OUT/bench_lru_kernel.json" 2>&1 | grep -v WARNING
# Issue 25: the side-by-side ratios against the peers (ours and the peer alternately, 3 pairs):
# the PureJaxRL-style PPO always, tunix where it is installed (pip install -e ".[peers]").
python3 benchmarks/bench_ppo.py --peer purejaxrl --pairs 3 --out "$OUT/bench_ppo_peer.json" 2>&1 \
  | grep -v WARNING
if python3 -c "import tunix" 2>/dev/null; then
  python3 benchmarks/bench_grpo.py --peer tunix --pairs 3 --out "$OUT/bench_grpo_tunix.json" 2>&1 \
    | grep -v WARNING
  python3 benchmarks/bench_sampler.py --peer tunix --pairs 3 --out "$OUT/bench_sampler_tunix.json" \
    2>&1 | grep -v WARNING
else
  echo "tunix is not installed: no tunix ratios (pip install -e '.[peers]')" | tee "$OUT/peers.txt"
fi

"""Tokens per video and rollout throughput at a keyframe budget (k = 4) against all frames, on the
same VLM (issue 47, ChronoForge-RL's "equal compute" argument).

    python benchmarks/bench_video.py            # the study's model (LM 4 x 128), ~1 min on 2 cores
    python benchmarks/bench_video.py --smoke    # tiny sizes, seconds (the tests)

For each frame rule (`--k` TAD keyframes, all 32 frames) the same questions are put to the model
through `LMRunner.complete` (sampled, EOS disabled so every row decodes --new-tokens tokens):
prompt tokens per video (the image tokens: frames x (9 + 2) at 24 x 24), the seconds per rollout
of --batch prompts (after a warm-up compile; the two rules alternate, --pairs times), generated
tokens/s, and the ratios all / k. Frame selection (TAD on the host) is timed apart, per video.
Printed as a table and written as JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import numpy as np

from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.envs.vision import VideoQATask
from jaxrl_suite.models import VisionConfig, VisionLM, VLMConfig
from jaxrl_suite.sampling import KVCacheSampler, LMRunner
from jaxrl_suite.sampling import keyframes as kf


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=34)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", default="results/bench_video.json")
    a = p.parse_args(argv)
    if a.smoke:
        a.batch, a.new_tokens, a.pairs = 4, 4, 1
        cfg = VLMConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_len=544,
                        mrope_section=(2, 3, 3), vision=VisionConfig(
                            embed_dim=16, depth=1, n_heads=2, mlp_ratio=2, out_dim=32))
    else:
        cfg = VLMConfig(max_len=544)  # the study's model: LM 4 x 128, tower 2 x 64
    model, tok = VisionLM(cfg), load_tokenizer()
    params = model.init(jax.random.key(0), np.zeros((1, 4), np.int32))
    base = VideoQATask(k=a.k)
    t0 = time.perf_counter()
    tad = base.with_selector(lambda v: kf.select_keyframes(v.render(), "tad", a.k), "tad")
    keyed = tad.examples("test", 0, a.batch)
    select_s = (time.perf_counter() - t0) / a.batch
    every = base.with_frames("all").examples("test", 0, a.batch)
    rules = {"k": (keyed, 200, tad), "all": (every, 504, base.with_frames("all"))}
    runners, prompt_tokens = {}, {}
    for name, (examples, plen, task) in rules.items():
        sampler = KVCacheSampler(model, max_new_tokens=a.new_tokens, eos_id=-1,
                                 pad_id=tok.pad_id)
        runners[name] = LMRunner(model, tok, task, mesh=make_mesh(1), prompt_len=plen,
                                 max_new_tokens=a.new_tokens, eval_sampler=sampler)
        _, mask = runners[name].encode_prompts(examples)
        prompt_tokens[name] = float(mask.sum(1).mean())
        runners[name].complete(params, examples, batch_size=a.batch,  # compile
                               rng=jax.random.key(0))
    times = {name: [] for name in rules}
    for i in range(a.pairs):
        for name, (examples, _, _) in rules.items():
            t = time.perf_counter()
            runners[name].complete(params, examples, batch_size=a.batch,
                                   rng=jax.random.key(i + 1))
            times[name].append(time.perf_counter() - t)
    med = {n: statistics.median(t) for n, t in times.items()}
    out = {"device": jax.devices()[0].device_kind, "batch": a.batch, "new_tokens": a.new_tokens,
           "k": a.k, "prompt_tokens_per_video": prompt_tokens,
           "rollout_s": {n: t for n, t in times.items()}, "rollout_s_median": med,
           "tokens_per_s": {n: a.batch * a.new_tokens / t for n, t in med.items()},
           "all_over_k": {"prompt_tokens": prompt_tokens["all"] / prompt_tokens["k"],
                          "rollout_s": med["all"] / med["k"],
                          "per_pair": [x / y for x, y in zip(times["all"], times["k"],
                                                              strict=True)]},
           "tad_select_s_per_video": select_s}
    print(f"{'frames':>6} {'prompt tokens':>14} {'rollout s':>10} {'tokens/s':>9}")
    for n in rules:
        print(f"{n:>6} {prompt_tokens[n]:14.1f} {med[n]:10.3f} {out['tokens_per_s'][n]:9.1f}")
    print(f"all / k: prompt tokens {out['all_over_k']['prompt_tokens']:.2f}x, rollout time "
          f"{out['all_over_k']['rollout_s']:.2f}x; TAD selection {select_s * 1e3:.1f} ms/video")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()

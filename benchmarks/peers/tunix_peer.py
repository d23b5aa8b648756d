"""The peer of `bench_grpo.py` and `bench_sampler.py`: Google tunix's GRPO on the same model,
task and batch, timed per step with its rollout / update split.

    pip install -e ".[peers]"                     # google-tunix, beside our JAX
    python benchmarks/peers/tunix_peer.py          # one GRPO run and one sampler run
    python benchmarks/bench_grpo.py --peer tunix   # ours and tunix alternately, with ratios
    python benchmarks/bench_sampler.py --peer tunix

Written against tunix's public API (`RLCluster`, `GRPOLearner`, `tunix.models.qwen2`,
`tunix.generate.sampler.Sampler`); nothing of tunix's code is copied here. The model is tunix's
Qwen2 module at our `CausalLM`'s shapes (RMSNorm, SwiGLU, RoPE, untied embeddings), freshly
initialised; the tokenizer is ours (bytes), behind the duck-typed tokenizer tunix accepts; the
prompts are the 3-digit arithmetic task's and the reward is its exact-match score.

What is timed: `sampler_seconds`, one call of tunix's `Sampler` (the KV-cache sampler its
vanilla rollout uses) on a batch of prompts, EOS disabled so that every row makes every token;
`grpo_steps`, one GRPO global step of `GRPOLearner.train` (rollout, advantages, and the actor
update over the batch), with the rollout part (`_generate_and_compute_advantage`) and the update
part (`RLCluster.update_actor`) timed separately, after `warmup` steps that compile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass

import jax
import numpy as np

from jaxrl_suite.envs.text import make_task
from jaxrl_suite.envs.text.tokenizer import load_tokenizer


@dataclass(frozen=True)
class Sizes:
    layers: int = 4
    d_model: int = 128
    heads: int = 4
    kv_heads: int = 4
    d_ff: int = 512
    vocab: int = 384
    prompts: int = 8
    group_size: int = 8
    new_tokens: int = 64
    prompt_len: int = 16
    lr: float = 1e-5


class _Bytes:
    """Our byte tokenizer with the methods tunix's `TokenizerAdapter` asks of a custom one."""

    def __init__(self):
        self.tok = load_tokenizer()

    def encode(self, text, **_):
        return self.tok.encode(text)

    def decode(self, ids, **_):
        return self.tok.decode(ids)

    def bos_id(self):
        return 2  # ByT5's <unk>: unused by the task's text, so a harmless start token

    def eos_id(self):
        return self.tok.eos_id

    def pad_id(self):
        return self.tok.pad_id


def _model(s: Sizes, seed: int = 0):
    from flax import nnx
    from tunix.models.qwen2 import model as qwen2

    cfg = qwen2.ModelConfig(num_layers=s.layers, vocab_size=s.vocab, embed_dim=s.d_model,
                            hidden_dim=s.d_ff, num_heads=s.heads, head_dim=s.d_model // s.heads,
                            num_kv_heads=s.kv_heads, rope_theta=10_000, norm_eps=1e-6)
    return qwen2.Qwen2(cfg, rngs=nnx.Rngs(seed))


def _mesh():
    return jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))


def grpo_steps(s: Sizes, steps: int, warmup: int = 2) -> list[dict]:
    """`steps` timed GRPO steps of tunix after `warmup` untimed ones: per step the wall time,
    the rollout and update parts, and the completion tokens."""
    import optax
    from flax import nnx
    from tunix.rl import rl_cluster as rl
    from tunix.rl.grpo import grpo_learner as grpo
    from tunix.rl.rollout import base_rollout

    task = make_task("arithmetic", digits=3)
    tokenizer = _Bytes()
    total = warmup + steps
    examples = task.examples("train", 0, total * s.prompts)
    batches = [{"prompts": np.array([e.prompt for e in examples[i * s.prompts:][:s.prompts]]),
                "answer": np.array([e.answer for e in examples[i * s.prompts:][:s.prompts]])}
               for i in range(total)]  # as a grain dataset's batches: arrays of strings
    by_prompt = {e.prompt: e for e in examples}

    def reward(prompts, completions, **_):
        return [task.score(c, by_prompt[p]) for p, c in zip(prompts, completions, strict=True)]

    mesh = _mesh()
    actor = _model(s)
    cluster = rl.RLCluster(
        actor=actor, reference=_model(s), tokenizer=tokenizer,
        cluster_config=rl.ClusterConfig(
            role_to_mesh={rl.Role.ACTOR: mesh, rl.Role.REFERENCE: mesh, rl.Role.ROLLOUT: mesh},
            rollout_engine="vanilla", offload_to_cpu=False,
            training_config=rl.RLTrainingConfig(
                actor_optimizer=optax.adam(s.lr), eval_every_n_steps=10 ** 9, max_steps=total),
            rollout_config=base_rollout.RolloutConfig(
                max_tokens_to_generate=s.new_tokens, max_prompt_length=s.prompt_len,
                kv_cache_size=s.prompt_len + s.new_tokens, temperature=1.0, top_p=1.0)))
    learner = grpo.GRPOLearner(
        rl_cluster=cluster, reward_fns=[reward],
        algo_config=grpo.GRPOConfig(num_generations=s.group_size, num_iterations=1, beta=0.0))

    rows: list[dict] = []
    parts = {"rollout": 0.0, "update": 0.0, "tokens": 0}

    def timed(fn, key):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            # the rollout's arrays, or (update_actor returns None) the updated params
            jax.block_until_ready(out if out is not None else nnx.state(actor, nnx.Param))
            parts[key] += time.perf_counter() - t0
            if key == "rollout":
                parts["tokens"] += int(np.asarray(out.completion_mask).sum())
            return out
        return wrapper

    learner._generate_and_compute_advantage = timed(learner._generate_and_compute_advantage,
                                                    "rollout")
    cluster.update_actor = timed(cluster.update_actor, "update")
    run_step = learner._run_global_step

    def global_step(*args, **kwargs):
        parts.update(rollout=0.0, update=0.0, tokens=0)
        t0 = time.perf_counter()
        run_step(*args, **kwargs)
        rows.append({"step_s": time.perf_counter() - t0, "rollout_s": parts["rollout"],
                     "update_s": parts["update"], "tokens": parts["tokens"]})

    learner._run_global_step = global_step
    learner.train(batches)
    return rows[warmup:]


def sampler_seconds(s: Sizes, batch: int, new_tokens: int, repeats: int) -> list[float]:
    """Seconds of `repeats` calls of tunix's `Sampler` on `batch` prompts of `s.prompt_len`
    tokens, `new_tokens` sampled tokens each (temperature 1, EOS never sampled), after one call
    that compiles."""
    from tunix.generate import sampler as tunix_sampler

    model = _model(s)
    rng = np.random.default_rng(0)
    # prompt_len tokens with the start token tunix puts first (ours: random full-length prompts)
    prompts = ["".join(map(chr, rng.integers(97, 123, s.prompt_len - 1))) for _ in range(batch)]
    sampler = tunix_sampler.Sampler(
        model, _Bytes(), tunix_sampler.CacheConfig(
            cache_size=s.prompt_len + new_tokens, num_layers=s.layers,
            num_kv_heads=s.kv_heads, head_dim=s.d_model // s.heads))
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        out = sampler(prompts, max_generation_steps=new_tokens, max_prompt_length=s.prompt_len,
                      eos_tokens=[s.vocab], temperature=1.0, top_p=1.0, seed=i)
        jax.block_until_ready(out.tokens)
        times.append(time.perf_counter() - t0)
    return times[1:]


def summarize(rows: list[dict]) -> dict:
    out = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    out["completion_tokens_per_s"] = out["tokens"] / out["step_s"]
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args(argv)
    s = Sizes(layers=1, d_model=32, heads=2, kv_heads=2, d_ff=64, prompts=2, group_size=2,
              new_tokens=8) if a.smoke else Sizes()
    result = summarize(grpo_steps(s, 1 if a.smoke else a.steps))
    batch, new = (4, 8) if a.smoke else (64, 64)
    result["sampler_tokens_per_s"] = batch * new / min(sampler_seconds(s, batch, new, 2))
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()

"""An SFT step and a GRPO step on every kind of mesh equal the single-device step.

Meshes (data, fsdp, tensor) = (8,1,1), (2,2,2), (1,4,2) on 8 fake CPU devices: pure data
parallelism, data x FSDP x tensor, FSDP x tensor parallelism. Runs in a subprocess because the
host device count is fixed when JAX starts (XLA_FLAGS=--xla_force_host_platform_device_count=8).

Each sharded state is also saved and restored (orbax) in its own placement. The steps are made to
carry signal: two SFT steps (the first has learning rate 0 after a one-step
warm-up) and a GRPO update on fixed advantages (the untrained policy's rewards are all 0, and
Adam would turn the remaining gradient noise into full-size steps of either sign).
"""

import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import tempfile
    import jax, numpy as np
    assert jax.device_count() == 8, jax.devices()
    from jaxrl_suite.algorithms.grpo import GRPOTrainer
    from jaxrl_suite.algorithms.grpo_config import GRPOConfig
    from jaxrl_suite.algorithms.sft import SFTConfig, SFTTrainer
    from jaxrl_suite.core.checkpoint import Checkpointer
    from jaxrl_suite.core.parallel import make_mesh
    from jaxrl_suite.envs.text import make_task
    from jaxrl_suite.envs.text.tokenizer import load_tokenizer
    from jaxrl_suite.models import CausalLM, LMConfig
    from jaxrl_suite.models.sharding import bytes_per_device, path_str

    model = CausalLM(LMConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64))
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, 12), np.int32))
    tok, task = load_tokenizer(), make_task("arithmetic", digits=2)
    grpo_cfg = GRPOConfig(prompts_per_step=4, group_size=4, max_new_tokens=22, beta=0.05, mu=2)
    sft_cfg = SFTConfig(batch_size=8, warmup_steps=1)
    advantages = np.random.default_rng(0).normal(size=16).astype(np.float32)

    def run(data, fsdp, tensor):
        mesh = make_mesh(data * fsdp * tensor, data=data, fsdp=fsdp, tensor=tensor)
        sft = SFTTrainer(model, tok, task, sft_cfg, mesh=mesh, prompt_len=12, max_new_tokens=22)
        s = sft.init_state(params, jax.random.PRNGKey(1))
        losses = []
        for i in range(2):
            s, m = sft.step(s, sft.batch(i))
            losses.append(m["loss"])
        grpo = GRPOTrainer(model, tok, task, grpo_cfg, mesh=mesh, prompt_len=12,
                           ref_params=params)
        g = grpo.init_state(s.params, jax.random.PRNGKey(2))
        seq, old_logp, rewards, info = grpo.rollout(g, grpo.batch(0))
        g, m = grpo.update(g, seq, old_logp, rewards, info, advantages=advantages)
        tokens = np.asarray(seq.completion)
        if fsdp * tensor > 1:  # a sharded state checkpoints and restores in its placement
            with tempfile.TemporaryDirectory() as d:
                ckpt = Checkpointer(d + "/ckpt")
                ckpt.save(1, g, force=True)
                back, _ = ckpt.restore(grpo.init_state(s.params, jax.random.PRNGKey(3)))
                ckpt.close()
            for x, y in zip(jax.tree.leaves(back), jax.tree.leaves(g), strict=True):
                assert x.sharding == y.sharding, (x.sharding, y.sharding)
                np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        return s.params, g, losses, m, tokens

    one = run(1, 1, 1)
    total = sum(x.nbytes for x in jax.tree.leaves(one[1]))
    for shape in ((8, 1, 1), (2, 2, 2), (1, 4, 2)):  # data; all three axes; no data axis
        sft_p, g, losses, m, tokens = run(*shape)
        np.testing.assert_allclose(losses, one[2], rtol=1e-5)
        np.testing.assert_array_equal(tokens, one[4])  # the sampler on sharded params
        for k in ("loss", "pg_loss", "kl", "grad_norm"):
            np.testing.assert_allclose(m[k], one[3][k], rtol=2e-4, atol=1e-7)
        for a, b in ((sft_p, one[0]), (g.params, one[1].params)):
            jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=2e-5),
                         a, b)
        # the state stays placed by the rules after the jitted update
        q = g.params["params"]["layer_0"]["attn"]["q"]["kernel"]
        want = tuple(a for a, n in (("fsdp", shape[1]), ("tensor", shape[2])) if n > 1)
        assert tuple(x for x in q.sharding.spec if x) == want, (shape, q.sharding.spec)
        # per-device bytes: at most total / (fsdp * tensor) plus what stays replicated, which
        # is only the norm scales and the scalars (step, rng, anchor, collapsed, Adam's count):
        # < 2 %
        split = shape[1] * shape[2]
        replicated = {}
        for path, x in jax.tree_util.tree_leaves_with_path(g):
            if all(a is None for a in x.sharding.spec):
                replicated[path_str(path)] = x.nbytes
        names = {p.rsplit("/", 1)[-1] for p in replicated}
        assert split == 1 or names <= {"scale", "count", "step", "rng", "anchor", "collapsed"}, \
            replicated
        extra = sum(replicated.values()) if split > 1 else 0
        assert extra < 0.02 * total, (extra, total)
        per_device = max(bytes_per_device(g).values())
        assert per_device <= total / split + extra, (shape, per_device, total, extra)
        print(shape, q.sharding.spec, per_device, total, extra)
    print("OK")
    """
)


def test_sft_and_grpo_steps_on_every_mesh_equal_the_one_device_step(run_on_host_devices):
    run_on_host_devices(SCRIPT, 8)


HF_SCRIPT = textwrap.dedent(
    """
    import sys, tempfile
    from pathlib import Path
    import jax, numpy as np
    assert jax.device_count() == 8, jax.devices()
    sys.path.insert(0, BENCH)
    import hf_parity as hp
    from jaxrl_suite.algorithms.grpo import GRPOTrainer
    from jaxrl_suite.algorithms.grpo_config import GRPOConfig
    from jaxrl_suite.algorithms.sft import SFTConfig, SFTTrainer
    from jaxrl_suite.core.parallel import make_mesh
    from jaxrl_suite.envs.text import make_task
    from jaxrl_suite.models import CausalLM
    from jaxrl_suite.models.hf import load_hf_checkpoint, save_hf_checkpoint

    root = Path(tempfile.mkdtemp())
    hp.save_tiny_checkpoint("qwen2", root / "in")  # GQA 4:2, q/k/v biases, tied, vocab 320
    config, params, tok = load_hf_checkpoint(root / "in")
    assert (config.n_heads, config.n_kv_heads, config.qkv_bias) == (4, 2, True)
    model, task = CausalLM(config), make_task("arithmetic", digits=2)
    advantages = np.random.default_rng(0).normal(size=8).astype(np.float32)

    def run(data, fsdp, tensor):
        mesh = make_mesh(data * fsdp * tensor, data=data, fsdp=fsdp, tensor=tensor)
        sft = SFTTrainer(model, tok, task, SFTConfig(batch_size=8, warmup_steps=1),
                         mesh=mesh, prompt_len=12, max_new_tokens=16)
        s = sft.init_state(params, jax.random.PRNGKey(1))
        for i in range(2):
            s, m_sft = sft.step(s, sft.batch(i))
        grpo = GRPOTrainer(model, tok, task, GRPOConfig(prompts_per_step=2, group_size=4,
                           max_new_tokens=16), mesh=mesh, prompt_len=12)
        g = grpo.init_state(s.params, jax.random.PRNGKey(2))
        seq, old_logp, rewards, info = grpo.rollout(g, grpo.batch(0))
        g, m = grpo.update(g, seq, old_logp, rewards, info, advantages=advantages)
        return g.params, m_sft["loss"], m, np.asarray(seq.completion)

    one = run(1, 1, 1)
    params_tp, sft_loss, m, tokens = run(2, 2, 2)
    q = params_tp["params"]["layer_0"]["attn"]["q"]["kernel"]
    assert tuple(q.sharding.spec) == ("fsdp", "tensor"), q.sharding.spec
    np.testing.assert_allclose(sft_loss, one[1], rtol=1e-5)
    np.testing.assert_array_equal(tokens, one[3])
    for k in ("loss", "pg_loss", "grad_norm"):
        np.testing.assert_allclose(m[k], one[2][k], rtol=2e-4, atol=1e-7)
    # Adam turns the float noise of near-zero gradient entries into a few % of a step (lr 1e-3)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=5e-5),
                 params_tp, one[0])
    assert max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in
               zip(jax.tree.leaves(params_tp), jax.tree.leaves(params), strict=True)) > 5e-4

    # the trained, sharded params saved back as a checkpoint that transformers loads
    import transformers
    save_hf_checkpoint(params_tp, config, root / "out", tokenizer=tok)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(root / "out").eval()
    ids, mask = hp.fixed_batch()
    real = mask.astype(bool)
    ref = hp.torch_logits(reloaded, ids, mask)[real]
    ours = hp.our_logits(config, params_tp, ids, mask)[real]
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)
    print("max logit error", np.abs(ours - ref).max())
    print("OK")
    """
)


def test_hf_qwen2_checkpoint_trains_on_a_tensor_parallel_mesh_and_saves_back(
        run_on_host_devices):
    """A tiny Qwen2 checkpoint (GQA 4:2, q/k/v biases) loaded through models/hf.py: an SFT step
    and a GRPO update on mesh (2, 2, 2) equal the one-device ones; the trained sharded params
    saved with save_hf_checkpoint load in transformers with the same logits."""
    pytest.importorskip("torch")
    bench = Path(__file__).resolve().parents[2] / "benchmarks"
    run_on_host_devices(f"BENCH = {str(bench)!r}\n" + HF_SCRIPT, 8)


MEMORY_SCRIPT = textwrap.dedent(
    """
    import jax, numpy as np
    assert jax.device_count() == 8, jax.devices()
    from jaxrl_suite.algorithms.grpo import GRPOTrainer
    from jaxrl_suite.algorithms.grpo_config import GRPOConfig, MemoryConfig
    from jaxrl_suite.algorithms.sft import SFTConfig, SFTTrainer
    from jaxrl_suite.core.parallel import make_mesh
    from jaxrl_suite.envs.text import make_task
    from jaxrl_suite.envs.text.tokenizer import load_tokenizer
    from jaxrl_suite.models import CausalLM, LMConfig
    from jaxrl_suite.sampling.engines import EngineOptions
    from jaxrl_suite.models.lora import LoraConfig, apply_lora, init_lora, is_adapter
    from jaxrl_suite.models.sharding import path_str

    # scanned layers, remat, chunked log-probs, micro-batches; and LoRA on the same model
    cfg = LMConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, scan_layers=True,
                   remat="block")
    base = CausalLM(cfg)
    params = base.init(jax.random.PRNGKey(0), np.zeros((1, 12), np.int32))
    lora = apply_lora(base, LoraConfig(rank=4, alpha=8.0))
    lora_params = init_lora(lora, params, jax.random.PRNGKey(5))
    tok, task = load_tokenizer(), make_task("arithmetic", digits=2)
    memory = MemoryConfig(train_micro_batch=8, logprob_micro_batch=8, rollout_micro_batch=8,
                          logprob_chunk=8)
    grpo_cfg = GRPOConfig(prompts_per_step=4, group_size=4, max_new_tokens=22, beta=0.05,
                          memory=memory)
    sft_cfg = SFTConfig(batch_size=8, warmup_steps=1, train_micro_batch=4, logprob_chunk=8)
    advantages = np.random.default_rng(0).normal(size=16).astype(np.float32)

    def run(model, start, data, fsdp, tensor):
        mesh = make_mesh(data * fsdp * tensor, data=data, fsdp=fsdp, tensor=tensor)
        sft = SFTTrainer(model, tok, task, sft_cfg, mesh=mesh, prompt_len=12, max_new_tokens=22)
        s = sft.init_state(start, jax.random.PRNGKey(1))
        for i in range(2):
            s, m_sft = sft.step(s, sft.batch(i))
        grpo = GRPOTrainer(model, tok, task, grpo_cfg, mesh=mesh, prompt_len=12,
                           ref_params=start)
        g = grpo.init_state(s.params, jax.random.PRNGKey(2))
        seq, old_logp, rewards, info = grpo.rollout(g, grpo.batch(0))
        g, m = grpo.update(g, seq, old_logp, rewards, info, advantages=advantages)
        return g, m_sft["loss"], m, np.asarray(seq.completion)

    for name, model, start in (("full", base, params), ("lora", lora, lora_params)):
        one = run(model, start, 1, 1, 1)
        g, sft_loss, m, tokens = run(model, start, 2, 2, 2)
        np.testing.assert_allclose(sft_loss, one[1], rtol=1e-5)
        np.testing.assert_array_equal(tokens, one[3])
        for k in ("loss", "pg_loss", "kl", "grad_norm"):
            np.testing.assert_allclose(m[k], one[2][k], rtol=2e-4, atol=1e-7)
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=5e-5),
                     g.params, one[0].params)
        q = g.params["params"]["layers"]["attn"]["q"]["kernel"]  # [L, D, N*Dh]
        assert tuple(q.sharding.spec) == (None, "fsdp", "tensor"), q.sharding.spec
        if name == "lora":  # the base is bit-identical, the adapters moved
            flat = {path_str(k): v for k, v in jax.tree_util.tree_leaves_with_path(start)}
            for path, x in jax.tree_util.tree_leaves_with_path(g.params):
                p = path_str(path)
                if not is_adapter(p):
                    np.testing.assert_array_equal(np.asarray(x), np.asarray(flat[p]))
            opt_paths = [path_str(k) for k, v in jax.tree_util.tree_leaves_with_path(
                g.opt_state) if np.ndim(v) >= 2]
            assert opt_paths and all("lora" in p for p in opt_paths), opt_paths
        print(name, m["loss"], m["grad_norm"])

    # The continuous rollout engine (issue 18) with scanned layers (the stacked [L, B, ...]
    # cache) on mesh (2, 2, 2): the one-device static rollout's completions, rows split like them.
    import dataclasses
    seqs = []
    for engine, mesh in ((EngineOptions(), make_mesh(1)),
                         (EngineOptions(engine="continuous", slots=8),
                          make_mesh(8, data=2, fsdp=2, tensor=2))):
        c = dataclasses.replace(grpo_cfg, rollout=engine, memory=dataclasses.replace(
            memory, rollout_micro_batch=0))
        grpo = GRPOTrainer(base, tok, task, c, mesh=mesh, prompt_len=12, ref_params=params)
        seqs.append(grpo.rollout(grpo.init_state(params, jax.random.PRNGKey(2)),
                                 grpo.batch(0))[0])
    np.testing.assert_array_equal(np.asarray(seqs[1].completion), np.asarray(seqs[0].completion))
    assert tuple(seqs[1].completion.sharding.spec) == (("data", "fsdp"),)
    print("OK")
    """
)


def test_memory_options_and_lora_on_a_mesh_equal_the_one_device_step(run_on_host_devices):
    """Scanned layers with remat, chunked log-probs and micro-batched rollout / log-prob /
    gradient steps, without and with LoRA: an SFT step and a GRPO update on mesh (2, 2, 2) equal
    the one-device ones; with LoRA the base stays bit-identical and Adam's moments exist for the
    adapters only. The continuous rollout engine on that mesh draws the one-device completions."""
    run_on_host_devices(MEMORY_SCRIPT, 8)

"""A vision-language policy through the LM runtime: the runner's image prompts (IMAGE_MARKER ->
vision_start, the image's tokens, vision_end; the scenes rendered into per-row image slots),
completions with images against direct sampler calls, and an SFT step and a GRPO step on a
(2, 2, 2) mesh of 8 fake CPU devices equal to one device (issue 46)."""

import dataclasses
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text import make_task
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.envs.vision import IMAGE_MARKER, render_scenes
from jaxrl_suite.models import VisionConfig, VisionLM, VLMConfig, patchify
from jaxrl_suite.sampling import KVCacheSampler, LMRunner

CONFIG = VLMConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=64, max_len=256,
                   mrope_section=(2, 3, 3),
                   vision=VisionConfig(embed_dim=16, depth=1, n_heads=2, mlp_ratio=2,
                                       out_dim=32))
PROMPT_LEN, NEW = 192, 6


@pytest.fixture(scope="module")
def runner():
    model = VisionLM(CONFIG)
    params = model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    task = make_task("spatial_qa", prompt_style="direct")
    run = LMRunner(model, load_tokenizer(), task, mesh=make_mesh(1), prompt_len=PROMPT_LEN,
                   max_new_tokens=NEW)
    return run, params


def test_prompt_inputs_lay_out_each_image_where_its_marker_was(runner):
    run, _ = runner
    examples = run.task.examples("train", 0, 3)
    ids, mask, images = run.prompt_inputs(examples)
    tok = run.tokenizer
    for row, ex in enumerate(examples):
        before, after = ex.prompt.split(IMAGE_MARKER)
        want = (tok.encode(before) + [CONFIG.vision_start_id] + [CONFIG.image_token_id] * 16
                + [CONFIG.vision_end_id] + tok.encode(after))  # 32 x 32: 8 x 8 patches -> 16
        assert ids[row, mask[row]].tolist() == want
        assert not mask[row, : PROMPT_LEN - len(want)].any()
        flat, grid = patchify(render_scenes(ex.meta.scenes), CONFIG.vision)
        np.testing.assert_array_equal(grid, [[1, 8, 8]])
        np.testing.assert_array_equal(images.patches[row, 0], flat)  # slot 0: its one image
    assert images.patches.shape == (3, 1, 64, CONFIG.vision.patch_dim)
    assert images.positions.shape == (3, PROMPT_LEN, 3)
    # text after the image continues from the image's max + 1: 16 tokens on a 4 x 4 grid span
    # 4 positions, so each row's positions end at T_real - 16 + 4 - 1 (rope_delta = 4 - 16)
    np.testing.assert_array_equal(images.rope_delta, [4 - 16] * 3)


def test_complete_passes_each_rows_image_to_the_sampler(runner):
    run, params = runner
    examples = run.task.examples("train", 0, 4)
    texts, _ = run.complete(params, examples, batch_size=2)
    direct = KVCacheSampler(run.model, greedy=True, max_new_tokens=NEW,
                            eos_id=run.tokenizer.eos_id, pad_id=run.tokenizer.pad_id)
    ids, mask, images = run.prompt_inputs(examples)
    out = direct(params, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(0), images=images)
    assert texts == run.tokenizer.decode_batch(np.asarray(out.tokens), np.asarray(out.mask))
    # the images reach the log-probs: the same prompt text over another scene scores otherwise
    other = dataclasses.replace(examples[0], meta=examples[0].meta._replace(
        scenes=examples[1].meta.scenes))
    logp, mask = run.score(params, [examples[0], other], ["B", "B"])
    assert mask.sum() == 4 and np.abs(logp[0] - logp[1])[mask[0] > 0].max() > 1e-4


MESH_SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    assert jax.device_count() == 8, jax.devices()
    from jaxrl_suite.algorithms.grpo import GRPOTrainer
    from jaxrl_suite.algorithms.grpo_config import GRPOConfig
    from jaxrl_suite.algorithms.sft import SFTConfig, SFTTrainer
    from jaxrl_suite.core.parallel import make_mesh
    from jaxrl_suite.envs.text import make_task
    from jaxrl_suite.envs.text.tokenizer import load_tokenizer
    from jaxrl_suite.models import VisionConfig, VisionLM, VLMConfig

    cfg = VLMConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=64, max_len=256,
                    mrope_section=(2, 3, 3),
                    vision=VisionConfig(embed_dim=16, depth=1, n_heads=2, mlp_ratio=2,
                                        out_dim=32))
    model = VisionLM(cfg)
    params = model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    tok, task = load_tokenizer(), make_task("spatial_qa", prompt_style="direct")
    grpo_cfg = GRPOConfig(prompts_per_step=2, group_size=4, max_new_tokens=8, beta=0.05)
    sft_cfg = SFTConfig(batch_size=8, warmup_steps=1)
    advantages = np.random.default_rng(0).normal(size=8).astype(np.float32)

    def run(data, fsdp, tensor):
        mesh = make_mesh(data * fsdp * tensor, data=data, fsdp=fsdp, tensor=tensor)
        sft = SFTTrainer(model, tok, task, sft_cfg, mesh=mesh, prompt_len=192,
                         max_new_tokens=40)
        s = sft.init_state(params, jax.random.PRNGKey(1))
        losses = []
        for i in range(2):
            s, m = sft.step(s, sft.batch(i))
            losses.append(m["loss"])
        grpo = GRPOTrainer(model, tok, task, grpo_cfg, mesh=mesh, prompt_len=192,
                           ref_params=params)
        g = grpo.init_state(s.params, jax.random.PRNGKey(2))
        seq, old_logp, rewards, info = grpo.rollout(g, grpo.batch(0))
        assert seq.images is not None and seq.images.patches.shape[:2] == (8, 1)
        g, m = grpo.update(g, seq, old_logp, rewards, info, advantages=advantages)
        return s.params, g.params, losses, m, np.asarray(seq.completion)

    one = run(1, 1, 1)
    sft_p, g_p, losses, m, tokens = run(2, 2, 2)
    np.testing.assert_allclose(losses, one[2], rtol=1e-5)
    assert losses[1] != losses[0]  # the second step moved the params
    np.testing.assert_array_equal(tokens, one[4])
    for k in ("loss", "pg_loss", "kl", "grad_norm"):
        np.testing.assert_allclose(m[k], one[3][k], rtol=2e-4, atol=1e-7)
    assert m["grad_norm"] > 0
    for a, b in ((sft_p, one[0]), (g_p, one[1])):
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=2e-5), a, b)
    moved = jax.tree.map(lambda x, y: float(np.abs(x - y).max()), g_p["params"]["visual"],
                         sft_p["params"]["visual"])
    assert max(jax.tree.leaves(moved)) > 0  # GRPO's gradient reaches the image tower
    print("OK")
    """
)


def test_vlm_sft_and_grpo_steps_on_a_mesh_equal_the_one_device_step(run_on_host_devices):
    run_on_host_devices(MESH_SCRIPT, 8)


def test_a_vision_model_section_builds_a_vision_lm_and_counts_image_tokens():
    from jaxrl_suite.algorithms.grpo_config import GRPOConfig
    from jaxrl_suite.algorithms.lm_study import (
        EvalConfig,
        LMSections,
        RunConfig,
        SFTConfig,
        TaskConfig,
        build_lm,
    )
    from jaxrl_suite.core.config import ConfigError
    from jaxrl_suite.models.hf import VisionModelConfig
    from jaxrl_suite.sampling import image_prompt

    model = VisionModelConfig(**{f.name: getattr(CONFIG, f.name)
                                 for f in dataclasses.fields(VLMConfig)})
    sections = dict(model=model, sft=SFTConfig(batch_size=2), eval=EvalConfig(),
                    grpo=GRPOConfig(prompts_per_step=1, group_size=2, max_new_tokens=200),
                    run=RunConfig(seeds=(0,)))
    lm = build_lm(LMSections(task=TaskConfig(name="spatial_qa", prompt_len=PROMPT_LEN),
                             **sections))
    assert isinstance(lm.model, VisionLM) and "visual" in lm.params["params"]
    examples = lm.task.examples("train", 0, 256) + lm.task.examples("test", 0, 256)
    need = max(len(image_prompt(lm.tokenizer, e, CONFIG)[0]) for e in examples)
    assert need == max(len(lm.tokenizer.encode(e.prompt)) for e in examples) - 7 + 18
    with pytest.raises(ConfigError, match=f"'task.prompt_len' is {need - 1} but this task "
                                          f"needs {need} tokens"):
        build_lm(LMSections(task=TaskConfig(name="spatial_qa", prompt_len=need - 1),
                            **sections))

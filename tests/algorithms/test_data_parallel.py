"""One SFT and one GRPO train step on a 4-device "data" mesh equal the single-device step.

Runs in a subprocess because the host device count is fixed when JAX starts
(XLA_FLAGS=--xla_force_host_platform_device_count=4).
"""

import textwrap

SCRIPT = textwrap.dedent(
    """
    import jax, numpy as np
    assert jax.device_count() == 4, jax.devices()
    from jaxrl_suite.algorithms.grpo import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer
    from jaxrl_suite.core.parallel import make_mesh
    from jaxrl_suite.envs.text import make_task
    from jaxrl_suite.envs.text.tokenizer import load_tokenizer
    from jaxrl_suite.models import CausalLM, LMConfig

    model = CausalLM(LMConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64))
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, 12), np.int32))
    tok, task = load_tokenizer(), make_task("arithmetic", digits=2)
    grpo_cfg = GRPOConfig(prompts_per_step=4, group_size=4, max_new_tokens=22, beta=0.05, mu=2)
    sft_cfg = SFTConfig(batch_size=8, warmup_steps=0)

    def run(n_dev):
        mesh = make_mesh(n_dev)
        sft = SFTTrainer(model, tok, task, sft_cfg, mesh=mesh, prompt_len=12, max_new_tokens=22)
        s = sft.init_state(params, jax.random.PRNGKey(1))
        s, sft_m = sft.step(s, sft.batch(0))
        grpo = GRPOTrainer(model, tok, task, grpo_cfg, mesh=mesh, prompt_len=12,
                           ref_params=params)
        g = grpo.init_state(s.params, jax.random.PRNGKey(2))
        g, grpo_m = grpo.step(g, grpo.batch(0))
        sharding = g.params["params"]["embed"]["embedding"].sharding
        return s.params, g.params, float(sft_m["loss"]), grpo_m, len(sharding.device_set)

    sft1, grpo1, loss1, m1, nd1 = run(1)
    sft4, grpo4, loss4, m4, nd4 = run(4)
    assert (nd1, nd4) == (1, 4), (nd1, nd4)
    np.testing.assert_allclose(loss1, loss4, rtol=1e-5)
    for a, b in ((sft1, sft4), (grpo1, grpo4)):
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5), a, b)
    np.testing.assert_allclose(m1["reward"], m4["reward"])
    np.testing.assert_allclose(m1["loss"], m4["loss"], rtol=1e-4, atol=1e-6)
    print("OK", loss1, m1["reward"], m1["loss"])
    """
)


def test_four_device_step_equals_one_device_step(run_on_host_devices):
    run_on_host_devices(SCRIPT, 4)

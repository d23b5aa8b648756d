"""`gradient_compiler_options`: the CPU dot fusion of backward passes changes speed, not values."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.core.parallel import gradient_compiler_options
from jaxrl_suite.models import CausalLM, LMConfig


def test_cpu_options_known_and_gradients_unchanged():
    opts = gradient_compiler_options()
    assert opts == {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}
    # a SwiGLU + RoPE model's gradient: the transposed fusions the option changes
    cfg = LMConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=64)
    model = CausalLM(cfg)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (4, 12), 0, 64)
    params = model.init(jax.random.PRNGKey(0), tokens)

    def loss(p):
        logits, _ = model.apply(p, tokens)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    plain = jax.jit(jax.grad(loss))(params)
    fused = jax.jit(jax.grad(loss), compiler_options=opts)(params)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(fused), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)

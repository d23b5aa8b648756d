"""GRPO with a LoRA model: the base stays bit-identical, only the adapters train and have optimizer
state, and a checkpoint holds the adapters alone and resumes exactly.

One tiny CausalLM (d_model 16, 1 layer) with rank-2 adapters on every projection, one GRPO step
(4 prompts x 4 completions of 6 tokens).
"""

import dataclasses

import jax
import numpy as np
import pytest

from jaxrl_suite.algorithms.grpo import GRPOTrainer
from jaxrl_suite.algorithms.grpo_config import GRPOConfig
from jaxrl_suite.core.checkpoint import Checkpointer
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text import ArithmeticTask
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.models import CausalLM, LMConfig
from jaxrl_suite.models.lora import LoraConfig, apply_lora, init_lora, is_adapter, split_lora
from jaxrl_suite.models.sharding import path_str

N = 6


@dataclasses.dataclass(frozen=True)
class AlnumTask(ArithmeticTask):
    """Reward = share of the completion's characters that are alphanumeric (dense, spread)."""

    def score(self, completion, ex):
        return sum(ch.isascii() and ch.isalnum() for ch in completion) / N


@pytest.fixture(scope="module")
def run():
    """(trainer, base params, initial state, state after one GRPO step, its metrics)."""
    base_model = CausalLM(LMConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32))
    base = base_model.init(jax.random.PRNGKey(0), np.zeros((1, 8), np.int32))
    model = apply_lora(base_model, LoraConfig(rank=2, alpha=4.0))
    params = init_lora(model, base, jax.random.PRNGKey(1))
    config = GRPOConfig(prompts_per_step=4, group_size=4, max_new_tokens=N, lr=5e-2)
    trainer = GRPOTrainer(model, load_tokenizer(), AlnumTask(digits=1), config,
                          mesh=make_mesh(1), prompt_len=8)
    state = trainer.init_state(params, jax.random.PRNGKey(2))
    new, metrics = trainer.step(state, trainer.batch(0))
    return trainer, base, state, new, metrics


def _leaves(tree):
    return {path_str(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def test_a_grpo_step_trains_the_adapters_alone(run):
    trainer, base, state, new, metrics = run
    assert trainer.trainable is is_adapter
    assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
    base_new, adapters_new = split_lora(new.params)
    for (path, a), b in zip(_leaves(base).items(), _leaves(base_new).values(), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=path)  # bit-identical
    before = _leaves(split_lora(state.params)[1])
    after = _leaves(adapters_new)
    assert len(after) == 14  # A and B of q, k, v, o, gate, up, down
    # every B moves; A does not on the first step: with B = 0, dL/dA = x^T (dL/dy) B^T = 0
    moved = {k: not np.array_equal(before[k], after[k]) for k in after}
    assert moved == {k: k.endswith("kernel_lora_b") for k in after}
    # the optimizer state exists for the adapters only: AdamW's mu and nu over A and B
    opt = _leaves(new.opt_state)
    arrays = {k: x for k, x in opt.items() if x.ndim}
    assert len(arrays) == 2 * len(after)
    assert all(is_adapter(k) for k in arrays), sorted(arrays)
    assert sum(x.size for x in arrays.values()) == 2 * sum(x.size for x in after.values())


def test_the_checkpoint_holds_the_adapters_and_resumes_exactly(run, tmp_path):
    trainer, base, _, new, _ = run
    ckpt = Checkpointer(tmp_path, trainable=trainer.trainable)
    ckpt.save(1, new, {"cursor": 4}, force=True)
    ckpt.wait()
    saved = ckpt._manager.item_metadata(1)["state"].tree  # what orbax wrote, as a dict
    saved_params = [path_str(p) for p, _ in
                    jax.tree_util.tree_leaves_with_path(saved["params"])]
    assert saved_params and all(is_adapter(p) for p in saved_params)
    assert len(saved_params) == 14
    # the template is what a resumed run builds: the trainer's initial state from the same base
    template = trainer.init_state(init_lora(trainer.model, base, jax.random.PRNGKey(7)),
                                  jax.random.PRNGKey(8))
    restored, meta = ckpt.restore(template)
    ckpt.close()
    assert meta == {"cursor": 4}
    assert jax.tree.structure(restored) == jax.tree.structure(new)
    for (path, a), b in zip(_leaves(new).items(), _leaves(restored).values(), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=path)

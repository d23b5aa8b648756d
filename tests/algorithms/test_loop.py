"""The host loop stops on a non-finite update and keeps the last good checkpoint."""

import jax
import numpy as np
import pytest

from jaxrl_suite.algorithms.grpo import GRPOTrainer
from jaxrl_suite.algorithms.grpo_config import GRPOConfig
from jaxrl_suite.algorithms.loop import fit
from jaxrl_suite.core.checkpoint import Checkpointer
from jaxrl_suite.core.metrics import MetricsLogger, read_metrics
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.core.train import NonFiniteError
from jaxrl_suite.envs.text import ArithmeticTask
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.models import CausalLM, LMConfig


class PoisonedTask(ArithmeticTask):
    """Arithmetic whose verifier's score (the reward: format_weight is 0) turns NaN from the
    `poison_from`-th rollout batch on."""

    def __init__(self, poison_from: int, batch: int):
        super().__init__(digits=1)
        object.__setattr__(self, "_calls", 0)
        object.__setattr__(self, "_poison_after", poison_from * batch)

    def score(self, completion, ex):
        object.__setattr__(self, "_calls", self._calls + 1)
        return float("nan") if self._calls > self._poison_after else 0.5 + 0.1 * len(completion)


def test_non_finite_stops_with_one_line_and_keeps_last_good_checkpoint(tmp_path):
    model = CausalLM(LMConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32))
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, 4), np.int32))
    cfg = GRPOConfig(prompts_per_step=2, group_size=2, max_new_tokens=4, lr=1e-2)
    task = PoisonedTask(poison_from=2, batch=cfg.prompts_per_step * cfg.group_size)
    trainer = GRPOTrainer(model, load_tokenizer(), task, cfg, mesh=make_mesh(1), prompt_len=4)
    state = trainer.init_state(params, jax.random.PRNGKey(1))
    ckpt = Checkpointer(tmp_path / "ck", save_every=1, keep=5)
    with MetricsLogger(tmp_path) as logger, pytest.raises(NonFiniteError) as err:
        fit(trainer, state, stage="grpo", num_steps=5, cursor=0, checkpointer=ckpt,
            logger=logger, progress=False)
    msg = str(err.value)
    assert "grpo step 3" in msg and "step 2) is kept" in msg and "\n" not in msg
    ckpt.wait()
    assert ckpt.latest_step() == 2  # the bad step 3 was never saved
    restored, meta = ckpt.restore(state)
    assert int(restored.step) == 2 and meta["cursor"] == 4
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(restored.params))
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.core.checkpoint import Checkpointer, CheckpointNotFoundError


def test_save_interval_keep_and_restore(tmp_path):
    ck = Checkpointer(tmp_path / "ck", save_every=2, keep=2)
    rng = jax.random.key_data(jax.random.PRNGKey(1))
    state = {"w": jnp.arange(3.0), "step": np.int32(0), "rng": rng}
    for s in range(1, 8):
        ck.save(s, {**state, "w": state["w"] + s}, {"cursor": 10 * s}, force=s == 7)
    ck.wait()
    assert ck.all_steps() == [6, 7]
    restored, meta = ck.restore(state)
    np.testing.assert_allclose(restored["w"], np.arange(3.0) + 7)
    assert meta == {"cursor": 70}
    restored, meta = ck.restore(state, step=6)
    assert meta["cursor"] == 60
    ck.close()


def test_missing_checkpoint_is_one_line_error(tmp_path):
    ck = Checkpointer(tmp_path / "empty")
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint found in .*empty"):
        ck.restore({"w": jnp.zeros(2)})

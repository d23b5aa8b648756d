import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_suite.core.checkpoint import (
    Checkpointer,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    load_tree,
    save_tree,
    verify_tree,
)


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


def test_save_tree_replaces_and_load_tree_reads_it(tmp_path):
    tree = {"w": jnp.arange(4.0), "b": jnp.ones((2, 3))}
    save_tree(tmp_path / "p", tree)
    save_tree(tmp_path / "p", jax.tree.map(lambda x: x + 1, tree))  # replaces step 0
    out = load_tree(tmp_path / "p", tree)
    np.testing.assert_array_equal(out["w"], np.arange(4.0) + 1)
    np.testing.assert_array_equal(out["b"], np.full((2, 3), 2.0))
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint found"):
        load_tree(tmp_path / "none", tree)


def test_missing_checkpoint_is_one_line_error(tmp_path):
    ck = Checkpointer(tmp_path / "empty")
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint found in .*empty"):
        ck.restore({"w": jnp.zeros(2)})


def _two_steps(directory):
    ck = Checkpointer(directory, keep=3)
    state = {"w": jnp.arange(600.0).reshape(6, 100), "b": jnp.ones(3)}
    for s in (1, 2):
        ck.save(s, jax.tree.map(lambda x, s=s: x * s, state), {"cursor": s}, force=True)
    ck.close()
    return state


def _damage(step_dir, how):
    """Cut the array data files of a step short, or overwrite bytes of them in place."""
    for f in [p for p in step_dir.rglob("*") if p.is_file() and p.parent.name == "d"]:
        data = bytearray(f.read_bytes())
        if how == "truncate":
            f.write_bytes(bytes(data[: len(data) // 2]))
        else:
            data[::5] = bytes((x + 101) % 256 for x in data[::5])
            f.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncate", "overwrite"])
def test_a_step_that_does_not_read_falls_back_to_the_one_before(tmp_path, how, capsys):
    state = _two_steps(tmp_path / "ck")
    _damage(tmp_path / "ck" / "2", how)
    ck = Checkpointer(tmp_path / "ck", keep=3)
    assert "step 2" in ck.verify(2) and ck.verify(1) is None
    restored, meta = ck.restore(state)
    assert meta == {"cursor": 1}
    np.testing.assert_array_equal(restored["w"], state["w"])
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "step 2" in err and "using step 1" in err
    assert ck.all_steps() == [1] and (tmp_path / "ck.corrupt" / "2").is_dir()  # kept, aside
    # the resumed run saves step 2 afresh
    ck.save(2, jax.tree.map(lambda x: x * 5, state), {"cursor": 5}, force=True)
    ck.wait()
    assert ck.restore(state)[1] == {"cursor": 5} and ck.verify() is None
    ck.close()


def test_no_step_that_reads_is_one_line_error(tmp_path):
    state = _two_steps(tmp_path / "ck")
    for s in ("1", "2"):
        _damage(tmp_path / "ck" / s, "truncate")
    ck = Checkpointer(tmp_path / "ck")
    with pytest.raises(CorruptCheckpointError, match=r"in .*ck reads \(steps \[1, 2\]"):
        ck.restore(state)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir() if p.name.isdigit()) == ["1", "2"]
    assert issubclass(CorruptCheckpointError, CheckpointNotFoundError)  # exit 2 in the CLI
    ck.close()


def test_verify_tree_checks_every_series(tmp_path):
    _two_steps(tmp_path / "run" / "sft")
    _two_steps(tmp_path / "run" / "grpo")
    assert verify_tree(tmp_path / "run") is None and verify_tree(tmp_path / "none") is None
    _damage(tmp_path / "run" / "grpo" / "2", "overwrite")
    assert "grpo" in verify_tree(tmp_path / "run")

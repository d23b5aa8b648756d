"""The sharding rules table, checked on abstract meshes (no devices needed), and the mesh config;
a VLM's image tower placed on 8 fake CPU devices."""

import textwrap

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from jaxrl_suite.core.parallel import MESH_AXES, MeshConfig, make_mesh
from jaxrl_suite.models import CausalLM, LMConfig, VisionConfig, VLMConfig
from jaxrl_suite.models.sharding import (
    check_model_mesh,
    constrain,
    logical_axes,
    partition_spec,
    path_str,
)

MESH = AbstractMesh((2, 2, 2), MESH_AXES)  # data 2, fsdp 2, tensor 2


@pytest.fixture(scope="module")
def params():
    model = CausalLM(LMConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64,
                              qkv_bias=True, tie_embeddings=False))
    return model.init(jax.random.PRNGKey(0), np.zeros((1, 4), np.int32))


def test_every_matrix_is_split_megatron_style_and_norms_stay_replicated(params):
    specs = {path_str(p): partition_spec(path_str(p), x.shape, MESH)
             for p, x in jax.tree_util.tree_leaves_with_path(params)}
    want = {
        "params/embed/embedding": P("tensor", "fsdp"),       # [V, D]
        "params/layer_0/attn/q/kernel": P("fsdp", "tensor"),  # column-parallel in
        "params/layer_0/attn/k/kernel": P("fsdp", "tensor"),
        "params/layer_0/attn/v/bias": P("tensor"),
        "params/layer_0/attn/o/kernel": P("tensor", "fsdp"),  # row-parallel out
        "params/layer_0/mlp/up/kernel": P("fsdp", "tensor"),
        "params/layer_0/mlp/down/kernel": P("tensor", "fsdp"),
        "params/lm_head/kernel": P("fsdp", "tensor"),
        "params/layer_0/attn_norm/scale": P(None),
        "params/final_norm/scale": P(None),
    }
    for path, spec in want.items():
        assert specs[path] == spec, (path, specs[path])
    # the optimizer state's moments carry the parameter's path as suffix: same rule
    assert partition_spec("opt_state/1/0/mu/params/layer_0/mlp/down/kernel", (64, 32),
                          MESH) == P("tensor", "fsdp")


def test_axes_of_size_one_are_dropped_and_a_layer_stack_is_replicated():
    data_only = AbstractMesh((8, 1, 1), MESH_AXES)
    assert partition_spec("params/layer_0/attn/q/kernel", (32, 32), data_only) == P(None, None)
    assert logical_axes("layers/attn/o/kernel", 3) == ("layers", "heads", "embed")
    assert partition_spec("layers/attn/o/kernel", (4, 32, 32), MESH) == P(None, "tensor", "fsdp")
    with pytest.raises(ValueError, match="4 dimensions, but the sharding table names 2"):
        logical_axes("params/layer_0/mlp/up/kernel", 4)


def test_a_dimension_that_does_not_divide_its_axis_is_a_one_line_error():
    mesh = AbstractMesh((1, 1, 4), MESH_AXES)
    with pytest.raises(ValueError, match=r"attn/k/kernel: its kv_heads dimension of size 6 does "
                                         r"not divide over mesh axis tensor of size 4"):
        partition_spec("params/layer_0/attn/k/kernel", (32, 6), mesh)
    with pytest.raises(ValueError, match="model.n_kv_heads=2 does not divide over mesh axis "
                                         "tensor of size 4"):
        check_model_mesh(LMConfig(d_model=32, n_heads=4, n_kv_heads=2, d_ff=64), mesh)
    with pytest.raises(ValueError, match="model.d_model=36 does not divide over mesh axis fsdp"):
        check_model_mesh(LMConfig(d_model=36, n_heads=2, n_kv_heads=2, d_ff=64),
                         AbstractMesh((1, 8, 1), MESH_AXES))


def test_mesh_config_resolves_minus_one_and_rejects_what_does_not_fit():
    assert MeshConfig().shape(8) == (8, 1, 1)
    assert MeshConfig(fsdp=4).shape(8) == (2, 4, 1)
    assert MeshConfig(data=1, fsdp=-1, tensor=2).shape(8) == (1, 4, 2)
    with pytest.raises(ValueError, match=r"the fixed axes \(3 devices\) do not divide the 8"):
        MeshConfig(tensor=3).shape(8)
    with pytest.raises(ValueError, match="needs 4 devices, but 8 are in use"):
        MeshConfig(data=2, fsdp=2, tensor=1).shape(8)
    with pytest.raises(ValueError, match="-1 for at most one axis"):
        MeshConfig(data=-1, fsdp=-1)
    mesh = make_mesh(1)
    assert mesh.axis_names == MESH_AXES and dict(mesh.shape) == {"data": 1, "fsdp": 1,
                                                                 "tensor": 1}


def test_constrain_is_a_no_op_without_a_mesh():
    x = np.ones((4, 3), np.float32)
    assert constrain(x, ("batch", None)) is x


def test_a_towers_width_that_does_not_divide_is_a_one_line_error():
    cfg = VLMConfig(d_model=64, n_layers=1, n_heads=8, n_kv_heads=8, d_ff=128,
                    mrope_section=(2, 1, 1),
                    vision=VisionConfig(embed_dim=12, n_heads=3, out_dim=64))
    check_model_mesh(cfg, AbstractMesh((1, 4, 2), MESH_AXES))
    with pytest.raises(ValueError, match="model.vision.embed_dim=12 does not divide over mesh "
                                         "axis fsdp of size 8"):
        check_model_mesh(cfg, AbstractMesh((1, 8, 1), MESH_AXES))
    with pytest.raises(ValueError, match="model.vision.embed_dim=12 does not divide over mesh "
                                         "axis tensor of size 8"):
        check_model_mesh(cfg, AbstractMesh((1, 1, 8), MESH_AXES))


TOWER_SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import PartitionSpec as P
    assert jax.device_count() == 8, jax.devices()
    from jaxrl_suite.core.parallel import make_mesh
    from jaxrl_suite.models import VisionConfig, VisionLM, VLMConfig
    from jaxrl_suite.models.sharding import bytes_per_device, check_model_mesh, path_str
    from jaxrl_suite.models.sharding import shard_tree

    cfg = VLMConfig(d_model=64, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=128, max_len=64,
                    mrope_section=(2, 3, 3),
                    vision=VisionConfig(embed_dim=32, depth=2, n_heads=4, mlp_ratio=2,
                                        out_dim=64))
    params = VisionLM(cfg).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    col, row = ("fsdp", "tensor"), ("tensor", "fsdp")  # column- / row-parallel
    want = {"patch_embed/kernel": (None, "fsdp"), "merger/mlp_0/kernel": col,
            "merger/mlp_0/bias": ("tensor",), "merger/mlp_2/kernel": row}
    for i in range(cfg.vision.depth):
        b = f"blocks_{i}/"
        want |= {b + "attn/qkv/kernel": col, b + "attn/qkv/bias": ("tensor",),
                 b + "attn/proj/kernel": row, b + "mlp/fc1/kernel": col,
                 b + "mlp/fc1/bias": ("tensor",), b + "mlp/fc2/kernel": row}
    replicated = {"attn/proj/bias", "mlp/fc2/bias", "merger/mlp_2/bias", "norm1/scale",
                  "norm1/bias", "norm2/scale", "norm2/bias", "ln_q/scale", "ln_q/bias"}

    mesh = make_mesh(8, data=2, fsdp=2, tensor=2)
    check_model_mesh(cfg, mesh)
    tower = shard_tree(params, mesh)["params"]["visual"]
    leaves = {path_str(p): x for p, x in jax.tree_util.tree_leaves_with_path(tower)}
    for path, x in leaves.items():  # every leaf: split as listed, or one of the small ones
        spec = x.sharding.spec
        if path in want:
            assert spec == P(*want[path]), (path, spec)
            parts = [2 if a else 1 for a in want[path]]
            local = tuple(d // k for d, k in zip(x.shape, parts))
            assert all(s.data.shape == local for s in x.addressable_shards), path
        else:
            assert any(path.endswith(r) for r in replicated), path
            assert all(a is None for a in spec), (path, spec)
    assert set(want) <= set(leaves)

    # FSDP alone: every big kernel split 8 ways; the tower's bytes per device ~ 1/8
    mesh = make_mesh(8, data=1, fsdp=8, tensor=1)
    tower = shard_tree(params, mesh)["params"]["visual"]
    total = sum(x.nbytes for x in jax.tree.leaves(tower))
    per_device = bytes_per_device(tower)
    assert len(per_device) == 8 and max(per_device.values()) < 0.2 * total, per_device
    print("OK")
    """
)


def test_the_towers_kernels_are_split_on_eight_devices(run_on_host_devices):
    run_on_host_devices(TOWER_SCRIPT, 8)

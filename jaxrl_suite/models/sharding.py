"""How the language model's parameters (and a VLM's image tower's) are laid out on the mesh: one
table, one file.

Each parameter's dimensions get logical names (`PARAM_AXES`, matched on the parameter's path), and
`RULES` maps the logical names to the axes of the mesh (`core.parallel.MESH_AXES`):

    logical name   meaning                                    mesh axis
    batch          rows of a batch                            ("data", "fsdp")
    embed          the residual width d_model                 fsdp      (FSDP: ZeRO-3 style)
    vocab          vocabulary rows of embed / lm_head         tensor
    heads          query heads x head_dim (q's columns)       tensor    (column-parallel in)
    kv_heads       key/value heads x head_dim                 tensor
    mlp            the SwiGLU hidden width d_ff               tensor    (row-parallel out)
    layers         the stacked layer axis (scanned layers)    -         (replicated)

Tensor parallelism is Megatron's: q, k, v, gate and up are split by columns (heads, hidden units),
o and down by rows, so each device computes its heads and hidden units and one all-reduce sums
the block's output; GSPMD inserts it. FSDP shards every matrix's d_model dimension over `fsdp`
(and the optimizer state with it, since its leaves have the parameters' paths); XLA all-gathers a
layer's weights where they are used. Norm scales (and anything the table does not name) stay
replicated: they are small. LoRA adapters follow their kernel: A [in, r] is split like the
kernel's input dimension, B [r, out] like its output dimension, and the rank is never split.

The image tower of a `VisionLM` (`models/vision.py`) uses the same names: its width E is "embed",
the fused qkv's 3E columns and proj's E rows are "heads", fc1 / fc2's hidden width and the
merger's are "mlp" (its rows in the table). The qkv columns are split in one piece, [q | k | v]
in HF's order, not head by head; the tower's attention constrains q, k and v to be split by
heads, and GSPMD moves the columns there (`check_model_mesh` asks E to divide fsdp and tensor).

The rules apply to any tree whose leaves have a parameter's path as suffix (params, gradients,
the Adam moments inside `opt_state`, the reference params), so `shard_tree(state, mesh)` places a
whole train state. A leaf with one more dimension than its names (a scanned `layers` stack) gets
"layers" in front.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

# (pattern on the "/"-joined path's end, logical names of the leaf's dimensions)
PARAM_AXES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (r"embed/embedding$", ("vocab", "embed")),
    (r"attn/q/kernel$", ("embed", "heads")),
    (r"attn/(k|v)/kernel$", ("embed", "kv_heads")),
    (r"attn/q/bias$", ("heads",)),
    (r"attn/(k|v)/bias$", ("kv_heads",)),
    (r"attn/o/kernel$", ("heads", "embed")),
    (r"mlp/(gate|up)/kernel$", ("embed", "mlp")),
    (r"mlp/down/kernel$", ("mlp", "embed")),
    (r"lm_head/kernel$", ("embed", "vocab")),
    # LoRA adapters (models/lora.py): A [in, r] splits its input dim as the kernel does, B [r, out]
    # its output dim; the rank r stays whole.
    (r"(attn/(q|k|v)|mlp/(gate|up))/kernel_lora_a$", ("embed", None)),
    (r"attn/q/kernel_lora_b$", (None, "heads")),
    (r"attn/(k|v)/kernel_lora_b$", (None, "kv_heads")),
    (r"attn/o/kernel_lora_a$", ("heads", None)),
    (r"mlp/(gate|up)/kernel_lora_b$", (None, "mlp")),
    (r"mlp/down/kernel_lora_a$", ("mlp", None)),
    (r"(attn/o|mlp/down)/kernel_lora_b$", (None, "embed")),
    # The image tower (models/vision.py, `visual/...` in a VisionLM), split as the LM: its
    # residual width E is "embed", the fused qkv's 3E columns and proj's E rows are "heads"
    # (column- / row-parallel), fc1's / fc2's hidden width "mlp". The merger's mlp_0 takes the
    # m^2 patches of a window side by side (m^2 E: "embed") to a hidden m^2 E ("mlp"), mlp_2
    # maps that to the LM's width ("embed"). patch_embed's input, a flattened patch C*T*p*p,
    # stays whole. Norms and the biases of E-wide outputs (proj, fc2, mlp_2) stay replicated.
    (r"patch_embed/kernel$", (None, "embed")),
    (r"attn/qkv/kernel$", ("embed", "heads")),
    (r"attn/qkv/bias$", ("heads",)),
    (r"attn/proj/kernel$", ("heads", "embed")),
    (r"mlp/fc1/kernel$", ("embed", "mlp")),
    (r"mlp/fc1/bias$", ("mlp",)),
    (r"mlp/fc2/kernel$", ("mlp", "embed")),
    (r"merger/mlp_0/kernel$", ("embed", "mlp")),
    (r"merger/mlp_0/bias$", ("mlp",)),
    (r"merger/mlp_2/kernel$", ("mlp", "embed")),
)
RULES: Mapping[str, str | tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),
    "embed": "fsdp",
    "vocab": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "layers": None,
}
_COMPILED = tuple((re.compile(p), names) for p, names in PARAM_AXES)


def path_str(path) -> str:
    """"params/layer_0/attn/q/kernel" for a `jax.tree_util` key path."""
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return "/".join(parts)


def logical_axes(path: str, ndim: int) -> tuple[str | None, ...]:
    """The logical names of a leaf's dimensions (None: not split), from `PARAM_AXES`."""
    for pattern, names in _COMPILED:
        if pattern.search(path):
            if ndim == len(names) + 1:
                return ("layers", *names)
            if ndim == len(names):
                return names
            raise ValueError(f"{path}: {ndim} dimensions, but the sharding table names "
                             f"{len(names)} ({', '.join(map(str, names))})")
    return (None,) * ndim


def mesh_axes(name: str | None, mesh) -> tuple[str, ...]:
    """The mesh axes (of size > 1) that logical axis `name` is split over, by `RULES`."""
    axes = RULES.get(name) if name is not None else None
    axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
    return tuple(a for a in axes if a in mesh.axis_names and mesh.shape[a] > 1)


def _entry(axes: tuple[str, ...]):
    return None if not axes else axes[0] if len(axes) == 1 else axes


def partition_spec(path: str, shape, mesh: Mesh) -> P:
    """The `PartitionSpec` of a leaf: its logical axes mapped by `RULES` onto the mesh's axes
    (axes of size 1 dropped). A dimension that does not divide its axes is a one-line error."""
    spec = []
    for dim, name in zip(shape, logical_axes(path, len(shape)), strict=True):
        axes = mesh_axes(name, mesh)
        size = int(np.prod([mesh.shape[a] for a in axes]))
        if dim % size:
            raise ValueError(f"{path}: its {name} dimension of size {dim} does not divide over "
                             f"mesh axis {' x '.join(axes)} of size {size}")
        spec.append(_entry(axes))
    return P(*spec)


def tree_shardings(tree, mesh: Mesh):
    """A `NamedSharding` per leaf of `tree` (params, a train state, gradients) by the table."""
    def one(path, x):
        shape = np.shape(x)
        return NamedSharding(mesh, partition_spec(path_str(path), shape, mesh) if shape else P())

    return jax.tree_util.tree_map_with_path(one, tree)


def shard_tree(tree, mesh: Mesh):
    """Place `tree` on the mesh by the table: sharded over fsdp / tensor, replicated over data."""
    return jax.device_put(tree, tree_shardings(tree, mesh))


def constrain(x: jax.Array, names: tuple[str | None, ...]) -> jax.Array:
    """Constrain activation `x` to the layout its logical axis `names` give under `RULES`, on the
    mesh set by `jax.set_mesh` (the trainers' jitted calls set it: `core.parallel.jit_on_mesh`);
    a no-op without one or on one device. A None name keeps that dimension whole; a named one
    that does not divide its axes is left to XLA, so small batches (a one-row init) need no
    special case."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return x
    spec = []
    for dim, name in zip(x.shape, names, strict=True):
        axes = mesh_axes(name, mesh)
        if name is None:
            spec.append(None)  # kept whole on every device
        elif not axes or dim % int(np.prod([mesh.shape[a] for a in axes])):
            spec.append(P.UNCONSTRAINED)  # XLA decides
        else:
            spec.append(_entry(axes))
    return jax.lax.with_sharding_constraint(x, P(*spec))


def check_model_mesh(config, mesh: Mesh) -> None:
    """The model's head counts and widths divide over the mesh axes that split them: a one-line
    error naming the field, its value and the axis size otherwise. A vision-language model's
    tower (`config.vision`) splits its width E over both (every other split dimension of the
    tower is a multiple of E: 3E, mlp_ratio E, m^2 E)."""
    tensor, fsdp = mesh.shape.get("tensor", 1), mesh.shape.get("fsdp", 1)
    checks = [
        ("n_heads", config.n_heads, "tensor", tensor),
        ("n_kv_heads", config.n_kv_heads, "tensor", tensor),
        ("d_ff", config.d_ff, "tensor", tensor),
        ("vocab_size", config.vocab_size, "tensor", tensor),
        ("d_model", config.d_model, "fsdp", fsdp),
    ]
    vision = getattr(config, "vision", None)
    if vision is not None:
        checks += [("vision.embed_dim", vision.embed_dim, "tensor", tensor),
                   ("vision.embed_dim", vision.embed_dim, "fsdp", fsdp)]
    for field, value, axis, size in checks:
        if value % size:
            raise ValueError(f"model.{field}={value} does not divide over mesh axis {axis} of "
                             f"size {size}")


def bytes_per_device(tree) -> dict[str, int]:
    """Bytes of `tree`'s placed arrays on each device ({device: bytes}), read from the shards."""
    out: dict[str, int] = {}
    for x in jax.tree.leaves(tree):
        for shard in x.addressable_shards:
            key = str(shard.device)
            out[key] = out.get(key, 0) + shard.data.nbytes
    return out


__all__ = ["PARAM_AXES", "RULES", "bytes_per_device", "check_model_mesh", "constrain",
           "logical_axes", "mesh_axes",
           "partition_spec", "path_str", "shard_tree", "tree_shardings"]

"""The device mesh and batch placement: data parallelism, FSDP and tensor parallelism on one mesh.

One code path serves one CPU, N local accelerators and several hosts. The mesh has three named
axes, `("data", "fsdp", "tensor")` (`MESH_AXES`), sized by `MeshConfig` (`run.mesh: {data: -1,
fsdp: 1, tensor: 1}`, -1 = the rest of the devices; the default is pure data parallelism):

- batches are split along their leading dimension over `("data", "fsdp")` (`BATCH_AXES`);
- parameters and optimizer state are sharded over `fsdp` and `tensor` by the rules of
  `models/sharding.py`, and replicated over `data`;
- inside `jax.jit` XLA (GSPMD) inserts every collective: the gradient all-reduce over the batch
  axes, FSDP's per-layer all-gathers and reduce-scatters, the tensor-parallel all-reduces. Nothing
  is hand-written, so a step on any mesh computes the step of one device.

Devices are laid out data-major and tensor-minor, so the tensor axis (the most communication)
spans neighbouring devices (the same host, the fastest links).

Multi-host: call `jax.distributed.initialize()` first on every host; `make_mesh()` then spans all
hosts' devices. Each process handles the rows `process_rows(n)` of a global batch of n rows:
`shard_batch` builds the global arrays from those host-local rows, `host_local` reads this process's
rows of a result back, and `gather_rows` collects a host-side per-row array from every process.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Annotated

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_suite.core.config import Range, check_fields

DATA_AXIS = "data"
MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # a batch's leading dimension is split over these


# A mesh axis size: >= 1, or -1 for "the rest of the devices" (0 is refused by MeshConfig).
AxisSize = Annotated[int, Range(ge=-1)]


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Sizes of the mesh axes; one of them may be -1 ("the rest of the devices")."""

    data: AxisSize = -1  # data parallelism: replicas of the (sharded) model, each with batch rows
    fsdp: AxisSize = 1  # parameters, gradients and optimizer state sharded; batch rows too
    tensor: AxisSize = 1  # attention heads and the MLP hidden dimension split (Megatron style)

    def __post_init__(self):
        check_fields(self, "run.mesh.")  # the Ranges declared above (>= -1; 0 is refused below)
        sizes = dataclasses.asdict(self)
        if 0 in sizes.values() or list(sizes.values()).count(-1) > 1:
            raise ValueError(f"run.mesh: every axis size must be >= 1, or -1 for at most one "
                             f"axis; got {', '.join(f'{k}={v}' for k, v in sizes.items())}")

    def shape(self, num_devices: int) -> tuple[int, int, int]:
        """(data, fsdp, tensor) for `num_devices` devices; a one-line error when they do not
        multiply to it."""
        sizes = (self.data, self.fsdp, self.tensor)
        known = int(np.prod([s for s in sizes if s != -1]))
        if -1 in sizes:
            if num_devices % known:
                raise ValueError(f"run.mesh {self._text()}: the fixed axes ({known} devices) do "
                                 f"not divide the {num_devices} devices")
            sizes = tuple(num_devices // known if s == -1 else s for s in sizes)
        elif known != num_devices:
            raise ValueError(f"run.mesh {self._text()} needs {known} devices, but {num_devices} "
                             "are in use")
        return sizes

    def _text(self) -> str:
        return "{" + ", ".join(f"{k}: {v}" for k, v in dataclasses.asdict(self).items()) + "}"


def init_distributed(**kwargs) -> None:
    """`jax.distributed.initialize` with failure detection sized for training runs.

    Where the job comes from: `JAX_COORDINATOR_ADDRESS` (host:port of process 0, read by JAX), and
    `JAX_NUM_PROCESSES` / `JAX_PROCESS_ID` when set; otherwise JAX's cluster auto-detection
    (SLURM, Open MPI, Kubernetes, Cloud TPU). Keyword arguments override both.

    Failure detection: process 0 runs the coordination service and declares a process dead once
    it has missed heartbeats for `JAXRL_HEARTBEAT_TIMEOUT_S` seconds (default 30; JAX's own
    default is 100); every surviving process then aborts with "Terminating process because the
    JAX distributed service detected fatal errors". If process 0 itself dies, the others abort at
    once. `JAXRL_INIT_TIMEOUT_S` (default 300) bounds the wait for all processes to connect.
    """
    from jaxrl_suite.core.config import ConfigError

    def env_int(name: str, default: int | None, minimum: int) -> int | None:
        text = os.environ.get(name, "")
        if not text:
            return default
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"{name}={text!r} is not an integer") from None
        if value < minimum:
            raise ConfigError(f"{name}={value} must be >= {minimum}")
        return value

    options = {
        "num_processes": env_int("JAX_NUM_PROCESSES", None, 1),
        "process_id": env_int("JAX_PROCESS_ID", None, 0),
        "heartbeat_timeout_seconds": env_int("JAXRL_HEARTBEAT_TIMEOUT_S", 30, 1),
        "initialization_timeout": env_int("JAXRL_INIT_TIMEOUT_S", 300, 1),
    }
    jax.distributed.initialize(**{**options, **kwargs})


def make_mesh(num_devices: int | None = None, *, data: int = -1, fsdp: int = 1,
              tensor: int = 1) -> Mesh:
    """The ("data", "fsdp", "tensor") `Mesh` over the first `num_devices` devices (default: all,
    across hosts), with the axis sizes of `MeshConfig(data, fsdp, tensor)`."""
    devices = jax.devices()
    n = len(devices) if num_devices is None else num_devices
    if not 1 <= n <= len(devices):
        raise ValueError(f"num_devices={n} but {len(devices)} devices are visible")
    shape = MeshConfig(data, fsdp, tensor).shape(n)
    # An explicit Mesh (not jax.make_mesh) keeps Auto axes, so jit propagates shardings itself.
    return Mesh(np.asarray(devices[:n]).reshape(shape), MESH_AXES)


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes a batch's leading dimension is split over (those of `BATCH_AXES` it has)."""
    return tuple(a for a in BATCH_AXES if a in mesh.axis_names)


def batch_shards(mesh: Mesh) -> int:
    """How many pieces a batch is split into: the product of the batch axes' sizes."""
    return int(np.prod([mesh.shape[a] for a in batch_axes(mesh)]))


def data_sharding(mesh: Mesh) -> NamedSharding:
    """Leading axis split over the batch axes ("data", "fsdp"), the rest replicated."""
    return NamedSharding(mesh, P(batch_axes(mesh)))


def place_seeds(keys: jax.Array, mesh: Mesh | None) -> jax.Array:
    """Seed keys [S] split over the mesh's batch axes, so that a `jit(vmap(train))` over them runs
    each device's share of the seeds; unchanged without a mesh or when S does not divide."""
    if mesh is None or keys.shape[0] % batch_shards(mesh):
        return keys
    return jax.device_put(keys, data_sharding(mesh))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def shard_batch(batch, mesh: Mesh):
    """Place every leaf of `batch` with its leading axis split over the batch axes.

    `batch` leaves hold this host's rows (all rows on a single host). The leading size must divide
    evenly by this host's share of the batch shards, otherwise a one-line ValueError says so.
    """
    sharding = data_sharding(mesh)
    n_local = max(1, batch_shards(mesh) // jax.process_count())

    def put(x):
        x = np.asarray(x)
        if x.ndim == 0 or x.shape[0] % n_local:
            raise ValueError(f"batch leading size {x.shape[:1]} must be divisible by the {n_local} "
                             "batch shards of this host (mesh axes data x fsdp)")
        if jax.process_count() == 1:
            return jax.device_put(x, sharding)
        return jax.make_array_from_process_local_data(sharding, x)

    return jax.tree.map(put, batch)


def process_rows(n: int) -> slice:
    """This process's share of `n` global rows: rows [p*n/k, (p+1)*n/k) of process p out of k."""
    k, p = jax.process_count(), jax.process_index()
    if n % k:
        raise ValueError(f"a global batch of {n} rows must be divisible by the {k} processes")
    return slice(p * n // k, (p + 1) * n // k)


def host_local(x: jax.Array) -> np.ndarray:
    """This process's rows of an array sharded along its leading axis (all rows on one host)."""
    if x.is_fully_addressable:
        return np.asarray(x)
    by_start = {}
    for shard in x.addressable_shards:  # replicas along other axes repeat a row range
        by_start.setdefault(shard.index[0].start or 0, shard.data)
    return np.concatenate([np.asarray(by_start[s]) for s in sorted(by_start)])


def gather_rows(local: np.ndarray) -> np.ndarray:
    """Concatenate every process's host-local rows in process order (identity on one host)."""
    if jax.process_count() == 1:
        return np.asarray(local)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(np.asarray(local), tiled=True))


def mesh_of(tree) -> Mesh | None:
    """The mesh of the first array in `tree` placed with a `NamedSharding` (None if none is)."""
    for x in jax.tree.leaves(tree):
        sharding = getattr(x, "sharding", None)
        if isinstance(sharding, NamedSharding):
            return sharding.mesh
    return None


# XLA:CPU's YNNPACK fusion of dots with the transposes and elementwise ops around them. XLA's
# default leaves the weight gradients' transposed operands to its loop emitter, and a transposed
# fusion that holds a constant or a transcendental (SwiGLU's and RoPE's backward) runs several
# times slower there; with dot fusion the GRPO update at bench_grpo's sizes takes 0.42 s
# instead of 0.65 s (issue 25). Generation is slower with it, so only backward passes use it.
_CPU_GRADIENT_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}


@functools.cache
def gradient_compiler_options() -> dict:
    """XLA compiler options for a jitted program with a backward pass (an update step), on the
    default backend: `jax.jit(update, compiler_options=gradient_compiler_options())`.

    On CPU, dot fusion (`_CPU_GRADIENT_OPTIONS`); elsewhere, or where this jaxlib does not know
    the option (it is experimental), none. The numerics are the same up to float rounding."""
    if jax.default_backend() != "cpu":
        return {}
    try:
        jax.jit(lambda x: x @ x.T, compiler_options=_CPU_GRADIENT_OPTIONS).lower(
            jax.ShapeDtypeStruct((2, 2), np.float32)).compile()
    except Exception:  # noqa: BLE001 - an unknown option: compile without it
        return {}
    return dict(_CPU_GRADIENT_OPTIONS)


def jit_on_mesh(fn, *, keep_placement: bool = False, **jit_kwargs):
    """`jax.jit(fn)`, traced and run under the mesh its first argument is placed on
    (`jax.set_mesh`), so the activation constraints inside (`models.sharding.constrain`) apply.

    With `keep_placement`, `fn(state, *args) -> (state, aux)` and the new state keeps the
    placement of the given one (its leaves' shardings are the `out_shardings`; aux is left to
    XLA): a sharded train state stays sharded the same way, step after step. One compiled program
    per placement.
    """
    compiled = {}

    def call(first, *args, **kwargs):
        shardings = jax.tree.map(lambda x: getattr(x, "sharding", None), first)
        key = (jax.tree.structure(first), tuple(jax.tree.leaves(shardings)))
        if key not in compiled:
            out = {"out_shardings": (shardings, None)} if keep_placement else {}
            compiled[key] = jax.jit(fn, **out, **jit_kwargs)
        mesh = mesh_of(first)
        if mesh is None:
            return compiled[key](first, *args, **kwargs)
        with jax.set_mesh(mesh):
            return compiled[key](first, *args, **kwargs)

    # as on a jitted function: how many programs are compiled (all placements together)
    call._cache_size = lambda: sum(f._cache_size() for f in compiled.values())
    return call


def replicate(tree, mesh: Mesh):
    """Place every leaf of `tree` (params, optimizer state) on all devices of the mesh."""
    return jax.device_put(tree, replicated(mesh))


def print0(text: str) -> None:
    """Print on process 0 only (flushed), so a multi-host job prints each line once."""
    if jax.process_index() == 0:
        print(text, flush=True)

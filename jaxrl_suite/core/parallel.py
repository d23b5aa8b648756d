"""Device mesh and batch placement for data parallelism.

One code path serves one CPU, N local accelerators and several hosts. The mesh has a single
`"data"` axis: batches are split along their leading dimension over it and parameters are
replicated; inside `jax.jit` XLA then inserts the gradient all-reduce, so a step on N devices
computes the same global-batch gradient as a step on one device.

Multi-host: call `jax.distributed.initialize()` first on every host; `make_mesh()` then spans all
hosts' devices. Each process handles the rows `process_rows(n)` of a global batch of n rows:
`shard_batch` builds the global arrays from those host-local rows, `host_local` reads this process's
rows of a result back, and `gather_rows` collects a host-side per-row array from every process.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DATA_AXIS = "data"


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


def make_mesh(num_devices: int | None = None, *, axis: str = DATA_AXIS) -> Mesh:
    """A 1-D `Mesh` over the first `num_devices` devices (default: all, across hosts)."""
    devices = jax.devices()
    n = len(devices) if num_devices is None else num_devices
    if not 1 <= n <= len(devices):
        raise ValueError(f"num_devices={n} but {len(devices)} devices are visible")
    # An explicit Mesh (not jax.make_mesh) keeps Auto axes, so jit propagates shardings itself.
    return Mesh(np.asarray(devices[:n]), (axis,))


def data_sharding(mesh: Mesh) -> NamedSharding:
    """Leading axis split over `"data"`, the rest replicated."""
    return NamedSharding(mesh, P(mesh.axis_names[0]))


def place_seeds(keys: jax.Array, mesh: Mesh | None) -> jax.Array:
    """Seed keys [S] split over the mesh's data axis, so that a `jit(vmap(train))` over them runs
    each device's share of the seeds; unchanged without a mesh or when S does not divide."""
    if mesh is None or keys.shape[0] % mesh.size:
        return keys
    return jax.device_put(keys, data_sharding(mesh))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def shard_batch(batch, mesh: Mesh):
    """Place every leaf of `batch` with its leading axis split over the mesh.

    `batch` leaves hold this host's rows (all rows on a single host). The leading size must divide
    evenly by the number of devices (per host), otherwise a one-line ValueError says so.
    """
    sharding = data_sharding(mesh)
    n_local = len(mesh.local_devices)

    def put(x):
        x = np.asarray(x)
        if x.ndim == 0 or x.shape[0] % n_local:
            raise ValueError(
                f"batch leading size {x.shape[:1]} must be divisible by the {n_local} local devices"
            )
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


def replicate(tree, mesh: Mesh):
    """Place every leaf of `tree` (params, optimizer state) on all devices of the mesh."""
    return jax.device_put(tree, replicated(mesh))


def print0(text: str) -> None:
    """Print on process 0 only (flushed), so a multi-host job prints each line once."""
    if jax.process_index() == 0:
        print(text, flush=True)

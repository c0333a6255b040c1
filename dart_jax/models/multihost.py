"""What a run over several JAX processes (multi-controller: the same program in every process,
`python -m dart_jax.launch`) needs beyond the mesh: one writer, and decisions every process shares.

Every process runs the same jitted calls in the same order; a choice that steers them (which tree
size to verify next, whether to draft at all) must therefore be the same in every process, even
when it rests on a process's own timings: `agree` hands process 0's choice to all. Files that
every process would write alike are written by process 0 alone (`is_writer`). With one process
all of this is a no-op.
"""
from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils


def is_writer() -> bool:
    """Whether this process writes the run's files (process 0; the only one without multi-host)."""
    return jax.process_index() == 0


def agree(value: int) -> int:
    """Process 0's `value` (an integer choice) in every process: a collective, so every process
    must call it at the same point of the program."""
    if jax.process_count() == 1:
        return value
    return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


def wait_for_all(name: str) -> None:
    """Block until every process reaches the barrier `name` (e.g. until process 0 wrote a file the
    others read)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def share(payload: bytes | None) -> bytes:
    """Process 0's `payload` in every process (the others pass None): two collectives, its length
    and then its bytes, padded to a power of two so that few shapes compile."""
    if jax.process_count() == 1:
        return payload or b""
    n = int(multihost_utils.broadcast_one_to_all(np.int32(len(payload) if payload is not None else 0)))
    if n == 0:
        return b""
    buffer = np.zeros(1 << (n - 1).bit_length(), np.uint8)
    if payload is not None:
        buffer[:n] = np.frombuffer(payload, np.uint8)
    return np.asarray(multihost_utils.broadcast_one_to_all(buffer))[:n].tobytes()


def to_host(x) -> np.ndarray:
    """The whole value of an array on the host, also when its shards lie on the devices of several
    processes (then gathered: a collective, so every process must call it at the same point)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.sharding.is_fully_replicated:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)

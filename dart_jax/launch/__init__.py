"""`python -m dart_jax.launch`: several JAX processes joined in one runtime (`jax.distributed`).

The launcher (`__main__`) starts the processes of one run and watches them; each process starts
through `dart_jax.launch.child`, which joins the runtime (`child.join`) before the command's own code
touches JAX, then runs the command. The contract between the two is a handful of environment
variables, the same ones a cluster script sets by hand (docs/multihost.md):

  JAX_COORDINATOR_ADDRESS   host:port of process 0's coordinator (JAX reads it too)
  JAX_NUM_PROCESSES         how many processes the run has
  JAX_PROCESS_ID            this process's rank, 0 … N-1
  DART_JAX_INIT_TIMEOUT     seconds to wait for every process to join (default 60)
  DART_JAX_HEARTBEAT        seconds after which a silent process counts as dead (default 10)

With none of the first three set, `join` lets JAX find its peers itself (TPU pods, SLURM, Open MPI).
This package imports nothing of dart_jax but `errors`; the launcher itself does not import jax.
"""
from __future__ import annotations

import socket

from dart_jax.errors import InputError

ENV_COORDINATOR, ENV_PROCESSES, ENV_ID = "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"
ENV_INIT_TIMEOUT, ENV_HEARTBEAT = "DART_JAX_INIT_TIMEOUT", "DART_JAX_HEARTBEAT"


def check_port_free(address: str) -> None:
    """An InputError when process 0 could not open its coordinator at `address` here: JAX binds
    the port on every interface (and crashes when it is taken), so this binds it the same way."""
    port = int(address.rpartition(":")[2])
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 here
            continue
        with s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as e:
                raise InputError(f"the coordinator port {port} ({address}) is in use ({e.strerror}): another run or "
                                 f"another program holds it; pick another port (--coordinator HOST:PORT), or leave "
                                 f"--coordinator out to take a free one.") from None
        return

"""One process of a launched run: `python -m dart_jax.launch.child (-m MODULE | -c CODE | SCRIPT) ARGS...`.

Joins the JAX runtime (`join`) before anything else touches JAX, then runs the
module, code or script as `python` would, with `sys.argv` as it would see it. The launcher
rewrites a `python ...` command into this; a cluster job may call it directly.
"""
from __future__ import annotations

import os
import runpy
import sys
import time
import traceback

import jax
from jax._src import distributed

from dart_jax.errors import InputError, cli_boundary

from . import ENV_COORDINATOR, ENV_HEARTBEAT, ENV_ID, ENV_INIT_TIMEOUT, ENV_PROCESSES, check_port_free


def _int_env(name: str, default: int | None) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if not value.isdigit():
        raise InputError(f"the environment variable {name}={value!r} is not a non-negative integer; "
                         f"set it to a whole number or unset it.")
    return int(value)


def join() -> None:
    """Join this process to the run's JAX runtime (`jax.distributed.initialize`) as the environment
    describes it, then check that every process agrees on the number of processes. An InputError
    says what went wrong (no coordinator within the time, a port taken, a count that differs)."""
    coordinator = os.environ.get(ENV_COORDINATOR) or None
    processes, rank = _int_env(ENV_PROCESSES, None), _int_env(ENV_ID, None)
    init_timeout, heartbeat = _int_env(ENV_INIT_TIMEOUT, 60), _int_env(ENV_HEARTBEAT, 10)
    if (processes is None) != (rank is None) or (processes is not None and coordinator is None):
        raise InputError(f"set all of {ENV_COORDINATOR}, {ENV_PROCESSES} and {ENV_ID} (or none of them, where JAX "
                         f"finds its peers itself: TPU pods, SLURM, Open MPI); found "
                         f"{ENV_COORDINATOR}={coordinator!r}, {ENV_PROCESSES}={processes!r}, {ENV_ID}={rank!r}.")
    if processes is not None and not 0 <= rank < processes:
        raise InputError(f"{ENV_ID}={rank} is outside 0 … {processes - 1} ({ENV_PROCESSES}={processes}).")
    if rank == 0:
        check_port_free(coordinator)
    try:
        jax.distributed.initialize(coordinator, processes, rank, initialization_timeout=init_timeout,
                                   heartbeat_timeout_seconds=heartbeat)
    except Exception as e:  # noqa: BLE001 - every failure to join is the setup's, told with what to check
        text = str(e)
        if "DEADLINE_EXCEEDED" in text or "timed out" in text.lower() or "Barrier timed out" in text:
            raise InputError(f"process {rank} of {processes}: not every process joined the coordinator {coordinator} "
                             f"within {init_timeout} s. Check that all {processes} processes were started with the "
                             f"same process count ({ENV_PROCESSES}) and distinct ranks, and that {coordinator} is "
                             f"reachable from every host. ({text.splitlines()[0][:300]})") from None
        if "address already in use" in text.lower() or "failed to add port" in text.lower() or "bind" in text.lower():
            raise InputError(f"process {rank}: the coordinator port {coordinator} is in use (another run, or "
                             f"another program); pick a free port.") from None
        raise InputError(f"process {rank} of {processes}: could not join the JAX runtime at {coordinator}: "
                         f"{text.splitlines()[0][:500]}") from None
    _check_same_count(processes)


def _check_same_count(processes: int | None) -> None:
    """Every process states its process count in the coordinator's key-value store and reads the
    others': a process started with another count than the rest fails here, in every process,
    naming both counts."""
    client = distributed.global_state.client
    if client is None or processes is None:
        return
    rank = jax.process_index()
    client.key_value_set(f"dart_jax/processes/{rank}", str(processes))
    counts = {other: int(client.blocking_key_value_get(f"dart_jax/processes/{other}", 60_000))
              for other in range(jax.process_count())}
    # every process reads every count before any leaves: the coordinator lives in process 0, and a
    # process whose coordinator is gone is aborted by the runtime before it could say why
    client.wait_at_barrier("dart_jax/processes/read", 60_000)
    for other, theirs in counts.items():
        if theirs != processes:
            if rank == 0:
                time.sleep(2)
            raise InputError(f"process {rank} was started with {ENV_PROCESSES}={processes} but process {other} with "
                             f"{theirs}; start every process with the same count.")
    if jax.process_count() != processes:
        raise InputError(f"process {rank} was started with {ENV_PROCESSES}={processes} but the coordinator counts "
                         f"{jax.process_count()} processes; start every process with the same count.")


USAGE = "usage: python -m dart_jax.launch.child (-m MODULE | -c CODE | SCRIPT) [ARGS...]"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] in ("-m", "-c") and len(argv) < 2):
        print(USAGE, file=sys.stderr)
        return 2
    code = cli_boundary(join, prog="dart_jax.launch")
    if code:
        leave(code)
    try:
        run(argv)
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
        if status:
            leave(status)
        return status
    except BaseException:  # noqa: BLE001 - told, then the process leaves at once (below)
        traceback.print_exc()
        leave(1)
    return 0


def leave(status: int) -> None:
    """Exit now, skipping JAX's shutdown barrier: at exit the runtime waits (minutes) for every
    other process to reach the barrier, and those others are blocked in a collective that waits
    for this one. Leaving at once lets the launcher, or the others' heartbeat, end the run."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def run(argv: list[str]) -> None:
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102 - what `python -c` does
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    sys.exit(main())

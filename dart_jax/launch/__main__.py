"""`python -m dart_jax.launch --processes N [--devices-per-process K] -- COMMAND...`

Starts N processes of COMMAND on this host, joined in one JAX runtime (`jax.distributed`, with
process 0's coordinator on a free local port), and watches them: when one fails or is killed the
others are stopped (SIGTERM, then SIGKILL after --grace seconds) and the launcher exits with the
failed one's status, saying which failed; it exits 0 when all exit 0. `--devices-per-process K`
gives each process K forced CPU devices (a CPU stand-in for K accelerators per host).

On a cluster, where a scheduler starts one process per host, run the same command with
`--process-id I --coordinator HOST:PORT` on each host (or `--cluster` where JAX finds its peers
itself: TPU pods, SLURM, Open MPI): it runs only this host's process (docs/multihost.md).

A COMMAND that starts with a Python interpreter (`python -m MODULE`, `python SCRIPT`,
`python -c CODE`) joins the runtime before its own code runs; any other command gets the
environment (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID) and must call
`dart_jax.launch.join()` (or `jax.distributed.initialize`) itself.
"""
from __future__ import annotations

import argparse
import ctypes
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from dart_jax.errors import InputError, cli_boundary

from . import ENV_COORDINATOR, ENV_HEARTBEAT, ENV_ID, ENV_INIT_TIMEOUT, ENV_PROCESSES, check_port_free

PROG = "dart_jax.launch"
# interpreter options that take a value (`python -X dev -m mod`)
_OPTION_WITH_VALUE = {"-X", "-W", "--check-hash-based-pycs"}


def _seconds(minimum: float, strict: bool, kind=float):
    """An argparse type: a finite number of seconds > `minimum` (`strict`) or >= it."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
        if not math.isfinite(value) or (value <= minimum if strict else value < minimum):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {minimum:g} seconds, got {text}")
        return value
    return parse


def _host_port(text: str) -> str:
    """An argparse type: HOST:PORT with a port in 1 … 65535."""
    match = re.fullmatch(r"\[?[\w.:-]+\]?:(\d{1,5})", text)
    if not match or not 1 <= int(match.group(1)) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT with a port in 1 … 65535, e.g. 10.0.0.1:1234; got {text!r}")
    return text


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m dart_jax.launch", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="example: python -m dart_jax.launch --processes 2 --devices-per-process 4 -- "
                                       "python -m dart_jax.generate --demo tiny --mesh data=2,model=4 --prompt hi")
    p.add_argument("--processes", "-n", type=int, default=None, help="number of processes in the run (all hosts)")
    p.add_argument("--devices-per-process", type=int, default=None, metavar="K",
                   help="K forced CPU devices per process (sets JAX_PLATFORMS=cpu and XLA_FLAGS)")
    p.add_argument("--coordinator", metavar="HOST:PORT", default=None, type=_host_port,
                   help="process 0's coordinator (default: 127.0.0.1 and a free port, all processes on this host)")
    p.add_argument("--process-id", type=int, default=None, metavar="I",
                   help="run only process I here (one per host on a cluster; needs --coordinator)")
    p.add_argument("--cluster", action="store_true",
                   help="run one process here and let JAX find its peers (TPU pods, SLURM, Open MPI)")
    p.add_argument("--timeout", type=_seconds(0, strict=True), default=None, metavar="S", help="stop the whole run after S seconds")
    p.add_argument("--init-timeout", type=_seconds(1, strict=False, kind=int), default=60, metavar="S",
                   help="seconds to wait for every process to join (default 60)")
    p.add_argument("--heartbeat", type=_seconds(1, strict=False, kind=int), default=10, metavar="S",
                   help="seconds after which a silent process counts as dead and the others stop (default 10)")
    p.add_argument("--grace", type=_seconds(0, strict=False), default=3.0, metavar="S",
                   help="seconds between SIGTERM and SIGKILL when stopping processes (default 3)")
    p.add_argument("--all-output", action="store_true",
                   help="also pass on the standard output of processes 1 … N-1 (prefixed); by default only "
                        "process 0's is shown, and the others' standard error, prefixed")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = p.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        raise InputError("no COMMAND: put it after `--`, e.g. `python -m dart_jax.launch --processes 2 -- "
                         "python -m dart_jax.generate --demo tiny`.")
    if args.cluster:
        if args.processes is not None or args.process_id is not None or args.coordinator is not None:
            raise InputError("--cluster lets JAX find the processes itself; drop --processes, --process-id and "
                             "--coordinator (or drop --cluster and give all three).")
    elif args.processes is None or args.processes < 1:
        raise InputError(f"--processes must be a whole number >= 1 (got {args.processes}).")
    if args.devices_per_process is not None and args.devices_per_process < 1:
        raise InputError(f"--devices-per-process must be >= 1 (got {args.devices_per_process}).")
    if args.process_id is not None:
        if args.coordinator is None:
            raise InputError("--process-id runs one process of a run spread over hosts: give --coordinator "
                             "HOST:PORT (process 0's host, the same on every host).")
        if not 0 <= args.process_id < args.processes:
            raise InputError(f"--process-id {args.process_id} is outside 0 … {args.processes - 1} "
                             f"(--processes {args.processes}).")
    return args


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def child_command(command: list[str]) -> list[str]:
    """`python [opts] (-m M | -c C | SCRIPT) args` → the same through `dart_jax.launch.child`; any
    other command as it is."""
    if not re.fullmatch(r"python[\d.]*|pypy[\d.]*", os.path.basename(command[0])) and command[0] != sys.executable:
        return list(command)
    i, opts = 1, []
    while i < len(command) and command[i].startswith("-") and command[i] not in ("-m", "-c", "-"):
        opts.append(command[i])
        if command[i] in _OPTION_WITH_VALUE and i + 1 < len(command):
            opts.append(command[i + 1])
            i += 1
        i += 1
    return [command[0], *opts, "-m", "dart_jax.launch.child", *command[i:]]


def _die_with_parent():
    """In a child, before exec: receive SIGTERM when the launcher dies (Linux), so that a killed
    launcher leaves no processes behind."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# Gloo's connection notices, which it prints on the standard output (they would break `--json`):
# "[Gloo] Rank R is connected to N peer ranks. Expected number of connected peer ranks is : N".
# Its threads write a notice in pieces and may interleave two or more of them anywhere between
# pieces: a notice's tail may then come on a later line of its own.
_GLOO_START = b"[Gloo] Rank "
_GLOO_PIECES = (_GLOO_START, b" is connected to ", b" peer ranks. ", b" peer ranks.",
                b"Expected number of connected peer ranks is : ")
_NUMBERS = re.compile(rb"[\d\s]*")


class GlooFilter:
    """Tells the lines of Gloo's connection notices, whole or interleaved, from a process's own."""

    def __init__(self):
        self.open = 0  # notices begun whose line end has not come yet

    def is_notice(self, line: bytes) -> bool:
        rest = line
        for piece in _GLOO_PIECES:
            rest = rest.replace(piece, b" ")
        if _NUMBERS.fullmatch(rest) is None or (rest == line and not self.open):
            return False
        self.open = max(0, self.open + line.count(_GLOO_START) - line.count(b"\n"))
        return True


def _forward(stream, prefix: str, out) -> None:
    """Copy a process's output line by line to `out`, each line after `prefix`."""
    gloo = GlooFilter()
    for line in iter(stream.readline, b""):
        if gloo.is_notice(line):
            continue
        out.buffer.write(prefix.encode() + line)
        out.flush()
    stream.close()


def describe(status: int) -> str:
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


def start(args) -> list[tuple[int, subprocess.Popen]]:
    env = dict(os.environ)
    env[ENV_INIT_TIMEOUT], env[ENV_HEARTBEAT] = str(args.init_timeout), str(args.heartbeat)
    if args.devices_per_process is not None:
        flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", ""))
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={args.devices_per_process}".strip()
        env["JAX_PLATFORMS"] = "cpu"
    if args.cluster:
        for name in (ENV_COORDINATOR, ENV_PROCESSES, ENV_ID):
            env.pop(name, None)
        ranks = [None]
    else:
        coordinator = args.coordinator
        if coordinator is None:
            coordinator = f"127.0.0.1:{free_port('127.0.0.1')}"
        ranks = [args.process_id] if args.process_id is not None else list(range(args.processes))
        if 0 in ranks:
            check_port_free(coordinator)
        env[ENV_COORDINATOR], env[ENV_PROCESSES] = coordinator, str(args.processes)
    command = child_command(args.command)
    procs = []
    for rank in ranks:
        child_env = dict(env)
        if rank is not None:
            child_env[ENV_ID] = str(rank)
        main_process = rank in (0, None) or len(ranks) == 1
        show_stdout = main_process or args.all_output
        proc = subprocess.Popen(command, env=child_env, preexec_fn=_die_with_parent,
                                stdout=subprocess.PIPE if show_stdout else subprocess.DEVNULL,
                                stderr=None if main_process else subprocess.PIPE)
        prefix = "" if main_process else f"[process {rank}] "
        readers = []
        if show_stdout:
            readers.append(threading.Thread(target=_forward, args=(proc.stdout, prefix, sys.stdout), daemon=True))
        if not main_process:
            readers.append(threading.Thread(target=_forward, args=(proc.stderr, prefix, sys.stderr), daemon=True))
        procs.append((rank, proc, readers))
    for _, _, readers in procs:  # after every fork: preexec_fn is not safe once threads run
        for reader in readers:
            reader.start()
    return procs


def stop(procs, grace: float) -> None:
    """SIGTERM to every process still running, SIGKILL to those still running `grace` s later."""
    for _, p, _ in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for _, p, _ in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def supervise(procs, args) -> int:
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    while True:
        running = False
        for rank, p, _ in procs:
            status = p.poll()
            if status is None:
                running = True
            elif status != 0:
                others = [r for r, q, _ in procs if q is not p and q.poll() is None]
                print(f"{PROG}: process {rank} {describe(status)}"
                      + (f"; stopping processes {', '.join(map(str, others))}" if others else ""), file=sys.stderr)
                stop(procs, args.grace)
                for _, _, readers in procs:
                    for reader in readers:
                        reader.join(timeout=2)
                return status if status > 0 else 128 - status
        if not running:
            for _, _, readers in procs:
                for reader in readers:
                    reader.join(timeout=5)
            return 0
        if deadline is not None and time.monotonic() > deadline:
            print(f"{PROG}: the run took longer than --timeout {args.timeout:g} s; stopping every process",
                  file=sys.stderr)
            stop(procs, args.grace)
            return 124
        time.sleep(0.05)


def run(argv) -> int:
    args = parse_args(argv)
    procs = start(args)

    def on_signal(signum, frame):
        stop(procs, args.grace)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    try:
        return supervise(procs, args)
    except KeyboardInterrupt:
        stop(procs, args.grace)
        raise


def main(argv=None) -> int:
    return cli_boundary(lambda: run(sys.argv[1:] if argv is None else argv), prog=PROG)


if __name__ == "__main__":
    sys.exit(main())

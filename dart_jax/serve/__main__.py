"""`python -m dart_jax.serve`: an OpenAI-compatible HTTP API and a chat UI in one process. Its usage
and options are in `dart_jax.serve.options` (parsed before jax loads)."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import threading

from .options import parse_args

# answer --help and bad flags before jax, flax and the model code load (seconds)
if __name__ == "__main__":
    parse_args()

import jax  # noqa: E402 (after the check above, on purpose; likewise below)

from dart_jax.api.compiling import CompileNotice, settle  # noqa: E402
from dart_jax.api.generate import DEMO_PROMPT, load_model  # noqa: E402
from dart_jax.errors import InputError, cli_boundary

try:
    import uvicorn

    from .app import create_app
    from .multihost import SharedScheduler
    from .scheduler import Scheduler
    from .ui import mount
    _MISSING = None
except ImportError as e:  # the serve extra is not installed
    _MISSING = e


SHUTDOWN_MESSAGE = "the server is shutting down; this answer was cut short, send the request again later."
SHUTDOWN_GRACE = 2.0  # seconds uvicorn waits past --shutdown-timeout, for the cut answers to reach their clients
FLUSH_WAIT = 1.0  # seconds the cut answers get to reach their clients before what is left is cancelled
# seconds the process waits at exit for the scheduler's step in progress (a compilation may take
# minutes, and its work is of no use to anyone once the answers are cut)
STOP_WAIT = 2.0


def _requests(n: int) -> str:
    return f"{n} running request{'s' * (n != 1)}"


class _Server(uvicorn.Server if _MISSING is None else object):
    """uvicorn's server, printing the URL once it listens. At shutdown it says what it does, and
    requests still running at the deadline (`cut_after`), or at once on a second Ctrl-C, are ended
    through the scheduler, so that each stream ends with an error event and [DONE] (and a plain
    request with a 503) rather than a cut connection; once no request runs, what is left (the UI's
    idle streams) is cancelled, so that the process exits without waiting for them."""

    url = ""
    scheduler = None
    cut_after: float | None = None  # seconds after the shutdown starts (None: just inside uvicorn's deadline)
    signal: int | None = None  # the signal that stopped it
    cut_now = False  # a second Ctrl-C: end the running requests now

    async def startup(self, sockets=None):
        await super().startup(sockets)
        if self.started:
            print(f"dart_jax: serving on {self.url}", flush=True)

    def handle_exit(self, sig, frame):
        if self.should_exit:
            # not uvicorn's forced exit, which would skip the app's shutdown and cut the streams bare
            self.cut_now = self.cut_now or sig == signal.SIGINT
            return
        self.signal = sig
        super().handle_exit(sig, frame)

    def _running(self) -> int:
        return self.scheduler.load()["open"]

    async def shutdown(self, sockets=None):
        timeout = self.config.timeout_graceful_shutdown
        if self.scheduler is None or timeout is None:
            return await super().shutdown(sockets)
        after = self.cut_after if self.cut_after is not None else timeout - min(1.0, timeout / 2)
        running = self._running()
        why = signal.Signals(self.signal).name if self.signal else "shutdown"
        if running:
            print(f"dart_jax: stopping ({why}): {_requests(running)} {'gets' if running == 1 else 'get'} up to {after:g} s to finish "
                  "(--shutdown-timeout); press Ctrl-C again to end them now", file=sys.stderr, flush=True)
        else:
            print(f"dart_jax: stopping ({why})", file=sys.stderr, flush=True)
        cutter = asyncio.create_task(self._cut(max(0.0, after)))
        try:
            await super().shutdown(sockets)
        finally:
            await cutter  # also after a forced exit, when uvicorn's own wait ends at once

    async def _cut(self, after: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + after
        while self._running() and not self.cut_now and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if self._running():
            print(f"dart_jax: ending {_requests(self._running())} with the shutdown error", file=sys.stderr,
                  flush=True)
        self.scheduler.interrupt(SHUTDOWN_MESSAGE)
        # the cut answers reach their clients, then uvicorn need not wait for what is left
        flush_until = loop.time() + FLUSH_WAIT
        while self.server_state.tasks and loop.time() < flush_until:
            await asyncio.sleep(0.05)
        for task in list(self.server_state.tasks):
            task.cancel()


class _Signals:
    """SIGINT, SIGTERM and SIGHUP from the scheduler's start to the end of serving. Before uvicorn
    serves (the warm-up), a signal ends the warm-up through the scheduler and the process then
    stops it before XLA is torn down: a KeyboardInterrupt there would leave the scheduler thread
    compiling while the interpreter exits, which aborts the process. While uvicorn serves, each
    goes to its shutdown (SIGHUP too, which uvicorn leaves alone, so that it ends the streams as
    SIGTERM does)."""

    def __init__(self):
        self.received: int | None = None  # a signal before serving
        self.scheduler = None
        self.server: _Server | None = None
        self.done = False
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._handle)

    def _handle(self, sig, frame) -> None:
        if self.done:  # the process is stopping already
            return
        if self.server is not None:
            self.server.handle_exit(sig, frame)
        elif self.received is None:
            self.received = sig
            # a thread: the handler runs inside the main thread's own code, which may hold the locks
            # that printing and the scheduler take
            threading.Thread(target=self._stop_warmup, args=(sig,), daemon=True).start()

    def _stop_warmup(self, sig: int) -> None:
        print(f"dart_jax: {signal.Signals(sig).name} before serving: ending the warm-up and stopping",
              file=sys.stderr, flush=True)
        if self.scheduler is not None:
            self.scheduler.interrupt(SHUTDOWN_MESSAGE)


def warmup_ids(model) -> list[int]:
    """The warm-up prompt's ids, raw (no chat template: a base without one serves /v1/completions)."""
    return model.encode(DEMO_PROMPT, chat=False)


def _check(args) -> None:
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must lie in [0, 65535], got {args.port}.")
    if args.slots < 1:
        raise ValueError(f"--slots must be >= 1, got {args.slots}.")
    if args.api_key is not None and not args.api_key.strip():
        raise ValueError("--api-key is empty; pass a key, or leave it out to serve without one.")
    # fail before loading the model when the address cannot be had
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((args.host, args.port))
        except OSError as e:
            raise InputError(f"cannot listen on {args.host}:{args.port} ({e.strerror}); pick another --port or --host.") from None


def warmup_line(n: int, of: int, label: str, count: int, seconds: float | None) -> str:
    """The line the warm-up prints as its stage `n` of `of` starts (`seconds` None) and as it ends."""
    if seconds is not None:
        return f"dart_jax: warm-up {n} of {of} done in {seconds:.1f} s"
    return f"dart_jax: warm-up {n} of {of}: {label}, {count} request{'s' * (count > 1)} at once ..."


def warm_up(scheduler, model, *, full: bool, stream=None) -> None:
    """The scheduler's warm-up, saying on `stream` (stderr) which of its stages runs, how far it
    is, and what compiles in it (`CompileNotice`)."""
    stream = stream if stream is not None else sys.stderr

    def on_stage(n: int, of: int, method: str, count: int, seconds: float | None) -> None:
        settle()  # the compile notice's last line first
        print(warmup_line(n, of, scheduler.methods[method], count, seconds), file=stream, flush=True)

    with CompileNotice(stream):
        scheduler.warmup(warmup_ids(model), full=full, on_stage=on_stage)


def serve(args) -> int:
    _check(args)
    model = load_model(args)
    name = args.model_name or ("dart-jax-demo" if args.ckpt is None else str(args.ckpt).rstrip("/"))
    if jax.process_count() > 1:  # python -m dart_jax.launch: process 0 serves, the others follow its steps
        scheduler = SharedScheduler(model, slots=args.slots, max_length=args.max_length)
        if jax.process_index() != 0:
            scheduler.follow()
            return 0
    else:
        scheduler = Scheduler(model, slots=args.slots, max_length=args.max_length)
    signals = _Signals()  # before the scheduler thread runs: from here on no signal interrupts the main thread
    signals.scheduler = scheduler.start()
    try:
        if args.warmup != "none" and signals.received is None:
            warm_up(scheduler, model, full=args.warmup == "full")
        if signals.received is None:
            _run(args, scheduler, name, signals)
    finally:
        signals.done = True
        scheduler.stop(timeout=STOP_WAIT)
    busy = scheduler.running
    print("dart_jax: stopped" + (f" (not waiting for the step in progress: {_what(scheduler)})" if busy else ""),
          file=sys.stderr)
    code = 0 if signals.received is None else 128 + signals.received  # stopped before it served: as a shell says
    if busy:
        # still inside a step (XLA compiling): tearing the interpreter and XLA's runtime down under
        # it aborts the process, so it ends here, its output flushed
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _what(scheduler) -> str:
    compiling = scheduler.compiling()
    return f"compiling {compiling[1]}" if compiling else "a decode step"


def _run(args, scheduler, name: str, signals: _Signals) -> None:
    """Serve until a signal stops uvicorn."""
    app = create_app(scheduler, model_name=name, api_key=args.api_key, max_connections=args.max_connections)
    host = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{host}:{args.port}"
    if not args.no_ui:
        app = mount(app, scheduler, title=f"dart_jax · {name}", api_key=args.api_key)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                            timeout_graceful_shutdown=args.shutdown_timeout + SHUTDOWN_GRACE)
    server = _Server(config)
    server.scheduler, server.cut_after = scheduler, args.shutdown_timeout
    server.url = url + ("" if args.no_ui else "/ui") + f"  (API: {url}/v1)"
    signals.server = server
    try:
        server.run()
    except SystemExit:  # uvicorn exits when it cannot bind
        pass
    if not server.started:
        raise InputError(f"could not listen on {args.host}:{args.port} (in use, or not an address of this machine); "
                         "pick another --port or --host.")


def main(argv=None) -> int:
    args = parse_args(argv)
    if _MISSING is not None:
        print(f"error: serving needs the 'serve' extra ({_MISSING}); install it with "
              "pip install 'dart-jax[serve]'.", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return cli_boundary(lambda: serve(args), prog="dart_jax")


if __name__ == "__main__":
    sys.exit(main())

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
import time

from dart_jax.collector import pause, resume

from .options import WARM_LENGTH, parse_args

# answer --help and bad flags before jax, flax and the model code load (seconds)
if __name__ == "__main__":
    parse_args()

pause()  # the garbage collector waits while jax, flax and transformers load (dart_jax.collector)
import jax  # noqa: E402 (after the check above, on purpose; likewise below)

from dart_jax.api.compiling import CompileNotice, cache_in_use, settle  # noqa: E402
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
resume()


log = logging.getLogger("dart_jax.serve")

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


def warmup_line(n: int, of: int, stage, seconds: float | None) -> str:
    """The line the warm-up prints as its stage `n` of `of` starts (`seconds` None) and as it ends."""
    if seconds is not None:
        return f"dart_jax: warm-up {n} of {of} done in {seconds:.1f} s"
    return f"dart_jax: warm-up {n} of {of}: {stage} ..."


def warm_up(scheduler, model, *, full: bool, length: int = WARM_LENGTH, stream=None) -> threading.Thread:
    """Start the scheduler's warm-up (dart_jax/serve/warmup.py) in a thread, saying on `stream`
    (stderr) which of its stages runs and what compiles in it (`CompileNotice`); return once single
    requests of every method are warm (an error before then is raised here), the thread going on
    with the rest while the server serves (an error then is printed, and the pools admit requests
    as they come)."""
    stream = stream if stream is not None else sys.stderr
    began = time.monotonic()
    ready = threading.Event()
    failed: list[BaseException] = []

    def say(line: str) -> None:
        settle()  # the compile notice's last line first
        print(line, file=stream, flush=True)

    def announce() -> None:
        rest = len(scheduler.progress.stages) - sum(s.ready for s in scheduler.progress.stages)
        say(f"dart_jax: single requests of every method are warm after {time.monotonic() - began:.1f} s"
            + (f"; the other {rest} stage{'s' * (rest > 1)} warm while the server serves (GET /health shows how far)"
               if rest else ""))
        ready.set()

    def run() -> None:
        try:
            with CompileNotice(stream, cache=cache_in_use()):
                scheduler.warmup(warmup_ids(model), full=full, length=length, ready=announce,
                                 on_stage=lambda n, of, stage, seconds: say(warmup_line(n, of, stage, seconds)))
            if ready.is_set() and scheduler.progress.done and scheduler.progress.error is None:
                say(f"dart_jax: warm-up done in {time.monotonic() - began:.1f} s")
        except BaseException as e:  # noqa: BLE001 - raised in the caller before it serves, else told here
            failed.append(e)
            if ready.is_set():
                log.error("the warm-up failed (%s: %s); requests now compile what they need on first use",
                          type(e).__name__, e, exc_info=e)
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="dart_jax-warmup", daemon=True)
    thread.start()
    ready.wait()
    if failed and not scheduler.progress.ready:
        raise failed[0]
    return thread


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
            warm_up(scheduler, model, full=args.warmup == "full", length=args.warmup_length)
        if signals.received is None:
            _run(args, scheduler, name, signals)
    finally:
        signals.done = True
        scheduler.stop(timeout=STOP_WAIT)
    busy = scheduler.running or scheduler.compiling_ahead
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
    if compiling:
        return f"compiling {compiling[1]}"
    return "a decode step" if scheduler.running else "the warm-up's compilation"


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

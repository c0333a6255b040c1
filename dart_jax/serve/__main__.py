"""`python -m dart_jax.serve`: an OpenAI-compatible HTTP API and a chat UI in one process. Its usage
and options are in `dart_jax.serve.options` (parsed before jax loads)."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys

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
# seconds the process waits at exit for the scheduler's step in progress (a compilation may take
# minutes, and its work is of no use to anyone once the answers are cut)
STOP_WAIT = 2.0


class _Server(uvicorn.Server if _MISSING is None else object):
    """uvicorn's server, printing the URL once it listens. At shutdown, requests still running
    shortly before the graceful deadline are ended through the scheduler, so that each stream
    ends with an error event and [DONE] (and a plain request with a 503) rather than a cut
    connection."""

    url = ""
    scheduler = None
    cut_after: float | None = None  # seconds after the shutdown starts (None: just inside uvicorn's deadline)

    async def startup(self, sockets=None):
        await super().startup(sockets)
        if self.started:
            print(f"dart_jax: serving on {self.url}", flush=True)

    async def shutdown(self, sockets=None):
        cutter = None
        timeout = self.config.timeout_graceful_shutdown
        if self.scheduler is not None and timeout is not None:
            async def cut():
                # leave the answers a moment to reach their clients before uvicorn cancels what is left
                after = self.cut_after if self.cut_after is not None else timeout - min(1.0, timeout / 2)
                await asyncio.sleep(max(0.0, after))
                self.scheduler.interrupt(SHUTDOWN_MESSAGE)
            cutter = asyncio.create_task(cut())
        try:
            await super().shutdown(sockets)
        finally:
            if cutter is not None:
                cutter.cancel()


def warmup_ids(model) -> list[int]:
    """The warm-up prompt's ids, raw (no chat template: a base without one serves /v1/completions)."""
    return model.encode(DEMO_PROMPT, chat=False)


def _check(args) -> None:
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must lie in [0, 65535], got {args.port}.")
    if args.slots < 1:
        raise ValueError(f"--slots must be >= 1, got {args.slots}.")
    if args.max_length is not None and args.max_length < 16:
        raise ValueError(f"--max-length must be >= 16, got {args.max_length}.")
    if args.shutdown_timeout < 0:
        raise ValueError(f"--shutdown-timeout must be >= 0, got {args.shutdown_timeout}.")
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
        scheduler.start()
    else:
        scheduler = Scheduler(model, slots=args.slots, max_length=args.max_length).start()
    try:
        if args.warmup != "none":
            warm_up(scheduler, model, full=args.warmup == "full")
        app = create_app(scheduler, model_name=name, api_key=args.api_key)
        host = f"[{args.host}]" if ":" in args.host else args.host
        url = f"http://{host}:{args.port}"
        if not args.no_ui:
            app = mount(app, scheduler, title=f"dart_jax · {name}", api_key=args.api_key)
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                                timeout_graceful_shutdown=args.shutdown_timeout + SHUTDOWN_GRACE)
        server = _Server(config)
        server.scheduler, server.cut_after = scheduler, args.shutdown_timeout
        server.url = url + ("" if args.no_ui else "/ui") + f"  (API: {url}/v1)"
        # uvicorn finishes running requests on SIGINT/SIGTERM, then raises the signal again: end quietly then
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
        try:
            server.run()
        except SystemExit:  # uvicorn exits when it cannot bind
            pass
        if not server.started:
            raise InputError(f"could not listen on {args.host}:{args.port} (in use, or not an address of this machine); "
                          "pick another --port or --host.")
    finally:
        scheduler.stop(timeout=STOP_WAIT)
    print("dart_jax: stopped", file=sys.stderr)
    if scheduler.running:
        # still inside a step (XLA compiling): tearing the interpreter and XLA's runtime down under
        # it aborts the process, so it ends here, its output flushed
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


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

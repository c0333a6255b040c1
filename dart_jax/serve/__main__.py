"""Serve a DART model: an OpenAI-compatible HTTP API and a chat UI in one process.

    python -m dart_jax.serve                                   # the embedded demo model, offline
    python -m dart_jax.serve --ckpt fvliang/qwen4b-dart --small-ngram --port 8000
    python -m dart_jax.serve --no-ui --api-key "$KEY"          # the API alone, behind a bearer key

The API is at http://HOST:PORT/v1 (GET /v1/models, POST /v1/chat/completions, POST
/v1/completions, streaming or not); the UI at http://HOST:PORT/ui. Concurrent requests share a
pool of --slots sequences (continuous batching). The server compiles its shapes before it accepts
requests, prints its URL when ready, and stops cleanly on Ctrl-C or SIGTERM: running requests
finish, or after --shutdown-timeout seconds end with an error (a stream: an error event and [DONE]).
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys

import jax

from dart_jax.api.generate import DEMO_PROMPT, add_model_options, load_model
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


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dart_jax.serve", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(ap)
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--no-ui", action="store_true", help="serve the API only")
    ap.add_argument("--api-key", default=os.environ.get("DART_JAX_API_KEY"),
                    help="require 'Authorization: Bearer KEY' on /v1, /docs and /openapi.json, and a login with the "
                         "key as the password on /ui (default: $DART_JAX_API_KEY; unset = open)")
    ap.add_argument("--model-name", help="the model id clients send (default: the head's folder or hub id; "
                                         "'dart-jax-demo' for the demo)")
    ap.add_argument("--slots", type=int, default=8, help="sequences decoded together per method (the pool size)")
    ap.add_argument("--max-length", type=int, default=None,
                    help="context per request: prompt + answer tokens (default: the model's max_position_embeddings, "
                         "at most 2048)")
    ap.add_argument("--warmup", choices=["full", "quick", "none"], default="full",
                    help="compile before accepting requests: 'full' every pool size up to --slots (1, 2, 4, … "
                         "requests at once), 'quick' one request per method (more concurrent requests compile on "
                         "first use), 'none' nothing (the first requests wait for compilation)")
    ap.add_argument("--shutdown-timeout", type=float, default=10.0,
                    help="seconds that running requests get to finish at shutdown")
    return ap.parse_args(argv)


SHUTDOWN_MESSAGE = "the server is shutting down; this answer was cut short, send the request again later."
SHUTDOWN_GRACE = 2.0  # seconds uvicorn waits past --shutdown-timeout, for the cut answers to reach their clients


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
            print(f"dart_jax: compiling ({args.warmup} warm-up) ...", file=sys.stderr, flush=True)
            scheduler.warmup(warmup_ids(model), full=args.warmup == "full")
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
        scheduler.stop()
    print("dart_jax: stopped", file=sys.stderr)
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

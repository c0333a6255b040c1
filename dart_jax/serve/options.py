"""Serve a DART model: an OpenAI-compatible HTTP API and a chat UI in one process.

    python -m dart_jax.serve                                   # the SmolLM2 demo (downloaded once, then cached)
    python -m dart_jax.serve --demo tiny                       # the embedded toy, offline
    python -m dart_jax.serve --ckpt fvliang/qwen4b-dart --small-ngram --port 8000
    python -m dart_jax.serve --no-ui --api-key "$KEY"          # the API alone, behind a bearer key

The API is at http://HOST:PORT/v1 (GET /v1/models, POST /v1/chat/completions, POST
/v1/completions, streaming or not); the UI at http://HOST:PORT/ui. Concurrent requests share a
pool of --slots sequences (continuous batching). The server compiles what one request of each
method runs before it accepts requests and prints its URL then; the rest of its warm-up (longer
prompts, more requests at once) compiles while it serves (GET /health shows how far). It stops
cleanly on Ctrl-C, SIGTERM or SIGHUP (also during the warm-up): running requests finish, or after
--shutdown-timeout seconds (at once on a second Ctrl-C) end with an error (a stream: an error
event and [DONE]).
"""
from __future__ import annotations

# This module (the --help text above) holds the command's options, and only argparse and what the
# model options need: a bad flag or value is refused, and --help answered, before jax loads.

import argparse
import math
import os

from dart_jax.api.options import HelpFormatter, add_model_options

MIN_LENGTH = 16  # the smallest --max-length: a prompt and an answer of a few tokens
MAX_CONNECTIONS = 256  # requests served at once by default: well under the usual limit of 1024 open files
WARM_LENGTH = 512  # tokens of prompt and answer the warm-up covers by default (dart_jax/serve/warmup.py)
SERVE_MIN_BUCKET = 64  # the server's --min-bucket: prompts prefilled in chunks of 64 tokens


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0, got {text!r}")
    return value


def _at_least(low: int):
    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value
    return check


def _name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("the model id is empty; pass a name, or leave --model-name out for the default")
    return text


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dart_jax.serve", description=__doc__, formatter_class=HelpFormatter)
    add_model_options(ap)
    # a chat turn with its template is rarely under 33 tokens: chunks of 64 prefill it in one call,
    # and a longer prompt in half the calls of 32, for a few more padded tokens
    ap.set_defaults(min_bucket=SERVE_MIN_BUCKET)
    # "%(default).0s" prints nothing: argparse then adds no "(default: …)" where the text says it
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1: this machine only)")
    ap.add_argument("--port", type=int, default=8000, help="TCP port")
    ap.add_argument("--no-ui", action="store_true", help="serve the API only")
    ap.add_argument("--api-key", default=os.environ.get("DART_JAX_API_KEY"),
                    help="require 'Authorization: Bearer KEY' on /v1, /docs and /openapi.json, and a login with the "
                         "key as the password on every route of /ui but its login form and static files (default: "
                         "$DART_JAX_API_KEY; unset = open)%(default).0s")
    ap.add_argument("--model-name", type=_name, help="the model id clients send (default: the head's folder or hub id; "
                                                     "'dart-jax-demo' for the demo)%(default).0s")
    ap.add_argument("--slots", type=int, default=8, help="sequences decoded together per method (the pool size)")
    ap.add_argument("--max-length", type=_at_least(MIN_LENGTH), default=None,
                    help=f"context per request: prompt + answer tokens, at least {MIN_LENGTH} (default: the model's "
                         "max_position_embeddings, at most 2048)%(default).0s")
    ap.add_argument("--max-connections", type=_at_least(1), default=MAX_CONNECTIONS,
                    help="requests served at once, streams and the UI's included; one more gets a 503 at once")
    ap.add_argument("--warmup", choices=["full", "quick", "none"], default="full",
                    help="compile ahead: one request of each method first (the server accepts requests once these "
                         "are warm), then with 'full' 2, 4, … --slots requests at once while it serves (a pool "
                         "takes only as many requests at once as are warm meanwhile; GET /health shows how far); "
                         "'quick' one request at a time only (more at once compile on first use); 'none' nothing "
                         "(the first requests wait for compilation)")
    ap.add_argument("--warmup-length", type=_at_least(2), default=WARM_LENGTH,
                    help="prompts and sequences (prompt + answer) of up to this many tokens compile nothing once "
                         "the warm-up has ended (at most --max-length); a longer one compiles its programs on "
                         "first use")
    ap.add_argument("--shutdown-timeout", type=_seconds, default=10.0,
                    help="seconds that running requests get to finish at shutdown (a finite number >= 0)")
    return ap.parse_args(argv)

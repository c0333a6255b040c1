"""Serve a DART model: an OpenAI-compatible HTTP API and a chat UI in one process.

    python -m dart_jax.serve                                   # the SmolLM2 demo (downloaded once, then cached)
    python -m dart_jax.serve --demo tiny                       # the embedded toy, offline
    python -m dart_jax.serve --ckpt fvliang/qwen4b-dart --small-ngram --port 8000
    python -m dart_jax.serve --no-ui --api-key "$KEY"          # the API alone, behind a bearer key

The API is at http://HOST:PORT/v1 (GET /v1/models, POST /v1/chat/completions, POST
/v1/completions, streaming or not); the UI at http://HOST:PORT/ui. Concurrent requests share a
pool of --slots sequences (continuous batching). The server compiles its shapes before it accepts
requests, prints its URL when ready, and stops cleanly on Ctrl-C or SIGTERM: running requests
finish, or after --shutdown-timeout seconds end with an error (a stream: an error event and [DONE]).
"""
from __future__ import annotations

# This module (the --help text above) holds the command's options, and only argparse and what the
# model options need: a bad flag or value is refused, and --help answered, before jax loads.

import argparse
import os

from dart_jax.api.options import add_model_options


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dart_jax.serve", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(ap)
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    ap.add_argument("--no-ui", action="store_true", help="serve the API only")
    ap.add_argument("--api-key", default=os.environ.get("DART_JAX_API_KEY"),
                    help="require 'Authorization: Bearer KEY' on /v1, /docs and /openapi.json, and a login with the "
                         "key as the password on /ui (default: $DART_JAX_API_KEY; unset = open)")
    ap.add_argument("--model-name", help="the model id clients send (default: the head's folder or hub id; "
                                         "'dart-jax-demo' for the demo)")
    ap.add_argument("--slots", type=int, default=8, help="sequences decoded together per method (the pool size; default 8)")
    ap.add_argument("--max-length", type=int, default=None,
                    help="context per request: prompt + answer tokens (default: the model's max_position_embeddings, "
                         "at most 2048)")
    ap.add_argument("--warmup", choices=["full", "quick", "none"], default="full",
                    help="compile before accepting requests: 'full' every pool size up to --slots (1, 2, 4, … "
                         "requests at once), 'quick' one request per method (more concurrent requests compile on "
                         "first use), 'none' nothing (the first requests wait for compilation)")
    ap.add_argument("--shutdown-timeout", type=float, default=10.0,
                    help="seconds that running requests get to finish at shutdown (default 10)")
    return ap.parse_args(argv)

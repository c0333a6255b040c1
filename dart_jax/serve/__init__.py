"""Serving: an OpenAI-compatible HTTP API and a chat UI over one scheduler (`python -m dart_jax.serve`).

Needs the `serve` extra (FastAPI, uvicorn, Gradio): pip install 'dart-jax[serve]'.
"""

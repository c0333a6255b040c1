"""Token ids → text as they stream: the one streaming detokenizer is `dart_jax.api.text.StopText`
(incomplete characters and the start of a stop string held back); `TextStream` is its former name
here, kept for code that imports it from this module."""
from __future__ import annotations

from dart_jax.api.text import StopText

TextStream = StopText

__all__ = ["StopText", "TextStream"]

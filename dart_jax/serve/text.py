"""Token ids → text as they stream: incremental detokenization and stop strings."""
from __future__ import annotations

from typing import Callable, Sequence


class TextStream:
    """Turns a growing list of token ids into text pieces that are safe to show.

    Text is held back while it ends in an incomplete character (the tokenizer's U+FFFD) or in the
    beginning of a stop string; once a stop string appears, the text before it is the last piece
    and `stopped` is set (the stop string itself is not shown, as in OpenAI's API)."""

    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = ()):
        self.decode = decode
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.text = ""  # what has been shown
        self._full = ""
        self.stopped = False

    def feed(self, ids: Sequence[int]) -> str:
        """Add token ids; returns the new text to show (maybe empty)."""
        if self.stopped:
            return ""
        self.ids.extend(int(t) for t in ids)
        full = self._full = self.decode(self.ids)
        shown = len(self.text)
        if not full.startswith(self.text):  # the tokenizer rewrote shown text: show nothing new until it settles
            return ""
        if self.stop:
            longest = max(len(s) for s in self.stop)
            start = max(shown - longest + 1, 0)
            hits = [i for i in (full.find(s, start) for s in self.stop) if i >= 0]
            if hits:
                self.stopped = True
                return self._show(full[:max(min(hits), shown)])
        end = len(full)
        while end > shown and full[end - 1] == "\ufffd":
            end -= 1
        held = max((k for s in self.stop for k in range(1, len(s)) if full[:end].endswith(s[:k])), default=0)
        return self._show(full[:max(end - held, shown)])

    def finish(self) -> str:
        """The text still held back once no more tokens come (nothing after a stop string)."""
        if self.stopped or not self._full.startswith(self.text):
            return ""
        return self._show(self._full)

    def _show(self, upto: str) -> str:
        piece = upto[len(self.text):]
        self.text = upto
        return piece

"""Generated ids → text for users: stop strings and stop ids, text safe to show while streaming,
and Qwen3's thinking part split from the answer."""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

from dart_jax.errors import InputError, check_text

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def check_stops(stop, stop_token_ids, vocab_size: int) -> tuple[list[str], frozenset[int]]:
    """`stop` (a string or strings) and `stop_token_ids` as checked values; empty strings are an error
    (they would match at once), as are strings that are not valid Unicode and ids outside the vocabulary."""
    if stop is not None and not isinstance(stop, (str, list, tuple)):
        raise InputError(f"stop must be a string or a list of strings, got {type(stop).__name__} {stop!r:.40}.")
    if stop_token_ids is not None and not isinstance(stop_token_ids, (list, tuple)):
        raise InputError(f"stop_token_ids must be a list of token ids, got {type(stop_token_ids).__name__} "
                         f"{stop_token_ids!r:.40}; wrap one id in a list: [{stop_token_ids!r:.20}].")
    strings = [stop] if isinstance(stop, str) else list(stop or ())
    bad = [s for s in strings if not isinstance(s, str) or not s]
    if bad:
        raise InputError(f"stop strings must be non-empty strings, got {bad[0]!r}.")
    for i, s in enumerate(strings):
        check_text(s, "stop" if isinstance(stop, str) else f"stop string {i}")
    ids = list(stop_token_ids or ())
    wrong = [t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size]
    if wrong:
        raise InputError(f"stop_token_ids must be integer token ids in [0, {vocab_size}), got {wrong[0]!r}.")
    return strings, frozenset(ids)


class StopText:
    """The one streaming detokenizer: the Python API (`generate`, `stream`) and the server (HTTP API
    and UI) use it; `dart_jax.serve.text.TextStream` is its former name. Follows one generation's
    ids: stops at a stop id (kept, as an EOS is) or at the token that completes a stop string (the
    string itself is not in the text, as in OpenAI's API), and hands out text that is safe to show:
    held back while it ends in an incomplete character (U+FFFD) or in the beginning of a stop string.

    After `feed`, `ids` holds the ids that count (cut after the stopping token) and `stopped` says
    whether a stop string or stop id ended the generation."""

    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = (),
                 stop_ids: Iterable[int] = ()):
        self.decode, self.stop, self.stop_ids = decode, [s for s in stop if s], frozenset(stop_ids)
        self.ids: list[int] = []
        self.shown = ""  # text handed out so far
        self.text = ""  # the whole text of `ids`, cut before a stop string once one appeared
        self.stopped = False

    def feed(self, new_ids: Sequence[int]) -> str:
        """Add the ids of one step; returns the new text to show (maybe empty)."""
        if self.stopped:
            return ""
        new = [int(t) for t in new_ids]
        for j, t in enumerate(new):
            if t in self.stop_ids:
                new, self.stopped = new[:j + 1], True
                break
        before = len(self.ids)
        self.ids.extend(new)
        full = self.decode(self.ids)
        cut = self._stop_string_at(full)
        if cut is not None:
            # the first token after which the stop string is in the text: the ids end there
            for n in range(before + 1, len(self.ids) + 1):
                if self._stop_string_at(self.decode(self.ids[:n])) is not None:
                    del self.ids[n:]
                    break
            self.stopped, self.text = True, full[:cut]
            return self._show(self.text)
        self.text = full
        if self.stopped:
            return self._show(full)
        end = len(full)
        while end > 0 and full[end - 1] == "\ufffd":
            end -= 1
        held = max((k for s in self.stop for k in range(1, len(s)) if full[:end].endswith(s[:k])), default=0)
        return self._show(full[:end - held])

    def finish(self) -> str:
        """The text still held back once no more ids come."""
        return self._show(self.text)

    def _stop_string_at(self, text: str) -> int | None:
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        return min(hits) if hits else None

    def _show(self, upto: str) -> str:
        if not upto.startswith(self.shown):  # the tokenizer rewrote shown text: show nothing new until it settles
            return ""
        piece, self.shown = upto[len(self.shown):], upto
        return piece


def split_thinking(text: str) -> tuple[str | None, str]:
    """(thinking, answer) of a Qwen3 reply: the part inside <think>…</think> and what follows it.
    No thinking block: (None, text). An unfinished block (cut by the length limit): (its text, "")."""
    head = text.lstrip()
    if THINK_CLOSE in text:
        thinking, answer = text.split(THINK_CLOSE, 1)
        thinking = thinking.lstrip()
        if thinking.startswith(THINK_OPEN):
            thinking = thinking[len(THINK_OPEN):]
        return thinking.strip(), answer.lstrip()
    if head.startswith(THINK_OPEN):
        return head[len(THINK_OPEN):].strip(), ""
    return None, text

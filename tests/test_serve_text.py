"""Streaming detokenization with stop strings (dart_jax.serve.text), against a plain restatement:
the shown text is the full text cut before the earliest stop string, and no piece shown before
the end ever holds text past that cut."""
from __future__ import annotations

import random

from dart_jax.serve.text import TextStream

PIECES = ["a", "b", "ab", "ba", " ", "\n", "é", "END", "E", "N", "D", "xyz"]


def cut(text: str, stops: list[str]) -> tuple[str, bool]:
    hits = [text.find(s) for s in stops if s in text]
    return (text[:min(hits)], True) if hits else (text, False)


def test_stream_pieces_equal_the_text_cut_at_the_first_stop():
    rng = random.Random(0)
    for trial in range(3000):
        vocab = PIECES
        ids = [rng.randrange(len(vocab)) for _ in range(rng.randrange(1, 30))]
        stops = rng.sample(["END", "ab a", "\n\n", "zz", "b b", "é"], rng.randrange(0, 3))
        stream = TextStream(lambda xs: "".join(vocab[i] for i in xs), stops)
        shown, i = "", 0
        full = "".join(vocab[t] for t in ids)
        want, stopped = cut(full, stops)
        while i < len(ids) and not stream.stopped:
            n = rng.randrange(1, 4)
            shown += stream.feed(ids[i:i + n])
            i += n
            assert want.startswith(shown), (trial, shown, want)  # never past the cut, never a stop string
        shown += stream.finish()
        if stopped:
            assert stream.stopped and shown == want
        else:
            assert shown == full


def test_an_incomplete_character_is_held_back():
    # a byte-level tokenizer decodes half a character as U+FFFD until its second byte comes
    table = {0: "x", 1: "\ufffd", 2: "é"}

    def decode(ids):
        text = "".join(table[i] for i in ids)
        return text.replace("\ufffd" + "é", "é")
    stream = TextStream(decode)
    assert stream.feed([0]) == "x"
    assert stream.feed([1]) == ""
    assert stream.feed([2]) == "é"
    assert stream.finish() == ""

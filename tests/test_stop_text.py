"""The one streaming detokenizer (`dart_jax.api.text.StopText`, also the server's `TextStream`)
against an independent oracle: a real byte-level BPE tokenizer's `decode` of the whole sequence,
cut before the first stop string. Tricky cases: characters of several bytes split across tokens,
stop strings spanning tokens, a stop string at the very start and at the very end."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from dart_jax.api.text import StopText
from dart_jax.serve import text as serve_text

TOKENIZER = Path(__file__).resolve().parent.parent / "dart_jax" / "demo" / "base" / "tokenizer.json"


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_file(str(TOKENIZER))


def oracle(tok, ids, stops):
    """(text, ids that count, stopped): the whole decode cut before the earliest stop string, and
    the ids up to the first token whose prefix decodes to a text holding a stop string."""
    full = tok.decode(ids)
    hits = [full.find(s) for s in stops if s in full]
    if not hits:
        return full, list(ids), False
    n = next(n for n in range(1, len(ids) + 1) if any(s in tok.decode(ids[:n]) for s in stops))
    return full[:min(hits)], list(ids[:n]), True


def stream(tok, ids, stops, chunks):
    follow = StopText(lambda xs: tok.decode(xs), stops)
    pieces, i = [], 0
    for n in chunks:
        if follow.stopped or i >= len(ids):
            break
        pieces.append(follow.feed(ids[i:i + n]))
        i += n
    while i < len(ids) and not follow.stopped:
        pieces.append(follow.feed(ids[i:i + 1]))
        i += 1
    pieces.append(follow.finish())
    return follow, pieces


def check(tok, text, stops, chunks=()):
    ids = tok.encode(text).ids
    want, want_ids, want_stopped = oracle(tok, ids, stops)
    follow, pieces = stream(tok, ids, stops, chunks)
    shown = ""
    for piece in pieces[:-1]:
        shown += piece
        assert want.startswith(shown), (text, stops, shown, want)  # never past the cut, never a stop string
        assert "\ufffd" not in shown  # never half a character
    assert shown + pieces[-1] == want
    assert follow.stopped == want_stopped and follow.text == want and follow.ids == want_ids
    return ids, pieces


def test_multi_byte_characters_split_across_tokens_are_held_until_complete(tok):
    text = "héllo 日本語 → ok 🙂"
    ids = tok.encode(text).ids
    assert any("\ufffd" in tok.decode(ids[:n]) for n in range(1, len(ids)))  # the case is really there
    _, pieces = check(tok, text, [], chunks=[1] * len(ids))
    assert all("\ufffd" not in p for p in pieces)


def test_a_stop_string_spanning_tokens_and_characters(tok):
    text = "say 日本語 END then more"
    ids = tok.encode(text).ids
    assert len(ids) > 10
    check(tok, text, ["本語 E"], chunks=[1] * len(ids))
    check(tok, text, ["N"], chunks=[3, 2, 5])


def test_a_stop_string_at_the_very_start_and_at_the_very_end(tok):
    _, pieces = check(tok, "END and the rest", ["END"], chunks=[1])
    assert "".join(pieces) == ""
    ids, pieces = check(tok, "all of it, then END", ["END"], chunks=[1] * 40)
    assert "".join(pieces) == "all of it, then "
    assert "".join(check(tok, "just 語", ["語"])[1]) == "just "  # the last character, split over tokens
    assert "".join(check(tok, "日", ["日"])[1]) == ""


def test_random_streams_match_the_oracle(tok):
    rng = random.Random(1)
    alphabet = ["a", "b", " ", "é", "日本", "語", "🙂", "END", "\n", "x", "→"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 25)))
        stops = rng.sample(["END", "b é", "\n\n", "語🙂", "🙂", "x a", "zz"], rng.randrange(0, 3))
        check(tok, text, stops, chunks=[rng.randrange(1, 4) for _ in range(30)])


def test_stop_ids_are_kept_and_end_the_stream(tok):
    ids = tok.encode("abc def").ids
    follow = StopText(lambda xs: tok.decode(xs), [], [ids[2]])
    shown = follow.feed(ids[:2]) + follow.feed(ids[2:]) + follow.finish()
    assert follow.stopped and follow.ids == ids[:3] and shown == tok.decode(ids[:3])


def test_the_server_uses_the_same_detokenizer():
    assert serve_text.TextStream is StopText

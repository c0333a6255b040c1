"""`python -m dart_jax.generate` end to end on a local tiny checkpoint, and its input errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dart_jax.api import generate
from dart_jax.bench.tiny import make_tiny_setup


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    # the same tiny configuration as test_engine, so that an in-process run reuses its executables
    return make_tiny_setup(tmp_path_factory.mktemp("cli"), vocab_size=32, draft_length=3, shuffle_d2t=True,
                           num_hidden_layers=4, seed=1)


def test_cli_json_with_compare_ar(ckpt, capsys):
    base, head, trie = ckpt
    code = generate.main(["--ckpt", str(head), "--base", str(base), "--ngram", str(trie), "--prompt", "hello",
                          "--max-new-tokens", "12", "--compare-ar", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    report = json.loads(out)
    assert report["greedy_match"] is True
    assert report["token_ids"] == report["ar"]["token_ids"] and 1 <= len(report["token_ids"]) <= 12
    assert report["stats"]["new_tokens"] == len(report["token_ids"])
    assert report["stats"]["tau"] > 0 and report["speedup"] > 0
    assert sum(report["accept_lengths"]) + 1 >= len(report["token_ids"])


def test_cli_compare_ar_streams_the_answer_before_plain_decoding_runs(ckpt, monkeypatch):
    """--compare-ar's plain decoding (its warm-up compiles for seconds) comes after the DART answer
    has started, and the timed plain run after a warm-up of its own."""
    base, head, trie = ckpt
    events = []
    load = generate.load_model

    def recording_load(args):
        model = load(args)
        plain = model.generate_ar

        def generate_ar(*a, **kw):
            events.append(("plain", kw["settings"].max_new_tokens))
            return plain(*a, **kw)
        monkeypatch.setattr(model, "generate_ar", generate_ar)
        return model

    class Out:
        def write(self, text):
            if text.strip():
                events.append(("out", None))

        def flush(self):
            pass

    monkeypatch.setattr(generate, "load_model", recording_load)
    args = generate.parse_args(["--ckpt", str(head), "--base", str(base), "--ngram", str(trie), "--prompt", "hello",
                                "--max-new-tokens", "12", "--compare-ar"])
    report = generate.run(args, out=Out())
    plain = [i for i, (kind, _) in enumerate(events) if kind == "plain"]
    assert events[0] == ("out", None) and [events[i][1] for i in plain] == [2, 12]  # the warm-up, then the timed run
    assert report["greedy_match"] is True and report["ar"]["stats"]["compile_s"] < 0.05


def test_cli_answer_starts_before_the_decode_step_is_traced(ckpt, monkeypatch):
    """The answer's first token waits for the prefill alone: no warm-up answer runs before it, so the
    first piece is written before JAX first traces the DART decode step (`_step`, which a warm-up
    would trace first), and the CLI calls no other generation before its stream. Oracle: the order
    of JAX's own trace events and of the written pieces; the answer is plain decoding's."""
    import jax
    from dart_jax.api.model import DartModel

    base, head, trie = ckpt
    events = []

    def on_duration(event, seconds, **kwargs):
        if event == "/jax/core/compile/jaxpr_trace_duration":
            events.append(("trace", str(kwargs.get("fun_name", ""))))

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    calls = []
    for name in ("generate", "generate_ar", "generate_many"):
        original = getattr(DartModel, name)

        def spy(self, *a, _original=original, _name=name, **kw):
            calls.append(_name)
            return _original(self, *a, **kw)
        monkeypatch.setattr(DartModel, name, spy)

    class Out:
        text = ""

        def write(self, piece):
            if not piece.startswith("[prompt] ") and piece:
                events.append(("out", piece))
                self.text += piece

        def flush(self):
            pass

    out = Out()
    try:
        report = generate.run(generate.parse_args(["--ckpt", str(head), "--base", str(base), "--ngram", str(trie),
                                                   "--prompt", "hello", "--max-new-tokens", "12",
                                                   "--keep", "6"]), out=out)  # a tree size no other test here compiles
    finally:
        jax.monitoring.unregister_event_duration_listener(on_duration)
    first_out = next(i for i, (kind, _) in enumerate(events) if kind == "out")
    step_traces = [i for i, event in enumerate(events) if event == ("trace", "_step")]
    assert step_traces and first_out < step_traces[0], events
    assert calls == []  # nothing but the stream answered
    plain = DartModel.from_pretrained(base, head, trie).generate_ar("hello", max_new_tokens=12)
    assert report["token_ids"] == plain.token_ids


def test_cli_streams_text_and_summary(ckpt, capsys):
    base, head, trie = ckpt
    code = generate.main(["--ckpt", str(head), "--base", str(base), "--ngram", "none", "--prompt", "hello",
                          "--max-new-tokens", "6", "--no-warmup"])
    out = capsys.readouterr().out
    assert code == 0
    assert "[DART]" in out and "tau" in out and "tokens/s" in out


@pytest.mark.parametrize("flags,message", [
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "0"], "top-p"),
    (["--top-p", "1.5"], "top-p"),
    (["--top-k", "-2"], "top-k"),
    (["--max-new-tokens", "0"], "max-new-tokens"),
    (["--max-length", "5"], "max-length"),
    (["--keep", "0"], "keep"),
])
def test_cli_bad_inputs(ckpt, capsys, flags, message):
    base, head, trie = ckpt
    try:
        code = generate.main(["--ckpt", str(head), "--base", str(base), "--ngram", str(trie), "--prompt",
                              "hello there", *flags])
    except SystemExit as e:  # refused by argparse itself (a bound it checks while parsing)
        code = e.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_cli_missing_files(ckpt, tmp_path, capsys):
    base, head, trie = ckpt
    assert generate.main(["--ckpt", str(tmp_path / "nohead"), "--base", str(base), "--ngram", str(trie)]) == 2
    assert "nohead" in capsys.readouterr().err
    assert generate.main(["--ckpt", str(head), "--base", str(base), "--ngram", str(tmp_path / "none.trie")]) == 2
    assert "none.trie" in capsys.readouterr().err
    # without --base the base is looked up from the published pairs: a missing local head must
    # still be reported as missing, not as an unknown base
    assert generate.main(["--ckpt", str(tmp_path / "nohead"), "--ngram", str(trie)]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_cli_demo_assets_missing_is_a_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(generate, "DEMO", tmp_path)
    assert generate.main([]) == 2
    err = capsys.readouterr().err
    assert "demo model is incomplete" in err and "--ckpt" in err


def test_cli_help():
    out = subprocess.run([sys.executable, "-m", "dart_jax.generate", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "--compare-ar" in out.stdout and "--small-ngram" in out.stdout


def test_cli_prompts_file_in_batches(ckpt, tmp_path, capsys):
    """--prompts/--output: every line decoded (two batches), results in input order, each equal to
    plain autoregressive decoding of that prompt with its own settings."""
    from dart_jax import DartModel

    base, head, trie = ckpt
    lines = [{"prompt": "hello", "id": "a"}, {"prompt": [5, 9, 14, 3, 27], "max_new_tokens": 3},
             {"messages": [{"role": "user", "content": "hi"}], "seed": 4}]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    out = tmp_path / "out.jsonl"
    # a fixed tree size: keep="auto" would time every size for both batch shapes (tested in test_engine)
    code = generate.main(["--ckpt", str(head), "--base", str(base), "--ngram", str(trie), "--prompts", str(src),
                          "--output", str(out), "--batch-size", "2", "--max-new-tokens", "8", "--keep", "16"])
    assert code == 0, capsys.readouterr().err
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in results] == ["a", 2, 3]
    model = DartModel.from_pretrained(base, head, trie)
    for line, result in zip(lines, results):
        alone = model.generate_ar(line.get("prompt", line.get("messages")), max_new_tokens=line.get("max_new_tokens", 8))
        assert result["token_ids"] == alone.token_ids and result["text"] == alone.text
        assert result["finish_reason"] == alone.finish_reason


@pytest.mark.parametrize("content,message", [
    ('{"prompt": "x", "temperature": -1}', "in.jsonl:1: temperature"),
    ('{"prompt": "x"}\n{"text": "y"}', "in.jsonl:2: expected an object with exactly one of"),
    ('{"prompt": "x", "colour": 1}', "unknown field"),
    ('{"prompt": "x", "max_new_tokens": "3"}', "max_new_tokens must be an integer"),
    ("", "holds no prompts"),
    ('{"prompt": [1, 999]}', "prompt 1"),
])
def test_cli_prompts_file_errors(ckpt, tmp_path, capsys, content, message):
    base, head, trie = ckpt
    src = tmp_path / "in.jsonl"
    src.write_text(content)
    code = generate.main(["--ckpt", str(head), "--base", str(base), "--ngram", str(trie), "--prompts", str(src),
                          "--output", str(tmp_path / "out.jsonl")])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()

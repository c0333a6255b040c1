"""What users of `DartModel` and `python -m dart_jax.generate` expect: stop strings and stop ids,
finish reasons, the max_length notice, messages through the chat template, Qwen3's thinking
switch, the reference's names, the tree-size bound, figures without compilation, the compile
notice and cache. Oracles: plain decoding (`generate_ar`) cut by hand, transformers' own
`apply_chat_template`, and JAX's compilation events."""
from __future__ import annotations

import io
import json
import os
import re
import stat
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from transformers import AutoTokenizer

from dart_jax.api import generate
from dart_jax.api.compiling import CompileNotice, CompileTimer, default_cache_dir, holding_notices
from dart_jax.api.model import DartModel, max_tree_nodes
from dart_jax.api.text import StopText, split_thinking
from dart_jax.bench.tiny import make_tiny_setup
from dart_jax.convert import save_dart_head
from dart_jax.convert.hub import resolve
from dart_jax.errors import InputError, MissingFileError
from dart_jax.ngram import TreeSettings

QWEN3_LIKE_TEMPLATE = (  # the part of Qwen3's template that matters here: the thinking switch
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
# short turns: with the tiny character-level tokenizer the conversation stays in one prompt bucket (64)
MESSAGES = [{"role": "system", "content": "b"}, {"role": "user", "content": "a"},
            {"role": "assistant", "content": "c"}, {"role": "user", "content": "f"}]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    # test_generate_cli's tiny configuration (so that a worker running both reuses executables)
    return make_tiny_setup(tmp_path_factory.mktemp("usability"), vocab_size=32, draft_length=3, shuffle_d2t=True,
                           num_hidden_layers=4, seed=1)


@pytest.fixture(scope="module")
def model(ckpt):
    base, head, trie = ckpt
    return DartModel.from_pretrained(base, head, trie, keep=16)  # one tree size: one compiled step


@pytest.fixture(scope="module")
def plain(model):
    """A plain-decoding answer long enough to stop inside, with no EOS before its end."""
    result = model.generate_ar("hello", max_new_tokens=24)
    assert len(result.token_ids) >= 12 and result.finish_reason == "length"
    return result


def test_stop_string_cuts_where_plain_decoding_first_shows_it(model, plain):
    stop = plain.text[6:8]
    first = plain.text.find(stop)
    cut = next(n for n in range(1, len(plain.token_ids) + 1) if stop in model.decode(plain.token_ids[:n]))
    for result in (model.generate("hello", max_new_tokens=24, stop=[stop, "never seen"]),
                   model.generate_ar("hello", max_new_tokens=24, stop=stop)):
        assert result.finish_reason == "stop"
        assert result.text == plain.text[:first]
        assert result.token_ids == plain.token_ids[:cut]


def test_stop_ids_are_kept_like_an_eos(model, plain):
    stop_id = plain.token_ids[5]
    j = plain.token_ids.index(stop_id)
    result = model.generate("hello", max_new_tokens=24, stop_token_ids=[stop_id])
    assert result.finish_reason == "stop" and result.token_ids == plain.token_ids[:j + 1]


def test_a_batch_stops_each_sequence_as_it_would_alone(model, plain):
    stop = plain.text[6:8]
    alone = model.generate("hello", max_new_tokens=24, stop=stop)
    results = model.generate(["hello", [{"role": "user", "content": "hello"}], "hello"], max_new_tokens=24,
                             stop=stop, batch_size=1)  # one slot: the shapes of a single generation
    for r in results:
        assert (r.token_ids, r.text, r.finish_reason) == (alone.token_ids, alone.text, "stop")


def test_streamed_pieces_never_show_the_stop_string(model, plain):
    stop = plain.text[6:9]
    sink = []
    pieces = [piece for piece, _ in model.stream("hello", max_new_tokens=24, stop=stop, result=sink)]
    assert "".join(pieces) == sink[0].text == plain.text[:plain.text.find(stop)]
    assert sink[0].finish_reason == "stop"


def test_stop_text_holds_back_a_possible_stop_string():
    words = {1: "ab", 2: "c", 3: "x", 4: "d"}
    follow = StopText(lambda ids: "".join(words[i] for i in ids), ["cd"])
    assert follow.feed([1]) == "ab" and follow.feed([2]) == "" and follow.feed([3]) == "cx"
    assert follow.feed([2, 4, 1]) == "" and follow.stopped and follow.ids == [1, 2, 3, 2, 4] and follow.text == "abcx"


def test_finish_reason_length_and_the_max_length_notice(model):
    prompt = model.encode("hello")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        by_new = model.generate(prompt, max_new_tokens=3, max_length=len(prompt) + 20)
        assert by_new.finish_reason == "length" and len(by_new.token_ids) == 3 and not caught
        by_length = model.generate(prompt, max_new_tokens=50, max_length=len(prompt) + 5)
    assert by_length.finish_reason == "length" and len(by_length.token_ids) == 5
    assert len(caught) == 1 and "max_length" in str(caught[0].message)


def test_messages_go_through_the_chat_template_as_transformers_renders_them(model, ckpt):
    oracle = AutoTokenizer.from_pretrained(str(ckpt[0]))
    expected = oracle.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert model.encode(MESSAGES) == list(expected)
    assert model.generate(MESSAGES, max_new_tokens=4).prompt_ids == list(expected)
    with pytest.raises(ValueError, match="role"):
        model.encode([{"role": "user", "text": "x"}])


def test_thinking_switch_follows_the_template(model, ckpt, tmp_path):
    oracle = AutoTokenizer.from_pretrained(str(ckpt[0]))
    with pytest.raises(InputError, match="enable_thinking"):
        model.encode("hi", enable_thinking=True)  # the tiny template has no switch
    thinking = AutoTokenizer.from_pretrained(str(ckpt[0]))
    thinking.chat_template = QWEN3_LIKE_TEMPLATE
    oracle.chat_template = QWEN3_LIKE_TEMPLATE
    m = DartModel(model.target, model.head, thinking, model.engine.trie, eos_ids=sorted(model.engine.eos_ids))
    assert m.has_thinking_switch and not model.has_thinking_switch
    for on in (True, False):
        expected = oracle.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True,
                                              enable_thinking=on, return_dict=False)
        assert m.encode(MESSAGES, enable_thinking=on) == list(expected)
    assert split_thinking("<think>\nplan it\n</think>\n\nThe answer.") == ("plan it", "The answer.")
    assert split_thinking("<think>\nstill thinking") == ("still thinking", "")
    assert split_thinking("No block.") == (None, "No block.")


def test_reference_names_and_dart_generate(ckpt, model):
    base, head, trie = ckpt
    ported = DartModel.from_pretrained(base_model_name_or_path=base, dart_model_name_or_path=head,
                                       ngram_model_name_or_path=trie, is_small_ngram=False)
    assert ported.head.config == model.head.config and ported.engine.trie.num_nodes == model.engine.trie.num_nodes
    assert ported.get_tokenizer() is ported.tokenizer
    with pytest.raises(InputError, match="base_model_name_or_path"):
        DartModel.from_pretrained(base, head, trie, base_model_name_or_path=base)
    prompt = model.encode("hello")
    expected = model.generate_ar(prompt, max_new_tokens=10, max_length=200).token_ids
    out = model.dart_generate(np.asarray([prompt]), temperature=0.0, top_p=0.0, top_k=0, max_new_token_num=10,
                              max_length=200)
    assert out.shape == (1, len(prompt) + len(expected)) and out.dtype == np.int64
    assert out[0].tolist() == prompt + expected
    assert model.ar_generate([prompt], max_new_token_num=10)[0].tolist() == prompt + expected


def test_tree_size_is_bounded_by_what_the_search_can_fill(ckpt, model, capsys, monkeypatch):
    base, head, trie = ckpt
    rows = model.engine.drafter.max_depth
    most = max_tree_nodes(TreeSettings(), rows)
    assert most == 25 + 20 * 25 * (rows - 1)  # row 0: 25 candidates; each later row: a beam of 20 times 25
    with pytest.raises(InputError, match=f"keep <= {most}"):
        DartModel.from_pretrained(base, head, trie, keep=most + 1)
    off = []
    monkeypatch.setattr(generate, "no_compile_cache", lambda: off.append(True))
    argv = ["--ckpt", str(head), "--base", str(base), "--ngram", str(trie), "--keep", "100000"]
    assert generate.main(argv + ["--no-compile-cache"]) == 2 and off
    err = capsys.readouterr().err
    assert "--keep" in err and "Traceback" not in err
    off.clear()
    assert generate.main(argv) == 2 and not off  # the cache is on by default (tests/test_compile_cache.py)


def test_figures_leave_compilation_out(model):
    odd = DartModel(model.target, model.head, model.tokenizer, model.engine.trie, eos_ids=sorted(model.engine.eos_ids),
                    tree=TreeSettings(keep=5))  # a tree size no other test compiles
    first = odd.generate("hello", max_new_tokens=8)
    second = odd.generate("hello", max_new_tokens=8)
    assert first.stats["compile_s"] > 0 and second.stats["compile_s"] == 0
    assert first.stats["tokens_per_s"] > first.stats["wall_tokens_per_s"]
    assert second.stats["tokens_per_s"] == pytest.approx(second.stats["wall_tokens_per_s"])


def test_compile_timer_and_notice_follow_jax_compilations():
    stream = io.StringIO()
    with CompileNotice(stream, after=0.0, idle=0.0), CompileTimer() as timer:
        jax.jit(lambda x: jnp.sin(x) * 3.25 + 1)(jnp.arange(7.0)).block_until_ready()
        seen = timer.seconds
        jax.jit(lambda x: jnp.sin(x) * 3.25 + 1)  # no call: nothing compiles
    assert seen > 0 and timer.compilations >= 1 and timer.seconds == seen
    # the notice only reports compilations it saw running for `after` seconds; a fast one may slip by
    assert stream.getvalue() == "" or "compil" in stream.getvalue()


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _compiling(name: str, seconds: float) -> None:
    """A compilation of `name` running `seconds` in this thread, as the notices see one (`busy`)."""
    from dart_jax.decoding import compile_time
    compile_time.busy[threading.get_ident()] = (time.monotonic(), name)
    try:
        time.sleep(seconds)
    finally:
        compile_time.busy.pop(threading.get_ident(), None)


def test_notices_keep_quiet_while_an_answer_prints_and_say_afterwards_what_compiled():
    """Outside an answer a compilation shows its notice (updated in place on a terminal); inside
    `holding_notices()` nothing but the answer reaches the terminal, and one line after it says what
    compiled meanwhile. Oracle: the terminal's text, piece by piece."""
    terminal = _Terminal()
    with CompileNotice(terminal, after=0.0, idle=0.0):
        _compiling("jit(_prefill)", 0.8)
        time.sleep(0.6)
        before = terminal.getvalue()
        with holding_notices():
            terminal.write("The answer")
            _compiling("jit(_step)", 0.8)
            time.sleep(0.6)
            terminal.write(" goes on.\n")
            during = terminal.getvalue()[len(before):]
        after = terminal.getvalue()[len(before) + len(during):]
    assert "compiling the DART prefill" in before and before.endswith(" s\n")
    assert "compiled the DART prefill in" in before.splitlines()[-1]
    assert during == "The answer goes on.\n"
    assert re.fullmatch(r"compiled the DART decode step in \d+\.\d s while answering \(the answer's figures leave it "
                        r"out\)\n", after), after


def test_default_cache_dir_honours_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "dart_jax" / "xla"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "dart_jax" / "xla"


def test_the_compile_cache_keeps_executables_in_its_folder(tmp_path):
    # a fresh process: JAX reads the cache setting at its first compilation (the CLIs' load_model
    # turns it on first thing, see test_tree_size_is_bounded_by_what_the_search_can_fill)
    # (a program this small compiles faster than the 0.2 s worth keeping: the threshold is lowered after)
    code = ("from dart_jax.api.compiling import use_compile_cache; import jax, jax.numpy as jnp; "
            "print(use_compile_cache()); jax.config.update('jax_persistent_cache_min_compile_time_secs', 0); "
            "jax.jit(lambda x: jnp.cumsum(x) * 2)(jnp.arange(9.0)).block_until_ready()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "dart_jax" / "xla")
    assert any((tmp_path / "dart_jax" / "xla").iterdir())


def test_cli_messages_and_system(ckpt, model, tmp_path, capsys):
    base, head, trie = ckpt
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(MESSAGES[1:]))
    common = ["--ckpt", str(head), "--base", str(base), "--ngram", str(trie), "--no-compile-cache", "--json",
              "--no-warmup", "--keep", "16"]
    assert generate.main(common + ["--messages", str(path), "--system", "b", "--max-new-tokens", "6"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["token_ids"] == model.generate_ar(MESSAGES, max_new_tokens=6).token_ids
    assert report["finish_reason"] == "length" and "notice" not in report
    path.write_text("[{\"role\": \"user\"}]")
    assert generate.main(common + ["--messages", str(path)]) == 2
    assert "content" in capsys.readouterr().err


def test_cli_chat_keeps_the_history(ckpt, model, monkeypatch, capsys):
    base, head, trie = ckpt
    monkeypatch.setattr(sys, "stdin", io.StringIO("a\nf\n\n"))
    code = generate.main(["--ckpt", str(head), "--base", str(base), "--ngram", str(trie), "--no-compile-cache",
                          "--chat", "--system", "b", "--max-new-tokens", "2", "--keep", "16"])
    out = capsys.readouterr().out
    assert code == 0
    history = [{"role": "system", "content": "b"}, {"role": "user", "content": "a"}]
    first = model.generate_ar(history, max_new_tokens=2)
    history += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "f"}]
    second = model.generate_ar(history, max_new_tokens=2)
    assert first.text in out and second.text in out and out.count("tau") == 2


def test_generate_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        generate.parse_args(["--help"])
    out = capsys.readouterr().out
    for flag in ("--keep", "--max-new-tokens", "--temperature", "--stop", "--messages", "--chat", "--system",
                 "--no-compile-cache"):
        assert flag in out
    assert "(default: 60)" in out and "(default: 256)" in out


def test_exported_files_respect_the_umask(ckpt, model, tmp_path):
    old = os.umask(0o027)
    try:
        folder = save_dart_head(tmp_path / "head", model.head.config, nnx.state(model.head))
    finally:
        os.umask(old)
    for name in ("model.safetensors", "config.json"):
        assert stat.S_IMODE(os.stat(folder / name).st_mode) == 0o640


def test_offline_advice_names_the_current_hub_command(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(MissingFileError, match="`hf download someone/nothing-here`"):
        resolve("someone/nothing-here")


def test_transformers_advice_about_a_missing_torch_is_held_back():
    """dart_jax needs no torch at run time: transformers' import-time line saying that its models
    need PyTorch is dropped; its other messages pass."""
    import logging

    import dart_jax  # noqa: F401 (installs the filter)

    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    log = logging.getLogger("transformers")
    handler = Keep()
    log.addHandler(handler)
    try:
        log.warning("PyTorch was not found. Models won't be available and only tokenizers, configuration and "
                    "file/data utilities can be used.")
        log.warning("another warning")
    finally:
        log.removeHandler(handler)
    assert seen == ["another warning"]

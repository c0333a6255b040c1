"""Issue 42, everything but the server: every JSON input read by one depth-bounded reader, the
Python API's bad arguments, damaged GGUF metadata, the launcher's numbers, a full disk, outputs
that would overwrite their inputs, and flags or values that were silently wrong. Each case must
end in one clear error naming the input and the fix (never a RecursionError, ZeroDivisionError or
a library's bare Exception), before any work; the oracles are the expected message, files left
untouched (their bytes), and plain arithmetic, never the code's own output."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dart_jax.api import generate
from dart_jax.errors import MAX_JSON_DEPTH, FileFormatError, InputError, cli_boundary, parse_json
from dart_jax.ngram.__main__ import main as ngram_cli
from test_reliability_inputs import no_loading, one_error_line  # noqa: F401 (no_loading: a fixture)

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "dart_jax" / "demo"
DEEP = "[" * 100000 + "]" * 100000  # Python's json recurses once a level: a RecursionError unchecked


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


# -- 6a: one JSON reader, bounded in depth ---------------------------------------------------------------
def test_the_reader_bounds_the_depth_and_names_the_input():
    ok = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert parse_json(ok, "x", "a list") is not None
    for text in (DEEP, "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1),
                 '{"a": ' * (MAX_JSON_DEPTH + 1) + "1" + "}" * (MAX_JSON_DEPTH + 1)):
        with pytest.raises(FileFormatError, match=rf"^in.json: JSON nested more than {MAX_JSON_DEPTH} levels deep; "
                                                  "expected a list"):
            parse_json(text, "in.json", "a list")
    with pytest.raises(FileFormatError, match=r"^in.json: not valid JSON \(Expecting"):
        parse_json("{", "in.json", "a list")
    with pytest.raises(FileFormatError, match=r"^in.json: not UTF-8 text \(byte 0xff"):
        parse_json(b"\xff", "in.json", "a list")


def _depth(value) -> int:
    """The oracle: how deep arrays and objects nest in a parsed value (a scalar: 0)."""
    children = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else None
    return 0 if children is None else 1 + max((_depth(c) for c in children), default=0)


def test_the_depth_bound_ignores_brackets_inside_strings():
    """Values nested 64 and 65 deep in random shapes, whose strings (keys too) hold brackets, braces,
    quotes and backslashes, compact and indented: accepted exactly when the parsed value nests at
    most MAX_JSON_DEPTH deep."""
    rng = np.random.default_rng(0)
    noise = ['[', ']]', '{', '}', '\\"', '\\', '"[{', 'ü}', ' ', 'x']

    def text() -> str:
        return "".join(rng.choice(noise, size=rng.integers(0, 6)))

    def value(depth: int):
        if depth == 0:
            return [text(), 1, None, 2.5][rng.integers(0, 4)]
        inner = [value(depth - 1)] + [value(int(rng.integers(0, min(depth, 3)))) for _ in range(rng.integers(0, 3))]
        rng.shuffle(inner)
        return {text() + str(i): v for i, v in enumerate(inner)} if rng.integers(0, 2) else inner

    for depth in (1, 2, MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, MAX_JSON_DEPTH + 2):
        for trial in range(4):
            v = value(depth)
            assert _depth(v) == depth
            encoded = json.dumps(v, indent=1 if trial % 2 else None, ensure_ascii=bool(trial // 2))
            if depth <= MAX_JSON_DEPTH:
                assert parse_json(encoded, "x", "a value") == v
            else:
                with pytest.raises(FileFormatError, match="nested more than"):
                    parse_json(encoded, "x", "a value")


def test_generate_prompts_and_messages_files(tmp_path, no_loading, capsys):
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "hi"}\n' + DEEP + "\n")
    assert generate.main(["--demo", "tiny", "--prompts", str(prompts)]) == 2
    assert f"{prompts}:2: JSON nested more than" in one_error_line(capsys.readouterr().err)
    messages = tmp_path / "chat.json"
    messages.write_text(DEEP)
    assert generate.main(["--demo", "tiny", "--messages", str(messages)]) == 2
    assert f"{messages}: JSON nested more than" in one_error_line(capsys.readouterr().err)


def test_ngram_build_inputs(tmp_path, capsys):
    src = tmp_path / "ids.jsonl"
    src.write_text("[1, 2, 3]\n" + DEEP + "\n")
    out = tmp_path / "t.trie"
    assert ngram_cli(["build", str(src), "-o", str(out)]) == 2
    assert f"{src}:2: JSON nested more than" in one_error_line(capsys.readouterr().err)
    assert not out.exists()


def test_train_data_with_and_without_skip_bad(tmp_path):
    from dart_jax.train.data import read_conversations

    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps(good) + "\n" + DEEP + "\n")
    with pytest.raises(InputError, match=r"train.jsonl line 2: JSON nested more than .*--skip-bad"):
        read_conversations(data)
    conversations, bad = read_conversations(data, skip_bad=True)
    assert bad == 1 and len(conversations) == 1


def test_a_deep_run_json_counts_as_damaged(tmp_path):
    from dart_jax.train.__main__ import claim_run_folder

    (tmp_path / "run.json").write_text(DEEP)
    with pytest.raises(InputError, match="run.json is damaged"):
        claim_run_folder(tmp_path, {"settings": {}}, has_checkpoint=True)


@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "tokenizer_config.json",
                                  "special_tokens_map.json"])
def test_a_base_folders_json_files(name, tmp_path):
    from dart_jax.convert.base_files import check_base_files

    base = tmp_path / "base"
    shutil.copytree(DEMO / "base", base)
    (base / name).write_text(DEEP)
    with pytest.raises(FileFormatError, match=rf"{name}: JSON nested more than"):
        check_base_files(base)


def test_bench_config_and_a_shard_index(tmp_path):
    from dart_jax.bench.shapes import shape_fields
    from dart_jax.convert.checksums import check_files

    config = tmp_path / "config.json"
    config.write_text(DEEP)
    with pytest.raises(FileFormatError, match="config.json: JSON nested more than"):
        shape_fields(config_path=str(config))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(DEEP)
    with pytest.raises(FileFormatError, match="model.safetensors.index.json: JSON nested more than"):
        check_files(tmp_path, patterns=())


# -- 6b and 7: the Python API ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    from dart_jax.api.model import DartModel

    return DartModel.demo("tiny", keep=16)


@pytest.mark.parametrize("call, message", [
    (lambda m: m.generate(None), r"the prompt must be a string, a list of int token ids.*got NoneType"),
    (lambda m: m.generate(123), r"the prompt must be a string.*got int 123"),
    (lambda m: m.encode(None), r"the prompt must be a string.*got NoneType"),
    (lambda m: m.generate(b"hi"), r"the prompt is bytes; pass text \(prompt.decode\('utf-8'\)\)"),
    (lambda m: m.generate({"role": "user", "content": "hi"}), r"one message dict; wrap it in a list"),
    (lambda m: m.generate("hi", stop=5), r"stop must be a string or a list of strings, got int 5"),
    (lambda m: m.generate("hi", stop={"a": 1}), r"stop must be a string or a list of strings, got dict"),
    (lambda m: m.generate("hi", stop_token_ids=5), r"stop_token_ids must be a list of token ids.*\[5\]"),
    (lambda m: m.decode([-1]), r"token id -1 lies outside the vocabulary \[0, 512\)"),
    (lambda m: m.decode([512]), r"token id 512 lies outside"),
    (lambda m: m.generate("hi", temperature=1e308), r"temperature must lie in \[0, 100\]"),
    (lambda m: m.generate("hi", temperature=float("nan")), r"temperature must lie in \[0, 100\]"),
])
def test_bad_arguments_of_the_python_api(tiny, call, message):
    with pytest.raises(InputError if "temperature" not in message else ValueError, match=message):
        call(tiny)


def test_a_dtype_the_models_do_not_compute_in_is_refused_with_the_allowed_ones(monkeypatch):
    from dart_jax.api import model

    monkeypatch.setattr(model, "head_folder", lambda *_: pytest.fail("a file was read before dtype was checked"))
    for dtype in ("int8", "banana", "torch.int8"):
        with pytest.raises(InputError, match=r"dtype must be one of float32, bfloat16, float16"):
            model.DartModel.from_pretrained(DEMO / "base", DEMO / "head", "none", torch_dtype=dtype)


def test_tau_counts_only_the_tokens_kept(tiny):
    """The oracle: the answer's tokens (all but the prefill's first one come from the steps) over
    the steps, also where max_new_tokens or a stop string cut a step; the accepted lengths stay
    what the target accepted."""
    prompt = "How is a head trained?"
    full = tiny.generate(prompt, max_new_tokens=48)
    assert max(full.accept_lengths) >= 5  # a step that max_new_tokens 4 cuts
    short = tiny.generate(prompt, max_new_tokens=4)
    stopped = tiny.generate(prompt, max_new_tokens=48, stop=full.text[12:16])
    for result in (full, short, stopped):
        assert result.stats["steps"] == len(result.accept_lengths)
        assert result.stats["tau"] == pytest.approx((len(result.token_ids) - 1) / len(result.accept_lengths))
    assert short.accept_lengths == full.accept_lengths[:1] and short.stats["tau"] == 3.0
    assert len(stopped.token_ids) < 1 + sum(stopped.accept_lengths)  # the stop string did cut a step


def test_stats_uncount_keeps_accepted_lengths_and_drops_cut_plain_steps():
    from dart_jax.decoding.requests import Stats

    s = Stats(steps=2, accept_lengths=[5, 6], tree_sizes=[8, 8])
    s.uncount(2)
    assert (s.steps, s.accept_lengths, s.mean_accept_length) == (2, [5, 6], 4.5)
    p = Stats(steps=5, accept_lengths=[4, 1, 1, 1, 1], tree_sizes=[8, 0, 0, 0, 0])
    p.uncount(3, plain=True)
    assert (p.steps, p.accept_lengths, p.tree_sizes, p.mean_accept_length) == (2, [4, 1], [8, 0], 2.5)


def test_a_trie_of_another_vocabulary_is_refused(tiny, tmp_path):
    from dart_jax.api.model import DartModel
    from dart_jax.ngram import Trie, check_trie_vocab, compress, load_any

    foreign = Trie.build([[1, 2, 3, 700, 2, 3]], order=3)
    with pytest.raises(InputError, match=r"holds token id 700, outside the model's vocabulary of 512 ids"):
        DartModel.from_modules(tiny.target, tiny.head, tiny.tokenizer, foreign, eos_ids=[0])
    path = tmp_path / "foreign.trie"
    foreign.save(path)
    with pytest.raises(InputError, match=rf"trie {path} holds token id 700"):
        DartModel.from_pretrained(DEMO / "base", DEMO / "head", str(path))
    compress(foreign, tmp_path / "foreign.ctrie")
    with pytest.raises(InputError, match="holds token id 700"):
        check_trie_vocab(load_any(tmp_path / "foreign.ctrie"), 512, "x")
    check_trie_vocab(Trie.build([[1, 511, 2]], order=3), 512, "fits")


# -- 7: the generate command's flags ---------------------------------------------------------------------
@pytest.mark.parametrize("flags, message", [
    (["--temperature", "1e308"], "--temperature must lie in [0, 100]"),
    (["--compare-ar", "--method", "ar"], "--compare-ar compares --method ar with plain decoding"),
    (["--batch-size", "4"], "--batch-size sets how many --prompts lines"),
    (["--system", "be brief", "--no-chat"], "--system is a message of the chat template"),
    (["--eagle3-depth", "3"], "--eagle3-depth: EAGLE-3 tree sizes, but no EAGLE-3 head is loaded; add --eagle3"),
    (["--ckpt", str(DEMO / "smollm2" / "head"), "--eagle3-top-k", "4", "--eagle3-total-token", "9"],
     "--eagle3-total-token, --eagle3-top-k: EAGLE-3 tree sizes"),
])
def test_flags_that_would_do_nothing_or_wrong_are_refused_before_loading(flags, message, no_loading, capsys):
    demo = [] if "--ckpt" in flags else ["--demo", "tiny"]
    assert generate.main([*demo, "--prompt", "hi", *flags]) == 2
    assert message in one_error_line(capsys.readouterr().err)


# -- 6c: damaged GGUF metadata ---------------------------------------------------------------------------
@pytest.mark.parametrize("damage, message", [
    ({"head_count_kv": 0}, r"llama.attention.head_count_kv = 0; it must be a positive number"),
    ({"head_count_kv": 3}, r"head_count 4 is not a multiple of llama.attention.head_count_kv 3"),
    ({"extra_merges": ("zzq qqz",)}, r"merges holds 'zzq qqz', whose token 'zzq' is not in tokenizer.ggml.tokens"),
])
def test_damaged_gguf_metadata_is_a_clear_error(damage, message, tmp_path):
    from gguf_writer import write_gguf
    from test_llama import bpe_tokenizer

    from dart_jax.bench.tiny import make_tiny_llama
    from dart_jax.convert import gguf_to_folder

    hf = make_tiny_llama(tmp_path / "hf", seed=5, vocab_size=384)
    bpe_tokenizer(tmp_path / "tokenizer.json")
    gguf = write_gguf(tmp_path / "bad.gguf", hf, tmp_path / "tokenizer.json", pre="gpt2", eos=2, **damage)
    with pytest.raises(FileFormatError, match=message):
        gguf_to_folder(gguf, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


# -- 6d: the launcher's numbers --------------------------------------------------------------------------
@pytest.mark.parametrize("flags, message", [
    (["--coordinator", "127.0.0.1:99999"], "argument --coordinator: expected HOST:PORT with a port in 1"),
    (["--coordinator", "127.0.0.1:0"], "argument --coordinator"),
    (["--timeout", "-1"], "argument --timeout: must be > 0 seconds, got -1"),
    (["--timeout", "nan"], "argument --timeout: must be > 0 seconds, got nan"),
    (["--grace", "-1"], "argument --grace: must be >= 0 seconds, got -1"),
    (["--heartbeat", "0"], "argument --heartbeat: must be >= 1 seconds, got 0"),
    (["--init-timeout", "0"], "argument --init-timeout: must be >= 1 seconds"),
])
def test_the_launcher_refuses_impossible_numbers_when_parsing(flags, message):
    done = subprocess.run([sys.executable, "-m", "dart_jax.launch", "-n", "1", *flags, "--", "true"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


# -- 6e: a full disk -------------------------------------------------------------------------------------
def test_a_full_disk_in_convert_export_is_one_error_line_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    from safetensors import SafetensorError

    from dart_jax.convert import safetensors_io
    from dart_jax.convert.__main__ import main as convert_cli

    def full(*_a, **_k):  # what safetensors raises when the disk fills
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    monkeypatch.setattr(safetensors_io, "save_file", full)
    for command in ("export", "int8"):
        assert convert_cli([command, str(DEMO / "head"), str(tmp_path / "out")]) == 2
        err = one_error_line(capsys.readouterr().err)
        assert f"{tmp_path / 'out'}/model.safetensors: No space left on device; free some space" in err
        assert list(tmp_path.iterdir()) == []


def test_a_full_disk_while_training_checkpoints_is_an_oserror_and_leaves_no_partial_step(tmp_path, monkeypatch):
    from dart_jax.train.checkpoint import Checkpoints

    checkpoints = Checkpoints(tmp_path / "ckpt", keep_last=2)

    def full(step, args):  # orbax's report of TensorStore's write error, after its scratch folder was made
        (tmp_path / "ckpt" / f"{step}.orbax-checkpoint-tmp-1" / "state").mkdir(parents=True)
        raise ValueError("RESOURCE_EXHAUSTED: Error writing ... No space left on device [os_error_code='28']")
    monkeypatch.setattr(checkpoints.manager, "save", full)
    with pytest.raises(OSError, match="No space left on device for checkpoint 3") as caught:
        checkpoints.save(3, {"w": np.zeros(2)})

    def body():
        raise caught.value
    assert cli_boundary(body) == 2  # one `error:` line, as a user's error
    assert list((tmp_path / "ckpt").iterdir()) == []


# -- 4: outputs that would overwrite their inputs --------------------------------------------------------
@pytest.fixture
def head_copy(tmp_path):
    head = tmp_path / "head"
    shutil.copytree(DEMO / "head", head)
    return head


@pytest.mark.parametrize("command", ["int8", "export"])
@pytest.mark.parametrize("where, relation", [(".", "is"), ("inside", "lies inside"), ("..", "holds")])
def test_convert_refuses_an_output_that_is_holds_or_lies_in_its_input(command, where, relation, head_copy, capsys):
    from dart_jax.convert.__main__ import main as convert_cli

    before = digest(head_copy)
    out = (head_copy / where).resolve() if where != "inside" else head_copy / "inside"
    assert convert_cli([command, str(head_copy), str(out)]) == 2
    err = one_error_line(capsys.readouterr().err)
    assert f"{relation} the input head" in err and "Pass an output path apart from the inputs" in err
    assert digest(head_copy) == before and sorted(p.name for p in head_copy.iterdir()) == sorted(before)


def test_convert_export_refuses_an_output_in_the_base(head_copy, tmp_path, capsys):
    from dart_jax.convert.__main__ import main as convert_cli

    base = tmp_path / "base"
    shutil.copytree(DEMO / "base", base)
    assert convert_cli(["export", str(head_copy), str(base / "head"), "--base", str(base)]) == 2
    assert "lies inside the input --base" in one_error_line(capsys.readouterr().err)


def test_ngram_commands_refuse_to_write_over_their_inputs(tmp_path, capsys):
    from dart_jax.ngram import Trie

    trie = tmp_path / "a.trie"
    Trie.build([[1, 2, 3, 1, 2]], order=3).save(trie)
    ids = tmp_path / "ids.jsonl"
    ids.write_text("[1, 2, 3]\n")
    shutil.copy(trie, tmp_path / "m.trie")
    before = {p: p.read_bytes() for p in (trie, ids, tmp_path / "m.trie")}
    for argv in (["reduce", str(trie), str(trie), "--threshold", "1"], ["merge", str(trie), str(trie)],
                 ["merge", str(tmp_path / "m.trie"), str(trie), str(tmp_path / "m.trie")],
                 ["compress", str(trie), str(trie)], ["convert", str(trie), str(trie)],
                 ["build", str(ids), "-o", str(ids)]):
        assert ngram_cli(argv) == 2, argv
        assert "is the input" in one_error_line(capsys.readouterr().err), argv
    assert {p: p.read_bytes() for p in before} == before


def test_train_refuses_an_out_in_its_inputs_or_in_another_head(tmp_path, capsys):
    from dart_jax.train.__main__ import cli

    base = tmp_path / "base"
    shutil.copytree(DEMO / "base", base)
    data = tmp_path / "chats.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    other_head = tmp_path / "run1" / "head"
    shutil.copytree(DEMO / "head", other_head)
    before = digest(base), digest(other_head)
    for out, message in ((base, "is the input --base"), (base / "run", "lies inside the input --base"),
                         (tmp_path, "holds the input --base"),
                         (other_head, "holds a model or head (config.json) and is no training run")):
        assert cli(["--base", str(base), "--data", str(data), "--out", str(out)]) == 2
        assert message in one_error_line(capsys.readouterr().err), out
    assert (digest(base), digest(other_head)) == before and not (base / "run").exists()


# -- 5: GGUF tensor extents ------------------------------------------------------------------------------
def test_gguf_tensors_whose_data_overlap_or_run_short_are_named(tmp_path):
    import struct

    from gguf_writer import write_gguf
    from test_llama import bpe_tokenizer

    from dart_jax.bench.tiny import make_tiny_llama
    from dart_jax.convert import gguf_to_folder

    hf = make_tiny_llama(tmp_path / "hf", seed=5, vocab_size=384)
    bpe_tokenizer(tmp_path / "tokenizer.json")
    good = write_gguf(tmp_path / "good.gguf", hf, tmp_path / "tokenizer.json", pre="gpt2", eos=2)
    data = bytearray(good.read_bytes())

    def offset_at(name: str) -> int:
        """Where a tensor's data offset lies in the header: length-prefixed name, dims, type, offset."""
        key = name.encode()
        at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
        (n_dims,) = struct.unpack_from("<I", data, at)
        return at + 4 + 8 * n_dims + 4

    # the output projection's data offset set to the query's (same shape): two tensors on the same bytes
    q, o = offset_at("blk.0.attn_q.weight"), offset_at("blk.0.attn_output.weight")
    data[o:o + 8] = data[q:q + 8]
    shared = tmp_path / "shared.gguf"
    shared.write_bytes(bytes(data))
    with pytest.raises(FileFormatError, match=r"shared.gguf: tensors 'blk.0.attn_output.weight' and "
                                              r"'blk.0.attn_q.weight' share the bytes"):  # sorted by name on a tie
        gguf_to_folder(shared, tmp_path / "out", progress=False)
    # a tensor's data moved past the end of the file
    data = bytearray(good.read_bytes())
    at = offset_at("token_embd.weight")
    data[at:at + 8] = struct.pack("<Q", struct.unpack_from("<Q", data, at)[0] + len(data))
    short = tmp_path / "short.gguf"
    short.write_bytes(bytes(data))
    with pytest.raises(FileFormatError, match=r"short.gguf: tensor 'token_embd.weight' runs to byte \d+, past the "
                                              r"file's end"):
        gguf_to_folder(short, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


# -- found by scripts/audit_bad_inputs.py ------------------------------------------------------------------
@pytest.mark.parametrize("call, message", [
    (lambda m: m.generate("hi", temperature=0.5, top_k=2**31), r"top_k must be at most 2147483647 \(int32"),
    (lambda m: m.generate("hi", max_new_tokens=2**40), r"max_new_tokens must be at most 2147483647"),
    (lambda m: m.generate("hi", max_length=2**31), r"max_length must be at most 2147483647"),
])
def test_numbers_past_int32_are_refused_by_the_python_api(tiny, call, message):
    with pytest.raises(ValueError, match=message):
        call(tiny)


@pytest.mark.parametrize("ids", [None, 5, "abc", b"ab"])
def test_decode_takes_a_list_of_ids(tiny, ids):
    with pytest.raises(InputError, match="decode takes a list of token ids"):
        tiny.decode(ids)

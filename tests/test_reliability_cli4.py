"""Issue 50, the command lines, training and files: no writer takes a fixed scratch name, a taps
manifest of the wrong shape is damage, numbers and backends refused where they come in, a full
disk is one line, and flag combinations that would do nothing (or print nonsense) are refused.
The oracles are the expected messages, files left as they were (their bytes, their kind) and
plain arithmetic, never the code's own output."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dart_jax.api import generate
from dart_jax.api import options as generate_options
from dart_jax.errors import InputError, cli_boundary
from dart_jax.files import atomic_folder
from dart_jax.ngram.__main__ import main as ngram_cli
from dart_jax.train import options as train_options
from dart_jax.train.taps import MANIFEST, _reusable
from test_reliability_inputs import no_loading, one_error_line  # noqa: F401 (no_loading: a fixture)

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "dart_jax" / "demo"
DEEP = "[" * 100000 + "]" * 100000
ENV = dict(os.environ, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1")


def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


# -- data lost: fixed scratch names ----------------------------------------------------------------------
def test_generate_output_leaves_a_user_file_named_like_a_scratch_file(tmp_path, monkeypatch):
    """Before: the results went to OUT.tmp first, then were renamed: a user's OUT.tmp was lost."""
    prompts = tmp_path / "in.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi"}) + "\n" + json.dumps({"prompt": "there"}) + "\n")
    out, user = tmp_path / "out.jsonl", tmp_path / "out.jsonl.tmp"
    user.write_text("my notes\n")
    result = SimpleNamespace(text="ok", token_ids=[1, 2], finish_reason="length", accept_lengths=[2], thinking=None,
                             prompt_ids=[5], stats={"tau": 2.0, "new_tokens": 2})

    class Model:
        def generate_many(self, prompts, settings, on_done, **_):
            return [result for _ in prompts]

    monkeypatch.setattr(generate, "load_model", lambda args: Model())
    monkeypatch.setattr(generate, "_method", lambda args, model: "dart")
    generate.run_batch(generate.parse_args(["--prompts", str(prompts), "--output", str(out)]))
    assert user.read_text() == "my notes\n"
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl", "out.jsonl.tmp"]


def test_training_files_leave_user_files_named_like_scratch_files(tmp_path):
    from dart_jax.train.data import Dataset
    from dart_jax.train.loop import save_npz_atomic, write_json_atomic

    mine = {name: tmp_path / name for name in ("run.json.tmp", "vocab.npz.tmp.npz", "data.npz.tmp.npz")}
    for path in mine.values():
        path.write_text("user file\n")
    write_json_atomic(tmp_path / "run.json", {"a": 1})
    save_npz_atomic(tmp_path / "vocab.npz", used=[1, 2, 3])
    Dataset([np.array([1, 2, 3], np.int32)], [np.array([False, True, True])]).save(tmp_path / "data.npz")
    assert all(path.read_text() == "user file\n" for path in mine.values())
    assert json.loads((tmp_path / "run.json").read_text()) == {"a": 1}
    assert len(Dataset.load(tmp_path / "data.npz")) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*mine, "run.json", "vocab.npz", "data.npz"])


# -- the taps cache's manifest: the wrong shape is damage -----------------------------------------------
PLAN = {"version": 1, "dtype": "float32", "width": 8, "row_bytes": 32, "target": {}, "data_sha256": "0",
        "shards": [{"first": 0, "count": 1, "tokens": 2, "file": "shard-00000.bin", "lengths": [2]}]}


@pytest.mark.parametrize("text, problem", [
    ("[]", "wrong shape"),                                   # before: AttributeError ('list' has no .get)
    (DEEP, "nested more than"),                              # before: RecursionError
    (json.dumps({**PLAN, "shards": [5]}), "wrong shape"),     # before: AttributeError ('int' has no .items)
    (json.dumps({**PLAN, "shards": {"a": 1}}), "wrong shape"),
    ("\xff\xfe", "not UTF-8"),
])
def test_a_manifest_of_the_wrong_shape_is_damage_and_rebuilt(tmp_path, text, problem):
    (tmp_path / MANIFEST).write_bytes(text.encode("latin-1") if problem == "not UTF-8" else text.encode())
    (tmp_path / "shard-00000.bin").write_bytes(bytes(64))  # the right size: kept if the manifest were trusted
    notes = []
    assert _reusable(tmp_path, PLAN, notes.append) == {}
    assert len(notes) == 1 and problem in notes[0] and notes[0].endswith("rebuilding the cache"), notes
    assert str(tmp_path / MANIFEST) in notes[0]
    assert not (tmp_path / "shard-00000.bin").exists()


# -- numbers and backends refused where they come in -----------------------------------------------------
def test_device_steps_are_bounded_where_parsed(capsys):
    from dart_jax.api.model import DartModel
    from dart_jax.models import backend

    assert generate_options.MAX_DEVICE_STEPS == backend.MAX_DEVICE_STEPS
    with pytest.raises(SystemExit):
        generate_options.parse_args(["--device-steps", "1000000000"])
    assert f"must lie in [0, {backend.MAX_DEVICE_STEPS}]" in capsys.readouterr().err
    assert generate_options.parse_args(["--device-steps", str(backend.MAX_DEVICE_STEPS)]).device_steps == 4096
    for steps in (10**9, backend.MAX_DEVICE_STEPS + 1, -1, 2.5, True):
        with pytest.raises(InputError, match=r"device_steps \(--device-steps\) must be an integer in \[0, 4096\]"):
            DartModel.from_pretrained(DEMO / "base", DEMO / "head", DEMO / "ngram.trie", keep=7, device_steps=steps)


def test_the_dtype_choices_are_the_models():
    from dart_jax.models.qwen3 import MODEL_DTYPES

    assert generate_options.DTYPE_CHOICES == MODEL_DTYPES
    train = next(a for a in train_options.build_parser()._actions if a.dest == "dtype")
    assert tuple(train.choices) == MODEL_DTYPES


@pytest.mark.parametrize("platforms", ["cuda", "bogus"])
def test_a_backend_jax_cannot_start_is_one_error_line(platforms):
    """Before: JAX's AssertionError (cuda without its build) or RuntimeError with a traceback."""
    done = subprocess.run([sys.executable, "-m", "dart_jax.generate", "--device-info"], capture_output=True, text=True,
                          env={**ENV, "JAX_PLATFORMS": platforms}, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    line = one_error_line(done.stderr)
    assert f"JAX_PLATFORMS={platforms}" in line and "'.[cuda]'" in line and "unset JAX_PLATFORMS" in line


FULL_DISK = textwrap.dedent("""
    import sys
    import jax
    from dart_jax.errors import cli_boundary
    from dart_jax.train.checkpoint import Checkpoints

    def body():  # 8 MiB of random numbers (orbax compresses) for a 1 MiB disk
        state = [jax.random.normal(jax.random.key(i), (512, 1024)) for i in range(4)]
        Checkpoints(sys.argv[1], keep_last=1).save(1, state)
    sys.exit(cli_boundary(body, prog="train"))
""")


def test_a_checkpoint_on_a_full_disk_is_one_error_line(tmp_path):
    """Before: orbax's threads logged tracebacks, then dozens of "Event loop is closed" and, at
    exit, its abandoned coroutines failed ("Exception ignored in ...")."""
    disk = tmp_path / "disk"
    disk.mkdir()
    script = tmp_path / "save.py"
    script.write_text(FULL_DISK)
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("no user namespaces here to mount a small tmpfs in")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o size=1m tmpfs "{disk}" && '
                                                          f'exec "{sys.executable}" "{script}" "{disk / "ckpt"}"'],
                          capture_output=True, text=True, env=ENV, timeout=300, cwd=ROOT)
    assert done.returncode == 2, done.stderr[-3000:]
    line = one_error_line(done.stderr)
    assert "No space left on device for checkpoint 1" in line and "free some space" in line


# -- flag combinations that would do nothing, or print nonsense --------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--compare-ar", "--no-warmup"], "--compare-ar compares speeds measured after a warm-up"),
    (["--compare", "--no-warmup"], "--compare compares speeds measured after a warm-up"),
    (["--compare", ""], "--compare names no method"),
    (["--compare", " , "], "--compare names no method"),
])
def test_generate_refuses_what_would_print_nonsense_before_loading(argv, message, no_loading, capsys):
    """Before: --no-warmup --compare-ar printed "[AR] 324728 tokens/s; speedup 0.00x"; --compare ''
    ran DART alone."""
    assert generate.main(["--demo", "tiny", *argv]) == 2
    assert message in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("extra, named", [(["--prompt", "hi"], "--prompt"), (["--compare-ar"], "--compare-ar"),
                                          (["--keep", "7", "--json"], "--keep, --json")])
def test_device_info_refuses_the_options_it_would_ignore(extra, named, capsys):
    with pytest.raises(SystemExit) as stop:
        generate_options.parse_args(["--device-info", *extra])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"so {named} would do nothing" in err.splitlines()[-1]
    assert generate_options.parse_args(["--device-info"]).device_info


def test_max_keep_has_the_bound_of_keep():
    """Before: --max-keep 100000 ran with the largest size the search fills; --keep 100000 was refused."""
    from dart_jax.api.model import DartModel

    paths = (DEMO / "base", DEMO / "head", DEMO / "ngram.trie")
    with pytest.raises(InputError, match=r"^keep \(--keep\): draft tree size 100000 is more than .* at most (\d+) "):
        DartModel.from_pretrained(*paths, keep=100000)
    with pytest.raises(InputError, match=r"^max_keep \(--max-keep\): draft tree size 100000 is more than .* pass "
                                         r"max_keep <= \d+"):
        DartModel.from_pretrained(*paths, keep="auto", max_keep=100000)


def train_args(tmp_path, *flags):
    base, data = tmp_path / "base", tmp_path / "chats.jsonl"
    base.mkdir(exist_ok=True)
    data.write_text("{}\n")
    return train_options.build_parser().parse_args(["--base", str(base), "--data", str(data), "--out",
                                                    str(tmp_path / "run"), *flags])


@pytest.mark.parametrize("flags, message", [
    (["--taps-dir", "{base}/taps"], "--taps-dir '{base}/taps' lies inside the input --base"),
    (["--taps", "online", "--taps-dir", "{tmp}/t"], "so --taps-dir would do nothing; drop it"),
    (["--taps", "online", "--taps-dtype", "float32", "--taps-shard-mb", "9"],
     "so --taps-dtype, --taps-shard-mb would do nothing; drop them"),
])
def test_train_refuses_taps_options_that_would_do_harm_or_nothing(tmp_path, flags, message):
    fill = dict(base=tmp_path / "base", tmp=tmp_path)
    args = train_args(tmp_path, *(f.format(**fill) for f in flags))
    with pytest.raises(InputError) as refused:
        train_options.check_args(args)
    assert message.format(**fill) in str(refused.value)


def test_train_fills_in_the_taps_defaults_when_not_given(tmp_path):
    args = train_args(tmp_path, "--taps", "cache")
    train_options.check_args(args)
    assert (args.taps_dtype, args.taps_shard_mb) == ("bfloat16", 256.0)
    online = train_args(tmp_path, "--taps", "online")
    train_options.check_args(online)


def test_ngram_export_refuses_a_named_pipe_rather_than_replacing_it(tmp_path, capsys):
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    assert ngram_cli(["export", str(DEMO / "ngram.trie"), str(pipe)]) == 2
    assert "exists and is not a regular file (a named pipe" in one_error_line(capsys.readouterr().err)
    assert pipe.is_fifo()


def test_a_killed_writers_scratch_of_another_name_is_removed_and_an_old_folder_put_back(tmp_path):
    """Before: only `.NAME.partial-…` of the folder being written was removed."""
    gone = dead_pid()
    stale = tmp_path / f".first.partial-{gone}-0a1b2c3d"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    moved = tmp_path / f".kept.old-{gone}-0a1b2c3d"  # killed between moving `kept` aside and moving its new one in
    moved.mkdir()
    (moved / "config.json").write_text("{}")
    alive = tmp_path / f".busy.partial-{os.getpid()}-0a1b2c3d"  # a live writer's: left alone
    alive.mkdir()
    with atomic_folder(tmp_path / "second", ("config.json",)) as scratch:
        (scratch / "config.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, "kept", "second"])
    assert (tmp_path / "kept" / "config.json").read_text() == "{}"


# -- help texts ------------------------------------------------------------------------------------------
def test_help_texts_say_each_default_once_and_the_demos_tree_rule(capsys):
    with pytest.raises(SystemExit):
        generate_options.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text and not re.search(r"\(default[^()]*\) \(default", text)
    assert "fixed 7" not in text and "chooses per sequence among plain decoding and trees of up to 7 nodes" in text
    assert "--dtype {float32,bfloat16,float16}" in text
    train = " ".join(train_options.build_parser().format_help().split())
    assert "(default: None)" not in train and not re.search(r"\(default[^()]*\) \(default", train)
    assert "(default 256)" in train and "(default bfloat16" in train

    from dart_jax.bench.options import build_parser

    compare = next(a for a in build_parser()._actions if a.dest == "mode").choices["compare"]
    text = " ".join(compare.format_help().split())
    assert "tokens to generate per prompt (default: 128 on the SmolLM2 demo's held-out prompts, else 64)" in text
    assert "(default: on the SmolLM2 demo its 20 held-out prompts" in text and "prompts_eval.jsonl" in text


def test_the_boundary_names_a_missing_output_folder_not_a_scratch_name(tmp_path, capsys):
    """A file written through the scratch names keeps the user's name in its error."""
    from dart_jax.files import atomic_path

    def body():
        with atomic_path(str(tmp_path / "out.json")) as tmp:
            raise OSError(28, "No space left on device", tmp)
    assert cli_boundary(body) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {tmp_path / 'out.json'}: No space left on device")

"""User errors end as one `error:` line and exit code 2 in every command; bugs keep their
traceback; requests and settings are checked before anything is allocated."""
from __future__ import annotations

import errno
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dart_jax.api import generate as generate_cli
from dart_jax.api.model import DartModel
from dart_jax.decoding.requests import check_prompt
from dart_jax.decoding.settings import GenerationSettings
from dart_jax.errors import InputError, ResourceError, cli_boundary, user_error_message
from dart_jax.train import __main__ as train_cli


def test_the_boundary_sorts_user_errors_from_bugs(capsys):
    def raising(e):
        def body():
            raise e
        return body
    for e in (InputError("bad --x"), FileNotFoundError("no such file: a.json"),
              IsADirectoryError(errno.EISDIR, "Is a directory", "/tmp/out"),
              NotADirectoryError(errno.ENOTDIR, "Not a directory", "/etc/passwd/x"),
              FileExistsError(errno.EEXIST, "File exists", "run/"), MemoryError()):
        assert cli_boundary(raising(e)) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert "/tmp/out" in user_error_message(IsADirectoryError(errno.EISDIR, "Is a directory", "/tmp/out"))

    class XlaRuntimeError(RuntimeError):  # the name jax's out-of-memory error has
        pass
    assert "device memory" in user_error_message(XlaRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 8GB"))
    for bug in (TypeError("x"), KeyError("k"), AttributeError("a"), XlaRuntimeError("INTERNAL: oops")):
        assert user_error_message(bug) is None
        with pytest.raises(type(bug)):
            cli_boundary(raising(bug))
    assert cli_boundary(lambda: None) == 0 and cli_boundary(lambda: 3) == 3


def test_prompts_must_be_integer_ids_within_the_model():
    with pytest.raises(InputError, match="integers"):
        check_prompt([1.7, 2.2], 100, 50)
    with pytest.raises(InputError, match="integers"):
        check_prompt(np.array([True, False]), 100, 50)
    with pytest.raises(InputError, match=r"\[0, 100\)"):
        check_prompt([5, 100], 100, 50)
    with pytest.raises(InputError, match="max_position_embeddings"):
        check_prompt(list(range(40)), 100, 1000, max_positions=32)
    np.testing.assert_array_equal(check_prompt([3, 4], 100, 50, max_positions=32), [3, 4])


@pytest.mark.parametrize("field, value", [("seed", 2**70), ("seed", -1), ("temperature", math.nan),
                                          ("temperature", -0.1), ("top_p", 0.0), ("max_new_tokens", 0),
                                          ("max_length", 1), ("top_k", -1), ("max_new_tokens", 2.5)])
def test_generation_settings_refuse_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        GenerationSettings(**{field: value})


TRAIN_FLAGS = {"--draft-vocab": ("0", "--draft-vocab"), "--lr": ("nan", "--lr"), "--clip": ("-1", "--clip"),
               "--warmup-steps": ("-5", "--warmup-steps"), "--stop-after": ("-1", "--stop-after"),
               "--rope-theta": ("0", "--rope-theta"), "--weight-decay": ("inf", "--weight-decay"),
               "--gamma": ("1.5", "--gamma"), "--keep-last": ("0", "--keep-last"),
               "--regen-temperature": ("-1", "--regen-temperature")}


@pytest.mark.parametrize("flag", sorted(TRAIN_FLAGS))
def test_train_flags_out_of_range_are_named_before_loading(flag, capsys, tmp_path):
    value, name = TRAIN_FLAGS[flag]
    code = train_cli.cli(["--base", str(tmp_path / "missing"), "--data", str(tmp_path / "d.jsonl"),
                          "--out", str(tmp_path / "out"), flag, value])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: {name} ") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()  # refused before anything was made


def test_generate_refuses_an_empty_prompt_and_a_cache_that_cannot_fit(capsys):
    assert generate_cli.main(["--demo", "tiny", "--prompt", " "]) == 2
    assert capsys.readouterr().err.strip().endswith("leave --prompt out for the default prompt.")
    assert generate_cli.main(["--demo", "tiny", "--max-length", "1000000000", "--no-warmup", "--max-new-tokens",
                              "2"]) == 2
    err = capsys.readouterr().err
    assert "GiB of caches" in err and "smaller max_length" in err and "Traceback" not in err


def test_dart_model_refuses_float_ids_and_over_long_prompts(demo_model):
    with pytest.raises(InputError, match="integers"):
        demo_model.generate([1.7, 2.2], max_new_tokens=2)
    limit = demo_model.target.config.max_position_embeddings
    with pytest.raises(InputError, match="max_position_embeddings"):
        demo_model.generate([5] * (limit + 1), max_new_tokens=2, max_length=limit + 8)
    with pytest.warns(UserWarning, match="max_position_embeddings"):  # warned before the first step
        next(demo_model.stream([5, 6, 7], max_new_tokens=limit, max_length=limit + 8, chat=False))


def test_commands_answer_bad_arguments_in_one_line_in_a_real_process():
    # (each process imports jax: two commands stand for all; the others are checked in-process above)
    cases = [["-m", "dart_jax.generate", "--seed", str(2**70)], ["-m", "dart_jax.serve", "--slots", "0"]]
    for args in cases:
        r = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)
        # one error line: the command's own ("error: …") or argparse's ("python -m …: error: argument …")
        lines = [line for line in r.stderr.splitlines() if line.startswith("error:") or ": error: argument" in line]
        assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (args, r.stderr[-800:])


_NUMBERS = st.one_of(st.integers(-10**12, 10**12).map(str), st.floats(allow_nan=True).map(repr),
                     st.sampled_from(["", "x", "1e400", "-0", "0x10", "nan", "inf", "-inf", "٣"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(sorted(TRAIN_FLAGS) + ["--epochs", "--batch-size", "--max-length",
                                                                  "--anchors-per-seq", "--draft-length", "--seed"]),
                          _NUMBERS), min_size=1, max_size=4))
def test_random_train_arguments_give_a_clear_error_never_a_traceback(tmp_path_factory, flags):
    folder = tmp_path_factory.mktemp("fuzz")
    argv = ["--base", str(folder / "missing"), "--data", str(folder / "d.jsonl"), "--out", str(folder / "o")]
    for flag, value in flags:
        argv += [flag, value] if not value.startswith("-") else [f"{flag}={value}"]
    try:
        code = train_cli.cli(argv)
    except SystemExit as e:  # argparse's own refusal of a malformed value: exit 2 with a usage line
        code = e.code
    assert code == 2  # every run fails: a bad value, or (all values fine) the missing base


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["--max-new-tokens", "--max-length", "--temperature", "--top-p",
                                           "--top-k", "--seed"]), _NUMBERS), min_size=1, max_size=4))
def test_random_generation_settings_give_a_clear_error_or_valid_settings(flags):
    argv = []
    for flag, value in flags:
        argv.append(f"{flag}={value}")
    try:
        args = generate_cli.parse_args(argv)
    except SystemExit as e:
        assert e.code == 2
        return
    try:
        s = generate_cli._settings(args)
    except ValueError as e:
        assert str(e).startswith("--") or " --" in str(e), str(e)  # names the flag
        return
    # accepted: every value is in its documented range
    assert s.max_new_tokens >= 1 and s.max_length >= 2 and 0 <= s.temperature < math.inf
    assert 0 < s.top_p <= 1 and 0 <= s.top_k <= 2**31 - 1 and 0 <= s.seed < 2**63  # top_k: int32 on the device


@pytest.mark.parametrize("value", ["3000000000", str(2**31), "-1"])
def test_a_top_k_past_int32_is_an_argparse_error_naming_the_limit(value, capsys):
    with pytest.raises(SystemExit) as e:
        generate_cli.parse_args([f"--top-k={value}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --top-k" in err and "[0, 2147483647]" in err, err
    assert generate_cli.parse_args(["--top-k=2147483647"]).top_k == 2**31 - 1


def test_resource_error_is_a_value_error():
    assert issubclass(ResourceError, ValueError) and issubclass(InputError, ValueError)


@pytest.fixture(scope="module")
def demo_model():
    base, head, trie = generate_cli._demo_paths("tiny")
    return DartModel.from_pretrained(base, head, trie)

"""Every command line refuses a bad flag or value through argparse (exit code 2, the usage and the
fault on stderr) before the heavy libraries load, and answers --help the same way: each command's
options live in a module that imports argparse and light names only (dart_jax.api.options,
dart_jax.serve.options, dart_jax.bench.options, train/options.py, the ngram and convert CLIs).

Checked without timing: the command runs in a fresh interpreter (as `python -m`), and what
`sys.modules` holds when it exits says what was imported."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

import pytest

# run a module as `python -m MODULE ARGS` would, then report the exit code and the heavy modules loaded
WRAPPER = textwrap.dedent("""
    import json, runpy, sys
    module, report = sys.argv[1], sys.argv[2]
    sys.argv = ["python -m " + module, *sys.argv[3:]]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code
    heavy = ("jax", "flax", "torch", "transformers", "tokenizers", "dart_jax.api.model", "dart_jax.api.generate",
             "dart_jax.decoding.engine", "dart_jax.serve.app", "dart_jax.bench.cli", "dart_jax.train.loop")
    with open(report, "w") as f:
        json.dump({"code": code, "loaded": [m for m in heavy if m in sys.modules]}, f)
""")

COMMANDS = ["generate", "serve", "bench", "train", "train.distill", "ngram", "convert"]
BOGUS = {  # an unknown flag where the command's required arguments are there (else argparse names those first)
    "generate": ["--bogus"], "serve": ["--bogus"], "bench": ["e2e", "--bogus"],
    "train": ["--base", "b", "--data", "d", "--out", "o", "--bogus"], "ngram": ["build", "in.txt", "-o", "out.trie", "--bogus"],
    "convert": ["inspect", "x", "--bogus"], "train.distill": ["p.jsonl", "o.jsonl", "--base", "b", "--bogus"],
}
BAD = {  # a bad value for an option each command really has (a bad flag is tested for all)
    "generate": ["--max-new-tokens", "many"], "serve": ["--port", "eighty"], "bench": ["e2e", "--reps", "x"],
    "train": ["--base", "b", "--data", "d", "--out", "o", "--epochs", "x"], "ngram": ["build", "--order", "x"],
    "convert": ["no-such-command"], "train.distill": ["p.jsonl", "o.jsonl", "--base", "b", "--slots", "x"],
}


def run(tmp_path, command, args):
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-c", WRAPPER, f"dart_jax.{command}", str(report), *args],
                          capture_output=True, text=True, timeout=300)
    return json.loads(report.read_text()), done.stdout, done.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_flag_is_refused_by_argparse_before_the_model_code_loads(command, tmp_path):
    got, _, err = run(tmp_path, command, BOGUS[command])
    assert got["code"] == 2, err
    assert "usage: python -m dart_jax." in err and "unrecognized arguments: --bogus" in err
    assert not got["loaded"], got  # neither jax nor flax nor the model code


@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_value_is_refused_the_same_way(command, tmp_path):
    got, _, err = run(tmp_path, command, BAD[command])
    assert got["code"] == 2 and "error: argument" in err and "invalid" in err, err
    assert not got["loaded"], got


@pytest.mark.parametrize("command", COMMANDS)
def test_help_answers_without_the_model_code(command, tmp_path):
    got, out, err = run(tmp_path, command, ["--help"])
    assert got["code"] == 0 and f"usage: python -m dart_jax.{command}" in out, err
    assert not got["loaded"], got



def test_one_name_per_flag_and_the_old_spellings_still_work():
    """The head is --ckpt in every command (bench's --dart an alias), the tree search's candidates per
    row --topk (generate's --tree-topk an alias), bench's lists of tree sizes --keeps (shapes'
    --budgets an alias): each spelling lands on the same value."""
    from dart_jax.api import options as api_options
    from dart_jax.bench.options import build_parser

    bench = build_parser()
    for flag in ("--ckpt", "--dart"):
        assert bench.parse_args(["e2e", flag, "some/head"]).dart == "some/head"
    for flag in ("--keeps", "--budgets"):
        assert bench.parse_args(["shapes", "--tiny", flag, "3,5"]).budgets == "3,5"
    for flag in ("--topk", "--tree-topk"):
        assert bench.parse_args(["search", flag, "7"]).topk == 7
        ap = argparse.ArgumentParser()
        api_options.add_model_options(ap)
        assert ap.parse_args([flag, "7"]).topk == 7


def _generate_input_faults(tmp_path):
    """(arguments, what the error must name) of faults in generate's input files and flag clashes."""
    (tmp_path / "empty.jsonl").write_text("\n")
    return [
        (["--messages", str(tmp_path / "no_such.json")], f"--messages file {tmp_path / 'no_such.json'} not found"),
        (["--prompts", str(tmp_path / "no_such.jsonl")], f"--prompts file {tmp_path / 'no_such.jsonl'} not found"),
        (["--prompts", str(tmp_path / "empty.jsonl")], str(tmp_path / "empty.jsonl")),
        (["--prompts", str(tmp_path / "empty.jsonl"), "--output", str(tmp_path / "missing" / "out.jsonl")],
         f"the folder {tmp_path / 'missing'} does not exist"),
        (["--chat", "--json"], "--chat is interactive and cannot be combined with --json"),
    ]


def test_generate_refuses_missing_input_files_and_clashes_before_jax_loads(tmp_path):
    for args, named in _generate_input_faults(tmp_path):
        got, _, err = run(tmp_path, "generate", args)
        assert got["code"] == 2 and err.startswith("error: ") and named in err, (args, err)
        assert not got["loaded"], (args, got)

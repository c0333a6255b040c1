"""`python -m dart_jax.train` as a user meets it: --help before the heavy imports, a run folder
that a failed run does not lock, one that refuses other data once it holds checkpoints, and
--no-progress without bars."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from train_base import make_train_base

from dart_jax.train.__main__ import cli

COMMON = ["--draft-length", "3", "--draft-vocab", "64", "--max-length", "48", "--anchors-per-seq", "8",
          "--no-progress", "--epochs", "1", "--stop-after", "1", "--save-every", "1"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_train_base(tmp_path_factory.mktemp("train_cli") / "base")


def write_data(path, n, seed):
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for _ in range(n):
            q, a = "".join(rng.choice(list("abcdefgh"), 6)), "".join(rng.choice(list("abcdefgh "), 24))
            f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n")
    return path


def test_help_answers_before_jax_loads():
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "dart_jax.train", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "(default: 0.6 for dart, 0.8 for eagle3)" in done.stdout and "--no-progress" in done.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "dart_jax.train.options" in imported
    assert not imported & {"jax", "flax", "orbax.checkpoint", "optax"}


def test_a_failed_run_does_not_lock_its_folder_and_a_trained_one_refuses_other_data(base, tmp_path, capsys):
    out = tmp_path / "run"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    assert cli(["--base", str(base), "--data", str(bad), "--out", str(out), *COMMON]) == 2
    assert "bad.jsonl" in capsys.readouterr().err and (out / "run.json").exists()

    data = write_data(tmp_path / "chats.jsonl", 8, seed=0)
    assert cli(["--base", str(base), "--data", str(data), "--out", str(out), *COMMON, "--lr", "1e-3"]) == 0
    err = capsys.readouterr().err
    assert "starting over" in err and "--data" in err
    assert "\r" not in err and "loading" not in err  # --no-progress: no bars, also not the weights' loading bar
    assert json.loads((out / "run.json").read_text())["data"] == str(data)

    recorded = (out / "run.json").read_bytes()
    write_data(data, 8, seed=1)  # same path, other content
    assert cli(["--base", str(base), "--data", str(data), "--out", str(out), *COMMON, "--lr", "1e-3"]) == 2
    err = capsys.readouterr().err
    assert "holds checkpoints" in err and "content of --data" in err and "fresh --out" in err
    assert (out / "run.json").read_bytes() == recorded  # the refused run rewrote nothing

"""The trainer's taps cache (train/taps.py) and its profile (train/profile.py) on a tiny target:
the cached taps are the target's own, training from them gives the online run's loss and head,
a killed cache pass resumes without recomputing finished shards, a damaged shard or changed data
is rebuilt, and the profile's parts add up to its step."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from dart_jax.models.checkpoints import load_target
from dart_jax.train.__main__ import main
from dart_jax.train.data import Dataset
from dart_jax.train.loop import data_mesh
from dart_jax.train.profile import LABELS
from dart_jax.train.taps import MANIFEST, build_cache, target_identity
from test_train_loop import COMMON, base, write_data  # noqa: F401 (base is a fixture)

REPO = Path(__file__).resolve().parents[1]


def run_args(base, data, out, *extra):
    return ["--base", str(base), "--data", str(data), "--out", str(out), *COMMON, "--batch-size", "2",
            "--epochs", "2", "--lr", "5e-3", *extra]


def final_loss(stderr: str) -> float:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")][-1]["loss"]


def test_cached_taps_train_the_same_head_as_the_online_target(base, tmp_path, capsys):
    data = write_data(tmp_path / "d.jsonl", 6, seed=3)
    main(run_args(base, data, tmp_path / "online", "--taps", "online"))
    online = final_loss(capsys.readouterr().err)
    assert not (tmp_path / "online" / "taps").exists()
    main(run_args(base, data, tmp_path / "f32", "--taps", "cache", "--taps-dtype", "float32"))
    f32 = final_loss(capsys.readouterr().err)
    assert (tmp_path / "f32" / "taps" / MANIFEST).is_file()
    main(run_args(base, data, tmp_path / "bf16"))  # the default: 2 epochs on a disk with room → a bfloat16 cache
    err = capsys.readouterr().err
    assert "caching the target's taps" in err and (tmp_path / "bf16" / "taps" / MANIFEST).is_file()
    bf16 = final_loss(err)
    np.testing.assert_allclose(f32, online, rtol=1e-5)
    want, got = load_file(tmp_path / "online" / "head" / "model.safetensors"), load_file(tmp_path / "f32" / "head" / "model.safetensors")
    assert set(want) == set(got)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)
    # bfloat16 taps round the head's inputs to 8 bits of mantissa: the loss moves, a little
    assert abs(bf16 - online) <= 0.02 * online


def dataset(base, n, seed):
    rng = np.random.default_rng(seed)
    ids = [rng.integers(3, 128, int(rng.integers(5, 40))).astype(np.int32) for _ in range(n)]
    return Dataset(ids, [np.ones(len(x), bool) for x in ids])


def check_rows(cache, target, data):
    """Every sample's cached rows against the target's forward over that sample alone (float32)."""
    for i, ids in enumerate(data.ids):
        hidden, taps = target.forward_hidden(jnp.asarray(ids)[None], return_taps=True)
        want = np.concatenate([np.asarray(taps[0]), np.asarray(hidden[0])], axis=-1)
        got = cache.states(np.asarray([i]), 1, len(ids) + 3)[0]
        np.testing.assert_allclose(got[:len(ids)], want, rtol=1e-4, atol=1e-4, err_msg=f"sample {i}")
        assert not got[len(ids):].any()


@pytest.mark.extended
def test_cache_holds_the_targets_taps_and_rebuilds_what_is_damaged_or_stale(base, tmp_path):
    target = load_target(base, dtype="float32")
    identity, logs = target_identity(target, str(base)), []
    data = dataset(base, 12, seed=0)
    folder = tmp_path / "taps"

    def build(data):
        return build_cache(folder, data, target, identity, dtype="float32", batch_size=2, max_length=48,
                           mesh=data_mesh(), pad_id=0, shard_bytes=64 * 128 * 4, progress=False, log=logs.append)

    cache = build(data)
    shards = cache.manifest["shards"]
    assert len(shards) >= 3 and sum(s["count"] for s in shards) == len(data)
    assert any(s["count"] >= 2 for s in shards)  # rows of several samples one after the other
    check_rows(cache, target, data)
    stats = {s["file"]: (folder / s["file"]).stat().st_mtime_ns for s in shards}

    damaged = folder / shards[1]["file"]
    raw = bytearray(damaged.read_bytes())
    raw[100:108] = bytes(b ^ 0xFF for b in raw[100:108])
    damaged.write_bytes(bytes(raw))
    logs.clear()
    cache = build(data)
    assert any(f"{shards[1]['file']} fails its sha256" in line for line in logs), logs
    assert any(f"reusing {len(shards) - 1} of {len(shards)}" in line for line in logs), logs
    assert cache.manifest["shards"][1]["sha256"] == shards[1]["sha256"]
    for s in shards:
        if s["file"] != shards[1]["file"]:
            assert (folder / s["file"]).stat().st_mtime_ns == stats[s["file"]], f"{s['file']} was rewritten"
    check_rows(cache, target, data)

    changed = Dataset([x.copy() for x in data.ids], data.loss_mask)
    changed.ids[4][2] = (changed.ids[4][2] + 1) % 128
    logs.clear()
    cache = build(changed)
    assert any("other data_sha256" in line for line in logs), logs
    assert not any("reusing" in line for line in logs), logs
    check_rows(cache, target, changed)

    (folder / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds other files"):
        build(changed)


SLOW_PASS = """
import sys, time
import dart_jax.train.taps as taps
write = taps._write_json
def slow(path, obj):  # each recorded shard takes long enough for the test to kill the pass between two
    write(path, obj)
    time.sleep(0.5)
taps._write_json = slow
from dart_jax.train.__main__ import main
main(sys.argv[1:])
"""


def recorded(manifest: Path) -> list:
    try:
        return json.loads(manifest.read_text())["shards"]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


@pytest.mark.extended
def test_a_cache_pass_killed_with_sigkill_resumes_from_its_finished_shards(base, tmp_path, capsys):
    data = write_data(tmp_path / "d.jsonl", 8, seed=4)
    args = run_args(base, data, tmp_path / "run", "--taps", "cache", "--taps-shard-mb", "0.01")
    manifest = tmp_path / "run" / "taps" / MANIFEST
    proc = subprocess.Popen([sys.executable, "-c", SLOW_PASS, *args], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not any(s["sha256"] for s in recorded(manifest)):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no shard was finished in 2 minutes"
            time.sleep(0.01)
        proc.kill()  # SIGKILL: no finally, no cleanup
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    shards = recorded(manifest)
    finished = [s for s in shards if s["sha256"]]
    assert finished and len(finished) < len(shards), "the pass was not interrupted mid-way"
    before = {s["file"]: (manifest.parent / s["file"]).stat().st_mtime_ns for s in finished}

    main(args)
    err = capsys.readouterr().err
    assert f"reusing {len(finished)} of {len(shards)} finished shards" in err
    for name, stamp in before.items():
        assert (manifest.parent / name).stat().st_mtime_ns == stamp, f"{name} was recomputed"
    assert (tmp_path / "run" / "head" / "model.safetensors").is_file()
    assert not [p for p in manifest.parent.iterdir() if p.name.startswith(".")]  # the killed pass's scratch file
    # the resumed cache is the one an uninterrupted pass makes
    main([*args, "--out", str(tmp_path / "again")])
    fresh = recorded(tmp_path / "again" / "taps" / MANIFEST)
    assert [s["sha256"] for s in fresh] == [s["sha256"] for s in recorded(manifest)]


@pytest.mark.extended  # a second look (the default run's 10 minutes): .ci/run runs it after
@pytest.mark.parametrize("taps", ["online", "cache"])
def test_profile_parts_add_up_to_the_step(base, tmp_path, capsys, taps):
    data = write_data(tmp_path / "d.jsonl", 6, seed=5)
    out = tmp_path / "run"
    main(run_args(base, data, out, "--taps", taps, "--profile", "3"))
    printed = capsys.readouterr().out
    report = json.loads((out / "profile.json").read_text())
    assert report["mode"] == taps and report["steps"] == 3
    parts = report["split"]
    for part, label in LABELS.items():
        assert part in parts and parts[part] >= 0, part
        assert label in printed, label
    total = sum(parts[p] for p in ("data", "host", "target", "head", "optimizer"))
    assert abs(total - parts["step"]) <= 0.05 * parts["step"] + 1e-3, (total, parts["step"])
    assert report["fused"]["step"] > 0 and report["tokens_per_s"] > 0
    assert not (out / "ckpt").exists() or not any((out / "ckpt").iterdir())  # a profile saves no checkpoint
    assert not (out / "head").exists()

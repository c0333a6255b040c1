"""The GPU campaign (benchmarks/gpu_campaign.py) run on this machine with --smoke: every stage
writes its JSON, the archive holds them, a second call skips them all, and --resume carries
results into a new folder."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_campaign.py"
_SPEC = importlib.util.spec_from_file_location("gpu_campaign", SCRIPT)  # a script, not a package
gpu_campaign = sys.modules.setdefault("gpu_campaign", importlib.util.module_from_spec(_SPEC))  # dataclasses need it
_SPEC.loader.exec_module(gpu_campaign)
STAGES = {name: f"{name}.json" for name in (
    "forced-tiny-6L-b1-device", "forced-tiny-6L-b1-pallas", "forced-tiny-6L-b1", "forced-tiny-6L-b1-device8", "forced-tiny-6L-b1-cbwhile",
    "shapes-tiny", "forced-tiny-6L-pool", "forced-tiny-6L-pool-device", "forced-tiny-3L-b1-device", "forced-tiny-6L-b1-xla", "shapes-tiny-xla",
    "shapes-tiny-cublas", "shapes-tiny-ctx2048", "forced-tiny-6L-b1-device128", "train-tiny-6L")}
STAGES["profile-tiny-6L-device"] = "profile-tiny-6L-device/profile.json"


def campaign(*args: str, env: dict | None = None) -> str:
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--budget-s", "1500", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=1800, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow  # about 2 minutes (11 stages, each a process): .ci/run runs it after the default run
def test_smoke_campaign_writes_every_stage_and_resumes(tmp_path):
    out, archive = tmp_path / "camp", tmp_path / "back" / "campaign.tar.gz"
    cache = tmp_path / "xla-cache"
    first = campaign("--out", str(out), "--archive", str(archive), "--compile-cache", str(cache))
    for name, result in STAGES.items():
        data = json.loads((out / result).read_text())
        assert data.get("rows") or data.get("phases"), name
        assert f"[skip] {name}:" not in first
    # the cuDNN stage needs a GPU: skipped on this CPU, noted in the report, no JSON (a GPU call runs it)
    assert "[skip] forced-tiny-6L-b1-cudnn: needs a GPU, the stages run on cpu" in first
    assert not (out / "forced-tiny-6L-b1-cudnn.json").exists()
    # drawn in memory, at two depths, in the device loop and the host loop, and variants of the first
    for name, layers, steps in (("forced-tiny-6L-b1-device", 6, 32), ("forced-tiny-3L-b1-device", 3, 32),
                                ("forced-tiny-6L-b1", 6, 0), ("forced-tiny-6L-b1-xla", 6, 0),
                                ("forced-tiny-6L-b1-cbwhile", 6, 32), ("forced-tiny-6L-b1-pallas", 6, 32)):
        forced = json.loads((out / f"{name}.json").read_text())
        assert [r["tau_asked"] for r in forced["rows"]] == [1.0, 3.0] and all(r["same_output"] for r in forced["rows"])
        assert forced["config"]["model"]["layers"] == layers
        assert forced["config"]["model"]["weights"] == "drawn on the device"
        assert forced["config"].get("device_steps", 0) == steps, name
    assert json.loads((out / "forced-tiny-6L-b1-pallas.json").read_text())["config"]["attention"] == "pallas"
    few = json.loads((out / "forced-tiny-6L-b1-device8.json").read_text())
    assert [r["tau_asked"] for r in few["rows"]] == [1.0] and few["config"]["device_steps"] == 8
    many = json.loads((out / "forced-tiny-6L-b1-device128.json").read_text())
    assert [r["tau_asked"] for r in many["rows"]] == [1.0] and many["config"]["device_steps"] == 128
    (row,) = json.loads((out / "forced-tiny-6L-pool.json").read_text())["rows"]  # the pool, default and overlapped
    assert row["batch"] == 2 and row["same_output"] and row["overlap_same_output"] and row["overlap_half_steps"] > 0
    (row,) = json.loads((out / "forced-tiny-6L-pool-device.json").read_text())["rows"]  # the pool in the device loop
    assert row["batch"] == 2 and row["same_output"] and row["unforced_steps"] == 0
    # the trainer: online and cached taps on one device, every sequence 128 random ids long (the
    # smoke's --seq), the cache holding each token's three taps and final hidden state in bfloat16
    train = json.loads((out / "train-tiny-6L.json").read_text())
    assert [(r["mesh"], r["taps"]) for r in train["rows"]] == [("1 device", "online"), ("1 device", "cache")]
    assert all(r["tokens_per_step"] == 2 * 128 and r["tokens_per_s"] > 0 and r["epoch_tokens_per_s"] > 0
               for r in train["rows"])
    assert train["rows"][1]["split_ms"]["target"] < train["rows"][0]["split_ms"]["target"]  # the cache skips it
    assert train["config"]["layers"] == 6 and train["config"]["draft_length"] == 7
    assert train["cache_pass"]["bytes"] == train["config"]["samples"] * 128 * 4 * train["config"]["hidden"] * 2
    assert train["data_parallel"].startswith("skipped: one device") and not train["partial"]
    assert not (out / "train-tiny-6L.json.partial").exists()  # the finished run leaves no partial results
    report = (out / "RESULTS-gpu.md").read_text()
    assert "### The trainer on a random tiny (6 layers) target" in report and "| 1 device | cache | 2 |" in report
    assert "forced acceptance" in report and "| phase | ms per step |" in report
    assert "tiny (6 layers, 9-node trees)" in report and "tiny (3 layers, 9-node trees)" in report
    assert "tree search overlapped" in report
    assert "| tiny [every verify with cuBLAS] |" in report  # the shapes under other settings
    assert "| tiny [every verify with XLA's own GEMMs (Triton)] |" in report
    assert "| tiny [2048 tokens in the cache] |" in report
    assert json.loads((out / "shapes-tiny-ctx2048.json").read_text())["config"]["context"] == 2048
    assert "| tiny (6 layers, 9-node trees) [host loop, every verify with XLA's own GEMMs (Triton)] | 1 | 1 |" in report
    assert "| tiny (6 layers, 9-node trees) [device loop, 32 steps a call] | 1 | 3 |" in report
    assert "| tiny (6 layers, 9-node trees) [device loop, 8 steps a call] | 1 | 1 |" in report
    assert "| tiny (6 layers, 9-node trees) [device loop, 32 steps a call, attention by our Pallas kernel] | 1 | 3 |" in report
    assert "call with the weights ms" in report
    # the device loop's profile: its search is a phase of the device
    assert "device loop, 3 steps a call" in report and "| device_tree_search |" in report
    # a variant's log opens with its command and the settings it ran under
    assert "--verify-gemms xla" in (out / "forced-tiny-6L-b1-xla.log").read_text().splitlines()[0]
    assert "--verify-gemms cublas" in (out / "shapes-tiny-cublas.log").read_text().splitlines()[0]
    assert json.loads((out / "shapes-tiny-cublas.json").read_text())["config"]["verify_gemms"] == "cublas"
    assert "XLA_FLAGS" not in (out / "profile-tiny-6L-device.log").read_text().splitlines()[0]  # stage 1's settings
    assert "+WHILE,+CONDITIONAL" in (out / "forced-tiny-6L-b1-cbwhile.log").read_text().splitlines()[0]
    # every stage but the tests compiled into one cache, which later stages read
    assert f"JAX_COMPILATION_CACHE_DIR='{cache}'" in (out / "shapes-tiny.log").read_text().splitlines()[0]
    assert any(cache.iterdir())
    with tarfile.open(archive) as tar:  # everything the device tool must bring back, in one file
        names = set(tar.getnames())
    assert set(STAGES.values()) | {"RESULTS-gpu.md", "env.txt", "forced-tiny-6L-b1.log"} <= names
    assert not [n for n in names if "trace" in n.split("/")]  # the raw profiler trace stays behind
    assert not archive.with_name(archive.name + ".partial").exists()
    stamps = {name: (out / result).stat().st_mtime_ns for name, result in STAGES.items()}

    second = campaign("--out", str(out))  # everything is there: nothing runs again
    for name, result in STAGES.items():
        assert f"[skip] {name}:" in second
        assert (out / result).stat().st_mtime_ns == stamps[name]
    assert "[0]" not in second  # no stage command ran

    moved = tmp_path / "next"
    third = campaign("--out", str(moved), "--resume", str(out))  # a later call fed the earlier results
    for name, result in STAGES.items():
        assert f"[skip] {name}:" in third and (moved / result).exists()
    assert (moved / "profile-tiny-6L-device" / "profile.md").exists()

    # a device with too little memory skips the real-depth stage (no JSON: a later call may run it)
    (moved / "forced-tiny-6L-b1-device.json").unlink()
    fourth = campaign("--out", str(moved), env={"DART_JAX_CAMPAIGN_DEVICE_GIB": "0.001"})
    assert "[skip] forced-tiny-6L-b1-device: needs about" in fourth and "[0]" not in fourth
    assert not (moved / "forced-tiny-6L-b1-device.json").exists()
    assert "forced-tiny-6L-b1-device: skipped, needs about" in (moved / "RESULTS-gpu.md").read_text()
    assert "forced-tiny-6L-b1-cudnn: skipped, needs a GPU" in (moved / "RESULTS-gpu.md").read_text()


def test_the_cudnn_stage_is_the_device_loop_with_cudnn_attention_on_a_gpu_only(tmp_path):
    """Stage 3: stage 1's command (the device loop, forced τ) with --attention cudnn, marked GPU-only."""
    args = argparse.Namespace(out=tmp_path, smoke=False, skip_tests=True, resume=[], archive=None, budget_s=450.0,
                              compile_cache="")
    stages = gpu_campaign.Campaign(args).stages()
    first, cudnn = stages[0], stages[2]
    assert cudnn.name == "forced-Qwen3-8B-36L-b1-cudnn" and cudnn.gpu_only and not first.gpu_only
    command, base = cudnn.command(), first.command()
    at = command.index("--attention")
    assert command[at + 1] == "cudnn" and "--attention" not in base
    assert command[:at] == [a.replace("-cudnn", "-device") for a in base[:at]]  # stage 1's options, then the kernel
    assert command[command.index("--device-steps") + 1] == str(gpu_campaign.LOOP_STEPS)


def test_the_pallas_stage_is_the_device_loop_with_pallas_attention(tmp_path):
    """Stage 4: stage 1's command with --attention pallas, on every backend (Triton on a GPU)."""
    args = argparse.Namespace(out=tmp_path, smoke=False, skip_tests=True, resume=[], archive=None, budget_s=450.0,
                              compile_cache="")
    stages = gpu_campaign.Campaign(args).stages()
    first, pallas = stages[0], stages[3]
    assert pallas.name == "forced-Qwen3-8B-36L-b1-pallas" and not pallas.gpu_only
    command, base = pallas.command(), first.command()
    at = command.index("--attention")
    assert command[at + 1] == "pallas" and "--attention" not in base
    assert command[:at] == [a.replace("-pallas", "-device") for a in base[:at]]


def test_the_trainer_stage_runs_qwen3_8b_at_2048_tokens_after_its_decoding_stages(tmp_path):
    """Stage 17: benchmarks/train_shape.py at Qwen3-8B's real depth and the trainer's sequence length,
    after every decoding stage of that shape (the campaign runs most valuable first)."""
    args = argparse.Namespace(out=tmp_path, smoke=False, skip_tests=False, resume=[], archive=None, budget_s=450.0,
                              compile_cache="")
    stages = gpu_campaign.Campaign(args).stages()
    names = [s.name for s in stages]
    at = names.index("train-Qwen3-8B-36L")
    command = stages[at].command()
    assert command[1].endswith("benchmarks/train_shape.py")
    options = dict(zip(command[2::2], command[3::2]))
    assert options["--shape"] == "Qwen3-8B" and options["--layers"] == "36" and options["--seq"] == "2048"
    assert options["--output"] == str(tmp_path / "train-Qwen3-8B-36L.json")
    decoding = [n for n in names if n.startswith(("forced-Qwen3-8B", "profile-Qwen3-8B", "shapes-Qwen3-8B"))]
    assert decoding and all(names.index(n) < at for n in decoding)
    assert at > 0 and names[at + 1] == "tests"
    assert stages[at].min_device_gib > gpu_campaign.DEPTH["Qwen3-8B"][1]  # the weights, the head and AdamW


def test_a_trainer_stage_cut_short_is_reported_with_what_it_measured(tmp_path):
    """train_shape.py's <name>.json.partial (the online row only, no cache pass yet) is in the report, marked."""
    row = {"mesh": "1 device", "taps": "online", "batch": 4, "tokens_per_s": 5000.0, "epoch_tokens_per_s": 4800.0,
           "fused_ms": {"step": 1638.4}, "split_ms": {"target": 900.0, "head": 600.0, "optimizer": 20.0, "data": 1.0},
           "memory": [{"peak_bytes": 30 * 2**30}, {"peak_bytes": None}]}
    config = {"label": "Qwen3-8B (36 layers)", "target_dtype": "bfloat16", "seq": 2048, "draft_length": 7,
              "draft_vocab": 32000, "anchors_per_seq": 64, "steps": 3, "samples": 16}
    (tmp_path / "train-Qwen3-8B-36L.json.partial").write_text(json.dumps(
        {"config": config, "rows": [row], "cache_pass": None, "data_parallel": None, "partial": True}))
    report = gpu_campaign.report(tmp_path)
    assert "### The trainer on a random Qwen3-8B (36 layers) target (bfloat16; benchmarks/train_shape.py) (cut short)" \
        in report
    assert "| 1 device | online | 4 | 5000 | 4800 | 1638.4 | 900.0 | 600.0 | 20.0 | 1.0 | 30.0 |" in report
    assert "Cache pass" not in report and "Data-parallel mesh: not reached." in report


def test_resume_from_a_missing_folder_is_refused(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path / "o"), "--resume",
                           str(tmp_path / "nope")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--resume" in done.stderr and "no such folder" in done.stderr


def test_results_of_another_campaign_version_are_refused(tmp_path):
    """Stages keep their names when what they measure changes: a folder made by another version of
    the campaign (or an unmarked one, from before the versions) is refused as --resume and as --out,
    naming the versions; a new or empty folder is taken."""
    old = tmp_path / "old"
    old.mkdir()
    (old / "forced-tiny-6L-b1.json").write_text("{}")
    for args in (["--out", str(tmp_path / "o"), "--resume", str(old)], ["--out", str(old)]):
        done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2 and "campaign version 1 (unmarked)" in done.stderr, done.stderr
    (old / "campaign-version.txt").write_text("1\n")
    assert "version 1, this is version" in gpu_campaign.foreign_results(old)
    (old / "campaign-version.txt").write_text(gpu_campaign.CAMPAIGN_VERSION + "\n")
    assert gpu_campaign.foreign_results(old) is None
    empty = tmp_path / "empty"
    empty.mkdir()
    assert gpu_campaign.foreign_results(empty) is None


def test_report_shows_the_rows_of_a_stage_cut_short(tmp_path):
    """A forced stage killed by its time limit leaves <name>.json.partial: the report shows its rows,
    marked, and prefers the finished JSON where both exist."""
    row = {"tau_asked": 3.61, "batch": 1, "tau": 3.5, "ar_tok_s": 100.0, "dart_tok_s": 200.0, "speedup": 2.0,
           "same_output": True}
    config = {"model": {"shape": "Qwen3-8B", "layers": 36}, "keep": 60}
    (tmp_path / "forced-Qwen3-8B-36L-b1.json.partial").write_text(json.dumps(
        {"config": config, "rows": [row], "partial": True}))
    (tmp_path / "forced-Qwen3-8B-4L-b1.json.partial").write_text(json.dumps(
        {"config": {**config, "model": {"shape": "Qwen3-8B", "layers": 4}}, "rows": [row], "partial": True}))
    (tmp_path / "forced-Qwen3-8B-4L-b1.json").write_text(json.dumps(
        {"config": {**config, "model": {"shape": "Qwen3-8B", "layers": 4}}, "rows": [row, {**row, "tau_asked": 1.0}]}))
    text = gpu_campaign.report(tmp_path)
    assert "| Qwen3-8B (36 layers, 61-node trees) [host loop] (cut short) | 1 | 3.61 | 3.50 |" in text
    assert "| 1.75 |" in text  # step ÷ plain token = τ × plain ÷ DART = 3.5 × 100 / 200
    assert text.count("Qwen3-8B (4 layers, 61-node trees) [host loop] |") == 2  # the finished JSON's two rows, not the partial


def test_report_puts_variants_beside_their_stage(tmp_path):
    """The device loop's rows first, then the host loop's, then the other variants, each labelled
    with its settings; more τ values of the same settings continue the stage's rows under its label."""
    config = {"model": {"shape": "Qwen3-8B", "layers": 36}, "keep": 60}

    def rows(*taus):
        return [{"tau_asked": t, "batch": 1, "tau": t, "ar_tok_s": 100.0, "dart_tok_s": 150.0, "speedup": 1.5,
                 "same_output": True} for t in taus]

    for name, taus in (("forced-Qwen3-8B-36L-b1-xla", (3.61,)), ("forced-Qwen3-8B-36L-b1-devicemore", (5.0,)),
                       ("forced-Qwen3-8B-36L-b1", (3.61, 1.0)), ("forced-Qwen3-8B-4L-b1-device", (2.0,)),
                       ("forced-Qwen3-8B-36L-b1-device8", (1.0,)), ("forced-Qwen3-8B-36L-b1-device", (3.61, 1.0))):
        steps = 8 if name.endswith("device8") else gpu_campaign.LOOP_STEPS if "device" in name else 0
        (tmp_path / f"{name}.json").write_text(json.dumps({"config": {**config, "device_steps": steps} if "36L" in name
                                                           else {**config, "device_steps": steps,
                                                                 "model": {"shape": "Qwen3-8B", "layers": 4}},
                                                           "rows": rows(*taus)}))
    table = [line.split(" | ")[0:3] for line in gpu_campaign.report(tmp_path).splitlines()
             if line.startswith("| Qwen3-8B (")]
    deep, loop = "| Qwen3-8B (36 layers, 61-node trees)", f"device loop, {gpu_campaign.LOOP_STEPS} steps a call"
    assert table == [
        [f"{deep} [{loop}]", "1", "3.61"], [f"{deep} [{loop}]", "1", "1"], [f"{deep} [{loop}]", "1", "5"],
        [f"{deep} [host loop]", "1", "3.61"], [f"{deep} [host loop]", "1", "1"],
        [f"{deep} [device loop, {gpu_campaign.FEW_STEPS} steps a call]", "1", "1"],
        [f"{deep} [host loop, every verify with XLA's own GEMMs (Triton)]", "1", "3.61"],
        [f"| Qwen3-8B (4 layers, 61-node trees) [{loop}]", "1", "2"]]

"""The GPU campaign: every GPU figure the project tracks, in one command on an H100/H200.

    bash benchmarks/gpu_campaign.sh [--resume DIR]     # installs the project (no deps), then runs this
    python benchmarks/gpu_campaign.py --out DIR [--budget-s 450] [--resume DIR ...] [--archive FILE] [--smoke]

Stages, most valuable first; each writes its JSON (and log) to --out as it finishes, under its own
time limit, so a campaign cut short still leaves what it measured. A stage whose JSON is already
in --out or in a --resume folder is skipped (its JSON is copied into --out), so the next call goes
on where the last one stopped: pass the previous call's results as --resume. `--archive FILE`
packs --out (profile traces left out) into one .tar.gz after every stage: the device tool brings
back at most 8 files, and a call cut short still returns what it measured. A forced stage (and
the trainer's) cut short by its time limit keeps the rows it finished (`bench e2e --output` and
benchmarks/train_shape.py write `<name>.json.partial` after each row): the report shows them,
marked, and a resumed call runs the stage again.

Every model is random (bench/e2e.py `random_model`: bf16 weights drawn on the device at a Qwen3
shape, nothing written to disk), with trees of 61 nodes (keep 60, 8 levels) and one prompt of 128
new tokens; "plain" is the device loop of plain greedy decoding. "Device loop": LOOP_STEPS
speculative steps a device call, the trees searched on the device (`--device-steps`,
`Engine(device_steps=...)`); "host loop": one device call a step, the trees searched on the host.
 1. forced-Qwen3-8B-36L-b1-device: `bench e2e --force-tau 3.61,1 --device-steps 32` at the real
    depth (36 layers, 16 GB of weights), batch 1: the end-to-end speedup at the paper's τ
    (bench/forced.py), and at τ = 1 the bare step against a plain token (the issue's goal: within 1.2×).
 2. profile-Qwen3-8B-36L-device: `python -m dart_jax.bench.profile --device-steps 32` at τ 3.61: a
    device trace of one call of the device loop (32 steps) and the per-phase and per-op tables
    (profile.{json,md}; the device's tree search and the forcing are phases of their own). While
    the profiler traces, XLA runs a command buffer's kernels one by one (its default,
    `--xla_enable_command_buffers_during_profiling=false`), so every kernel is traced under its own
    HLO instruction and scope, with stage 1's settings: its programs come from the compilation
    cache, not compiled again.
 3. forced-Qwen3-8B-36L-b1-cudnn: stage 1 with the target attending by cuDNN's fused attention kernel
    (`--attention cudnn`, `Qwen3.use_attention`), DART's verify and plain decoding alike: the
    A/B of the attention's non-matmul work (0.8 ms of a 7 ms step in the 2026-11-26 profile, about
    seven kernels a layer). GPU only: skipped on another backend.
 4. forced-Qwen3-8B-36L-b1-pallas: stage 1 with the target attending by our Pallas kernel
    (`--attention pallas`, models/pallas_attention.py: the cache's window and the tree's nodes in
    one kernel, Triton on a GPU), DART's verify and plain decoding alike: with stages 1 and 3, the
    xla / cudnn / pallas A/B.
 5. forced-Qwen3-8B-36L-b1: stage 1 in the host loop, the same machine: what the device loop gains.
 6. forced-Qwen3-8B-36L-b1-device8: stage 1 at τ 1 with 8 steps a call: against stage 1's 32, what a
    device call costs besides its steps.
 7. forced-Qwen3-8B-36L-b1-cbwhile: stage 1 with XLA's command buffers holding whole while loops
    and conditionals (WHOLE_LOOP_COMMAND_BUFFERS; the default records only the kernels inside
    them, so each iteration is a host launch and a copy of the loop's predicate to the host);
    plain decoding's loop runs under it too.
 8. shapes-Qwen3-8B: `bench shapes`, the target's verify for trees of 2…64 rows (61: keep 60)
    against a decode call and a token of the device loop, at the full depth, and what a host call
    costs besides its device work (an empty call; a call taking every weight array).
 9. shapes-Qwen3-8B-ctx2048: stage 8 with 2048 tokens in the cache (the default 512), at 2 and 61 rows.
10. forced-Qwen3-8B-36L-b1-device128: stage 6 with 128 steps a call (the whole generation in one;
    its attention window is larger: every slot the last step may reach).
11. forced-Qwen3-8B-36L-b1-devicemore: stage 1 at τ 5, 3 and 2.
12. forced-Qwen3-4B-36L-b1-device, forced-Qwen3-1.7B-28L-b1-device: stage 1 at those shapes' real
    depths.
13. forced-Qwen3-8B-36L-pool: the host loop at τ 1 and 3.61, batch 4 and 16, 16-node trees
    (POOL_KEEP), through the pool, default and overlapped (`--overlap`: the host searches half
    the rows' trees while the device verifies the other half, `Batcher(overlap=True)`):
    `overlap_gain` = overlapped / default tok/s; then the same pools in the device loop
    (forced-Qwen3-8B-36L-pool-device).
14. forced-Qwen3-8B-4L-b1-device: every τ at 4 layers (where what is not the layers shows most).
15. forced-Qwen3-8B-36L-b1-xla: stage 5 with every verify compiled with XLA's own GEMMs
    (`--verify-gemms xla`): the A/B of the default, which compiles a step of 32 rows or more
    with cuBLAS (`qwen3.verify_compiler_options`) and plain decoding with XLA's (Triton) GEMMs.
16. shapes-Qwen3-8B-xla, shapes-Qwen3-8B-cublas: stage 8 at 32, 61 and 64 rows with XLA's GEMMs,
    and at 4 and 16 rows with cuBLAS: both kinds at 4 to 64 rows, where CUBLAS_MIN_ROWS is read off.
17. train-Qwen3-8B-36L: the trainer (benchmarks/train_shape.py: its own Trainer, `--profile`'s
    `profile`, `build_cache` and `train_loop`) on a random Qwen3-8B at the real depth, sequences of
    TRAIN_SEQ (2048) random ids, TRAIN_BATCH a step, the DART head's default sizes: tokens/s and the
    step in pieces (target forward, head forward+backward, optimizer, data), online taps then
    cached (the cache pass, bfloat16, timed after a one-batch warm-up pass that compiles it: the
    persistent compilation cache hands the timed pass its program), an epoch each way, the devices'
    peak memory (`memory_stats()`); with several devices the same on a data-parallel mesh over all
    of them (TRAIN_BATCH a device), on one device that is skipped and the JSON says so. After the
    decoding stages: the decoding figures come first.
18. tests: the suite in fp32 on the GPU (matmul precision "highest"), serving and notebook tests
    left out (their packages are not in the image), files that cannot be collected there (a
    missing package) reported, not fatal; when at least 150 s are left.
19. shapes-Qwen3-4B, shapes-Qwen3-1.7B.
20. shapes-Qwen3-30B-A3B: stage 8 on the Qwen3-MoE shape (MOE_SHAPE, 48 sparse layers, 128 experts,
    top-8): what a tree's verify costs where its nodes route to other experts (docs/spec.md §2.2).
A variant (a name after the stage: -device, -xla, ...; VARIANTS) is its stage again under other
settings, reported beside it. Settled by earlier campaigns (benchmarks/RESULTS.md) and no longer
run: fused projections (faster plain decoding, the same verify), XLA's command buffers (on: faster
plain decoding and step), stacked layer weights (benchmarks/layer_layout_probe.py: slower
one-row matmuls), the host loop's profile.
Every stage but the tests shares one persistent XLA compilation cache (--compile-cache): a
program compiled by an earlier stage, or an earlier call on the same machine, is loaded, not
compiled again (a 36-layer device loop takes about a minute to compile).
The real-depth stages are skipped, not failed, on a device with less memory than their weights
need (the skip is noted in the report, and a later call on a bigger device runs them); a GPU-only stage
(cuDNN) likewise on another backend; the Pallas stage runs everywhere (on a CPU, --smoke, in
Pallas' interpret mode).

Then RESULTS-gpu.md in --out: the tables of every stage found there. `--smoke` checks the campaign
itself on a CPU in a few minutes: the same stages on the tiny shape ("tiny", 6 layers for the
real-depth ones, 3 for stage 14; the trainer's at 128 tokens a sequence, 2 a step, one timed
step), one tree size per table, no tests (figures meaningless).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Callable

# the stages' names and settings as of this version; a folder of results made by another version
# measured other settings under the same names, so --resume (and --out) refuse it
CAMPAIGN_VERSION = "4"
VERSION_FILE = "campaign-version.txt"
PAPER_TAU_8B = 3.61
TAUS_FIRST = "3.61,1"  # stage 1: the paper's τ on Qwen3-8B, then the bare step
TAUS_MORE = "5,3,2"
PER_CALL_TAU = "1"  # stages 6 and 10: the step's cost is what they compare
SHAPES = ("Qwen3-8B", "Qwen3-4B", "Qwen3-1.7B")
MOE_SHAPE = "Qwen3-30B-A3B"  # stage 20 (bench.shapes.MOE_SHAPES)
# tree nodes besides the root (`bench shapes --keeps`): 60 is the engine's keep 60 (61 rows), the
# others give 2, 4, 16, 32 and 64 rows
BUDGETS = "1,3,15,31,60,63"
# real depth and the device memory it needs (bf16 weights, the head, caches, XLA's workspace), GiB
DEPTH = {"Qwen3-8B": (36, 24.0), "Qwen3-4B": (36, 14.0), "Qwen3-1.7B": (28, 8.0), "tiny": (6, 0.01),
         MOE_SHAPE: (48, 70.0)}
SHALLOW_LAYERS = 4  # stage 14
# the trainer's stage (benchmarks/train_shape.py): sequences of TRAIN_SEQ tokens, TRAIN_BATCH a device,
# and the device memory it needs (bf16 weights, the head in fp32 with AdamW's moments, 2048-token
# activations), GiB
TRAIN_SEQ, TRAIN_BATCH, TRAIN_GIB = 2048, 4, 40.0
LOOP_STEPS = 32  # steps per device call of the device loop (Engine(device_steps=...))
FEW_STEPS = 8  # stage 6's
MANY_STEPS = 128  # stage 10's: a whole generation of 128 tokens at τ 1 in one call
# the pool's trees: 16 nodes, not 61. At batch 16, 61-node trees verify 976 rows a step, about 16
# TFLOP at Qwen3-8B's depth: compute-bound, several plain batch steps (the 2026-11-26 campaign's
# 4-layer pool at keep 60 ran at 0.12-0.27x); keep="auto" sizes a pool's trees the same way
POOL_KEEP = ["--keep", "15"]
# a while loop's and a conditional's bodies recorded into CUDA graphs (conditional nodes) as well, not
# only the kernels inside them: a loop's steps are then not one host launch and predicate copy each
WHOLE_LOOP_COMMAND_BUFFERS = "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"
COMPILE_CACHE = Path("/tmp/dart_jax_campaign_xla_cache")  # the default --compile-cache: kept by a warm machine
# a stage again under other settings: name → (what, environment (XLA_FLAGS are added to the
# caller's), options added to the stage's command)
VARIANTS: dict[str, tuple[str, dict[str, str], tuple[str, ...]]] = {
    "device": (f"device loop, {LOOP_STEPS} steps a call", {}, ("--device-steps", str(LOOP_STEPS))),
    # more τ values, the same settings (the same label: its rows continue the stage's)
    "devicemore": (f"device loop, {LOOP_STEPS} steps a call", {}, ("--device-steps", str(LOOP_STEPS))),
    "device8": (f"device loop, {FEW_STEPS} steps a call", {}, ("--device-steps", str(FEW_STEPS))),
    "device128": (f"device loop, {MANY_STEPS} steps a call", {}, ("--device-steps", str(MANY_STEPS))),
    "cbwhile": (f"device loop, {LOOP_STEPS} steps a call, loops and conditionals in XLA command buffers",
                {"XLA_FLAGS": WHOLE_LOOP_COMMAND_BUFFERS}, ("--device-steps", str(LOOP_STEPS))),
    "cudnn": (f"device loop, {LOOP_STEPS} steps a call, attention by cuDNN's fused kernel", {},
              ("--device-steps", str(LOOP_STEPS), "--attention", "cudnn")),
    "pallas": (f"device loop, {LOOP_STEPS} steps a call, attention by our Pallas kernel", {},
               ("--device-steps", str(LOOP_STEPS), "--attention", "pallas")),
    "xla": ("every verify with XLA's own GEMMs (Triton)", {}, ("--verify-gemms", "xla")),
    "cublas": ("every verify with cuBLAS", {}, ("--verify-gemms", "cublas")),
    "ctx2048": ("2048 tokens in the cache", {}, ("--context", "2048")),  # bench shapes only
}
# in the shapes table, in this order, with the tree sizes each measures (`--keeps`: nodes besides
# the root, one sequence): with the default (cuBLAS from CUBLAS_MIN_ROWS = 32 rows up, XLA's GEMMs
# below) they give both kinds at 4 to 64 rows
SHAPE_VARIANTS = {"xla": "31,60,63", "cublas": "3,15", "ctx2048": "1,60"}


def variant_env(variant: str) -> dict[str, str] | None:
    """The environment of a stage's `variant` ("" or None: the caller's as it is)."""
    if not variant:
        return None
    env = dict(VARIANTS[variant][1])
    if not env:
        return None
    if "XLA_FLAGS" in env:
        env["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {env['XLA_FLAGS']}".strip()
    return env


# overrides the device memory the campaign reads (GiB), e.g. to check the skip on a CPU
MEMORY_ENV = "DART_JAX_CAMPAIGN_DEVICE_GIB"


def run(cmd: list[str], log: Path, limit_s: float, env: dict | None = None) -> tuple[int, float]:
    """Run `cmd` under a time limit, its output to `log`; → (exit code, seconds). 124: timed out."""
    start = time.perf_counter()
    with log.open("w") as f:
        f.write("$ " + " ".join([*(f"{k}='{v}'" for k, v in (env or {}).items()), *cmd]) + "\n")
        f.flush()
        try:
            code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=max(limit_s, 1),
                                  env={**os.environ, **(env or {})}).returncode
        except subprocess.TimeoutExpired:
            code = 124
    seconds = time.perf_counter() - start
    print(f"[{code}] {seconds:6.1f}s  {log.stem}", flush=True)
    return code, seconds


def load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@dataclasses.dataclass
class Stage:
    name: str
    result: str  # path of its JSON under --out: the stage is done when it exists and parses
    command: Callable[[], list[str]]
    limit_s: float
    env: dict | None = None
    min_left_s: float = 45.0
    min_device_gib: float = 0.0  # skipped (not failed) on a device with less memory
    gpu_only: bool = False  # skipped (not failed) on another backend (e.g. the smoke run on a CPU)


class Campaign:
    def __init__(self, args: argparse.Namespace):
        self.args, self.out = args, args.out
        self.deadline = time.perf_counter() + args.budget_s
        self.memory: float | None = None
        self.platform: str | None = None

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def device_gib(self) -> float:
        """The memory of the device the stages run on (GiB; a CPU: the host's), read once in a
        subprocess that allocates nothing; $DART_JAX_CAMPAIGN_DEVICE_GIB overrides it."""
        if self.memory is None:
            if os.environ.get(MEMORY_ENV):
                gib = float(os.environ[MEMORY_ENV])
            else:
                probe = ("import os, jax; d = jax.devices()[0]; s = d.memory_stats() or {}; "
                         "print(s.get('bytes_limit') or os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'))")
                done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                      env={**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
                try:
                    gib = int(done.stdout.strip().splitlines()[-1]) / 2**30
                except (ValueError, IndexError):
                    gib = float("inf")  # unknown: let the stage try
            self.memory = gib
        return self.memory

    def backend(self) -> str:
        """JAX's default backend where the stages run ("gpu", "cpu", ...), read once in a subprocess."""
        if self.platform is None:
            done = subprocess.run([sys.executable, "-c", "import jax; print(jax.default_backend())"],
                                  capture_output=True, text=True,
                                  env={**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
            lines = done.stdout.strip().splitlines()
            self.platform = lines[-1] if lines else "unknown"
        return self.platform

    def done(self, stage: Stage) -> bool:
        """Whether `stage` has its JSON in --out, or in a --resume folder (then copied here)."""
        if load(self.out / stage.result) is not None:
            return True
        for folder in self.args.resume:
            src = folder / stage.result
            if load(src) is not None:
                dst = self.out / stage.result
                dst.parent.mkdir(parents=True, exist_ok=True)
                if src.parent.name.startswith("profile-"):  # the whole profile folder (tables and trace)
                    shutil.copytree(src.parent, dst.parent, dirs_exist_ok=True)
                else:
                    shutil.copy2(src, dst)
                return True
        return False

    def model(self, shape: str, layers: int) -> list[str]:
        """The bench options of a random target of `shape` and `layers` drawn on the device, and
        the workload (one prompt, 128 new tokens; 16 with --smoke)."""
        return ["--random-shape", shape, "--random-layers", str(layers), "--limit", "1",
                "--max-new-tokens", "16" if self.args.smoke else "128"]

    def stages(self) -> list[Stage]:
        a, bench, out = self.args, [sys.executable, "-m", "dart_jax.bench"], self.args.out
        smoke = a.smoke
        shapes = ("tiny",) if smoke else SHAPES
        keep = ["--keep", "8" if smoke else "60"]
        reps = ["--reps", "1", "--warmup", "0"] if smoke else ["--reps", "3", "--warmup", "1"]
        tau = "3" if smoke else str(PAPER_TAU_8B)
        taus = "1,3" if smoke else TAUS_FIRST
        first = shapes[0]

        def forced(name: str, shape: str, layers: int, taus: str, limit: float, *extra: str,
                   deep: bool = True, nodes: list[str] = keep, variant: str = "", gpu_only: bool = False) -> Stage:
            name += f"-{variant}" if variant else ""
            return Stage(name, f"{name}.json", lambda: bench + [
                "e2e", "--force-tau", taus, *nodes, *reps, *self.model(shape, layers), *extra,
                *VARIANTS.get(variant, ("", {}, ()))[2], "--no-progress", "--output", str(out / f"{name}.json")], limit,
                env=variant_env(variant),
                min_device_gib=DEPTH[shape][1] if deep else 0.0, gpu_only=gpu_only)

        def shapes_stage(shape: str, variant: str = "") -> Stage:
            model = (["--tiny", "--reps", "2", "--warmup", "1", "--keeps", "1,4"] if smoke else
                     ["--model", shape, "--dtype", "bfloat16", "--reps", "20", "--warmup", "3", "--keeps",
                      SHAPE_VARIANTS[variant] if variant else BUDGETS])
            name = f"shapes-{shape}" + (f"-{variant}" if variant else "")
            return Stage(name, f"{name}.json", lambda: bench + [
                "shapes", *model, *VARIANTS.get(variant, ("", {}, ()))[2], "--no-progress",
                "--output", str(out / f"{name}.json")], 150,
                env=variant_env(variant), min_device_gib=DEPTH[shape][1])

        deep = DEPTH[first][0]
        profile = f"profile-{first}-{deep}L-device"
        b1 = f"forced-{first}-{deep}L-b1"
        loop = ["--device-steps", "3" if smoke else str(LOOP_STEPS)]
        shallow = 3 if smoke else SHALLOW_LAYERS
        stages = [
            forced(b1, first, deep, taus, 240, variant="device"),
            Stage(profile, f"{profile}/profile.json", lambda: [
                sys.executable, "-m", "dart_jax.bench.profile", "--out", str(out / profile), "--force-tau", tau,
                *keep, *loop, "--steps", "4" if smoke else str(LOOP_STEPS), *self.model(first, deep)], 200,
                min_device_gib=DEPTH[first][1]),
            forced(b1, first, deep, taus, 240, variant="cudnn", gpu_only=True),
            forced(b1, first, deep, taus, 240, variant="pallas"),
            forced(b1, first, deep, taus, 200),
            forced(b1, first, deep, PER_CALL_TAU, 200, variant="device8"),
            forced(b1, first, deep, taus, 240, variant="cbwhile"),
            shapes_stage(first),
            shapes_stage(first, "ctx2048"),
            forced(b1, first, deep, PER_CALL_TAU, 200, variant="device128"),
        ]
        if not smoke:  # the same code as stage 1
            stages.append(forced(b1, first, deep, TAUS_MORE, 240, variant="devicemore"))
        stages += [forced(f"forced-{s}-{DEPTH[s][0]}L-b1", s, DEPTH[s][0], taus, 200, variant="device")
                   for s in shapes[1:]]
        stages += [
            forced(f"forced-{first}-{deep}L-pool", first, deep, tau if smoke else f"1,{PAPER_TAU_8B}", 240,
                   "--force-batches", "2" if smoke else "4,16", "--overlap", nodes=keep if smoke else POOL_KEEP),
            forced(f"forced-{first}-{deep}L-pool", first, deep, tau if smoke else f"1,{PAPER_TAU_8B}", 240,
                   "--force-batches", "2" if smoke else "4,16", nodes=keep if smoke else POOL_KEEP, variant="device"),
            forced(f"forced-{first}-{shallow}L-b1", first, shallow, taus if smoke else f"{TAUS_FIRST},{TAUS_MORE}",
                   150, deep=False, variant="device"),
            forced(b1, first, deep, taus, 200, variant="xla"),
            shapes_stage(first, "xla"),
            shapes_stage(first, "cublas"),
            Stage(f"train-{first}-{deep}L", f"train-{first}-{deep}L.json", lambda: [
                sys.executable, str(Path(__file__).resolve().parent / "train_shape.py"), "--shape", first,
                "--layers", str(deep), "--seq", "128" if smoke else str(TRAIN_SEQ),
                "--batch", "2" if smoke else str(TRAIN_BATCH), "--steps", "1" if smoke else "3",
                "--epoch-steps", "2" if smoke else "4", "--output", str(out / f"train-{first}-{deep}L.json")], 180,
                min_left_s=60, min_device_gib=DEPTH[first][1] if smoke else TRAIN_GIB),
        ]
        if not (smoke or a.skip_tests):
            stages.append(Stage("tests", "tests.json", lambda: [
                sys.executable, "-m", "pytest", "-q", *test_workers(), "-p", "no:cacheprovider",
                "--continue-on-collection-errors", "--ignore=tests/test_serve_api.py",
                "--ignore=tests/test_serve_ui.py", "--ignore=tests/test_notebook.py",
                "--ignore=tests/test_bench_campaign.py"], 360,
                # JAX_PLATFORMS empty: the GPU (tests/conftest.py would pick the CPU when it is unset)
                env={"JAX_DEFAULT_MATMUL_PRECISION": "highest", "JAX_PLATFORMS": ""},
                min_left_s=150))
        stages += [shapes_stage(s) for s in shapes[1:]]
        if not smoke:
            stages.append(shapes_stage(MOE_SHAPE))
        return stages

    def run_all(self) -> None:
        for stage in self.stages():
            if self.done(stage):
                print(f"[skip] {stage.name}: {stage.result} is there", flush=True)
                continue
            if self.left() < stage.min_left_s:
                print(f"[stop] {stage.name}: {self.left():.0f} s left", flush=True)
                continue
            if stage.gpu_only and self.backend() != "gpu":
                why = f"needs a GPU, the stages run on {self.backend()}"
                print(f"[skip] {stage.name}: {why}", flush=True)
                (self.out / f"{stage.name}.skipped").write_text(why + "\n")
                continue
            if stage.min_device_gib and self.device_gib() < stage.min_device_gib:
                why = (f"needs about {stage.min_device_gib:g} GiB of device memory, the device has "
                       f"{self.device_gib():.1f} GiB")
                print(f"[skip] {stage.name}: {why}", flush=True)
                (self.out / f"{stage.name}.skipped").write_text(why + "\n")  # for the report; no JSON: a
                continue  # later call on a bigger device runs it
            env = stage.env
            if self.args.compile_cache and stage.name != "tests":  # the tests count their own compilations
                env = {**(env or {}), "JAX_COMPILATION_CACHE_DIR": self.args.compile_cache}
            code, seconds = run(stage.command(), self.out / f"{stage.name}.log",
                                min(stage.limit_s, self.left() - 15), env=env)
            if stage.name == "tests":  # its "JSON": the outcome, so that a later call skips it
                tail = [ln for ln in (self.out / "tests.log").read_text().splitlines() if ln.strip()][-1:]
                if code != 124:
                    (self.out / "tests.json").write_text(json.dumps(
                        {"exit_code": code, "seconds": seconds, "summary": tail[0] if tail else ""}) + "\n")
            self.pack()

    def pack(self) -> None:
        """--out as one .tar.gz at --archive (written beside it, then renamed: never half a file),
        the profiles' raw traces left out."""
        if self.args.archive is None:
            return
        report(self.out)
        pack_folder(self.out, self.args.archive)


def pack_folder(folder: Path, archive: Path) -> None:
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    with tarfile.open(partial, "w:gz") as tar:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "trace" not in path.relative_to(folder).parts:
                tar.add(path, arcname=str(path.relative_to(folder)))
    partial.replace(archive)


def foreign_results(folder: Path) -> str | None:
    """Why `folder`'s results cannot be taken as this campaign's (made by another version of it,
    whose stages measured other settings under the same names), or None."""
    version = folder / VERSION_FILE
    found = version.read_text().strip() if version.exists() else None
    if found == CAMPAIGN_VERSION or (found is None and not any(folder.glob("*.json"))):
        return None
    return (f"its results were made by campaign version {found or '1 (unmarked)'}, this is version "
            f"{CAMPAIGN_VERSION} (stages with the same names now measure other settings)")


def test_workers() -> list[str]:
    """pytest-xdist's 8 workers where the image has it."""
    return ["-n", "8"] if importlib.util.find_spec("xdist") else []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="folder for the JSON results, logs and RESULTS-gpu.md")
    ap.add_argument("--resume", type=Path, action="append", default=[], metavar="DIR",
                    help="a previous call's results: its finished stages are skipped (repeatable)")
    ap.add_argument("--archive", type=Path, metavar="FILE.tar.gz",
                    help="pack --out into this file after every stage (profile traces left out)")
    ap.add_argument("--budget-s", type=float, default=450.0,
                    help="wall-clock budget of the whole campaign (default 450: an 8-minute device call with margin)")
    ap.add_argument("--skip-tests", action="store_true", help="leave out the fp32 test stage")
    ap.add_argument("--compile-cache", default=str(COMPILE_CACHE), metavar="DIR",
                    help=f"JAX's persistent compilation cache, shared by the stages (default {COMPILE_CACHE}: "
                         "a warm machine keeps it between calls); '' turns it off")
    ap.add_argument("--smoke", action="store_true",
                    help="a check of the campaign itself on a CPU: the tiny shape (stages named 'tiny'), no tests "
                         "(figures meaningless)")
    args = ap.parse_args(argv)
    for folder in args.resume:
        if not folder.is_dir():
            ap.error(f"--resume {folder}: no such folder (pass the --out folder of an earlier call)")
        if (problem := foreign_results(folder)):
            ap.error(f"--resume {folder}: {problem}; resume only from a call of this version")
    if args.out.is_dir() and (problem := foreign_results(args.out)):
        ap.error(f"--out {args.out}: {problem}; give a new folder")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / VERSION_FILE).write_text(CAMPAIGN_VERSION + "\n")
    info = subprocess.run([sys.executable, "-c", "import jax, flax, numba; print(jax.__version__, flax.__version__, "
                           "numba.__version__, jax.devices()); from dart_jax.models.backend import defaults_for; "
                           "print('the defaults here:', defaults_for())"],
                          capture_output=True, text=True)
    smi = shutil.which("nvidia-smi")
    gpu = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout.strip() if smi else "(no nvidia-smi)"
    (args.out / "env.txt").write_text(f"{info.stdout}{info.stderr}\n{gpu}\n")
    campaign = Campaign(args)
    campaign.run_all()
    print(report(args.out))
    campaign.pack()
    return 0


def _speedup_table(rows: list[dict]) -> list[str]:
    lines = ["| target | batch | τ asked | τ measured | plain tok/s | DART tok/s | speedup | step ÷ plain token | "
             "step ms = device call + search + other | same output | resynced | unforced steps |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        # tokens per second per sequence: a step makes τ tokens, a plain token one
        ratio = r["tau"] * r["ar_tok_s"] / r["dart_tok_s"] if r["dart_tok_s"] else float("nan")
        split = (f"{r['step_ms']:.2f} = {r['device_call_ms']:.2f} + {r['search_ms']:.2f} + {r['host_other_ms']:.2f}"
                 if "step_ms" in r else "-")
        lines.append(f"| {r['_label']} | {r['batch']} | {r['tau_asked']:g} | {r['tau']:.2f} | {r['ar_tok_s']:.0f} | "
                     f"{r['dart_tok_s']:.0f} | **{r['speedup']:.2f}×** | {ratio:.2f} | {split} | {r['same_output']} | "
                     f"{r.get('resynced', 0)} | {r.get('unforced_steps', 0)} |")
    return lines


_FORCED_NAME = re.compile(r"forced-(?P<shape>.+)-(?P<layers>\d+)L-(?P<batch>[a-z0-9]+)(?:-(?P<variant>[a-z0-9]+))?$")
# the report's order of a stage's variants ("": the stage itself, the host loop)
REPORT_ORDER = ("device", "devicemore", "", "device8", "device128",
                *(v for v in VARIANTS if not v.startswith("device")))


def _forced_name(path: Path) -> dict[str, str]:
    """The parts of a forced stage's file name, forced-<shape>-<layers>L-<b1|pool>[-<variant>].json[.partial]."""
    match = _FORCED_NAME.match(path.name.split(".json")[0])
    return match.groupdict(default="") if match else {"shape": "", "layers": "0", "batch": "", "variant": ""}


def _stage_order(path: Path) -> tuple:
    """Report order: shape as in SHAPES, deeper first, batch 1 before the pool, the variants of a
    stage in REPORT_ORDER (the device loop's first)."""
    name = _forced_name(path)
    rank = (SHAPES + ("tiny",)).index(name["shape"]) if name["shape"] in SHAPES + ("tiny",) else 99
    variant = REPORT_ORDER.index(name["variant"]) if name["variant"] in REPORT_ORDER else len(REPORT_ORDER)
    return rank, -int(name["layers"]), name["batch"] != "b1", variant, path.name


def _gib(memory: list[dict] | None) -> str:
    """The largest peak of the devices' memory, GiB ("-" where the backend does not tell)."""
    peaks = [m["peak_bytes"] for m in memory or [] if m.get("peak_bytes") is not None]
    return f"{max(peaks) / 2**30:.1f}" if peaks else "-"


def _train_table(out: Path) -> list[str]:
    """The trainer's stage (benchmarks/train_shape.py) as a table, or nothing when it did not run (a
    skip is listed under the first table, with the others)."""
    lines = []
    # a stage cut short by its time limit leaves what it measured in <name>.json.partial
    found = list(out.glob("train-*.json")) + [p for p in out.glob("train-*.json.partial")
                                              if not (out / p.name[:-len(".partial")]).exists()]
    for path in sorted(found):
        d = load(path)
        if not d:
            continue
        c, p = d["config"], d["cache_pass"]
        cut = " (cut short)" if d.get("partial") else ""
        lines += ["", f"### The trainer on a random {c['label']} target ({c['target_dtype']}; "
                  f"benchmarks/train_shape.py){cut}", "",
                  f"{c['seq']} tokens a sequence, random ids; the DART head's default sizes (draft length "
                  f"{c['draft_length']}, {c['draft_vocab']} draft ids, {c['anchors_per_seq']} anchors a sequence); "
                  f"profile: {c['steps']} timed steps in pieces and as training runs them (`--profile`); epoch: "
                  f"`train_loop` over {c['samples']} sequences. Peak: the devices' largest peak so far.", "",
                  "| mesh | taps | batch | tokens/s (profile) | tokens/s (epoch) | step ms | target ms | "
                  "head ms | optimizer ms | data ms | peak GiB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in d["rows"]:
            split = r["split_ms"]
            lines.append(f"| {r['mesh']} | {r['taps']} | {r['batch']} | {r['tokens_per_s']:.0f} | "
                         f"{r['epoch_tokens_per_s']:.0f} | {r['fused_ms']['step']:.1f} | {split['target']:.1f} | "
                         f"{split['head']:.1f} | {split['optimizer']:.1f} | {split['data']:.1f} | {_gib(r['memory'])} |")
        if p:
            lines += ["", f"Cache pass: {p['tokens']} tokens in {p['seconds']:.2f} s ({p['tokens_per_s']:.0f} tokens/s; "
                      f"{p['bytes'] / 2**30:.2f} GiB of {p['dtype']} taps; its compilation in a one-batch warm-up "
                      f"pass of {p['warm_up_seconds']:.2f} s before it)."]
        lines += ["", f"Data-parallel mesh: {d['data_parallel'] or 'not reached'}."]
    return lines


def report(out: Path) -> str:
    """RESULTS-gpu.md in `out` from every stage's JSON there; → its text."""
    env = (out / "env.txt").read_text().strip() if (out / "env.txt").exists() else "?"
    lines = [f"## GPU campaign, {datetime.date.today().isoformat()}", "",
             "Command: `bash benchmarks/gpu_campaign.sh` (benchmarks/gpu_campaign.py). Hardware and versions:", "",
             "```", env, "```", "",
             "### End-to-end speedup at forced acceptance (random weights, bf16 at the Qwen3 shapes; "
             "`bench e2e --force-tau`)", "",
             "The trees hold plain greedy decoding's next D tokens, D drawn per step with mean τ - 1 (geometric, "
             "capped at the tree depth); same tree size, verify and step as DART (dart_jax/bench/forced.py). "
             "Step ÷ plain token = τ measured × plain tok/s ÷ DART tok/s.", ""]
    rows, overlap = [], []
    # a stage cut short by its time limit leaves the rows it measured in <name>.json.partial
    found = list(out.glob("forced-*.json")) + [p for p in out.glob("forced-*.json.partial")
                                               if not (out / p.name[:-len(".partial")]).exists()]
    for path in sorted(found, key=_stage_order):
        d = load(path)
        if not d:
            continue
        cut = " (cut short)" if d.get("partial") else ""
        model = d.get("config", {}).get("model", {})
        keep = d.get("config", {}).get("keep")
        nodes = f", {int(keep) + 1}-node trees" if isinstance(keep, int) else ""
        what = VARIANTS.get(_forced_name(path)["variant"], ("",))[0]
        if not d.get("config", {}).get("device_steps"):  # one device call a step
            what = "host loop" + (f", {what}" if what else "")
        label = f"{model.get('shape', '?')} ({model.get('layers', '?')} layers{nodes}){f' [{what}]' if what else ''}{cut}"
        labelled = [{**r, "_label": label} for r in d["rows"]]
        rows += labelled
        overlap += [r for r in labelled if "overlap_gain" in r]
    lines += _speedup_table(rows) if rows else ["(not measured: see the logs)"]
    lines += [f"- {p.stem}: skipped, {p.read_text().strip()}" for p in sorted(out.glob("*.skipped"))
              if not (out / f"{p.stem}.json").exists()]
    if overlap:
        lines += ["", "### The pool with the tree search overlapped (`--overlap`: half the rows searched while the "
                  "other half verifies)", "",
                  "| target | batch | τ | default tok/s | overlapped tok/s | gain | search ms / half-step | "
                  "wait ms / half-step | same output |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['_label']} | {r['batch']} | {r['tau']:.2f} | {r['dart_tok_s']:.0f} | {r['overlap_tok_s']:.0f} | "
                  f"**{r['overlap_gain']:.2f}×** | {r['overlap_search_ms_per_half_step']:.2f} | "
                  f"{r['overlap_wait_ms_per_half_step']:.2f} | {r['overlap_same_output']} |" for r in overlap]
    profiles = sorted(out.glob("profile-*/profile.md"))
    lines += [""] + ([p.read_text().strip() for p in profiles] or ["### Profile\n\n(not measured: see the logs)"])
    shape_files = {(shape, variant): load(out / (f"shapes-{shape}" + (f"-{variant}" if variant else "") + ".json"))
                   for shape in SHAPES + (MOE_SHAPE, "tiny") for variant in ("", *SHAPE_VARIANTS)}
    # the tree sizes the files hold (the constants' where none is there yet)
    budgets = sorted({int(b) for d in shape_files.values() if d for b in d["summary"]["verify_ms"]}
                     or {int(b) for b in ",".join([BUDGETS, *SHAPE_VARIANTS.values()]).split(",")})
    lines += ["", "### Verify step by tree size (random weights, bf16; ms, and ratio to a token of plain decoding's "
              "device loop; nodes with the root, one sequence; c: compiled with cuBLAS GEMMs)", "",
              "Host calls besides their device work: an empty call (one tiny array), and a call taking every "
              "weight array and the cache as a step does (reads one element).", "",
              "| shape | empty call ms | call with the weights ms | decode call ms | plain token ms | "
              + " | ".join(f"{b + 1} nodes" for b in budgets) + " |",
              "|---|---|---|---|---|" + "---|" * len(budgets)]
    for shape in SHAPES + (MOE_SHAPE, "tiny"):
        for variant in ("", *SHAPE_VARIANTS):
            d = shape_files[(shape, variant)]
            label = shape + (f" [{VARIANTS[variant][0]}]" if variant else "")
            if not d:
                if shape != "tiny" and not variant:
                    lines.append(f"| {label} | (not measured) |")
                continue
            s = d["summary"]
            cublas = {str(r["budget"]) for r in d.get("rows", []) if r.get("gemms") == "cublas"}
            cells = [f"{s['verify_ms'][b]:.2f} ({s['ratio_to_plain'][b]:.2f}×{', c' if b in cublas else ''})"
                     if b in s["verify_ms"] else "-" for b in map(str, budgets)]
            calls = s.get("call_ms", {})
            lines.append(f"| {label} | " + " | ".join(f"{calls[c]:.3f}" if c in calls else "-"
                                                       for c in ("empty", "weights"))
                         + f" | {s['decode_ms']:.2f} | {s['plain_token_ms']:.2f} | " + " | ".join(cells) + " |")
    lines += _train_table(out)
    tests = load(out / "tests.json")
    if tests:
        lines += ["", "### Test suite on the GPU (fp32, matmul precision highest)", "", f"`{tests['summary']}`"]
    text = "\n".join(lines) + "\n"
    (out / "RESULTS-gpu.md").write_text(text)
    return text


if __name__ == "__main__":
    sys.exit(main())

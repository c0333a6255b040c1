"""The GPU campaign: every GPU figure the project tracks, in one command on an H100/H200.

    bash benchmarks/gpu_campaign.sh [--resume DIR]     # installs the project (no deps), then runs this
    python benchmarks/gpu_campaign.py --out DIR [--budget-s 450] [--resume DIR ...] [--smoke]

Stages, most valuable first; each writes its JSON (and log) to --out as it finishes, under its own
time limit, so a campaign cut short still leaves what it measured. A stage whose JSON is already
in --out or in a --resume folder is skipped (its JSON is copied into --out), so the next call goes
on where the last one stopped: pass the previous call's results as --resume.

 1. forced-Qwen3-8B-b1: `bench e2e --force-tau 1,2,3,3.61,5` on a random target of the Qwen3-8B
    widths and vocabulary (bf16, --layers layers, default 4; built once outside --out and shared
    by stages 1, 3, 4, 5), batch 1, 61-node trees: the end-to-end speedup at forced acceptance
    (dart_jax/bench/forced.py); τ = 1 gives the bare step against a plain token.
 2. forced-Qwen3-8B-36L-b1: the same at the real depth, 36 layers (the issue's goal is stated
    there), τ = 3.61 and 1 only, batch 1, 61-node trees; the weights (16 GB of bf16) are drawn on
    the device (`bench e2e --random-shape Qwen3-8B --random-layers 36`: nothing written to disk);
    skipped, not failed, on a device with less than 24 GiB (the skip is noted in the report, and a
    later call on a bigger device runs it).
 3. profile-Qwen3-8B: `python -m dart_jax.bench.profile` at τ 3.61: a device trace of 8 steps,
    the per-phase and per-op tables (profile-Qwen3-8B/profile.{json,md}, the trace beside them).
 4. forced-Qwen3-8B-pool: stage 1 at batch 4 and 16 through the continuous-batching pool.
 5. forced-Qwen3-8B-overlap: the pool at τ 3.61, batch 4 and 16, default and overlapped
    (`--overlap`: the host searches half the rows' trees while the device verifies the other
    half, `Batcher(overlap=True)`), in one process: `overlap_gain` = overlapped / default tok/s.
 6. forced-Qwen3-4B-b1, forced-Qwen3-1.7B-b1: stage 1 at those shapes.
 7. tests: the suite in fp32 on the GPU (matmul precision "highest"), serving and notebook tests
    left out (their packages are not in the image); when at least 150 s are left.
 8. shapes-Qwen3-8B/4B/1.7B: `bench shapes`, the target's verify for trees of 1…60 nodes against
    a decode step (measured on 2026-11-25; kept for comparison).

Then RESULTS-gpu.md in --out: the tables of every stage found there. `--smoke` checks the campaign
itself on a CPU in a few minutes: the stages of one tiny random model ("tiny"; stage 2 at 6
layers of bench.shapes' tiny shape, drawn in memory) instead of the three shapes, no tests
(figures meaningless).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

PAPER_TAU_8B = 3.61
TAUS = "1,2,3,3.61,5"
SHAPES = ("Qwen3-8B", "Qwen3-4B", "Qwen3-1.7B")
BUDGETS = "1,4,16,32,60"
DEEP_LAYERS = 36  # stage 2: Qwen3-8B at its real depth
DEEP_GIB = 24.0  # its device memory: 16.4 GB of bf16 weights, the head, caches and XLA's workspace
# overrides the device memory the campaign reads (GiB), e.g. to check the skip on a CPU
MEMORY_ENV = "DART_JAX_CAMPAIGN_DEVICE_GIB"


def run(cmd: list[str], log: Path, limit_s: float, env: dict | None = None) -> tuple[int, float]:
    """Run `cmd` under a time limit, its output to `log`; → (exit code, seconds). 124: timed out."""
    start = time.perf_counter()
    with log.open("w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
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
    needs: str | None = None  # the model set it runs on (built on first need)
    env: dict | None = None
    min_left_s: float = 45.0
    min_device_gib: float = 0.0  # skipped (not failed) on a device with less memory


class Campaign:
    def __init__(self, args: argparse.Namespace):
        self.args, self.out = args, args.out
        self.deadline = time.perf_counter() + args.budget_s
        self.assets: dict[str, Path | None] = {}
        self.tmp = Path(tempfile.mkdtemp(prefix="dart_jax_campaign_"))

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def device_gib(self) -> float:
        """The memory of the device the stages run on (GiB; a CPU: the host's), read once in a
        subprocess that allocates nothing; $DART_JAX_CAMPAIGN_DEVICE_GIB overrides it."""
        if "device_gib" not in self.assets:
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
            self.assets["device_gib"] = gib
        return self.assets["device_gib"]

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

    def model(self, shape: str) -> Path | None:
        """The random model set of `shape` (tiny with --smoke), built on first need; None if that failed."""
        if shape not in self.assets:
            folder = self.tmp / shape
            build = ("import sys; from dart_jax.bench.tiny import build_random_assets as b; "
                     "from dart_jax.bench.shapes import KNOWN_SHAPES as K; "
                     "b(sys.argv[1], layers=int(sys.argv[2]), shape=None if sys.argv[3] == '-' else K[sys.argv[3]])")
            code, _ = run([sys.executable, "-c", build, str(folder), str(3 if self.args.smoke else self.args.layers),
                           "-" if self.args.smoke else shape], self.out / f"build-{shape}.log",
                          min(240, self.left() - 30))
            self.assets[shape] = folder if code == 0 else None
        return self.assets[shape]

    def given(self, shape: str) -> list[str]:
        folder = self.assets[shape]
        return ["--base", str(folder / "base"), "--dart", str(folder / "head"), "--ngram", str(folder / "ngram.trie"),
                *self.workload()]

    def workload(self) -> list[str]:
        return ["--limit", "1", "--max-new-tokens", "16" if self.args.smoke else "128", "--no-progress"]

    def stages(self) -> list[Stage]:
        a, bench = self.args, [sys.executable, "-m", "dart_jax.bench"]
        shapes = ("tiny",) if a.smoke else SHAPES
        taus = "1,3" if a.smoke else TAUS
        keep = "8" if a.smoke else "60"
        reps = ["--reps", "1", "--warmup", "0"] if a.smoke else ["--reps", "3", "--warmup", "1"]
        out = self.out
        stages = []
        for i, shape in enumerate(shapes):
            stages.append(Stage(f"forced-{shape}-b1", f"forced-{shape}-b1.json", lambda s=shape: bench + [
                "e2e", "--force-tau", taus, "--keep", keep, *reps, *self.given(s),
                "--output", str(out / f"forced-{s}-b1.json")], 200, needs=shape))
            if i == 0:
                deep = 6 if a.smoke else DEEP_LAYERS
                stages.append(Stage(f"forced-{shape}-{deep}L-b1", f"forced-{shape}-{deep}L-b1.json",
                                    lambda s=shape, d=deep: bench + [
                    "e2e", "--force-tau", "3,1" if a.smoke else f"{PAPER_TAU_8B},1", "--keep", keep, *reps,
                    "--random-shape", s, "--random-layers", str(d), *self.workload(),
                    "--output", str(out / f"forced-{s}-{d}L-b1.json")], 150,
                    min_device_gib=0.01 if a.smoke else DEEP_GIB))
                stages.append(Stage(f"profile-{shape}", f"profile-{shape}/profile.json", lambda s=shape: [
                    sys.executable, "-m", "dart_jax.bench.profile", "--out", str(out / f"profile-{s}"),
                    "--force-tau", "3" if a.smoke else str(PAPER_TAU_8B), "--keep", keep,
                    "--steps", "2" if a.smoke else "8", *[x for x in self.given(s) if x != "--no-progress"]], 150,
                    needs=shape))
                stages.append(Stage(f"forced-{shape}-pool", f"forced-{shape}-pool.json", lambda s=shape: bench + [
                    "e2e", "--force-tau", "3" if a.smoke else f"1,{PAPER_TAU_8B}", "--force-batches",
                    "2" if a.smoke else "4,16", "--keep", keep, *reps, *self.given(s),
                    "--output", str(out / f"forced-{s}-pool.json")], 200, needs=shape))
                stages.append(Stage(f"forced-{shape}-overlap", f"forced-{shape}-overlap.json", lambda s=shape: bench + [
                    "e2e", "--force-tau", "3" if a.smoke else str(PAPER_TAU_8B), "--force-batches",
                    "2" if a.smoke else "4,16", "--overlap", "--keep", keep, *reps, *self.given(s),
                    "--output", str(out / f"forced-{s}-overlap.json")], 150, needs=shape))
        if not (a.smoke or a.skip_tests):
            stages.append(Stage("tests", "tests.json", lambda: [
                sys.executable, "-m", "pytest", "-q", "-x", "-n", "8", "-p", "no:cacheprovider",
                "--ignore=tests/test_serve_api.py", "--ignore=tests/test_serve_ui.py", "--ignore=tests/test_notebook.py",
                "--ignore=tests/test_bench_campaign.py"], 360, env={"JAX_DEFAULT_MATMUL_PRECISION": "highest"},
                min_left_s=150))
        for shape in shapes:
            model = (["--tiny", "--reps", "2", "--warmup", "1", "--budgets", "1,4"] if a.smoke else
                     ["--model", shape, "--dtype", "bfloat16", "--reps", "20", "--warmup", "3", "--budgets", BUDGETS])
            stages.append(Stage(f"shapes-{shape}", f"shapes-{shape}.json", lambda s=shape, m=model: bench + [
                "shapes", *m, "--no-progress",
                "--output", str(out / f"shapes-{s}.json")], 150))
        return stages

    def run_all(self) -> None:
        try:
            for stage in self.stages():
                if self.done(stage):
                    print(f"[skip] {stage.name}: {stage.result} is there", flush=True)
                    continue
                if self.left() < stage.min_left_s:
                    print(f"[stop] {stage.name}: {self.left():.0f} s left", flush=True)
                    continue
                if stage.min_device_gib and self.device_gib() < stage.min_device_gib:
                    why = (f"needs about {stage.min_device_gib:g} GiB of device memory, the device has "
                           f"{self.device_gib():.1f} GiB")
                    print(f"[skip] {stage.name}: {why}", flush=True)
                    (self.out / f"{stage.name}.skipped").write_text(why + "\n")  # for the report; no JSON: a
                    continue  # later call on a bigger device runs it
                if stage.needs and self.model(stage.needs) is None:
                    print(f"[fail] {stage.name}: the {stage.needs} model set was not built (see its build log)")
                    continue
                code, seconds = run(stage.command(), self.out / f"{stage.name}.log",
                                    min(stage.limit_s, self.left() - 15), env=stage.env)
                if stage.name == "tests":  # its "JSON": the outcome, so that a later call skips it
                    tail = [ln for ln in (self.out / "tests.log").read_text().splitlines() if ln.strip()][-1:]
                    if code != 124:
                        (self.out / "tests.json").write_text(json.dumps(
                            {"exit_code": code, "seconds": seconds, "summary": tail[0] if tail else ""}) + "\n")
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="folder for the JSON results, logs and RESULTS-gpu.md")
    ap.add_argument("--resume", type=Path, action="append", default=[], metavar="DIR",
                    help="a previous call's results: its finished stages are skipped (repeatable)")
    ap.add_argument("--budget-s", type=float, default=450.0,
                    help="wall-clock budget of the whole campaign (default 450: an 8-minute device call with margin)")
    ap.add_argument("--layers", type=int, default=4, help="layers of the random targets (default 4)")
    ap.add_argument("--skip-tests", action="store_true", help="leave out the fp32 test stage")
    ap.add_argument("--smoke", action="store_true",
                    help="a check of the campaign itself on a CPU: one tiny model (stages named 'tiny'), no tests "
                         "(figures meaningless)")
    args = ap.parse_args(argv)
    for folder in args.resume:
        if not folder.is_dir():
            ap.error(f"--resume {folder}: no such folder (pass the --out folder of an earlier call)")
    args.out.mkdir(parents=True, exist_ok=True)
    info = subprocess.run([sys.executable, "-c", "import jax, flax, numba; print(jax.__version__, flax.__version__, "
                           "numba.__version__, jax.devices())"], capture_output=True, text=True)
    smi = shutil.which("nvidia-smi")
    gpu = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout.strip() if smi else "(no nvidia-smi)"
    (args.out / "env.txt").write_text(f"{info.stdout}{info.stderr}\n{gpu}\n")
    Campaign(args).run_all()
    report(args.out, 3 if args.smoke else args.layers)
    return 0


def _speedup_table(rows: list[dict], label: str) -> list[str]:
    lines = [f"| {label} | batch | τ asked | τ measured | plain tok/s | DART tok/s | speedup | same output | resynced |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['_label']} | {r['batch']} | {r['tau_asked']:g} | {r['tau']:.2f} | {r['ar_tok_s']:.0f} | "
                     f"{r['dart_tok_s']:.0f} | **{r['speedup']:.2f}×** | {r['same_output']} | {r.get('resynced', 0)} |")
    return lines


def report(out: Path, layers: int | str = "?") -> None:
    env = (out / "env.txt").read_text().strip() if (out / "env.txt").exists() else "?"
    lines = [f"## GPU campaign, {datetime.date.today().isoformat()}", "",
             "Command: `bash benchmarks/gpu_campaign.sh` (benchmarks/gpu_campaign.py). Hardware and versions:", "",
             "```", env, "```", "",
             "### End-to-end speedup at forced acceptance (random weights, bf16 at the Qwen3 shapes; "
             "`bench e2e --force-tau`)", "",
             "The trees hold plain greedy decoding's next D tokens, D drawn per step with mean τ - 1 (geometric, "
             "capped at the tree depth); same tree size, verify and step as DART (dart_jax/bench/forced.py).", ""]
    rows, overlap, skipped = [], [], []
    for shape in SHAPES + ("tiny",):
        deep = sorted(out.glob(f"forced-{shape}-*L-b1.json")) + sorted(out.glob(f"forced-{shape}-*L-b1.skipped"))
        kinds = dict.fromkeys([("b1", layers)] + [(p.stem.split(f"forced-{shape}-")[1], p.stem.split("-")[-2][:-1])
                                                  for p in deep] + [("pool", layers), ("overlap", layers)])
        for kind, depth in kinds:
            note = out / f"forced-{shape}-{kind}.skipped"
            if note.exists() and not (out / f"forced-{shape}-{kind}.json").exists():
                skipped.append(f"forced-{shape}-{kind}: skipped, {note.read_text().strip()}")
                continue
            d = load(out / f"forced-{shape}-{kind}.json")
            if d:
                labelled = [{**r, "_label": f"{shape} ({depth} layers)"} for r in d["rows"]]
                rows += labelled
                overlap += [r for r in labelled if "overlap_gain" in r]
    lines += _speedup_table(rows, "target") if rows else ["(not measured: see the logs)"]
    lines += [f"- {s}" for s in dict.fromkeys(skipped)]
    if overlap:
        lines += ["", "### The pool with the tree search overlapped (`--overlap`: half the rows searched while the "
                  "other half verifies)", "",
                  "| target | batch | τ | default tok/s | overlapped tok/s | gain | search ms / half-step | "
                  "wait ms / half-step | same output |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['_label']} | {r['batch']} | {r['tau']:.2f} | {r['dart_tok_s']:.0f} | {r['overlap_tok_s']:.0f} | "
                  f"**{r['overlap_gain']:.2f}×** | {r['overlap_search_ms_per_half_step']:.2f} | "
                  f"{r['overlap_wait_ms_per_half_step']:.2f} | {r['overlap_same_output']} |" for r in overlap]
    prof = next(iter(sorted(out.glob("profile-*/profile.md"))), None)
    lines += ["", prof.read_text().strip() if prof else "### Profile\n\n(not measured: see the logs)"]
    lines += ["", "### Verify step by tree size (random weights, bf16; ms, and ratio to a token of plain decoding's "
              "device loop)", "",
              "| shape | decode call ms | plain token ms | " + " | ".join(f"{b} nodes" for b in BUDGETS.split(",")) + " |",
              "|---|---|---|" + "---|" * len(BUDGETS.split(","))]
    for shape in SHAPES + ("tiny",):
        d = load(out / f"shapes-{shape}.json")
        if not d and shape == "tiny":
            continue
        if not d:
            lines.append(f"| {shape} | (not measured) |")
            continue
        s = d["summary"]
        cells = [f"{s['verify_ms'][b]:.2f} ({s['ratio_to_plain'][b]:.2f}×)" if b in s["verify_ms"] else "-"
                 for b in BUDGETS.split(",")]
        lines.append(f"| {shape} | {s['decode_ms']:.2f} | {s['plain_token_ms']:.2f} | " + " | ".join(cells) + " |")
    tests = load(out / "tests.json")
    if tests:
        lines += ["", "### Test suite on the GPU (fp32, matmul precision highest)", "", f"`{tests['summary']}`"]
    (out / "RESULTS-gpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())

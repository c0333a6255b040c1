"""Audit: bad inputs of every family issue 42 names, each run and its outcome classified.

    python scripts/audit_bad_inputs.py [--quick] [--family NAME ...] [--verbose]

Families: the command lines (generate, serve, launch, convert, ngram, train, bench; run as
subprocesses with a timeout), the Python API (calls on the tiny demo model), the HTTP API (requests
to a live `python -m dart_jax.serve` on 127.0.0.1, with and without --api-key), GGUF files, the
converted GGUF cache, DART heads, n-gram tries and JSON files, all damaged copies of the tiny
checkpoints of dart_jax/bench/tiny.py. Each outcome is one of:

  clear       a user error: exit code 2 with an `error:` line, an InputError/ValueError/
              FileNotFoundError, or an HTTP 4xx with an OpenAI-shaped error
  recovered   a case where recovery is the right answer (a damaged cache rebuilt, a damaged
              checkpoint passed over), and its result checked
  traceback   a Python traceback, or an exception that is not a user error
  5xx         an HTTP status of 500 or more (or a server that stops answering)
  hang        no answer within the case's timeout
  data lost   an input file changed
  no auth     a model route answered without the key on a server that has one
  silent      accepted without a word where an error was due (or a recovery whose result is wrong)

It prints each failure, then the counts per class and per family, and exits 1 when any
traceback, 5xx, hang, data lost, no auth or silent outcome remains. `--quick` runs a few cases
per family (tests/test_audit_harness.py runs it): cheap ones (a command line argparse refuses rather
than one that loads JAX first, Python calls refused before a model loads), and for the servers a
health check after their cases where the full run sends a first generation (which compiles the
decode step).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the GGUF writer and the live-server helper of the tests
DEMO = ROOT / "dart_jax" / "demo"
KEY = "audit-key"
NAME = "dart-jax-demo"
DEEP = "[" * 100000 + "]" * 100000
FATAL = ("traceback", "5xx", "hang", "data lost", "no auth", "silent")


@dataclass
class Case:
    family: str
    name: str
    run: Callable[[], tuple[str, str]]  # (class, detail)
    quick: bool = False
    inputs: tuple = ()  # files or folders that must come out unchanged
    parallel: bool = False  # a subprocess that may run beside another


@dataclass
class Audit:
    cases: list[Case] = field(default_factory=list)

    def add(self, family, name, run, *, quick=False, inputs=(), parallel=False):
        self.cases.append(Case(family, name, run, quick, tuple(inputs), parallel))


# -- outcomes ----------------------------------------------------------------------------------------
def digest(paths) -> dict[str, str]:
    out = {}
    for p in map(Path, paths):
        files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p] if p.exists() else []
        for f in files:
            out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def run_case(case: Case) -> tuple[str, str]:
    before = digest(case.inputs)
    try:
        kind, detail = case.run()
    except Exception as e:  # noqa: BLE001 - a bug of the harness's own setup is reported, not hidden
        kind, detail = "traceback", f"harness: {type(e).__name__}: {e}"
    if digest(case.inputs) != before:
        return "data lost", f"an input changed ({detail})"
    return kind, detail


def cli(argv: list[str], *, ok: Callable[[subprocess.CompletedProcess], bool] | None = None, timeout: float = 120,
        env: dict | None = None):
    """A command `python -m dart_jax.<argv>`: an error is due unless `ok` (a check of the finished
    process) is given."""
    def run():
        try:
            done = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=timeout,
                                  cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})},
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return "hang", f"no exit within {timeout} s"
        err = done.stderr.strip()
        last = err.splitlines()[-1] if err else ""
        if "Traceback (most recent call last)" in err:
            return "traceback", last[-200:]
        if ok is not None:
            return ("recovered", last[-120:]) if done.returncode == 0 and ok(done) else ("silent", f"rc {done.returncode}: {last[-200:]}")
        if done.returncode == 2 and "error:" in last:
            return "clear", last[-160:]
        if done.returncode == 0:
            return "silent", f"exit 0: {(done.stdout.strip().splitlines() or [''])[-1][-120:]}"
        return "traceback", f"rc {done.returncode} without an error line: {last[-200:]}"
    return run


def api(call: Callable[[], object], *, ok: Callable[[object], bool] | None = None):
    """A Python call: a user error (ValueError, FileNotFoundError) is due unless `ok` checks its result."""
    def run():
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                result = call()
        except (ValueError, FileNotFoundError) as e:
            return ("clear", f"{type(e).__name__}: {str(e)[:160]}") if ok is None else ("silent", f"refused: {e}")
        except Exception as e:  # noqa: BLE001 - counted
            return "traceback", f"{type(e).__name__}: {str(e)[:200]}"
        if ok is None:
            return "silent", f"returned {str(result)[:120]!r}"
        return ("recovered", err.getvalue().strip()[:120]) if ok(result) else ("silent", "wrong result")
    return run


class LazyDemo:
    """The tiny demo model, loaded at its first use: a run none of whose cases calls it (the quick
    run) does not pay for it."""

    def __init__(self):
        self._model = None

    def __getattr__(self, name):
        if self._model is None:
            from dart_jax import DartModel

            self._model = DartModel.demo("tiny", keep=16)
        return getattr(self._model, name)


# -- the tiny checkpoints and their damaged copies -------------------------------------------------------
def zero(path: Path, at: int, n: int = 64) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(bytes(n))


def copy(src: Path, dst: Path) -> Path:
    (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    return dst


def make_gguf(folder: Path, **damage) -> Path:
    from gguf_writer import write_gguf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from dart_jax.bench.tiny import make_tiny_llama

    hf = folder / "hf"
    if not hf.exists():
        make_tiny_llama(hf, seed=5, vocab_size=384)
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=330, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(["the quick brown fox jumps over the lazy dog " * 20], trainer)
        tok.save(str(folder / "tokenizer.json"))
    name = "-".join(f"{k}{v}" for k, v in damage.items()) or "good"
    return write_gguf(folder / f"{name}.gguf", hf, folder / "tokenizer.json", pre="gpt2", eos=2, **damage)


# -- the families -------------------------------------------------------------------------------------------
def cli_cases(a: Audit, tmp: Path) -> None:
    gen = ["dart_jax.generate", "--demo", "tiny", "--prompt", "hi", "--max-new-tokens", "4"]
    bad_values = {"--max-new-tokens": ["0", "-1", "abc", "1e400", str(2**70)], "--max-length": ["0", "-5", "x"],
                  "--temperature": ["-1", "nan", "inf", "1e308"], "--top-p": ["0", "1.5", "nan"],
                  "--top-k": ["-1", "3000000000", "abc"], "--seed": ["-1", str(2**70)], "--keep": ["0", "-3", "x"],
                  "--device-steps": ["-1", "x", "1000000000"], "--dtype": ["int8"], "--mesh": ["model=abc", "nonsense"],
                  "--stop-id": ["-1", "x"], "--beam-width": ["0"], "--tree-topk": ["0"]}
    for flag, values in bad_values.items():
        for i, value in enumerate(values):
            a.add("cli generate", f"{flag} {value}", cli([*gen, f"{flag}={value}"]), quick=i == 0 and flag == "--top-k",
                  parallel=True)
    prompts = tmp / "prompts.jsonl"
    prompts.write_text(DEEP + "\n")
    messages = tmp / "messages.json"
    messages.write_text(DEEP)
    binary = tmp / "binary.jsonl"
    binary.write_bytes(os.urandom(256))
    for name, flags, inputs in [
            ("--compare-ar --method ar", ["--compare-ar", "--method", "ar"], ()),
            ("--batch-size without --prompts", ["--batch-size", "4"], ()),
            ("--system with --no-chat", ["--system", "x", "--no-chat"], ()),
            ("--eagle3-depth without a head", ["--eagle3-depth", "3"], ()),
            ("--prompts missing", ["--prompts", str(tmp / "none.jsonl")], ()),
            ("--prompts deep JSON", ["--prompts", str(prompts)], (prompts,)),
            ("--prompts binary", ["--prompts", str(binary)], (binary,)),
            ("--messages deep JSON", ["--messages", str(messages)], (messages,)),
            ("--ckpt missing", ["--ckpt", str(tmp / "nohead")], ()),
            ("--ngram missing", ["--ngram", str(tmp / "none.trie")], ()),
            ("--prompts output over input", ["--prompts", str(prompts), "--output", str(prompts)], (prompts,)),
            ("--compare-ar --no-warmup", ["--compare-ar", "--no-warmup"], ()),
            ("--compare --no-warmup", ["--compare", "--no-warmup"], ()),
            ("--compare ''", ["--compare", ""], ()),
            ("--max-keep 100000", ["--max-keep", "100000"], ()),
            ("--device-info --prompt", ["--device-info"], ()),
            ("--device-info --compare-ar", ["--device-info", "--compare-ar"], ())]:
        argv = [a_ for a_ in gen if a_ not in ("--prompt", "hi")] if "--prompts" in flags or "--messages" in flags else gen
        a.add("cli generate", name, cli([*argv, *flags]), quick=name == "--compare-ar --no-warmup", inputs=inputs,
              parallel=True)

    good = tmp / "good_prompts.jsonl"
    good.write_text(json.dumps({"prompt": "hi", "max_new_tokens": 2}) + "\n")
    user_file = tmp / "results.jsonl.tmp"  # a user's file of the name a fixed scratch name would take
    user_file.write_text("keep me\n")
    a.add("cli generate", "--output OUT beside a user file OUT.tmp",
          cli([*[a_ for a_ in gen if a_ not in ("--prompt", "hi")], "--prompts", str(good), "--output",
               str(tmp / "results.jsonl")], ok=lambda d: (tmp / "results.jsonl").is_file()),
          inputs=(good, user_file), parallel=True)
    for platforms in ("cuda", "tpu", "bogus"):  # JAX's own errors without the check: AssertionError, RuntimeError
        for name, argv in (("--device-info", ["dart_jax.generate", "--device-info"]), ("generate", gen),
                           ("train", ["dart_jax.train", "--base", str(DEMO / "base"), "--data", str(good), "--out",
                                      str(tmp / f"run_{platforms}")])):
            a.add("cli platforms", f"JAX_PLATFORMS={platforms} {name}",
                  cli(argv, env={"JAX_PLATFORMS": platforms}), quick=platforms == "bogus" and name == "--device-info",
                  inputs=(good,), parallel=True)

    serve = ["dart_jax.serve", "--demo", "tiny", "--warmup", "none"]
    for flags in (["--port", "-1"], ["--port", "99999"], ["--slots", "0"], ["--max-length", "0"],
                  ["--shutdown-timeout", "-1"], ["--shutdown-timeout", "nan"], ["--shutdown-timeout", "inf"],
                  ["--max-length", "15"], ["--model-name", ""], ["--max-connections", "0"],
                  ["--warmup", "bogus"], ["--keep", "0"], ["--slots", "x"],
                  ["--dtype", "int4"], ["--ckpt", str(tmp / "nohead")]):
        a.add("cli serve", " ".join(flags), cli([*serve, *flags], timeout=120), quick=flags == ["--slots", "x"],
              parallel=True)

    for flags in (["--coordinator", "127.0.0.1:99999"], ["--coordinator", "127.0.0.1:0"], ["--coordinator", "nohost"],
                  ["--timeout", "-1"], ["--timeout", "nan"], ["--grace", "-1"], ["--heartbeat", "0"],
                  ["--init-timeout", "0"], ["--processes", "0"], ["--processes", "x"]):
        a.add("cli launch", " ".join(flags), cli(["dart_jax.launch", "-n", "1", *flags, "--", "true"]) if
              flags[0] != "--processes" else cli(["dart_jax.launch", *flags, "--", "true"]),
              quick=flags[0] == "--timeout" and flags[1] == "-1", parallel=True)

    bench = ["dart_jax.bench"]
    for flags in (["bogus"], ["e2e", "--demo", "tiny", "--reps", "0"], ["e2e", "--random-shape", "Nope"],
                  ["e2e", "--demo", "tiny", "--keep", "0"], ["e2e", "--demo", "tiny", "--prompts", str(prompts)],
                  ["e2e", "--demo", "tiny", "--max-new-tokens", "-1"], ["e2e", "--demo", "tiny", "--temperature", "nan"]):
        a.add("cli bench", " ".join(flags[:3]), cli([*bench, *flags]), quick=flags == ["bogus"], parallel=True,
              inputs=(prompts,) if str(prompts) in flags else ())


def convert_cases(a: Audit, tmp: Path) -> None:
    head = copy(DEMO / "head", tmp / "head")
    deep_head = copy(DEMO / "head", tmp / "deep_head")
    (deep_head / "config.json").write_text(DEEP)
    short_head = copy(DEMO / "head", tmp / "short_head")
    os.truncate(short_head / "model.safetensors", 1000)
    zero_head = copy(DEMO / "head", tmp / "zero_head")
    zero(zero_head / "model.safetensors", 0, 16)
    typed_head = copy(DEMO / "head", tmp / "typed_head")
    config = json.loads((typed_head / "config.json").read_text())
    (typed_head / "config.json").write_text(json.dumps({**config, "hidden_size": "wide"}))
    conv = ["dart_jax.convert"]
    for name, argv, inputs in [
            ("inspect missing head", ["inspect", str(tmp / "nohead")], ()),
            ("inspect deep config.json", ["inspect", str(deep_head)], (deep_head,)),
            ("inspect truncated weights", ["inspect", str(short_head)], (short_head,)),
            ("inspect zeroed header", ["inspect", str(zero_head)], (zero_head,)),
            ("inspect hidden_size a string", ["inspect", str(typed_head)], (typed_head,)),
            ("inspect --base missing", ["inspect", str(head), "--base", str(tmp / "nobase")], (head,)),
            ("export HEAD HEAD", ["export", str(head), str(head)], (head,)),
            ("export into HEAD", ["export", str(head), str(head / "sub")], (head,)),
            ("export --dtype int4", ["export", str(head), str(tmp / "e"), "--dtype", "int4"], (head,)),
            ("int8 HEAD HEAD", ["int8", str(head), str(head)], (head,)),
            ("int8 truncated head", ["int8", str(short_head), str(tmp / "i8")], (short_head,)),
            ("gguf missing file", ["gguf", str(tmp / "none.gguf"), str(tmp / "g")], ()),
            ("gguf not a GGUF", ["gguf", str(DEMO / "head" / "config.json"), str(tmp / "g")], ())]:
        a.add("cli convert", name, cli([*conv, *argv]), quick=name == "int8 HEAD HEAD", inputs=inputs, parallel=True)

    def stale_scratch_of_another_export():
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        stale = tmp / "exports" / f".first.partial-{gone.stdout.strip()}-0a1b2c3d"  # a killed export of another name
        stale.mkdir(parents=True)
        (stale / "model.safetensors").write_bytes(b"half")
        kind, detail = cli([*conv, "export", str(head), str(tmp / "exports" / "second")],
                           ok=lambda d: (tmp / "exports" / "second" / "config.json").is_file())()
        return ("silent", f"{stale} left behind") if kind == "recovered" and stale.exists() else (kind, detail)
    a.add("cli convert", "export after a killed export of another name", stale_scratch_of_another_export,
          inputs=(head,))
    moe_cases(a, tmp)


def moe_cases(a: Audit, tmp: Path) -> None:
    """Qwen3-MoE target folders (the demo base's weights under a qwen3_moe config.json): config
    values that disagree, and dense weights where the config names experts."""
    from dart_jax.convert.qwen3 import check_checkpoint
    from dart_jax.convert.target import load_target_config

    dense = json.loads((DEMO / "base" / "config.json").read_text())
    moe = {**dense, "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64}

    def folder(name: str, config: dict) -> Path:
        out = copy(DEMO / "base", tmp / name)
        (out / "config.json").write_text(json.dumps(config))
        return out

    for name, config, call in [
            ("qwen3_moe top-k above the experts", {**moe, "num_experts_per_tok": 5}, load_target_config),
            ("qwen3_moe num_experts vs num_local_experts", {**moe, "num_local_experts": 8}, load_target_config),
            ("qwen3_moe no sparse layer", {**moe, "mlp_only_layers": list(range(6))}, load_target_config),
            ("qwen3_moe dense weights, no experts", moe, lambda f: check_checkpoint(f, load_target_config(f)))]:
        a.add("python convert", name, api(lambda f=folder(name.replace(" ", "_"), config), call=call: call(f)))


def ngram_cases(a: Audit, tmp: Path) -> None:
    trie = copy(DEMO / "ngram.trie", tmp / "good.trie")
    short = copy(DEMO / "ngram.trie", tmp / "short.trie")
    os.truncate(short, short.stat().st_size // 2)
    zeroed = copy(DEMO / "ngram.trie", tmp / "zeroed.trie")
    zero(zeroed, 0, 64)
    noise = tmp / "noise.trie"
    noise.write_bytes(os.urandom(4096))
    empty = tmp / "empty.trie"
    empty.write_bytes(b"")
    deep = tmp / "deep.jsonl"
    deep.write_text(DEEP + "\n")
    text = tmp / "text.jsonl"
    text.write_text(json.dumps({"text": "hello world"}) + "\n")
    ids = tmp / "ids.jsonl"
    ids.write_text("[1, 2, 3, 4, 5]\n[2, 3, 4]\n")
    badtok = copy(DEMO / "base", tmp / "badtok")
    (badtok / "tokenizer.json").write_text("{\"model\": 5")
    ng = ["dart_jax.ngram"]
    for name, argv, inputs in [
            ("build missing input", ["build", str(tmp / "none.jsonl"), "-o", str(tmp / "o.trie")], ()),
            ("build deep JSON", ["build", str(deep), "-o", str(tmp / "o.trie")], (deep,)),
            ("build text without --tokenizer", ["build", str(text), "-o", str(tmp / "o.trie")], (text,)),
            ("build --order 0", ["build", str(ids), "-o", str(tmp / "o.trie"), "--order", "0"], (ids,)),
            ("build --order 1000", ["build", str(ids), "-o", str(tmp / "o.trie"), "--order", "1000"], (ids,)),
            ("build output is input", ["build", str(ids), "-o", str(ids)], (ids,)),
            ("build --eos -5", ["build", str(ids), "-o", str(tmp / "o.trie"), "--eos", "-5"], (ids,)),
            ("build damaged tokenizer.json", ["build", str(text), "-o", str(tmp / "o.trie"), "--tokenizer", str(badtok)],
             (text, badtok)),
            ("info truncated", ["info", str(short)], (short,)),
            ("info zeroed header", ["info", str(zeroed)], (zeroed,)),
            ("info random bytes", ["info", str(noise)], (noise,)),
            ("info empty file", ["info", str(empty)], (empty,)),
            ("info a folder", ["info", str(tmp)], ()),
            ("query bad tokens", ["query", str(trie), "--tokens", "a,b"], (trie,)),
            ("query negative tokens", ["query", str(trie), "--tokens", "-1,-2"], (trie,)),
            ("compress output is input", ["compress", str(trie), str(trie)], (trie,)),
            ("merge output is input", ["merge", str(trie), str(trie), "-o", str(trie)], (trie,)),
            ("convert random bytes", ["convert", str(noise), str(tmp / "c.dart_jax")], (noise,))]:
        a.add("cli ngram", name, cli([*ng, *argv]), quick=name == "build deep JSON", inputs=inputs, parallel=True)

    def export_to_a_pipe():
        pipe = tmp / "pipe"
        os.mkfifo(pipe)
        kind, detail = cli([*ng, "export", str(trie), str(pipe)])()
        return ("data lost", "the named pipe was replaced") if not pipe.is_fifo() else (kind, detail)
    if hasattr(os, "mkfifo"):
        a.add("cli ngram", "export to a named pipe", export_to_a_pipe, inputs=(trie,))


def train_cases(a: Audit, tmp: Path) -> None:
    from dart_jax.bench.tiny import make_tiny_qwen3, make_tiny_tokenizer

    base = tmp / "tbase"
    make_tiny_qwen3(base, vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    make_tiny_tokenizer(base, vocab_size=128)
    data = tmp / "chats.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i} abc"},
                                                     {"role": "assistant", "content": f"answer {i} abcdefgh"}]}) + "\n"
                            for i in range(6)))
    deep = tmp / "deep_chats.jsonl"
    deep.write_text(DEEP + "\n")
    tr = ["dart_jax.train", "--base", str(base), "--data", str(data), "--draft-vocab", "64", "--max-length", "48",
          "--anchors-per-seq", "8", "--no-progress", "--batch-size", "2", "--epochs", "1"]
    for flags in (["--lr", "nan"], ["--epochs", "0"], ["--batch-size", "0"], ["--max-length", "2"], ["--gamma", "2"],
                  ["--keep-last", "0"], ["--draft-vocab", "0"], ["--seed", "-1"]):
        a.add("cli train", " ".join(flags), cli([*tr, "--out", str(tmp / "run0"), *flags]),
              quick=flags[0] == "--lr", inputs=(base, data), parallel=True)
    a.add("cli train", "--data missing", cli([*tr, "--out", str(tmp / "run1"), "--data", str(tmp / "none.jsonl")]),
          inputs=(base,), parallel=True)
    a.add("cli train", "--data deep JSON with --skip-bad", cli([*tr, "--out", str(tmp / "run2"), "--data", str(deep),
                                                                "--skip-bad"]), inputs=(base, deep), parallel=True)
    a.add("cli train", "--out inside the base", cli([*tr, "--out", str(base / "run")]), inputs=(base, data),
          parallel=True)
    for name, flags in (("--taps-dir inside the base", ["--taps-dir", str(base / "taps")]),
                        ("--taps online --taps-dir", ["--taps", "online", "--taps-dir", str(tmp / "taps")]),
                        ("--taps online --taps-dtype", ["--taps", "online", "--taps-dtype", "float32"])):
        a.add("cli train", name, cli([*tr, "--out", str(tmp / "run4"), *flags]), inputs=(base, data), parallel=True)
    manifest_cases(a, tmp)
    run = tmp / "run3"

    def damaged_resume():
        first = cli([*tr, "--out", str(run), "--stop-after", "2", "--save-every", "1"], ok=lambda d: True,
                    timeout=300)()
        if first[0] != "recovered":
            return first
        steps = sorted(int(p.name) for p in (run / "ckpt").iterdir() if p.name.isdigit())
        for entry in (run / "ckpt" / str(steps[-1])).iterdir():
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        os.truncate(run / "data.npz", (run / "data.npz").stat().st_size // 2)
        return cli([*tr, "--out", str(run), "--stop-after", "3", "--save-every", "1"], timeout=300,
                   ok=lambda d: "cannot be read" in d.stderr and f"resuming from micro-step {steps[-2]}" in d.stderr)()
    a.add("cli train", "resume from an emptied checkpoint and a truncated data.npz", damaged_resume,
          inputs=(base, data))


def manifest_cases(a: Audit, tmp: Path) -> None:
    """A taps cache whose manifest.json is valid JSON of the wrong shape: damage, rebuilt with a notice."""
    from dart_jax.train.taps import MANIFEST, _reusable

    plan = {"version": 1, "dtype": "float32", "width": 8, "row_bytes": 32, "target": {}, "data_sha256": "0",
            "shards": [{"first": 0, "count": 1, "tokens": 2, "file": "shard-00000.bin", "lengths": [2]}]}
    for name, text in (("a list", "[]"), ("deep nesting", DEEP), ("a shard entry 5", json.dumps({**plan, "shards": [5]})),
                       ("shards an object", json.dumps({**plan, "shards": {"a": 1}}))):
        folder = tmp / f"taps_{name.replace(' ', '_')}"
        folder.mkdir()
        (folder / MANIFEST).write_text(text)
        (folder / "shard-00000.bin").write_bytes(bytes(64))
        notes: list[str] = []
        a.add("python taps", f"manifest.json {name}",
              api(lambda f=folder, n=notes: _reusable(f, plan, n.append),
                  ok=lambda kept, n=notes, f=folder: kept == {} and any("rebuilding" in line for line in n)
                  and not (f / "shard-00000.bin").exists()))


def gguf_cases(a: Audit, tmp: Path) -> None:
    from dart_jax.convert import gguf_folder, gguf_to_folder
    from dart_jax.convert.target import target_folder

    folder = tmp / "gguf"
    folder.mkdir()
    good = make_gguf(folder)
    damaged = {"head_count_kv 0": make_gguf(folder, head_count_kv=0),
               "head_count_kv 3": make_gguf(folder, head_count_kv=3),
               "merges of unknown tokens": make_gguf(folder, extra_merges=("zzq qqz",))}
    short = copy(good, folder / "short.gguf")
    os.truncate(short, short.stat().st_size - 4096)
    damaged["truncated"] = short
    magic = copy(good, folder / "magic.gguf")
    zero(magic, 0, 4)
    damaged["zeroed magic"] = magic
    header = copy(good, folder / "header.gguf")
    zero(header, 8, 512)
    damaged["zeroed metadata"] = header
    noise = folder / "noise.gguf"
    noise.write_bytes(b"GGUF" + os.urandom(4000))
    damaged["GGUF magic then noise"] = noise
    empty = folder / "empty.gguf"
    empty.write_bytes(b"")
    damaged["empty file"] = empty
    for i, (name, path) in enumerate(damaged.items()):
        a.add("gguf", name, api(lambda p=path, n=i: gguf_to_folder(p, tmp / f"gout{n}", progress=False)),
              quick=name in ("head_count_kv 0", "truncated"), inputs=(path,))
    a.add("gguf", "--base of a truncated GGUF (CLI)", cli(["dart_jax.convert", "inspect", str(DEMO / "head"), "--base",
                                                            str(short)]), inputs=(short,), parallel=True)

    cache = tmp / "gcache"
    reference = {}

    def converted():
        out = gguf_folder(good, cache_dir=cache)
        if not reference:
            reference.update({p.name: p.read_bytes() for p in out.iterdir()})
        return out

    def intact(out) -> bool:
        return {p.name: p.read_bytes() for p in Path(out).iterdir()} == reference

    def damage_then(fn, load):
        def call():
            out = converted()
            fn(out)
            return load(out)
        return call

    for name, fn in [("zeroed weights", lambda o: zero(o / "model.safetensors", o.joinpath("model.safetensors")
                                                       .stat().st_size // 2)),
                     ("truncated weights", lambda o: os.truncate(o / "model.safetensors", 1000)),
                     ("deleted tokenizer.json", lambda o: (o / "tokenizer.json").unlink()),
                     ("deep manifest", lambda o: (o / "gguf_source.json").write_text(DEEP)),
                     ("zeroed config.json", lambda o: zero(o / "config.json", 0, 32))]:
        a.add("converted cache", f"{name}: rebuilt from the GGUF file",
              api(damage_then(fn, lambda out: gguf_folder(good, cache_dir=cache)), ok=intact), quick=name.startswith("zeroed w"),
              inputs=(good,))
        # a manifest that cannot be read does not name the GGUF file to rebuild from: refused
        a.add("converted cache", f"{name}, passed as a folder: " + ("refused" if "manifest" in name else "rebuilt"),
              api(damage_then(fn, target_folder), ok=None if "manifest" in name else intact), inputs=(good,))
    gone = copy(good, folder / "gone.gguf")

    def source_gone():
        out = gguf_folder(gone, cache_dir=tmp / "gone-cache")
        gone.unlink()
        os.truncate(out / "model.safetensors", 100)
        return target_folder(out)
    a.add("converted cache", "damaged with its GGUF file gone: refused, naming the command", api(source_gone),
          quick=True)


def head_and_trie_cases(a: Audit, tmp: Path) -> None:
    from dart_jax import DartModel

    base, head, trie = DEMO / "base", DEMO / "head", DEMO / "ngram.trie"

    def load(h=head, t=trie, b=base, **kw):
        return lambda: DartModel.from_pretrained(b, h, t, dtype="float32", **kw)

    def head_copy(name: str, change: Callable[[Path], None]) -> Path:
        out = copy(head, tmp / f"h-{name}")
        change(out)
        return out

    def config_edit(**values):
        def change(folder):
            config = json.loads((folder / "config.json").read_text())
            (folder / "config.json").write_text(json.dumps({**config, **values}))
        return change

    heads = {"deep config.json": lambda f: (f / "config.json").write_text(DEEP),
             "config.json not JSON": lambda f: (f / "config.json").write_text("{hidden"),
             "config.json a list": lambda f: (f / "config.json").write_text("[]"),
             "hidden_size -1": config_edit(hidden_size=-1),
             "hidden_size a string": config_edit(hidden_size="x"),
             "draft_vocab_size 0": config_edit(draft_vocab_size=0),
             "vocab_size of another base": config_edit(vocab_size=999),
             "truncated weights": lambda f: os.truncate(f / "model.safetensors", 2000),
             "zeroed weights header": lambda f: zero(f / "model.safetensors", 0, 8),
             "weights deleted": lambda f: (f / "model.safetensors").unlink(),
             "a huge header length": lambda f: (f / "model.safetensors").write_bytes((2**62).to_bytes(8, "little"))}
    for i, (name, change) in enumerate(heads.items()):
        h = head_copy(str(i), change)
        a.add("heads", name, api(load(h=h)), quick=name == "deep config.json", inputs=(h,))

    def trie_copy(name, change):
        out = copy(trie, tmp / f"t-{name}")
        change(out)
        return out

    other_vocab = tmp / "other_vocab.trie"
    from dart_jax.ngram import Trie
    Trie.build([[600, 700, 800, 900], [600, 700, 801]], order=3).save(other_vocab)
    tries = {"truncated": trie_copy("short", lambda p: os.truncate(p, p.stat().st_size // 2)),
             "zeroed header": trie_copy("zero", lambda p: zero(p, 0, 64)),
             "random bytes": trie_copy("noise", lambda p: p.write_bytes(os.urandom(2048))),
             "empty file": trie_copy("empty", lambda p: p.write_bytes(b"")),
             "ids beyond the vocabulary": other_vocab,
             "a folder": tmp}
    for name, path in tries.items():
        a.add("tries", name, api(load(t=path)), quick=name == "truncated", inputs=(path,) if path != tmp else ())
    a.add("tries", "missing", api(load(t=tmp / "none.trie")))
    base_deep = copy(base, tmp / "b-deep")
    (base_deep / "tokenizer_config.json").write_text(DEEP)
    base_tok = copy(base, tmp / "b-tok")
    (base_tok / "tokenizer.json").write_text("\0" * 100)
    base_gen = copy(base, tmp / "b-gen")
    (base_gen / "generation_config.json").write_text(DEEP)
    for name, b in (("deep tokenizer_config.json", base_deep), ("zeroed tokenizer.json", base_tok),
                    ("deep generation_config.json", base_gen)):
        a.add("heads", f"base with a {name}", api(load(b=b)), inputs=(b,))


def python_api_cases(a: Audit, model) -> None:
    calls = {
        "generate(None)": lambda: model.generate(None), "generate(123)": lambda: model.generate(123),
        "generate(b'hi')": lambda: model.generate(b"hi"), "generate(1.5)": lambda: model.generate(1.5),
        "generate(one message dict)": lambda: model.generate({"role": "user", "content": "hi"}),
        "generate([])": lambda: model.generate([]), "generate([None])": lambda: model.generate([None]),
        "generate([-1])": lambda: model.generate([-1]), "generate([10**9])": lambda: model.generate([10**9]),
        "generate lone surrogate": lambda: model.generate("\ud800"),
        "stop=5": lambda: model.generate("hi", stop=5), "stop={'a': 1}": lambda: model.generate("hi", stop={"a": 1}),
        "stop_token_ids=5": lambda: model.generate("hi", stop_token_ids=5),
        "stop_token_ids=[-1]": lambda: model.generate("hi", stop_token_ids=[-1]),
        "max_new_tokens=0": lambda: model.generate("hi", max_new_tokens=0),
        "max_new_tokens=-1": lambda: model.generate("hi", max_new_tokens=-1),
        "max_new_tokens=2**40": lambda: model.generate("hi", max_new_tokens=2**40),
        "max_new_tokens='4'": lambda: model.generate("hi", max_new_tokens="4"),
        "temperature=1e308": lambda: model.generate("hi", temperature=1e308),
        "temperature=nan": lambda: model.generate("hi", temperature=float("nan")),
        "temperature=-1": lambda: model.generate("hi", temperature=-1.0),
        "top_p=0": lambda: model.generate("hi", temperature=0.5, top_p=0.0),
        "top_k=2**31": lambda: model.generate("hi", temperature=0.5, top_k=2**31),
        "seed=-1": lambda: model.generate("hi", temperature=0.5, seed=-1),
        "encode(None)": lambda: model.encode(None), "encode(123)": lambda: model.encode(123),
        "decode([-1])": lambda: model.decode([-1]), "decode([512])": lambda: model.decode([512]),
        "decode(None)": lambda: model.decode(None), "decode(['a'])": lambda: model.decode(["a"]),
        "generate_ar(None)": lambda: model.generate_ar(None),
    }
    for name, call in calls.items():
        a.add("python api", name, api(call))
    from dart_jax import DartModel
    # the quick run's: refused before any model loads
    for name, call in {"from_pretrained(dtype='int8')": lambda: DartModel.from_pretrained(
                           DEMO / "base", DEMO / "head", DEMO / "ngram.trie", dtype="int8"),
                       "demo('nope')": lambda: DartModel.demo("nope"),
                       "from_pretrained(dart=None)": lambda: DartModel.from_pretrained(DEMO / "base", None),
                       "from_pretrained(keep=0)": lambda: DartModel.from_pretrained(
                           DEMO / "base", DEMO / "head", DEMO / "ngram.trie", keep=0)}.items():
        a.add("python api", name, api(call), quick=name != "from_pretrained(dart=None)")
    python_api_types(a, model)


def python_api_types(a: Audit, model) -> None:
    """Issue 50: arguments of the wrong type, and values that were taken the wrong way (truthy strings
    as booleans, floats truncated, strings parsed, a string or a set as prompts, one-shot iterators)."""
    import numpy as np

    from dart_jax import DartModel
    from dart_jax.decoding.settings import GenerationSettings

    ids, few = [5, 6, 7], GenerationSettings(max_new_tokens=3)  # token ids of the demo's vocabulary
    calls = {
        "generate(settings={...})": lambda: model.generate("hi", settings={"max_new_tokens": 3}),
        "generate(settings=5)": lambda: model.generate("hi", settings=5),
        "generate(settings=[s]) of one prompt": lambda: model.generate("hi", settings=[few]),
        "batch settings [s, {...}]": lambda: model.generate(["hi", "yo"], settings=[few, {"max_new_tokens": 2}]),
        "batch settings [s, None]": lambda: model.generate(["hi", "yo"], settings=[few, None]),
        "stream(result='x')": lambda: model.stream("hi", max_new_tokens=3, result="x"),
        "stream(stats=5)": lambda: model.stream("hi", max_new_tokens=3, stats=5),
        "generate_many(on_done=5)": lambda: model.generate_many(["hi"], few, on_done=5),
        "generate(np.array(ids))": lambda: model.generate(np.array(ids), max_new_tokens=3),
        "generate(np.array([ids, ids]))": lambda: model.generate(np.array([ids, ids]), max_new_tokens=3),
        "generate_many('hi')": lambda: model.generate_many("hi", few),
        "generate(memoryview(b'hi'))": lambda: model.generate(memoryview(b"hi"), max_new_tokens=3),
        "generate({'hi', 'yo'})": lambda: model.generate({"hi", "yo"}, max_new_tokens=3),
        "generate(batch_size=1.5)": lambda: model.generate(["hi", "yo"], max_new_tokens=3, batch_size=1.5),
        "generate(batch_size='2')": lambda: model.generate(["hi", "yo"], max_new_tokens=3, batch_size="2"),
        "batcher(slots=2.5)": lambda: model.batcher(slots=2.5),
        "dart_generate(top_p=-0.5)": lambda: model.dart_generate([ids], top_p=-0.5, max_new_token_num=3),
        "dart_generate(top_p=nan)": lambda: model.dart_generate([ids], top_p=float("nan"), max_new_token_num=3),
        "dart_generate(max_new_token_num=2.9)": lambda: model.dart_generate([ids], max_new_token_num=2.9),
        "dart_generate(max_new_token_num='3')": lambda: model.dart_generate([ids], max_new_token_num="3"),
        "dart_generate(remain_total=3.7)": lambda: model.dart_generate([ids], max_new_token_num=3, remain_total=3.7),
        "stop=['\\ud800']": lambda: model.generate("hi", max_new_tokens=3, stop=["\ud800"]),
        "role 'wizard'": lambda: model.generate([{"role": "wizard", "content": "hi"}], max_new_tokens=3),
        "encode([])": lambda: model.encode([]),
        "encode(chat='no')": lambda: model.encode("hi", chat="no"),
    }
    for name, call in calls.items():
        a.add("python api", name, api(call))

    def on_pool(call, closed: bool = False):
        def run():
            pool = model.batcher(slots=1, max_length=64)
            try:
                if closed:
                    pool.close()
                return call(pool)
            finally:
                pool.close()
        return run

    a.add("python api", "pool.submit(ids, None)", api(on_pool(lambda p: p.submit(ids, None))))
    a.add("python api", "pool.cancel(None)", api(on_pool(lambda p: p.cancel(None))))
    a.add("python api", "pool.step() after close()", api(on_pool(lambda p: (p.submit(ids, few), p.step()), closed=True)))

    def load(**opts):
        return lambda: DartModel.from_pretrained(DEMO / "base", DEMO / "head", DEMO / "ngram.trie", keep=16, **opts)

    for name, opts in {"tree={...}": dict(tree={"keep": 3}), "untied_lm_head='no'": dict(untied_lm_head="no"),
                       "small_ngram='no'": dict(small_ngram="no"), "fused_projections='yes'": dict(fused_projections="yes"),
                       "eagle3_depth=-1 without a head": dict(eagle3_depth=-1),
                       "eagle3_total_token=0 without a head": dict(eagle3_total_token=0),
                       "system_prompt=5": dict(system_prompt=5), "trie_cache_dir=5": dict(trie_cache_dir=5)}.items():
        a.add("python api", f"from_pretrained({name})", api(load(**opts)), quick=name == "untied_lm_head='no'")

    def same_as_list(result) -> bool:
        return [r.token_ids for r in result] == [r.token_ids for r in model.generate(["hi"], max_new_tokens=3)]

    # a generator of prompts was consumed by the batch test, then refused as empty: it decodes as its list
    a.add("python api", "generate(generator of prompts)",
          api(lambda: model.generate((p for p in ["hi"]), max_new_tokens=3), ok=same_as_list))


def start_servers(stack: contextlib.ExitStack) -> dict:
    """The http family's two live servers (with and without --api-key), started together now, while
    the other families run: {name: a future of (URL, process)}, which a case waits for. Both are
    stopped together when `stack` closes."""
    from serving import live_server

    common = ("--demo", "tiny", "--slots", "1", "--max-length", "256", "--warmup", "none")
    managers = {"key": live_server(*common, "--api-key", KEY), "open": live_server(*common)}
    pool = ThreadPoolExecutor(len(managers))
    servers = {which: pool.submit(manager.__enter__) for which, manager in managers.items()}

    def stop():
        stopping = [pool.submit(managers[which].__exit__, None, None, None)
                    for which, started in servers.items() if started.exception() is None]
        for stopped in stopping:
            stopped.result()
        pool.shutdown()
    stack.callback(stop)
    return servers


def http_cases(a: Audit, servers: dict) -> None:
    import httpx

    good = {"model": NAME, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}

    def request(which: str, method: str, path: str, *, body=None, raw: bytes | None = None, key: str | None = KEY,
                expect: str = "error", timeout: float = 120, content_type: str | None = "application/json",
                check: Callable[[dict], bool] | None = None):
        """`expect`: "error" (a 4xx in OpenAI's shape), "unauthorized" (a 401: a route that
        answers, or starts to stream, without the key is "no auth"), or "ok" (a 200 whose JSON
        passes `check`)."""
        def run():
            url, proc = servers[which].result()
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            if raw is not None and content_type is not None:
                headers["content-type"] = content_type
            try:
                with httpx.stream(method, url + path, json=body if raw is None else None, content=raw,
                                  headers=headers, timeout=timeout) as r:
                    if expect == "unauthorized" and r.status_code != 401:  # the body may be an endless stream
                        return ("5xx", str(r.status_code)) if r.status_code >= 500 else \
                            ("no auth", f"{r.status_code} without the key")
                    r.read()
            except httpx.TimeoutException:
                return "hang", f"no answer within {timeout} s"
            except httpx.TransportError as e:
                return "5xx", f"the server stopped answering ({e})"
            if r.status_code >= 500:
                return "5xx", f"{r.status_code} {r.text[:160]}"
            if expect == "unauthorized":
                return "clear", "401"
            if expect == "ok":
                if r.status_code != 200:
                    return "silent", f"{r.status_code} {r.text[:160]}"
                return ("recovered", "200") if check is None or check(r.json()) else ("silent", f"200 {r.text[:160]}")
            if 400 <= r.status_code < 500:
                try:
                    message = r.json()["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    return "silent", f"{r.status_code} without an OpenAI-shaped error: {r.text[:120]}"
                return "clear", f"{r.status_code} {message[:140]}"
            return "silent", f"{r.status_code}: {r.text[:160]}"
        return run

    chat = "/v1/chat/completions"
    for path, method in ((chat, "POST"), ("/v1/completions", "POST"), ("/v1/models", "GET")):
        a.add("http (key)", f"{method} {path} without the key",
              request("key", method, path, body=good if method == "POST" else None, key=None, expect="unauthorized"),
              quick=path == chat)
        a.add("http (key)", f"{method} {path} with a wrong key",
              request("key", method, path, body=good if method == "POST" else None, key="wrong", expect="unauthorized"))
    # issue 50: every route of the UI but its login form and static files needs the login
    for path, method in (("/ui/gradio_api/heartbeat/anyone", "GET"), ("/ui/config", "GET"),
                         ("/ui/gradio_api/info", "GET"), ("/ui/gradio_api/startup-events", "GET"),
                         ("/ui/gradio_api/cancel", "POST"), ("/ui/gradio_api/reset", "POST"),
                         ("/ui/gradio_api/queue/data?session_hash=x", "GET"), ("/ui/monitoring/x", "GET")):
        a.add("http (key)", f"{method} {path.split('?')[0]} without a login",
              request("key", method, path, body={} if method == "POST" else None, key=None, expect="unauthorized"),
              quick="heartbeat" in path)
    bad_bodies = {
        "top_k 2**31": {"top_k": 2**31, "temperature": 0.7}, "top_k 3e9": {"top_k": 3 * 10**9, "temperature": 0.7},
        "max_tokens 2**31": {"max_tokens": 2**31}, "max_tokens -1": {"max_tokens": -1}, "max_tokens 0": {"max_tokens": 0},
        "max_tokens a string": {"max_tokens": "4"}, "temperature 1e308": {"temperature": 1e308},
        "temperature -0.5": {"temperature": -0.5}, "top_p 0": {"top_p": 0}, "top_p 1.5": {"top_p": 1.5},
        "seed 2**70": {"seed": 2**70}, "seed -1": {"seed": -1}, "n 2": {"n": 2}, "logprobs": {"logprobs": True},
        "tools": {"tools": [{"type": "function", "function": {"name": "f"}}]},
        "response_format json_object": {"response_format": {"type": "json_object"}},
        "response_format json_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "method bogus": {"method": "magic"}, "tree_size 10**9": {"tree_size": 10**9},
        "model unknown": {"model": "gpt-4"}, "messages empty": {"messages": []}, "messages a string": {"messages": "hi"},
        "message content a number": {"messages": [{"role": "user", "content": 5}]},
        "message role bogus": {"messages": [{"role": "wizard", "content": "hi"}]},
        "17 stop strings": {"stop": [f"s{i}" for i in range(17)]}, "empty stop string": {"stop": [""]},
        "prompt beyond the context": {"messages": [{"role": "user", "content": "word " * 2000}]},
        "stream with top_k 2**31": {"stream": True, "top_k": 2**31, "temperature": 0.7},
        # issue 50: fields that would change the answer, refused rather than ignored
        "logit_bias": {"logit_bias": {"5": 100}}, "presence_penalty": {"presence_penalty": 1.5},
        "frequency_penalty": {"frequency_penalty": -1}, "top_logprobs": {"top_logprobs": 3},
        "tool_choice auto": {"tool_choice": "auto"}, "functions": {"functions": [{"name": "f", "parameters": {}}]},
        "function_call": {"function_call": {"name": "f"}}, "parallel_tool_calls false": {"parallel_tool_calls": False},
        "modalities audio": {"modalities": ["text", "audio"]},
        "prediction": {"prediction": {"type": "content", "content": "x"}}, "reasoning_effort": {"reasoning_effort": "high"},
        "min_tokens": {"min_tokens": 3}, "guided_json": {"guided_json": {"type": "object"}},
        "repetition_penalty": {"repetition_penalty": 1.2},
        "an assistant turn's tool_calls": {"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function",
                                                                    "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "user", "content": "go on"}]},
        "stop_token_ids beyond the vocabulary": {"stop_token_ids": [10**9]}, "stop_token_ids strings": {"stop_token_ids": ["1"]},
        # issue 50, a second look: OpenAI's newer fields and vLLM's sampling, prompt and template options
        "audio": {"audio": {"voice": "alloy", "format": "wav"}}, "verbosity low": {"verbosity": "low"},
        "web_search_options": {"web_search_options": {}}, "use_beam_search": {"use_beam_search": True},
        "length_penalty": {"length_penalty": 0.5}, "allowed_token_ids": {"allowed_token_ids": [1, 2]},
        "bad_words": {"bad_words": ["the"]}, "logits_processors": {"logits_processors": ["p"]},
        "structured_outputs": {"structured_outputs": {"choice": ["a", "b"]}},
        "include_stop_str_in_output": {"stop": ["."], "include_stop_str_in_output": True},
        "skip_special_tokens false": {"skip_special_tokens": False}, "add_special_tokens true": {"add_special_tokens": True},
        "truncate_prompt_tokens": {"truncate_prompt_tokens": 3}, "prompt_logprobs": {"prompt_logprobs": 1},
        "echo (chat)": {"echo": True}, "add_generation_prompt false": {"add_generation_prompt": False},
        "continue_final_message": {"continue_final_message": True}, "chat_template": {"chat_template": "{{ messages }}"},
        "documents": {"documents": [{"title": "t", "text": "x"}]},
        "chat_template_kwargs another key": {"chat_template_kwargs": {"tools": []}},
        "chat_template_kwargs enable_thinking a string": {"chat_template_kwargs": {"enable_thinking": "no"}},
        "enable_thinking on a template without the switch": {"chat_template_kwargs": {"enable_thinking": True}},
        "an assistant turn's function_call": {"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}},
            {"role": "user", "content": "go on"}]},
        # issue 50: strict types
        "n true": {"n": True}, "n a string": {"n": "1"}, "stream a string": {"stream": "yes"},
        "temperature true": {"temperature": True}, "tree_size true": {"tree_size": True},
        "include_usage a string": {"stream": True, "stream_options": {"include_usage": "maybe"}},
        "ignore_eos a string": {"ignore_eos": "yes"},
        # issue 50: sizes the server does not offer are refused, naming those it does
        "tree_size 3": {"tree_size": 3}, "tree_size 61": {"tree_size": 61},
    }
    for i, (name, change) in enumerate(bad_bodies.items()):
        a.add("http (key)", name, request("key", "POST", chat, body={**good, **change}),
              quick=name in ("top_k 2**31", "response_format json_object"))
    for name, raw in {"deep JSON body": DEEP.encode(), "invalid JSON": b'{"model": "x", "messages": [',
                      "empty body": b"", "a JSON list": b"[]", "5 MB body": b'{"x": "' + b"a" * (5 << 20) + b'"}',
                      "not UTF-8": b'{"model": "\xff\xfe"}',
                      "a lone surrogate": json.dumps({**good, "messages": [{"role": "user", "content": "\ud800"}]})
                      .encode()}.items():
        a.add("http (key)", name, request("key", "POST", chat, raw=raw), quick=name == "deep JSON body")
    for content_type in (None, "text/plain", "application/x-www-form-urlencoded"):  # JSON under another type
        a.add("http (key)", f"a JSON body sent as {content_type or 'no content type'}",
              request("key", "POST", chat, raw=json.dumps(good).encode(), content_type=content_type))
    completions = {"prompt ids beyond the vocabulary": {"prompt": [10**9]}, "empty prompt list": {"prompt": []},
                   "two prompts": {"prompt": ["a", "b"]}, "echo": {"prompt": "hi", "echo": True},
                   "best_of 2": {"prompt": "hi", "best_of": 2}, "prompt missing": {},
                   "response_format json_object": {"prompt": "hi", "response_format": {"type": "json_object"}},
                   "logit_bias": {"prompt": "hi", "logit_bias": {"5": 100}},
                   "presence_penalty": {"prompt": "hi", "presence_penalty": 0.5}, "echo a string": {"prompt": "hi", "echo": "no"},
                   "min_tokens": {"prompt": "hi", "min_tokens": 3}, "prompt_embeds": {"prompt": "hi", "prompt_embeds": "AAAA"},
                   "use_beam_search": {"prompt": "hi", "use_beam_search": True}}
    for name, body in completions.items():
        a.add("http (key)", f"completions: {name}",
              request("key", "POST", "/v1/completions", body={"model": NAME, "max_tokens": 2, **body}))
    a.add("http (key)", "GET on a POST route", request("key", "GET", chat))
    a.add("http (key)", "an unknown route", request("key", "GET", "/v1/nothing"))
    # issue 50: the cheap vLLM fields are honoured
    a.add("http (key)", "completions: max_completion_tokens 2 gives 2 tokens",
          request("key", "POST", "/v1/completions", body={"model": NAME, "prompt": "hi", "max_completion_tokens": 2,
                                                          "ignore_eos": True}, expect="ok",
                  check=lambda r: r["usage"]["completion_tokens"] == 2))
    a.add("http (key)", "ignore_eos runs to max_tokens",
          request("key", "POST", chat, body={**good, "max_tokens": 40, "ignore_eos": True}, expect="ok",
                  check=lambda r: r["usage"]["completion_tokens"] == 40 and r["choices"][0]["finish_reason"] == "length"))
    a.add("http (key)", "chat_template_kwargs enable_thinking false (what the template does) is served",
          request("key", "POST", chat, body={**good, "chat_template_kwargs": {"enable_thinking": False}}, expect="ok"))
    a.add("http (key)", "a good request after all of them", request("key", "POST", chat, body=good, expect="ok"))
    # the quick run's check that the server still serves (the request above compiles the decode step)
    a.add("http (key)", "healthy after all of them", request("key", "GET", "/health", expect="ok",
                                                             check=lambda r: r.get("status") == "ok"), quick=True)
    for name, change in {"top_k 2**31": {"top_k": 2**31, "temperature": 0.7}, "n 2": {"n": 2},
                         "response_format json_object": {"response_format": {"type": "json_object"}},
                         "messages empty": {"messages": []}}.items():
        a.add("http (no key)", name, request("open", "POST", chat, body={**good, **change}, key=None),
              quick=name == "top_k 2**31")
    a.add("http (no key)", "deep JSON body", request("open", "POST", chat, raw=DEEP.encode(), key=None))

    def ui_call(endpoint: str, data: list, refused: Callable[[str], bool]):
        """A call of one of the chat UI's events with these values, as any client may post them
        through Gradio's API: `refused` tells from the answer that the user was told, and the server
        logs no traceback."""
        def run():
            url, proc = servers["open"].result()
            before = proc.log.read_text().count("Traceback")
            try:
                event = httpx.post(f"{url}/ui/gradio_api/call/{endpoint}", json={"data": data}, timeout=120).json()
                shown = httpx.get(f"{url}/ui/gradio_api/call/{endpoint}/{event['event_id']}", timeout=120).text
            except httpx.HTTPError as e:
                return "5xx", f"the UI stopped answering ({e})"
            if proc.log.read_text().count("Traceback") > before:
                return "traceback", "the server logged a traceback"
            return ("clear", shown.strip().splitlines()[-1][-140:]) if refused(shown) else ("silent", shown[-160:])
        return run

    def ui_value(index: int, value):
        """The chat UI's Send with one value changed: the refusal is shown in its figures line."""
        data = ["hello", [], "dart", False, "ar", 0, 1, 0, 8, None]
        data[index] = value
        return ui_call("respond", data, lambda shown: "error: " in shown)
    for name, (index, value) in {"temperature 99": (5, 99), "temperature a string": (5, "hot"),
                                 "top-p 0": (6, 0), "top-k 2.5": (7, 2.5), "max new tokens null": (8, None),
                                 "tree size 3": (9, 3), "tree size a list": (9, [16]), "method bogus": (2, "magic"),
                                 "side by side a string": (3, "yes"), "message a number": (0, 5)}.items():
        a.add("http (no key)", f"UI: {name}", ui_value(index, value), quick=name == "temperature 99")
    # issue 50, a second look: a call with the wrong number of values (Gradio answered too few with a
    # traceback in the log and dropped extra ones): an error event that counts what was sent
    send = ["hello", "dart", False, "ar", 0, 1, 0, 8, None]  # the Send form's values, the state left out
    for name, (endpoint, data) in {"Send with one value": ("respond", send[:1]), "Send with none": ("respond", []),
                                   "Send with two values too many": ("respond", [*send, 1, 2]),
                                   "Regenerate with none": ("regenerate", []), "Stop with values": ("stop", [1, 2])}.items():
        a.add("http (no key)", f"UI: {name}",
              ui_call(endpoint, data, lambda shown, n=len(data): "event: error" in shown and f"got {n}" in shown))

    def connection_bound():
        """One request more than --max-connections (the default) held open at once gets a 503 at once."""
        import contextlib

        from dart_jax.serve.options import MAX_CONNECTIONS
        url, _ = servers["open"].result()
        with httpx.Client(limits=httpx.Limits(max_connections=MAX_CONNECTIONS + 8), timeout=60) as client, \
                contextlib.ExitStack() as held:
            for i in range(MAX_CONNECTIONS):  # the UI's heartbeat: a stream that never ends by itself
                r = held.enter_context(client.stream("GET", f"{url}/ui/gradio_api/heartbeat/audit{i}"))
                if r.status_code != 200:
                    return "silent", f"stream {i} got {r.status_code}"
            r = client.get(url + "/health")
        if r.status_code != 503:
            return "silent", f"{r.status_code} for request {MAX_CONNECTIONS + 1}"
        return "clear", f"503 {r.json()['error']['message'][:120]}"
    a.add("http (no key)", "one request past --max-connections", connection_bound)
    a.add("http (no key)", "a good request after all of them",
          request("open", "POST", chat, body=good, key=None, expect="ok"))
    a.add("http (no key)", "healthy after all of them",
          request("open", "GET", "/health", key=None, expect="ok", check=lambda r: r.get("status") == "ok"), quick=True)


# -- running ----------------------------------------------------------------------------------------------------
FAMILIES = ("cli", "convert", "ngram", "train", "gguf", "heads", "python", "http")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few cases per family (the CI test)")
    p.add_argument("--family", action="append", choices=FAMILIES, help="only these families (repeatable)")
    p.add_argument("--verbose", action="store_true", help="print every case's outcome")
    args = p.parse_args(argv)
    families = set(args.family or FAMILIES)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dart-jax-audit-") as tmp_name, contextlib.ExitStack() as stack:
        tmp = Path(tmp_name)
        os.environ["XDG_CACHE_HOME"] = str(tmp / "xdg")  # no cache of the user's is touched
        a = Audit()
        if "http" in families:  # first: the servers load their model while the other families run
            servers = start_servers(stack)
        setups = {"cli": cli_cases, "convert": convert_cases, "ngram": ngram_cases, "train": train_cases,
                  "gguf": gguf_cases}
        for family, setup in setups.items():
            if family in families:
                (tmp / family).mkdir()
                setup(a, tmp / family)
        if "heads" in families:
            (tmp / "heads").mkdir()
            head_and_trie_cases(a, tmp / "heads")
        if "python" in families:
            python_api_cases(a, LazyDemo())
        if "http" in families:
            http_cases(a, servers)
        cases = [c for c in a.cases if c.quick or not args.quick]
        outcomes: dict[int, tuple[str, str]] = {}
        with ThreadPoolExecutor(2) as pool:  # subprocesses two at a time, the in-process cases in order
            futures = {i: pool.submit(run_case, c) for i, c in enumerate(cases) if c.parallel}
            for i, c in enumerate(cases):
                if not c.parallel:
                    outcomes[i] = run_case(c)
            outcomes.update({i: f.result() for i, f in futures.items()})
        if "http" in families:
            for which, started in servers.items():
                if started.exception() is None and started.result()[1].poll() is not None:
                    outcomes[len(cases)] = ("5xx", f"the {which} server exited")
                    cases.append(Case("http", f"the {which} server still runs", lambda: ("", "")))
    by_class, by_family = Counter(), defaultdict(Counter)
    for i, case in enumerate(cases):
        kind, detail = outcomes[i]
        by_class[kind] += 1
        by_family[case.family][kind] += 1
        if args.verbose or kind in FATAL:
            print(f"{kind:10s} {case.family:16s} {case.name}: {detail}")
    print(f"\n{len(cases)} cases in {time.monotonic() - start:.0f} s: " +
          ", ".join(f"{k} {by_class[k]}" for k in ("clear", "recovered", *FATAL) if by_class[k] or k in FATAL))
    for family in sorted(by_family):
        print(f"  {family:16s} " + ", ".join(f"{k} {n}" for k, n in sorted(by_family[family].items())))
    return 1 if any(by_class[k] for k in FATAL) else 0


if __name__ == "__main__":
    sys.exit(main())

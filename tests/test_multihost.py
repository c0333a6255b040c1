"""Several real JAX processes on 127.0.0.1, joined by `python -m dart_jax.launch` (jax.distributed,
a local coordinator, CPU collectives over gloo, forced CPU devices), forming one global mesh.

The quick tests run small JAX programs: one mesh over 2 × 4 and 4 × 2 devices, and the faults (a
killed process ends the run in bounded time, with the launcher and without it; a coordinator port
in use; processes started with different counts). The slow ones run the project's own commands
across 2 processes × 4 devices and compare them with an independent oracle computed in one
process: greedy decoding by the plain forward of the single-device target (generate, a batch,
the pool, `--prompts --output`), and `python -m dart_jax.train` in one process on one device
(losses and the exported head), through a run stopped, resumed, killed mid-run and resumed again.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from serving import stop_process

pytestmark = pytest.mark.xdist_group("multihost")  # one worker: the processes share 2 cores

ONE_MESH = textwrap.dedent(r'''
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    n = jax.process_count()
    mesh = Mesh(np.asarray(jax.devices()).reshape(n, -1), ("data", "model"))
    x = jax.device_put(np.arange(8 * 16, dtype=np.float32).reshape(8, 16), NamedSharding(mesh, P("data", "model")))
    total = jax.jit(lambda x: jnp.sum(x @ x.T), out_shardings=NamedSharding(mesh, P()))(x)
    print("RESULT", jax.process_index(), n, len(jax.devices()), len(jax.local_devices()), float(total), flush=True)
''')


def env(**extra) -> dict:
    e = dict(os.environ, JAX_PLATFORMS="cpu")
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        e.pop(name, None)
    return {**e, **extra}


def launch(args: list[str], *, timeout: float, cwd=None, **extra) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "dart_jax.launch", *args], env=env(**extra), cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - t0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("processes, devices, all_output", [(2, 4, False), (4, 2, True)])
def test_processes_form_one_mesh(processes, devices, all_output):
    proc, _ = launch(["-n", str(processes), "--devices-per-process", str(devices), *(["--all-output"] * all_output),
                      "--", sys.executable, "-c", ONE_MESH], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    x = np.arange(8 * 16, dtype=np.float64).reshape(8, 16)
    want = float(np.sum(x @ x.T))  # the oracle: NumPy in this process
    lines = [line for line in proc.stdout.splitlines() if "RESULT" in line]
    # process 0's output as it is; the others' only with --all-output, prefixed
    assert len(lines) == (processes if all_output else 1), proc.stdout
    for line in lines:
        prefix, rank, n, devs, local, total = re.fullmatch(r"(\[process \d+\] )?RESULT (\d+) (\d+) (\d+) (\d+) (\S+)",
                                                           line).groups()
        assert (int(n), int(devs), int(local)) == (processes, processes * devices, devices), line
        assert (prefix is None) == (rank == "0") and (prefix is None or prefix == f"[process {rank}] "), line
        assert float(total) == pytest.approx(want, rel=1e-6)
    assert "[Gloo]" not in proc.stdout  # gloo's connection notices would break --json output


def gloo_notice_pieces(rank: int, peers: int) -> list[bytes]:
    """Gloo's connection notice as its C++ code writes it, one `<<` a piece (restated here)."""
    return [b"[Gloo] Rank ", str(rank).encode(), b" is connected to ", str(peers).encode(), b" peer ranks. ",
            b"Expected number of connected peer ranks is : ", str(peers).encode(), b"\n"]


def test_gloo_notices_are_dropped_however_their_pieces_interleave():
    from dart_jax.launch.__main__ import GlooFilter

    rng = np.random.default_rng(0)
    own = [b"RESULT 0 4 8 2 4150784.0\n", b"12\n", b"\n", b'{"tokens": [1, 2]}\n', b"Rank 1 is connected\n"]
    for trial in range(300):
        writers = [gloo_notice_pieces(int(r), int(rng.integers(1, 8))) for r in rng.integers(0, 16, rng.integers(1, 5))]
        out = b""
        while any(writers):  # the threads' pieces in a random order, each thread's own in order
            w = rng.choice([i for i, pieces in enumerate(writers) if pieces])
            out += writers[w].pop(0)
        out += b"".join(own)  # the program's own lines, after the notices
        gloo = GlooFilter()
        kept = [line for line in out.splitlines(keepends=True) if not gloo.is_notice(line)]
        assert kept == own, (trial, out)


KILLED = textwrap.dedent(r'''
    import os, signal, sys, time
    import jax, jax.numpy as jnp, numpy as np
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices("started")
    if jax.process_index() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    multihost_utils.sync_global_devices("never reached by process 1")  # blocks: its peer is gone
    open(sys.argv[1], "w").write("process 0 went on without its peer")
''')


def test_a_killed_process_ends_the_run(tmp_path):
    out = tmp_path / "out.txt"
    proc, elapsed = launch(["-n", "2", "--devices-per-process", "2", "--grace", "1", "--", sys.executable, "-c",
                            KILLED, str(out)], timeout=120)
    assert proc.returncode == 128 + signal.SIGKILL, (proc.returncode, proc.stderr[-2000:])
    assert "dart_jax.launch: process 1 was killed by SIGKILL; stopping processes 0" in proc.stderr, proc.stderr[-2000:]
    assert elapsed < 60 and not out.exists()


def test_a_killed_process_ends_the_others_without_the_launcher(tmp_path):
    """One launcher per process (as on a cluster, where nothing watches them all): the survivor
    learns of the death from the runtime's heartbeat (`--heartbeat 3`) and exits non-zero."""
    out, coordinator = tmp_path / "out.txt", f"127.0.0.1:{free_port()}"
    common = ["-n", "2", "--devices-per-process", "2", "--coordinator", coordinator, "--heartbeat", "3"]
    t0 = time.monotonic()
    survivor = subprocess.Popen([sys.executable, "-m", "dart_jax.launch", *common, "--process-id", "0", "--",
                                 sys.executable, "-c", KILLED, str(out)], env=env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        killed, _ = launch([*common, "--process-id", "1", "--", sys.executable, "-c", KILLED, str(out)], timeout=120)
        _, err = survivor.communicate(timeout=120)
    finally:
        survivor.kill()
    assert killed.returncode == 128 + signal.SIGKILL, killed.stderr[-2000:]
    assert survivor.returncode != 0 and time.monotonic() - t0 < 60, (survivor.returncode, err[-2000:])
    # gloo sees the closed connection at once; a peer stuck elsewhere learns it from the heartbeat
    assert re.search("Connection closed by peer|heartbeat", err) and "dart_jax.launch: process 0 " in err, err[-2000:]
    assert not out.exists()


def test_a_coordinator_port_in_use_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        proc, _ = launch(["-n", "2", "--coordinator", address, "--", sys.executable, "-c", "print('ran')"], timeout=60)
        assert proc.returncode == 2 and "ran" not in proc.stdout, proc
        assert proc.stderr.startswith(f"error: the coordinator port {address.split(':')[1]} ({address}) is in use"), \
            proc.stderr
        # a process started by hand (a cluster script) says the same instead of crashing in the runtime
        child = subprocess.run([sys.executable, "-m", "dart_jax.launch.child", "-c", "print('ran')"], timeout=60,
                               env=env(JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES="2", JAX_PROCESS_ID="0"),
                               capture_output=True, text=True)
        assert child.returncode == 2 and "is in use" in child.stderr and "Traceback" not in child.stderr, child


def test_processes_started_with_different_counts_fail_clearly():
    coordinator = f"127.0.0.1:{free_port()}"
    code = "import jax; print('ran', jax.process_count())"
    first = subprocess.Popen([sys.executable, "-m", "dart_jax.launch", "-n", "2", "--process-id", "0", "--coordinator",
                              coordinator, "--", sys.executable, "-c", code], env=env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        second, elapsed = launch(["-n", "3", "--process-id", "1", "--coordinator", coordinator, "--", sys.executable,
                                  "-c", code], timeout=120)
        out, err = first.communicate(timeout=120)
    finally:
        first.kill()
    assert second.returncode == 2 and "ran" not in second.stdout, second
    assert "error: process 1 was started with JAX_NUM_PROCESSES=3 but process 0 with 2" in second.stderr, second.stderr
    assert first.returncode == 2 and "ran" not in out, (out, err)
    assert "error: process 0 was started with JAX_NUM_PROCESSES=2 but process 1 with 3" in err, err
    assert elapsed < 60


def test_the_launcher_bounds_a_run_that_hangs():
    proc, elapsed = launch(["-n", "2", "--timeout", "5", "--grace", "1", "--", sys.executable, "-c",
                            "import time; time.sleep(300)"], timeout=120)
    assert proc.returncode == 124 and "longer than --timeout 5 s" in proc.stderr and elapsed < 60, proc.stderr


@pytest.mark.parametrize("args, message", [
    (["-n", "2"], "no COMMAND"),
    (["-n", "0", "--", "true"], "--processes must be"),
    (["-n", "2", "--process-id", "1", "--", "true"], "give --coordinator"),
    (["-n", "2", "--process-id", "2", "--coordinator", "127.0.0.1:1234", "--", "true"], "outside 0 … 1"),
])
def test_launcher_usage_errors(args, message):
    proc, _ = launch(args, timeout=30)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and message in proc.stderr, proc.stderr


# ---------------------------------------------------------------- the project's commands, 2 × 4


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A tiny target with 8 heads and 8 KV heads (so that `model=4` and `model=8` divide them), its
    DART head, a trie, a second head to train from, and a few conversations."""
    from dart_jax.bench.tiny import make_tiny_head, make_tiny_qwen3, make_tiny_tokenizer
    from dart_jax.ngram import Trie

    folder = tmp_path_factory.mktemp("multihost")
    shape = dict(num_attention_heads=8, num_key_value_heads=8, head_dim=4, intermediate_size=64)
    base = make_tiny_qwen3(folder / "base", vocab_size=64, num_hidden_layers=3, hidden_size=32, std=0.3,
                           tie_word_embeddings=False, seed=3, **shape)
    make_tiny_tokenizer(base, vocab_size=64)
    make_tiny_head(folder / "head", base, draft_length=3, seed=3, **shape)
    make_tiny_head(folder / "init", base, draft_length=3, draft_vocab_size=32, seed=4, **shape)
    rng = np.random.default_rng(3)
    Trie.build([rng.integers(3, 64, 64) for _ in range(20)], order=3).save(folder / "ngram.trie")
    with open(folder / "data.jsonl", "w") as f:
        for _ in range(8):
            q, a = "".join(rng.choice(list("abcdefgh"), 6)), "".join(rng.choice(list("abcdefgh "), 24))
            f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
                    + "\n")
    return folder


def cache_env() -> dict:
    """The test run's persistent compilation cache (tests/conftest.py), for the commands too."""
    cache = os.environ.get("DART_JAX_TEST_XLA_CACHE")
    return {"XDG_CACHE_HOME": cache} if cache else {}


PROMPTS = [[5, 9, 14, 3, 22], [7, 7, 8, 7, 7, 8, 30], [40, 41, 42], [11, 60, 12, 61, 13, 62, 14, 63, 15]]  # token ids
NEW = 10

GENERATE = textwrap.dedent(r"""
    import json, os, sys
    import jax
    from flax import nnx
    if os.environ.get("DART_JAX_TEST_XLA_CACHE"):
        jax.config.update("jax_compilation_cache_dir", os.environ["DART_JAX_TEST_XLA_CACHE"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    from dart_jax.api.model import DartModel
    from dart_jax.decoding.settings import GenerationSettings
    from dart_jax.models import checkpoints

    folder, prompts, new = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    assert jax.process_count() == 2 and len(jax.devices()) == 8 and len(jax.local_devices()) == 4
    read = {"bytes": 0}
    place = checkpoints.place

    def counting_place(shape, axes, mesh, read_block, rules):
        def counted(index):
            block = read_block(index)
            read["bytes"] += block.nbytes
            return block
        return place(shape, axes, mesh, counted, rules)

    checkpoints.place = counting_place
    # over model=8 each process holds, and reads, half of every sharded weight
    target = checkpoints.load_qwen3(f"{folder}/base", dtype="float32", mesh="model=8")
    out = {"read_fraction": read["bytes"] / sum(x.nbytes for x in jax.tree.leaves(nnx.state(target)))}

    model = DartModel.from_pretrained(f"{folder}/base", f"{folder}/head", f"{folder}/ngram.trie",
                                      mesh="data=2,model=4", keep=8, dtype="float32")
    out["single"] = model.generate(prompts[0], max_new_tokens=new, max_length=64).token_ids
    out["batch"] = [r.token_ids for r in model.generate(prompts, max_new_tokens=new, max_length=64, batch_size=2)]
    pool = model.batcher(slots=2, max_length=64)
    handles = [pool.submit(p, GenerationSettings(max_new_tokens=new, max_length=64)) for p in prompts[:3]]
    while pool.active:
        pool.step()
    pool.close()
    out["pool"] = [h.token_ids for h in handles]
    print("RESULTS " + json.dumps(out), flush=True)
""")


def greedy_oracle(base: Path, prompts: list[list[int]], new: int) -> list[list[int]]:
    """Greedy decoding by the plain forward of the single-device target in this process (no
    cache, no drafts), stopping at EOS (id 2) as the engine does."""
    import jax
    import jax.numpy as jnp

    from dart_jax.models.checkpoints import load_qwen3

    target = load_qwen3(base, dtype="float32")
    logits_at = jax.jit(lambda x: target(x))
    want = []
    for prompt in prompts:
        seq, out = list(prompt), []
        while len(out) < new and not (out and out[-1] == 2):
            padded = np.zeros((1, 32), np.int32)
            padded[0, :len(seq)] = seq
            out.append(int(np.argmax(np.asarray(logits_at(jnp.asarray(padded)))[0, len(seq) - 1])))
            seq.append(out[-1])
        want.append(out)
    return want


@pytest.mark.slow  # two processes load and compile the engine: about a minute on 2 cores
def test_generate_batch_and_pool_over_two_processes_match_one(assets):
    proc, elapsed = launch(["-n", "2", "--devices-per-process", "4", "--", sys.executable, "-c", GENERATE,
                            str(assets), json.dumps(PROMPTS), str(NEW)], timeout=400, **cache_env())
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS ")]
    assert proc.returncode == 0 and lines, (proc.stdout[-2000:], proc.stderr[-5000:])
    got = json.loads(lines[0].removeprefix("RESULTS "))
    want = greedy_oracle(assets / "base", PROMPTS, NEW)
    assert len({t for row in want for t in row}) > 3, want  # a test of something: not one repeated token
    assert got["single"] == want[0]
    assert got["batch"] == want
    assert got["pool"] == want[:3]
    assert 0.45 < got["read_fraction"] < 0.6, got["read_fraction"]  # half of the weights, and the small norms


@pytest.mark.slow  # about a minute
def test_generate_cli_writes_its_output_once(assets, tmp_path):
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "max_new_tokens": NEW}) + "\n" for p in PROMPTS))
    out = tmp_path / "out.jsonl"
    args = ["--base", str(assets / "base"), "--ckpt", str(assets / "head"), "--ngram", str(assets / "ngram.trie"),
            "--keep", "8", "--mesh", "data=2,model=4", "--batch-size", "2", "--max-length", "64", "--no-chat",
            "--prompts", str(prompts), "--output", str(out)]
    proc, _ = launch(["-n", "2", "--devices-per-process", "4", "--", sys.executable, "-m", "dart_jax.generate",
                      *args], timeout=400, cwd=tmp_path, **cache_env())
    assert proc.returncode == 0, proc.stderr[-5000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["token_ids"] for line in lines] == greedy_oracle(assets / "base", PROMPTS, NEW)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]  # no leftover .tmp


TRAIN_KILLED_AT_3 = textwrap.dedent(r"""
    import os, signal, sys
    import jax
    from dart_jax.train import loop
    from dart_jax.train.__main__ import main
    step = loop.Trainer.step
    def step_then_die(self, batch, _count=[0]):
        _count[0] += 1
        if jax.process_index() == 1 and _count[0] == 2:  # micro-step 4 of the run (it resumes at 2)
            os.kill(os.getpid(), signal.SIGKILL)
        return step(self, batch)
    loop.Trainer.step = step_then_die
    main(sys.argv[1:])
""")


@pytest.mark.slow  # four short training runs: about two minutes on 2 cores
def test_training_over_two_processes_matches_one_through_a_resume_and_a_kill(assets, tmp_path):
    from safetensors.numpy import load_file

    args = ["--base", str(assets / "base"), "--data", str(assets / "data.jsonl"), "--draft-length", "3",
            "--max-length", "48", "--anchors-per-seq", "8", "--no-progress", "--batch-size", "2", "--epochs", "1",
            "--lr", "5e-3", "--init-head", str(assets / "init"), "--save-every", "1", "--log-every", "1"]
    precise = "import jax; jax.config.update('jax_default_matmul_precision', 'highest'); "
    train = [sys.executable, "-c", precise + "import sys; from dart_jax.train.__main__ import main; main(sys.argv[1:])"]
    # the oracle: one process, one device
    one = subprocess.run([*train, *args, "--out", str(tmp_path / "one")], env=env(**cache_env()), capture_output=True,
                         text=True, timeout=400)
    assert one.returncode == 0, one.stderr[-3000:]
    two = tmp_path / "two"
    launched = ["-n", "2", "--devices-per-process", "4", "--grace", "1", "--"]
    mesh = ["--mesh", "data=2,model=4", "--out", str(two)]
    first, _ = launch([*launched, *train, *args, *mesh, "--stop-after", "2"], timeout=400, **cache_env())
    assert first.returncode == 0, first.stderr[-3000:]
    killed, elapsed = launch([*launched, sys.executable, "-c", precise + TRAIN_KILLED_AT_3, *args, *mesh], timeout=400,
                             **cache_env())
    assert killed.returncode == 128 + signal.SIGKILL and "process 1 was killed by SIGKILL" in killed.stderr, \
        killed.stderr[-3000:]
    # nothing half-written: complete checkpoints only (orbax renames a step's folder when done), no head
    assert not (two / "head").exists()
    steps = sorted(int(p.name) for p in (two / "ckpt").iterdir())
    assert steps and set(steps) <= {1, 2, 3}, sorted((two / "ckpt").iterdir())
    for step in steps:  # written once, by both processes together: one folder, each process its part
        state = two / "ckpt" / str(step) / "state"
        assert (state / "commit_success.txt").exists() or (state / "_METADATA").exists(), list(state.iterdir())
    again, _ = launch([*launched, *train, *args, *mesh], timeout=400, **cache_env())
    assert again.returncode == 0 and f"resuming from micro-step {steps[-1]} of 4" in again.stderr, again.stderr[-3000:]

    def losses(stderr: str) -> dict[int, float]:
        return {m["step"]: m["loss"] for m in (json.loads(line) for line in stderr.splitlines()
                                                if line.startswith('{"step"'))}

    want = losses(one.stderr)
    got = {**losses(first.stderr), **losses(killed.stderr), **losses(again.stderr)}
    assert sorted(want) == [1, 2, 3, 4] and set(got) >= set(want), (want, got)
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=1e-4, abs=1e-5), (step, got, want)
    head_one, head_two = load_file(tmp_path / "one/head/model.safetensors"), load_file(two / "head/model.safetensors")
    assert sorted(head_one) == sorted(head_two)
    for name in head_one:
        np.testing.assert_allclose(head_two[name], head_one[name], rtol=1e-4, atol=1e-5, err_msg=name)
    assert sorted(p.name for p in two.iterdir()) == ["ckpt", "data.npz", "head", "metrics.json", "run.json",
                                                     "vocab.npz"]


@pytest.mark.slow  # two processes load, compile and serve: a minute or two on 2 cores
def test_the_server_over_two_processes_answers_as_one_process_decodes(assets, tmp_path):
    """`python -m dart_jax.serve` under the launcher: process 0 serves HTTP, process 1 follows its
    step loop; the official `openai` client's greedy answers (two at once, a stream, and one by
    plain decoding) are the single-device target's greedy continuations."""
    import concurrent.futures
    import urllib.request

    import openai
    from transformers import AutoTokenizer

    port = free_port()
    args = ["--base", str(assets / "base"), "--ckpt", str(assets / "head"), "--ngram", str(assets / "ngram.trie"),
            "--keep", "8", "--mesh", "data=2,model=4", "--port", str(port), "--no-ui", "--warmup", "quick",
            "--slots", "2", "--max-length", "64"]
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "dart_jax.launch", "-n", "2", "--devices-per-process", "4",
                                   "--grace", "2", "--", sys.executable, "-m", "dart_jax.serve", *args],
                                  env=env(**cache_env()), cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while True:
            assert server.poll() is None, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=300)
        name = client.models.list().data[0].id
        tokenizer = AutoTokenizer.from_pretrained(assets / "base")
        want = [tokenizer.decode(ids, skip_special_tokens=True) for ids in greedy_oracle(assets / "base", PROMPTS, NEW)]

        def complete(prompt):
            return client.completions.create(model=name, prompt=prompt, max_tokens=NEW, temperature=0).choices[0].text

        with concurrent.futures.ThreadPoolExecutor(2) as pool:  # two clients at once share the pool's slots
            got = list(pool.map(complete, PROMPTS[:2]))
        assert got == want[:2]
        stream = client.completions.create(model=name, prompt=PROMPTS[2], max_tokens=NEW, temperature=0, stream=True)
        assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == want[2]
        plain = client.completions.create(model=name, prompt=PROMPTS[3], max_tokens=NEW, temperature=0,
                                          extra_body={"method": "ar"})  # the plain decoder's pool, sharded too
        assert plain.choices[0].text == want[3]
    finally:
        stop_process(server)

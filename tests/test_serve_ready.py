"""A server that is ready when it says so: its warm-up compiles, ahead of time, every program the
first requests of each method run (`dart_jax.decoding.ahead`), single requests first; JAX's own
compiler log (its "Compiling ..." record per program lowered, not our counters) then sees no
compilation while those requests are served, also where the programs are read back from the store
of exported programs (on in this module) rather than traced."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import threading
import time
import types

import pytest

from dart_jax.decoding.batcher import SlotPool

# one worker runs the tests of the `warming` fixture (a server warming up)
pytestmark = pytest.mark.xdist_group("serve_ready")
# the warm-up's programs go through a store of exported programs of this module's own (conftest):
# a program called as read back must compile no second time when fed its own outputs
EXPORTED_PROGRAMS = True


@pytest.mark.parametrize("busy, slots, rows", [
    ([0], 8, 1), ([0, 1], 8, 2), ([0, 2], 8, 4), ([0, 1, 2, 3], 8, 4), ([4], 8, 8), ([0, 1, 2], 3, 3), ([0], 1, 1)])
def test_a_pool_computes_the_power_of_two_rows_that_hold_its_highest_busy_slot(busy, slots, rows):
    # a lone request in slot 0 is one row, not two: the rows are slots 0 … 2^j - 1, the fewest that
    # reach the highest busy slot, never more than the pool
    pool = types.SimpleNamespace(busy=[object() if i in busy else None for i in range(slots)], slots=slots)
    assert SlotPool._live(pool) == rows


# ---------------------------------------------------------------------- the warm-up's stages
def test_the_plan_warms_single_requests_first_then_more_at_once():
    from dart_jax.serve.warmup import plan
    stages = plan({"dart": "DART", "ar": "Plain"}, slots=6, max_length=1024, full=True, length=512)
    got = [(s.method, s.rows, s.prompt_length, s.length, s.ready) for s in stages]
    # single requests with a chat turn's prompt in the first attention window, for every method (the
    # server accepts requests after these); then prompts and sequences up to the warm-up's length;
    # then 2, 4 and the pool's 6 requests at once
    assert got == [("dart", 1, 64, 192, True), ("ar", 1, 64, 192, True),
                   ("dart", 1, 511, 512, False), ("ar", 1, 511, 512, False),
                   ("dart", 2, 511, 512, False), ("ar", 2, 511, 512, False),
                   ("dart", 4, 511, 512, False), ("ar", 4, 511, 512, False),
                   ("dart", 6, 511, 512, False), ("ar", 6, 511, 512, False)]
    quick = plan({"dart": "DART"}, slots=6, max_length=100, full=False, length=512)
    assert [(s.rows, s.prompt_length, s.length) for s in quick] == [(1, 64, 100), (1, 99, 100)]


def test_the_programs_of_a_pool_cover_every_prefill_chunk_and_window_up_to_the_length():
    from dart_jax.decoding.ahead import prefill_windows, windows
    # prompts of 1 … 300 tokens in chunks of 32 reaching 35 slots past their offset (the last at
    # 288: 323 slots): windows 256 and 512, cut at the cache; of up to 64 tokens in chunks of 64: 256
    assert prefill_windows(32, 35, 300, 4096) == [256, 512]
    assert prefill_windows(32, 35, 300, 300) == [256, 300]
    assert prefill_windows(64, 64, 64, 4096) == [256]
    # the attention windows of sequences of up to 600 tokens whose steps reach 16 slots past them:
    # 256, 512 and 1024 (616 slots), cut at the cache
    assert windows(16, 600, 4096) == [256, 512, 1024]
    assert windows(16, 600, 768) == [256, 512, 768]
    assert windows(16, 200, 4096) == [256]


# ---------------------------------------------------------------------- a server warming up, then warm
NAME, KEY = "ready-test", "ready-key"
HANG = 600  # seconds: only keeps a broken warm-up from hanging the run


class Compilations(logging.Handler):
    """JAX's compiler log: one "Compiling <program> with global shapes ..." record per program it
    lowers (pxla's logger, at DEBUG), whoever asked for it."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.seen: list[str] = []

    def emit(self, record):
        text = record.getMessage()
        if text.startswith("Compiling "):
            self.seen.append(text.split(" with ")[0].removeprefix("Compiling "))


@contextlib.contextmanager
def compilations():
    logger = logging.getLogger("jax._src.interpreters.pxla")
    handler, level = Compilations(), logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield handler.seen
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture(scope="module")
def warming(tmp_path_factory):
    """The tiny demo (keep="auto" up to 4 nodes: plain chunks and trees of 3 and 4) with a small
    EAGLE-3 head, served by a pool of 2 slots of 64 tokens (one prompt bucket: few programs, a fast
    test), its full warm-up started as the command starts it (`warm_up`: it returns once single
    requests are warm, the rest going on in a thread) with the stages of 2 requests at once held
    back (their compilations wait for `gate`)."""
    from fastapi.testclient import TestClient

    from dart_jax.api.generate import _demo_paths
    from dart_jax.api.model import DartModel
    from dart_jax.bench.tiny import make_tiny_eagle3
    from dart_jax.decoding import ahead
    from dart_jax.serve.__main__ import warm_up
    from dart_jax.serve.app import create_app
    from dart_jax.serve.scheduler import Scheduler

    base, head, trie = _demo_paths("tiny")
    eagle3 = make_tiny_eagle3(tmp_path_factory.mktemp("eagle3") / "head", base)
    model = DartModel.from_pretrained(base, head, trie, keep="auto", max_keep=4, eagle3=eagle3,
                                      eagle3_total_token=8, eagle3_depth=3, eagle3_top_k=4, min_bucket=64)
    scheduler = Scheduler(model, slots=2, max_length=64).start()
    gate, out = threading.Event(), io.StringIO()
    listed = ahead.programs

    def gated(pool, rows, *args):
        out = listed(pool, rows, *args)
        if rows < 2:
            return out
        return [dataclasses.replace(p, lower=lambda p=p: gate.wait(HANG) and p.lower()) for p in out]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ahead, "programs", gated)
        thread = warm_up(scheduler, model, full=True, stream=out)
        client = TestClient(create_app(scheduler, model_name=NAME, api_key=KEY))
        try:
            yield types.SimpleNamespace(scheduler=scheduler, client=client, gate=gate, thread=thread, out=out)
        finally:
            gate.set()
            scheduler.stop()


def health(client, key=KEY) -> dict:
    r = client.get("/health", headers={"Authorization": f"Bearer {key}"} if key else {})
    assert r.status_code == 200, r.text
    return r.json()


def warm_to_the_end(warming) -> None:
    warming.gate.set()
    warming.thread.join(HANG)
    assert not warming.thread.is_alive() and warming.scheduler.progress.error is None


@pytest.mark.extended
def test_health_shows_the_progress_and_a_pool_takes_only_as_many_requests_as_are_warm(warming):
    from dart_jax.decoding.settings import GenerationSettings

    scheduler, client = warming.scheduler, warming.client
    if warming.gate.is_set():
        pytest.skip("the warm-up was let through already")
    # the stages, restated: each method alone (before the server serves) for the pool's 64 tokens,
    # then two at once (held back at the gate)
    methods = ["DART", "EAGLE-3", "Plain"]
    expected = ([f"{m}, 1 request at once, prompts up to 63 tokens, sequences up to 64" for m in methods]
                + [f"{m}, 2 requests at once, prompts up to 63 tokens, sequences up to 64" for m in methods])
    deadline = time.monotonic() + HANG
    while health(client)["warmup"]["stage"] < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    shown = health(client)
    assert shown["status"] == "ok" and shown["jobs"]["open"] == 0
    progress = shown["warmup"]
    assert {k: progress[k] for k in ("stage", "stages", "warming", "warm", "ready", "done")} == {
        "stage": 4, "stages": 6, "warming": expected[3], "warm": expected[:3], "ready": True, "done": False}
    assert 0 < progress["programs"] < progress["of"] and progress["seconds"] > 0
    assert set(health(client, key=None)) == {"status"}  # without the key: neither jobs nor warm-up

    # two requests of each method at once while only one at a time is warm: the second waits for the
    # first to end (its events all come after the first's last), and nothing compiles
    order = []
    with compilations() as seen:
        for method in scheduler.methods:
            events = {name: threading.Event() for name in "ab"}
            for name, temperature in (("a", 0.0), ("b", 0.9)):
                def sink(event, name=name):
                    order.append((method, name, event.done))
                    if event.done:
                        events[name].set()
                scheduler.submit(scheduler.model.encode("Tell me a story.", chat=False),
                                 GenerationSettings(max_new_tokens=12, max_length=64, temperature=temperature, seed=3),
                                 sink, method=method)
            assert all(e.wait(HANG) for e in events.values())
        assert seen == []
    for method in scheduler.methods:
        mine = [(name, done) for m, name, done in order if m == method]
        assert mine.index(("a", True)) < mine.index(next(x for x in mine if x[0] == "b")), mine
    warm_to_the_end(warming)
    final = health(client)["warmup"]
    assert {k: final[k] for k in ("stage", "stages", "warming", "warm", "ready", "done")} == {
        "stage": 6, "stages": 6, "warming": None, "warm": expected, "ready": True, "done": True}
    assert final["programs"] == final["of"] > 0 and "error" not in final


def stream(client, path: str, body: dict) -> tuple[str, dict]:
    """A streamed answer's text and the figures of its last chunk."""
    text, last = [], None
    with client.stream("POST", path, json=body, headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("choices"):
                    choice = chunk["choices"][0]
                    text.append(choice.get("text") or choice.get("delta", {}).get("content") or "")
                    if choice["finish_reason"]:
                        last = chunk["dart"]
    return "".join(text), last


# the server's whole warm-up (its fixture, about a minute on 2 cores): a second look at what the
# programs' cover above and test_engine's warm adaptive engine check more quickly
@pytest.mark.extended
def test_first_requests_of_every_method_compile_nothing_once_warm(warming):
    from dart_jax.decoding import exported
    from dart_jax.decoding.settings import GenerationSettings
    from dart_jax.serve.scheduler import thread_sink

    warm_to_the_end(warming)
    assert any(exported.folder().glob("*.jaxexp"))  # the warm-up's programs were exported and read back
    scheduler, client = warming.scheduler, warming.client
    auth = {"Authorization": f"Bearer {KEY}"}
    with compilations() as seen:
        for method in scheduler.methods:
            chat = {"model": NAME, "messages": [{"role": "user", "content": "Why do drafts help?"}], "method": method,
                    "max_tokens": 30}
            text = {"model": NAME, "prompt": "The trie counts", "method": method, "max_tokens": 30}
            r = client.post("/v1/chat/completions", json={**chat, "temperature": 0}, headers=auth)
            assert r.status_code == 200 and r.json()["dart"]["method"] == method
            r = client.post("/v1/completions", json={**text, "temperature": 0.8, "seed": 5}, headers=auth)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0
            for path, body in (("/v1/chat/completions", {**chat, "temperature": 0.8, "seed": 2}),
                               ("/v1/completions", {**text, "temperature": 0})):
                _, figures = stream(client, path, {**body, "stream": True})
                assert figures["method"] == method
            # two at once: a pool of two rows
            queues = []
            for temperature in (0.0, 0.7):
                q, sink = thread_sink()
                scheduler.submit(scheduler.model.encode("A longer prompt, of more words than the others.", chat=False),
                                 GenerationSettings(max_new_tokens=30, max_length=64, temperature=temperature), sink,
                                 method=method)
                queues.append(q)
            for q in queues:
                while not (event := q.get(timeout=HANG)).done:
                    pass
                assert event.error is None
        assert seen == []


@pytest.mark.extended
def test_the_warm_up_says_each_stage_as_it_starts_and_ends_and_when_it_serves(warming):
    warm_to_the_end(warming)
    lines = [line for line in warming.out.getvalue().splitlines() if line.startswith("dart_jax: ")]
    stages = [str(s) for s in warming.scheduler.progress.stages]
    said = iter(lines)
    for n, stage in enumerate(stages, 1):
        assert next(said) == f"dart_jax: warm-up {n} of 6: {stage} ..."
        done = next(said)
        assert done.startswith(f"dart_jax: warm-up {n} of 6 done in ") and done.endswith(" s")
        float(done.split("done in ")[1].removesuffix(" s"))
        if n == 3:  # every method's single requests: the server serves from here on
            ready = next(said)
            assert ready.startswith("dart_jax: single requests of every method are warm after ") and ready.endswith(
                " s; the other 3 stages warm while the server serves (GET /health shows how far)")
    assert next(said).startswith("dart_jax: warm-up done in ")


def test_compilations_are_named_in_words_or_by_their_function():
    from dart_jax.api.compiling import describe
    assert describe("jit(_step)") == describe("_step") == "the DART decode step"
    assert describe("jit(_pool_step)") == "the program _pool_step"
    assert describe("") == "a helper"


@pytest.mark.slow  # the device loop's compilation: half a minute on 2 cores, for paths only an accelerator runs
def test_an_accelerator_s_programs_compile_ahead_too(monkeypatch):
    """What only an accelerator runs, on the CPU: the device loop (device_steps) and the sampling
    branch decided on the host (each pool step compiled for all-greedy rows and for a sampling
    one). After the programs listed for one row are compiled and one greedy request has run (the
    small programs between the calls), a sampled request and a greedy one compile nothing."""
    from dart_jax.api.model import DartModel
    from dart_jax.decoding import ahead, sampling
    from dart_jax.decoding.driver import Driver
    from dart_jax.decoding.settings import GenerationSettings

    monkeypatch.setattr(sampling, "host_branch", lambda: True)
    model = DartModel.demo("tiny", keep=4, device_steps=2, min_bucket=64)
    engine = model.engine
    pool = engine.batcher(1, 64)
    try:
        programs = ahead.programs(pool, 1, 63, 64)
        assert {(p.kind, p.greedy) for p in programs} == {(kind, greedy) for kind in ("prefill", "loop")
                                                          for greedy in (True, False)}
        for program in programs:
            program.compile()
        prompt = model.encode("What is speculative decoding?", chat=False)

        def answer(temperature: float) -> list[int]:
            request = pool.submit(prompt, GenerationSettings(max_new_tokens=6, max_length=64, temperature=temperature,
                                                             seed=1), stop_at_eos=False)
            for _ in Driver(pool).run():
                pass
            return request.token_ids

        answer(0.0)
        with compilations() as seen:
            assert len(answer(0.8)) == 6 and len(answer(0.0)) == 6
        assert seen == []
    finally:
        pool.close()


def test_the_warm_up_stops_compiling_before_the_process_runs_out_of_memory_maps(monkeypatch):
    """Linux ends a process whose memory maps reach vm.max_map_count, and each compiled XLA:CPU
    program maps its kernels: past 75 % of the limit, the programs left fail with OutOfMaps."""
    from dart_jax.decoding.ahead import Program
    from dart_jax.serve import warmup

    used = iter([100, 740, 760, 900])  # of 1000: a quarter is left to programs compiled on first use
    monkeypatch.setattr(warmup, "maps_in_use", lambda: (next(used), 1000))
    ran = []
    compiler = warmup.Compiler(1)
    try:
        futures = [compiler.submit(Program("step", 1, 256, size, lower=lambda size=size: lambda: ran.append(size)))
                   for size in range(4)]
        outcomes = []
        for future in futures:
            try:
                outcomes.append(future.result(HANG) is not None)
            except warmup.OutOfMaps as e:
                outcomes.append(str(e))
    finally:
        compiler.close()
    assert ran == [0, 1] and outcomes[:2] == [True, True]
    assert all("vm.max_map_count 1000" in o and "sysctl -w vm.max_map_count" in o for o in outcomes[2:]), outcomes

"""The decoding methods' one home (`dart_jax.api.methods`) and the one plain-decoding baseline.

- Every list of methods (the HTTP schema, the CLIs' choices, the server's and the UI's options,
  the bench's check) is the registry's: a method added in this file alone is offered everywhere.
- "eagle3" is served over HTTP (the official `openai` client), its greedy text that of plain
  greedy decoding of the target (`generate_ar`, the oracle: greedy speculative decoding is lossless).
- The server's "ar" decodes with the device loop (several tokens per event) and says so: its
  chunks carry `plain_tokens`, never an accepted draft length; so do keep="auto"'s plain chunks.
- One tree-size check with one message for the Python API and a server request.
- The UI's labels, its "compiling…" state, and the CLI's words for plain_tokens / draft_tau.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import openai
import pytest
from fastapi.testclient import TestClient

from dart_jax.api import generate, methods
from dart_jax.api.model import DartModel
from dart_jax.bench import e2e
from dart_jax.bench.tiny import make_tiny_eagle3
from dart_jax.decoding.settings import GenerationSettings
from dart_jax.errors import InputError
from dart_jax.ngram import TreeSettings
from dart_jax.serve import ui
from dart_jax.serve.app import create_app
from dart_jax.serve.protocol import ChatCompletionRequest, CompletionRequest
from dart_jax.serve.scheduler import Scheduler

pytestmark = pytest.mark.xdist_group("methods")
ROOT = Path(__file__).resolve().parent.parent
NAME = "m"
PROMPT = "Speculative decoding is"


@pytest.fixture(scope="module")
def paths():
    return generate._demo_paths("tiny")


@pytest.fixture(scope="module")
def model(paths, tmp_path_factory):
    """The tiny demo with a fixed DART tree and a small random EAGLE-3 head beside it."""
    base, head, trie = paths
    eagle3 = make_tiny_eagle3(tmp_path_factory.mktemp("eagle3") / "head", base)
    return DartModel.from_pretrained(base, head, trie, keep=16, eagle3=eagle3, eagle3_total_token=8,
                                     eagle3_depth=3, eagle3_top_k=4)


@pytest.fixture(scope="module")
def served(model):
    scheduler = Scheduler(model, slots=1, max_length=256).start()
    client = TestClient(create_app(scheduler, model_name=NAME))
    try:
        yield scheduler, client
    finally:
        scheduler.stop()


def plain_greedy(model, n: int) -> str:
    return model.generate_ar(PROMPT, max_new_tokens=n, max_length=256, chat=False).text


def sse(client, body: dict) -> list[dict]:
    with client.stream("POST", "/v1/completions", json={"model": NAME, "prompt": PROMPT, "temperature": 0,
                                                         "stream": True, **body}) as r:
        assert r.status_code == 200, r.read()
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


# ---------------------------------------------------------------------- one list of methods
def test_every_list_of_methods_is_the_registry(model):
    names = list(methods.names())
    assert names[:3] == ["dart", "eagle3", "ar"]
    for request in (ChatCompletionRequest, CompletionRequest):
        assert request.model_json_schema()["properties"]["method"]["enum"] == names
    for name in names:
        assert CompletionRequest(model=NAME, prompt="x", method=name).method == name
    with pytest.raises(ValueError, match="method must be one of dart, eagle3, ar"):
        CompletionRequest(model=NAME, prompt="x", method="medusa")
    assert generate.parse_args(["--method", "eagle3"]).method == "eagle3"
    with pytest.raises(SystemExit):
        generate.parse_args(["--method", "medusa"])
    assert set(e2e.check_methods(names)) == set(names)
    # what a model has loaded: all three here, no eagle3 without its head
    assert [m.name for m in methods.loaded(model)] == names
    assert "eagle3" not in [m.name for m in methods.loaded(type("M", (), {"engine": model.engine})())]
    with pytest.raises(InputError, match="method must be one of"):
        methods.get("medusa")


def ui_options(client) -> dict[str, list]:
    config = client.get("/ui/config").json()
    out = {}
    for component in config["components"]:
        props = component.get("props", {})
        if props.get("elem_id") in ("dj-method", "dj-method-b"):
            out[props["elem_id"]] = [choice[1] for choice in props["choices"]]
    return out


def test_a_method_added_here_alone_is_offered_by_the_cli_the_http_api_and_the_ui(model, capsys):
    """A dummy method (DART's engine under another name, tree size fixed) registered in this test:
    the CLI takes it, the HTTP schema lists it, the server serves it (the same greedy text as plain
    decoding), the UI offers it, and the bench accepts it; nothing else was edited."""
    dummy = methods.register(methods.Method("dummy", "Dummy", "a test's own method", drafts=True,
                                            engine=lambda m: m.engine))
    try:
        assert generate.parse_args(["--method", "dummy"]).method == "dummy"
        with pytest.raises(SystemExit):
            generate.parse_args(["--help"])
        assert "dummy = a test's own method" in " ".join(capsys.readouterr().out.split())
        assert "dummy" in e2e.check_methods(["dart", "ar", "dummy"])
        scheduler = Scheduler(model, slots=1, max_length=256).start()
        try:
            client = TestClient(ui.mount(create_app(scheduler, model_name=NAME), scheduler, title="t"))
            assert "dummy" in client.get("/openapi.json").json()["components"]["schemas"]["CompletionRequest"][
                "properties"]["method"]["enum"]
            assert "dummy" in client.get("/v1/models").json()["data"][0]["methods"]
            assert all("dummy" in options for options in ui_options(client).values())
            got = client.post("/v1/completions", json={"model": NAME, "prompt": PROMPT, "temperature": 0,
                                                        "max_tokens": 12, "method": "dummy"}).json()
            assert got["choices"][0]["text"] == plain_greedy(model, 12)
            assert got["dart"]["method"] == "dummy" and got["dart"]["tree_size"] == model.engine.tree.keep
        finally:
            scheduler.stop()
    finally:
        methods.unregister(dummy.name)
    assert "dummy" not in methods.names()


# ---------------------------------------------------------------------- eagle3 over HTTP
def test_eagle3_is_served_over_http_with_the_openai_client(model, served):
    scheduler, client = served
    assert "eagle3" in scheduler.methods
    api = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client, max_retries=0)
    got = api.completions.create(model=NAME, prompt=PROMPT, temperature=0, max_tokens=20,
                                 extra_body={"method": "eagle3"})
    assert got.choices[0].text == plain_greedy(model, 20)
    dart = got.model_extra["dart"]
    assert dart["method"] == "eagle3" and dart["tree_size"] == 7  # eagle3_total_token 8: 7 nodes besides the root
    assert all(1 <= a <= 4 for a in dart["accept_lengths"])  # depth 3: at most 3 drafted + the bonus


# ---------------------------------------------------------------------- one plain baseline
def test_the_servers_plain_method_runs_the_device_loop_and_says_plain(model, served):
    _, client = served
    want = model.generate_ar(PROMPT, max_new_tokens=70, max_length=256, chat=False)
    chunks = sse(client, {"max_tokens": 70, "method": "ar"})
    assert "".join(c["choices"][0]["text"] for c in chunks) == want.text
    steps = [c["dart"] for c in chunks[:-1]]
    assert steps[0] == {"accepted": 0}  # the prefill's token
    plain = [s["plain_tokens"] for s in steps[1:]]
    assert all("accepted" not in s for s in steps[1:]), steps
    # the loop of generate_ar: up to 32 tokens a call, not one token per scheduler step
    assert max(plain) > 1 and len(chunks) <= 2 + -(-70 // 32) + 1, plain
    final = chunks[-1]["dart"]
    assert final["method"] == "ar" and final["tree_size"] is None and final["plain_tokens"] == len(want.token_ids) - 1


def test_plain_chunks_of_keep_auto_are_reported_as_plain(model):
    """keep="auto" with a sizer that plays tree size 0 (a chunk of plain decoding) then 8: the SSE
    chunks of the plain chunks say plain_tokens, those of drafted steps an accepted length; the
    text is still plain greedy decoding's."""
    auto = DartModel(model.target, model.head, model.tokenizer, model.engine.trie, eos_ids=sorted(model.engine.eos_ids),
                     tree=TreeSettings(keep=8), adaptive=True)

    class Plan:
        adaptive, calls = True, 0

        def drafting_pays(self, rows):
            return True

        def row(self):
            return None

        def choose(self, rows, measure, live=()):
            self.calls += 1
            return (0, 8)[self.calls % 2 == 0]

        def observe(self, *args):
            pass
    auto.engine.sizer = Plan()
    scheduler = Scheduler(auto, slots=1, max_length=256).start()
    try:
        client = TestClient(create_app(scheduler, model_name=NAME))
        chunks = sse(client, {"max_tokens": 60})
    finally:
        scheduler.stop()
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain_greedy(model, 60)
    steps = [c["dart"] for c in chunks[1:-1]]
    assert any("plain_tokens" in s for s in steps) and any("accepted" in s for s in steps), steps
    assert not any("plain_tokens" in s and "accepted" in s for s in steps)
    final = chunks[-1]["dart"]
    assert final["plain_tokens"] > 0 and "draft_tau" in final


# ---------------------------------------------------------------------- one tree-size check
def test_the_server_and_the_python_api_check_a_tree_size_alike(paths):
    base, head, trie = paths
    small = DartModel.from_pretrained(base, head, trie, keep=4, topk=2, beam_width=2, draft_rows=2)
    most = methods.max_tree_nodes(small.engine.tree, small.engine.drafter.max_depth)
    assert most == 6  # row 0: 2 candidates, row 1: a beam of 2 times 2
    with pytest.raises(InputError) as api_error:
        small.dart_generate([small.encode("hi")], remain_total=8, max_new_token_num=2)
    scheduler = Scheduler(small, slots=1, max_length=64)  # not started: a refused request runs nothing
    try:
        r = TestClient(create_app(scheduler, model_name=NAME)).post(
            "/v1/completions", json={"model": NAME, "prompt": "hi", "max_tokens": 2, "tree_size": 8})
    finally:
        scheduler._fail_all(None)
        for pool in scheduler._pools.values():
            pool.close()
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert f"tree_size <= {most}" in message and f"remain_total <= {most}" in str(api_error.value)
    assert message.replace("tree_size", "X") == str(api_error.value).replace("remain_total", "X")


# ---------------------------------------------------------------------- the UI's and the CLI's words
def test_ui_renders_plain_text_unhighlighted_and_says_compiling():
    chunks = [("Hi", 0, False), (" there", 3, False), (" plain", 1, True), (" more", 2, False)]
    html = ui.render(chunks, "dart")
    assert html.count('class="dj-c') == 3 and 'class="dj-c0"' in html and html.count("dj-plain") == 1
    assert "accepted" not in html.split("dj-plain")[1].split("</span>")[0]
    assert "dj-c" not in ui.render([("a", 0, False), ("b", 1, True)], "ar")

    class Busy:
        methods = {"dart": "DART"}

        def compiling(self):
            return 4.0, "the DART decode step"

    class FakeJob:
        token_ids, compile_s, finish_reason, tokens_per_s = [5], 0.0, None, 2.4

        class stats:
            accept_lengths = []

            @staticmethod
            def tree_figures():
                return {}
    run = ui._Run.__new__(ui._Run)
    run.scheduler, run.method, run.job, run.error, run.finished, run.chunks = Busy(), "dart", FakeJob(), None, False, []
    line = run.summary()
    assert "compiling" in line and "tokens/s" not in line, line
    run.finished = True
    assert "2.4 tokens/s" in run.summary()


def test_the_ui_page_explains_plain_text(served):
    scheduler, _ = served
    client = TestClient(ui.mount(create_app(scheduler, model_name=NAME), scheduler, title="t"))
    text = json.dumps(client.get("/ui/config").json())
    assert "not highlighted came from plain decoding" in text
    assert ui_options(client) == {"dj-method": list(scheduler.methods), "dj-method-b": list(scheduler.methods)}


def test_cli_text_explains_plain_tokens_and_draft_tau():
    stats = {"new_tokens": 40, "steps": 30, "tau": 1.3, "tokens_per_s": 10.0, "device_s": 1.0, "tree_s": 0.1,
             "host_s": 0.1, "compile_s": 0.0, "plain_tokens": 25, "draft_tau": 1.9}
    result = type("R", (), {"stats": stats, "finish_reason": "length"})()
    text = generate._summary(result)
    assert "25 of the tokens by plain decoding" in text and "plain_tokens" in text
    assert "15 by drafted steps whose mean accepted length is 1.90 (draft_tau)" in text
    assert "plain" not in generate._summary(type("R", (), {"stats": {**stats, "plain_tokens": 0},
                                                           "finish_reason": "eos"})())


# ---------------------------------------------------------------------- the engine's public calls
def test_the_batcher_uses_no_private_engine_attribute():
    tree = ast.parse((ROOT / "dart_jax" / "decoding" / "batcher.py").read_text())
    private = sorted({node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                      and isinstance(node.value, (ast.Name, ast.Attribute))
                      and (getattr(node.value, "id", None) == "engine" or getattr(node.value, "attr", None) == "engine")
                      and node.attr.startswith("_")})
    assert private == [], private

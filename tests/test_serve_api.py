"""The HTTP API of `python -m dart_jax.serve`, driven with the official `openai` client against a
live server on 127.0.0.1 (the embedded demo model). The oracle for every greedy answer is
`DartModel.generate` of the same prompt in this process (itself checked against plain greedy
decoding of the target in test_engine)."""
from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import openai
import pytest

from dart_jax.api.generate import _demo_paths
from dart_jax.api.model import DartModel

from serving import live_server

# one server for the module: the group keeps its tests on one pytest-xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("serve_api")
KEY = "test-key-123"
# the tests wait for answers, whatever the machine's load: this bound only keeps a broken server
# from hanging the run (a busy machine once took more than httpx's default 5 s for a first chunk)
HANG = 600
NAME = "dart-jax-demo"
PROMPTS = ["What is speculative decoding?", "Why does the draft tree help?", "Tell me about verification.",
           "hello", "Write a poem about rivers.", "What does the n-gram trie do?", "Explain tau.", "Count to ten."]


@pytest.fixture(scope="module")
def server():
    # a fixed tree: the streamed accepted lengths are compared with the in-process model's
    with live_server("--demo", "tiny", "--no-ui", "--api-key", KEY, "--slots", "4", "--max-length", "384", "--keep", "60") as (url, proc):
        yield url, proc


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key=KEY, max_retries=0, timeout=HANG)


@pytest.fixture(scope="module")
def model():
    base, head, trie = _demo_paths("tiny")
    return DartModel.from_pretrained(base, head, trie, keep=60)


def oracle(model, prompt, n, chat=True):
    messages = [{"role": "user", "content": prompt}] if chat else prompt
    return model.generate(messages, max_new_tokens=n, max_length=384, chat=chat)


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"]), body
    assert body["error"]["message"]
    return body["error"]


def test_models_and_the_api_key(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == [NAME]
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.get(server[0] + "/v1/models", headers=headers, timeout=HANG)
        assert r.status_code == 401
        assert error_of(r)["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server[0] + "/v1", api_key="nope", max_retries=0).models.list()


def test_chat_greedy_equals_generate_with_usage_and_decoding_figures(client, model):
    want = oracle(model, PROMPTS[0], 48)
    got = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": PROMPTS[0]}],
                                         temperature=0, max_tokens=48)
    choice = got.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == want.text
    assert choice.finish_reason == ("stop" if want.finish_reason == "eos" else "length")
    assert got.usage.prompt_tokens == len(want.prompt_ids)
    assert got.usage.completion_tokens == len(want.token_ids)
    assert got.usage.total_tokens == len(want.prompt_ids) + len(want.token_ids)
    dart = got.model_extra["dart"]
    assert dart["method"] == "dart" and dart["accept_lengths"] == want.accept_lengths
    assert dart["mean_accepted_length"] == pytest.approx(sum(want.accept_lengths) / len(want.accept_lengths))


def test_chat_streaming_gives_the_same_text_step_by_step(client, model):
    want = oracle(model, PROMPTS[1], 40)
    chunks = list(client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": PROMPTS[1]}], temperature=0, max_tokens=40, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.text
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == ("stop" if want.finish_reason == "eos" else "length")
    steps = [c.model_extra["dart"]["accepted"] for c in chunks if c.choices and not c.choices[0].finish_reason
             and c.model_extra.get("dart")]
    assert steps and steps[0] == 0 and all(1 <= s for s in steps[1:])  # the prefill's token, then accepted lengths
    assert finals[0].model_extra["dart"]["accept_lengths"] == want.accept_lengths
    assert chunks[-1].usage.completion_tokens == len(want.token_ids) and not chunks[-1].choices


def test_completions_raw_prompt_streaming_and_not(client, model):
    prompt = "Speculative decoding is"
    want = oracle(model, prompt, 32, chat=False)
    got = client.completions.create(model=NAME, prompt=prompt, temperature=0, max_tokens=32)
    assert got.choices[0].text == want.text and got.usage.prompt_tokens == len(want.prompt_ids)
    streamed = client.completions.create(model=NAME, prompt=prompt, temperature=0, max_tokens=32, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == want.text
    ids = client.completions.create(model=NAME, prompt=want.prompt_ids, temperature=0, max_tokens=32)
    assert ids.choices[0].text == want.text


def test_plain_method_gives_the_same_greedy_answer(client, model):
    want = oracle(model, PROMPTS[2], 40)
    got = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": PROMPTS[2]}],
                                         temperature=0, max_tokens=40, extra_body={"method": "ar"})
    assert got.choices[0].message.content == want.text
    assert got.model_extra["dart"]["method"] == "ar" and set(got.model_extra["dart"]["accept_lengths"]) == {1}


def test_stop_strings_cut_the_answer_before_them(client, model):
    want = oracle(model, PROMPTS[0], 64).text
    words = want.split()
    assert len(words) > 4, want
    stop = " " + words[3]
    cut = want[:want.index(stop)]
    got = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": PROMPTS[0]}],
                                         temperature=0, max_tokens=64, stop=[stop, "\x00never"])
    assert got.choices[0].message.content == cut and got.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": PROMPTS[0]}],
                                              temperature=0, max_tokens=64, stop=stop, stream=True)
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_eight_concurrent_streaming_clients_get_their_own_answers(client, model):
    lengths = [24, 40, 32, 56, 16, 48, 36, 28]
    wants = [oracle(model, p, n).text for p, n in zip(PROMPTS, lengths)]
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def one(i):
        try:
            stream = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": PROMPTS[i]}],
                                                    temperature=0, max_tokens=lengths[i], stream=True)
            results[i] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        except BaseException as e:  # reported below
            errors.append(e)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG)
    assert not errors, errors
    assert [results.get(i) for i in range(8)] == wants


def test_sampling_with_a_seed_repeats(client):
    kw = dict(model=NAME, messages=[{"role": "user", "content": PROMPTS[3]}], temperature=0.9, top_p=0.9,
              max_tokens=24, seed=1234, extra_body={"top_k": 50})
    first = client.chat.completions.create(**kw).choices[0].message.content
    assert client.chat.completions.create(**kw).choices[0].message.content == first


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server, client):
    url, headers = server[0] + "/v1/chat/completions", {"Authorization": f"Bearer {KEY}"}
    good = {"model": NAME, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    r = httpx.post(url, content=b'{"model": "x", "messages": [', headers={**headers, "content-type": "application/json"},
                   timeout=HANG)
    assert r.status_code == 400 and "JSON" in error_of(r)["message"]
    cases = [({"model": "gpt-4"}, 404, "model"), ({"max_tokens": -1}, 400, "max_tokens"),
             ({"temperature": -0.5}, 400, "temperature"), ({"top_p": 0}, 400, "top_p"),
             ({"top_p": 1.5}, 400, "top_p"), ({"n": 2}, 400, "n"), ({"messages": []}, 400, "messages"),
             ({"messages": [{"role": "user", "content": "word " * 2000}]}, 400, "messages"),
             ({"method": "magic"}, 400, "method"), ({"seed": 2**70}, 400, "seed"), ({"logprobs": True}, 400, "logprobs"),
             ({"response_format": {"type": "json_object"}}, 400, "response_format"),
             ({"response_format": "json"}, 400, "response_format"), ({"max_tokens": "4"}, 400, "max_tokens"),
             ({"top_k": "5"}, 400, "top_k")]
    for change, status, param in cases:
        r = httpx.post(url, json={**good, **change}, headers=headers, timeout=HANG)
        assert r.status_code == status, (change, r.text)
        err = error_of(r)
        assert err["param"] == param, (change, err)
    long = httpx.post(url, json={**good, "messages": [{"role": "user", "content": "word " * 2000}]}, headers=headers,
                      timeout=HANG)
    assert error_of(long)["code"] == "context_length_exceeded" and "384" in error_of(long)["message"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}], max_tokens=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    r = httpx.post(server[0] + "/v1/completions", json={"model": NAME, "prompt": [10**9], "max_tokens": 2},
                   headers=headers, timeout=HANG)
    assert r.status_code == 400 and "vocabulary" in error_of(r)["message"]
    schema = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}}
    for response_format in ({"type": "json_object"}, schema):  # constrained output: refused, not ignored
        with pytest.raises(openai.BadRequestError, match="response_format") as refused:
            client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                           response_format=response_format)
        assert refused.value.body["type"] == "invalid_request_error"
        assert refused.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.completions.create(model=NAME, prompt="hi", max_tokens=2,
                                  extra_body={"response_format": {"type": "json_object"}})
    ok = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hello"}], max_tokens=4,
                                        response_format={"type": "text"})
    assert ok.choices[0].finish_reason in ("stop", "length")
    assert server[1].poll() is None


def test_a_request_with_numbers_beyond_their_types_is_refused_and_the_server_serves_on(server, client, model):
    """A top_k past int32 once killed the scheduler (a 500, then every request hung): it is a 400
    naming the limit, and the next request is answered."""
    message = [{"role": "user", "content": PROMPTS[0]}]
    for kw in ({"max_tokens": 8, "extra_body": {"top_k": 2**31}}, {"max_tokens": 8, "extra_body": {"top_k": 3 * 10**9}},
               {"max_tokens": 2**31}):
        with pytest.raises(openai.BadRequestError, match="2147483647"):
            client.chat.completions.create(model=NAME, messages=message, temperature=0.7, **kw)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=NAME, messages=message, temperature=1e308, max_tokens=8)
    with pytest.raises(openai.BadRequestError, match="2147483647"):
        client.completions.create(model=NAME, prompt="hi", max_tokens=4, extra_body={"top_k": 2**31})
    want = oracle(model, PROMPTS[0], 24)
    got = client.chat.completions.create(model=NAME, messages=message, temperature=0, max_tokens=24)
    assert got.choices[0].message.content == want.text
    health = httpx.get(server[0] + "/health", headers={"Authorization": f"Bearer {KEY}"}, timeout=HANG)
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_a_client_that_disconnects_frees_its_slot(server):
    """Waits on what the server reports, not on a clock: a busy machine only makes it slower. The
    timeouts below only keep a broken server from hanging the test run."""
    headers = {"Authorization": f"Bearer {KEY}"}

    def health():  # the job counters need the key
        return httpx.get(server[0] + "/health", headers=headers, timeout=HANG).json()["jobs"]
    before = health()["finished"].get("cancelled", 0)
    body = {"model": NAME, "messages": [{"role": "user", "content": PROMPTS[4]}], "max_tokens": 300,
            "stream": True, "method": "ar", "temperature": 0.8, "seed": 1}
    for _ in range(2):
        with httpx.stream("POST", server[0] + "/v1/chat/completions", json=body, headers=headers, timeout=HANG) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert any(line.startswith("data: {") for line in got)
    deadline = time.monotonic() + HANG
    while (jobs := health())["open"] or jobs["finished"].get("cancelled", 0) < before + 2:
        assert time.monotonic() < deadline, jobs
        time.sleep(0.1)
    assert jobs["open"] == 0 and jobs["finished"].get("cancelled", 0) == before + 2, jobs


@pytest.mark.extended
def test_sigterm_finishes_running_requests_and_exits_cleanly():
    with live_server("--demo", "tiny", "--no-ui", "--slots", "1", "--max-length", "256", "--warmup", "quick", "--keep", "60") as (url, proc):
        body = {"model": NAME, "messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 120,
                "temperature": 0, "stream": True, "method": "ar"}
        texts, reasons = [], []
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=HANG) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    if not texts:
                        proc.send_signal(signal.SIGTERM)  # while the answer streams
                    choice = chunk["choices"][0]
                    texts.append(choice["delta"].get("content", ""))
                    reasons.append(choice["finish_reason"])
        assert reasons[-1] in ("stop", "length") and len(texts) > 2
        assert proc.wait(60) == 0
        log = proc.log.read_text()
        assert "Traceback" not in log and "dart_jax: stopped" in log, log[-2000:]


def test_fields_the_server_cannot_honour_are_refused_by_name_through_the_official_client(client):
    """Issue 50: each was answered with a 200 while ignored; now a 400 naming the field."""
    message = [{"role": "user", "content": "hello"}]
    refused = [("presence_penalty", dict(presence_penalty=0.5)), ("frequency_penalty", dict(frequency_penalty=1.0)),
               ("logit_bias", dict(logit_bias={"5": 10})), ("top_logprobs", dict(top_logprobs=2)),
               ("tool_choice", dict(tool_choice="required")), ("parallel_tool_calls", dict(parallel_tool_calls=False)),
               ("modalities", dict(modalities=["text", "audio"])),
               ("prediction", dict(prediction={"type": "content", "content": "x"})),
               ("reasoning_effort", dict(reasoning_effort="high")),
               ("functions", dict(functions=[{"name": "f", "parameters": {"type": "object"}}])),
               ("function_call", dict(function_call={"name": "f"})),
               ("min_tokens", dict(extra_body={"min_tokens": 4})), ("guided_json", dict(extra_body={"guided_json": {}})),
               ("repetition_penalty", dict(extra_body={"repetition_penalty": 1.3}))]
    for param, kw in refused:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=NAME, messages=message, max_tokens=4, **kw)
        assert e.value.body["param"] == param and param in e.value.body["message"], (param, e.value.body)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=NAME, prompt="hi", max_tokens=4, presence_penalty=1.0)
    assert e.value.body["param"] == "presence_penalty"
    # their defaults ask for nothing: served
    ok = client.chat.completions.create(model=NAME, messages=message, max_tokens=4, presence_penalty=0,
                                        frequency_penalty=0, logit_bias={}, parallel_tool_calls=True)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_tree_sizes_the_server_does_not_offer_are_refused_naming_those_it_does(server, client):
    offered = httpx.get(server[0] + "/v1/models", headers={"Authorization": f"Bearer {KEY}"},
                        timeout=HANG).json()["data"][0]["tree_sizes"]
    for size in (3, 61):
        assert size not in offered
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                           extra_body={"tree_size": size})
        assert e.value.body["param"] == "tree_size"
        assert f"tree_size {size} is not offered" in e.value.body["message"]
        assert ", ".join(map(str, offered)) in e.value.body["message"], (offered, e.value.body)


def test_max_completion_tokens_stop_token_ids_and_ignore_eos_are_honoured(client, model):
    """max_completion_tokens on /v1/completions (it ran 8 tokens for 2), stop_token_ids (the
    answer ends at the id, which is kept as the Python API keeps it), ignore_eos (the answer runs
    past EOS to its limit). The oracles: the in-process model's greedy answers."""
    raw = "Speculative decoding is"
    assert len(oracle(model, raw, 8, chat=False).token_ids) == 8  # no EOS within 8 tokens
    got = client.completions.create(model=NAME, prompt=raw, temperature=0, max_tokens=8,
                                    extra_body={"max_completion_tokens": 2})
    assert got.usage.completion_tokens == 2 and got.choices[0].finish_reason == "length"
    assert got.choices[0].text == oracle(model, raw, 2, chat=False).text
    want = oracle(model, PROMPTS[0], 24)
    stop_id = want.token_ids[5]
    cut = want.token_ids[:want.token_ids.index(stop_id) + 1]
    got = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": PROMPTS[0]}], temperature=0,
                                         max_tokens=24, extra_body={"stop_token_ids": [stop_id]})
    assert got.choices[0].message.content == model.decode(cut) and got.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       extra_body={"stop_token_ids": [10**9]})
    assert e.value.body["param"] == "stop_token_ids"
    # a prompt the model answers with EOS well inside the limit
    ended = [(p, w) for p in PROMPTS if (w := oracle(model, p, 60)).finish_reason == "eos"]
    assert ended, "the demo model ends none of the prompts by EOS within 60 tokens"
    prompt, short = ended[0]
    got = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": prompt}], temperature=0,
                                         max_tokens=60, extra_body={"ignore_eos": True})
    assert got.usage.completion_tokens == 60 and got.choices[0].finish_reason == "length"
    assert got.choices[0].message.content.startswith(short.text)

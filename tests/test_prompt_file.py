"""The one JSONL prompt reader (`dart_jax.api.prompts.read_prompt_file`), as its two users read
files: `generate --prompts` (`read_requests`) and `bench e2e --prompts` (`load_prompts`). Both
report the same faults the same way (the file and line, what is wrong); a good file reads as
`json.loads` of each non-blank line says."""
from __future__ import annotations

import json

import pytest

from dart_jax.api.generate import read_requests
from dart_jax.api.prompts import read_prompt_file
from dart_jax.bench.e2e import load_prompts
from dart_jax.decoding.settings import GenerationSettings
from dart_jax.errors import InputError


def generate_reads(path):
    return read_requests(path, GenerationSettings())


BOTH = [generate_reads, load_prompts]

FAULTS = [  # (file content, what the error says)
    (b'{"prompt": "ok"}\n{"prompt": \n', "in.jsonl:2: not valid JSON"),
    (b'{"prompt": "ok"}\n\n["a list"]\n', "in.jsonl:3: "),
    (b'{"prompt": ""}\n', "in.jsonl:1: "),
    (b'{"prompt": "caf\\ud800e"}\n', "in.jsonl:1: 'prompt' is not valid Unicode text: a lone surrogate U+D800"),
    (b'{"prompt": "ok"}\n{"prompt": "\xff\xfe"}\n', "in.jsonl: not UTF-8 text (byte 0xff"),
    (b"\n  \n", "in.jsonl holds no prompts"),
]


@pytest.mark.parametrize("read", BOTH, ids=["generate", "bench"])
@pytest.mark.parametrize("content,message", FAULTS)
def test_both_readers_name_the_file_the_line_and_the_fault(read, content, message, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(content)
    with pytest.raises(InputError) as caught:
        read(src)
    assert str(caught.value).startswith(str(src)) and message in str(caught.value)


@pytest.mark.parametrize("read", BOTH, ids=["generate", "bench"])
def test_a_missing_file_says_what_to_pass(read, tmp_path):
    with pytest.raises(FileNotFoundError, match="not found; pass a JSONL file"):
        read(tmp_path / "missing.jsonl")


def test_generate_reads_messages_and_token_ids_and_refuses_unknown_roles_and_fields(tmp_path):
    src = tmp_path / "in.jsonl"
    lines = [{"prompt": "a", "id": "x", "max_new_tokens": 3}, {"messages": [{"role": "user", "content": "é"}]},
             {"prompt": [1, 2, 3]}]
    src.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    got = read_requests(src, GenerationSettings())
    assert [r["prompt"] for r in got] == [line.get("prompt", line.get("messages")) for line in lines]
    assert [r["id"] for r in got] == ["x", 2, 3] and got[0]["settings"].max_new_tokens == 3
    for bad, message in [({"messages": [{"role": "wizard", "content": "hi"}]}, "in.jsonl:1: message 0 has role 'wizard'"),
                         ({"prompt": "x", "colour": 1}, "in.jsonl:1: unknown field(s) ['colour']"),
                         ({"prompt": "x", "messages": []}, "exactly one of 'prompt' and 'messages'"),
                         ({"messages": "hi"}, "'messages' a non-empty list")]:
        src.write_text(json.dumps(bad) + "\n")
        with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                           .replace("]", r"\]")):
            read_requests(src, GenerationSettings())


def test_bench_keeps_other_fields_but_wants_text(tmp_path):
    src = tmp_path / "p.jsonl"
    lines = [{"prompt": "one", "category": "code", "source": "mine"}, {"prompt": "two", "id": 7}]
    src.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    assert load_prompts(src) == [{"id": "p-1", "category": "code", "prompt": "one"},
                                 {"id": "7", "category": "all", "prompt": "two"}]
    for bad in ({"prompt": [1, 2]}, {"messages": [{"role": "user", "content": "hi"}]}):
        src.write_text(json.dumps(bad) + "\n")
        with pytest.raises(InputError, match='p.jsonl:1: needs a non-empty string field "prompt"'):
            load_prompts(src)


def test_the_reader_returns_each_non_blank_line_as_json_loads_reads_it(tmp_path):
    src = tmp_path / "in.jsonl"
    text = '{"prompt": "a\\u00e9"}\n\n{"messages": [{"role": "system", "content": "s"}], "id": 3}\n   \n{"prompt": [5]}'
    src.write_text(text)
    want = [(n, json.loads(line)) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    assert read_prompt_file(src, fields=("id",)) == want

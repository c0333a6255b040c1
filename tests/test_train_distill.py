"""`python -m dart_jax.train.distill`: the target's own greedy answers (transformers is the oracle),
written per conversation, resumed after a torn write, duplicates answered once, bad input refused."""
import json
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from train_base import make_train_base

from dart_jax.bench.tiny import make_tiny_head
from dart_jax.train.data import load_tokenizer

MAX_NEW = 12


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_train_base(tmp_path_factory.mktemp("distill") / "base", sharp=True)


@pytest.fixture(scope="module")
def oracle(base):
    """The answer transformers' greedy decoding gives to a conversation (EOS ids dropped)."""
    from transformers import Qwen3ForCausalLM

    hf = Qwen3ForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    tok = load_tokenizer(base)
    config = json.loads((base / "config.json").read_text())
    eos = config["eos_token_id"] if isinstance(config["eos_token_id"], list) else [config["eos_token_id"]]
    eos = sorted(set(eos) | {tok.eos_token_id})

    def answer(messages, n=MAX_NEW):
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                              eos_token_id=eos, pad_token_id=0)
        new = [t for t in out[0, ids.shape[1]:].tolist() if t not in eos]
        return tok.decode(new, skip_special_tokens=False)

    return answer


def write_prompts(path, n, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        text = "".join(rng.choice(list("abcdefgh "), int(rng.integers(3, 30))))
        if i % 3 == 2:  # a whole conversation, its last assistant turn to be answered anew
            rows.append({"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "old"}],
                         "topic": f"t{i}"})
        else:
            rows.append({"prompt": text, "topic": f"t{i}"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def run(base, prompts, out, *extra):
    """The command in a process of its own, as a user runs it (its programs stay out of this
    test worker's process)."""
    return subprocess.run([sys.executable, "-m", "dart_jax.train.distill", str(prompts), str(out), "--base", str(base),
                           "--max-new-tokens", str(MAX_NEW), "--slots", "4", "--no-progress", *extra]).returncode


def read(out):
    return [json.loads(line) for line in out.read_text().splitlines()]


def user_turns(row):
    return [{"role": "user", "content": row["prompt"]}] if "prompt" in row else row["messages"][:-1]


def test_answers_are_the_targets_greedy_replies_in_a_pool_smaller_than_the_prompts(base, oracle, tmp_path):
    rows = write_prompts(tmp_path / "p.jsonl", 11)
    rows.append(dict(rows[0]))  # a duplicate: answered once
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert run(base, tmp_path / "p.jsonl", tmp_path / "a.jsonl") == 0
    got = read(tmp_path / "a.jsonl")
    assert sorted(r["index"] for r in got) == list(range(11))
    for r in got:
        source = rows[r["index"]]
        assert r["topic"] == source["topic"]  # the prompt's own fields are kept
        assert r["messages"][:-1] == user_turns(source)
        assert r["messages"][-1]["role"] == "assistant"
        assert r["messages"][-1]["content"] == oracle(user_turns(source)), r["index"]
        assert r["finish_reason"] in ("eos", "length")


@pytest.mark.extended
def test_a_torn_last_line_is_cut_and_the_run_resumes_where_it_stopped(base, oracle, tmp_path):
    rows = write_prompts(tmp_path / "p.jsonl", 7, seed=1)
    out = tmp_path / "a.jsonl"
    assert run(base, tmp_path / "p.jsonl", out, "--limit", "3") == 0
    first = read(out)
    assert len(first) == 3
    with open(out, "ab") as f:  # what a kill -9 in the middle of a write leaves
        f.write(b'{"index": 5, "messages": [{"role": "us')
    assert run(base, tmp_path / "p.jsonl", out) == 0
    got = read(out)
    assert got[:3] == first  # nothing answered again
    assert sorted(r["index"] for r in got) == list(range(7))
    for r in got:
        assert r["messages"][-1]["content"] == oracle(user_turns(rows[r["index"]]))
    assert run(base, tmp_path / "p.jsonl", out) == 0  # all done: nothing appended
    assert read(out) == got


@pytest.mark.extended
def test_a_killed_process_resumes_without_losing_or_repeating_answers(base, tmp_path):
    write_prompts(tmp_path / "p.jsonl", 24, seed=2)
    out = tmp_path / "a.jsonl"
    cmd = [sys.executable, "-m", "dart_jax.train.distill", str(tmp_path / "p.jsonl"), str(out), "--base", str(base),
           "--max-new-tokens", "40", "--slots", "2", "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None and (not out.exists() or out.stat().st_size == 0):
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    assert sorted(r["index"] for r in read(out)) == list(range(24))  # each prompt once


@pytest.mark.extended
def test_dart_drafting_gives_the_same_answers(base, tmp_path):
    write_prompts(tmp_path / "p.jsonl", 5, seed=3)
    head = make_tiny_head(tmp_path / "head", base, draft_length=3)
    assert run(base, tmp_path / "p.jsonl", tmp_path / "ar.jsonl") == 0
    assert run(base, tmp_path / "p.jsonl", tmp_path / "dart.jsonl", "--method", "dart", "--ckpt", str(head)) == 0
    key = lambda r: r["index"]  # noqa: E731
    assert sorted(read(tmp_path / "ar.jsonl"), key=key) == sorted(read(tmp_path / "dart.jsonl"), key=key)


@pytest.mark.parametrize("lines, extra, words", [
    (['{"prompt": 5}'], [], ['line 1', '"prompt"']),
    (['{"prompt": "x"}', "[1, 2]"], [], ["line 2", "JSON object"]),
    (['{"prompt": "x"'], [], [":1"]),
    (['{"messages": [{"role": "assistant", "content": "x"}]}'], [], ["nothing to answer"]),
    (['{"prompt": "x"}'], ["--method", "dart"], ["--ckpt"]),
    (['{"prompt": "x"}'], ["--refill", "0"], ["--refill"]),
])
def test_bad_input_is_one_clear_error(base, tmp_path, lines, extra, words):
    (tmp_path / "p.jsonl").write_text("\n".join(lines) + "\n")
    proc = subprocess.run([sys.executable, "-m", "dart_jax.train.distill", str(tmp_path / "p.jsonl"),
                           str(tmp_path / "a.jsonl"), "--base", str(base), *extra], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr
    assert not (tmp_path / "a.jsonl").exists() or not (tmp_path / "a.jsonl").read_text()


def test_an_out_file_of_something_else_is_refused(base, tmp_path):
    write_prompts(tmp_path / "p.jsonl", 2)
    (tmp_path / "a.jsonl").write_text('{"messages": []}\n')
    proc = subprocess.run([sys.executable, "-m", "dart_jax.train.distill", str(tmp_path / "p.jsonl"),
                           str(tmp_path / "a.jsonl"), "--base", str(base)], capture_output=True, text=True)
    assert proc.returncode == 2 and "not an answer this command wrote" in proc.stderr, proc.stderr
    assert (tmp_path / "a.jsonl").read_text() == '{"messages": []}\n'  # nothing lost

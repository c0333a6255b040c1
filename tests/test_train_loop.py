"""`python -m dart_jax.train` end to end on a tiny target: data, overfitting, resume, export."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from train_base import make_train_base

from dart_jax.bench.tiny import make_tiny_head
from dart_jax.train.__main__ import cli, main
from dart_jax.train.data import encode_conversation, load_tokenizer, read_conversations

REPO = Path(__file__).resolve().parents[1]
COMMON = ["--draft-length", "3", "--draft-vocab", "64", "--max-length", "48", "--anchors-per-seq", "8",
          "--no-progress"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    # a sharper final norm gives the random target peaked next-token distributions to learn
    return make_train_base(tmp_path_factory.mktemp("train") / "base", sharp=True)


def write_data(path, n, seed=0):
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for i in range(n):
            q = "".join(rng.choice(list("abcdefgh"), 6))
            a = "".join(rng.choice(list("abcdefgh "), 24))
            if i % 2:
                f.write(json.dumps({"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]}) + "\n")
            else:
                f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n")
    return path


def test_loss_mask_covers_assistant_turns(base):
    tok = load_tokenizer(base)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"},
                {"role": "assistant", "content": "ok then"}]
    ids, mask = encode_conversation(tok, messages, 1000)
    # the tiny tokenizer has one id per character and one per special token, so build the oracle by hand
    expect_ids, expect_mask = [], []
    for m in messages:
        head = [tok.convert_tokens_to_ids("<|im_start|>")] + [tok.convert_tokens_to_ids(c) for c in m["role"] + "\n"]
        body = [tok.convert_tokens_to_ids(c) for c in m["content"]] + [tok.convert_tokens_to_ids("<|im_end|>"),
                                                                     tok.convert_tokens_to_ids("\n")]
        expect_ids += head + body
        expect_mask += [False] * len(head) + [m["role"] == "assistant"] * len(body)
    np.testing.assert_array_equal(ids, expect_ids)
    np.testing.assert_array_equal(mask, expect_mask)
    short_ids, short_mask = encode_conversation(tok, messages, 20)
    np.testing.assert_array_equal(short_ids, expect_ids[:20])
    np.testing.assert_array_equal(short_mask, expect_mask[:20])


def test_loss_mask_when_the_template_renders_the_last_turn_differently(base):
    # like Qwen3's template: only the final assistant turn carries an (empty) think block
    tok = load_tokenizer(base)
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' and loop.last %}"
        "<think>\n\n</think>\n\n{% endif %}{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "more"}, {"role": "assistant", "content": "ok then"}]
    ids, mask = encode_conversation(tok, messages, 1000)
    text = tok.apply_chat_template(messages, tokenize=False)
    assert tok.decode(ids) == text
    picked = tok.decode(ids[mask])
    # the earlier turn: its content and end-of-turn marker; the last turn: all it adds after the prompt
    assert picked == "hello<|im_end|>" + "<think>\n\n</think>\n\nok then<|im_end|>\n"
    first = text.index("hello")
    assert not mask[: len(tok(text[:first], add_special_tokens=False)["input_ids"])].any()


def test_bad_lines_are_named_or_skipped(tmp_path):
    path = tmp_path / "d.jsonl"
    good = json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})
    path.write_text(good + "\n\n" + "{not json\n" + json.dumps({"messages": [{"role": "robot", "content": "x"}]}) + "\n"
                    + json.dumps({"conversations": [{"from": "human", "value": "only a question"}]}) + "\n" + good + "\n")
    with pytest.raises(ValueError, match=r"line 3: .*--skip-bad"):
        read_conversations(path)
    convs, bad = read_conversations(path, skip_bad=True)
    assert len(convs) == 2 and bad == 3
    path.write_text(good + "\n" + json.dumps({"messages": [{"role": "robot", "content": "x"}]}) + "\n")
    with pytest.raises(ValueError, match=r"line 2: turn 0: unknown role 'robot'"):
        read_conversations(path)
    with pytest.raises(FileNotFoundError, match="--data"):
        read_conversations(tmp_path / "missing.jsonl")


def test_cli_reports_bad_input_without_a_traceback(tmp_path, capsys):
    assert cli(["--base", str(tmp_path / "nobase"), "--data", str(tmp_path / "d.jsonl"), "--out",
                str(tmp_path / "run"), "--no-progress"]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert cli(["--base", str(tmp_path), "--data", str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "run"),
                "--gamma", "0"]) == 2
    assert "--gamma" in capsys.readouterr().err


def test_tiny_head_overfits_regenerated_data_and_exports_a_lossless_head(base, tmp_path):
    data = write_data(tmp_path / "d.jsonl", 2)
    out = tmp_path / "run"
    main(["--base", str(base), "--data", str(data), "--out", str(out), *COMMON, "--batch-size", "2",
          "--epochs", "300", "--lr", "2e-2", "--save-every", "1000", "--log-every", "25",
          "--regenerate", "--regen-max-new", "20"])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["alpha"][0] > 0.9, metrics

    from dart_jax.api.model import DartModel

    model = DartModel.from_pretrained(str(base), str(out / "head"), ngram=False, keep=60)  # every step drafts
    assert int(model.head.config.draft_vocab_size) == 64
    tok = load_tokenizer(base)
    regenerated = [json.loads(line)["messages"] for line in (out / "regenerated.jsonl").read_text().splitlines()]
    for original, messages in zip(read_conversations(data)[0], regenerated):
        assert messages[0] == original[0]
        prompt = tok(tok.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True),
                     add_special_tokens=False)["input_ids"]
        ar = model.generate_ar(prompt, max_new_tokens=20)
        # the regenerated turn is the target's own greedy reply (EOS is the end-of-turn marker)
        eos = tok.convert_tokens_to_ids("<|im_end|>")
        assert tok(messages[1]["content"], add_special_tokens=False)["input_ids"] == [t for t in ar.token_ids if t != eos]
        spec = model.generate(prompt, max_new_tokens=20)
        assert list(spec.token_ids) == list(ar.token_ids)
        # the head memorised these replies, so its drafts are accepted
        assert np.mean(spec.accept_lengths) > 2.0, spec.accept_lengths


def full_and_stopped_runs(base, tmp_path) -> tuple[list[str], Path]:
    """(the arguments, the folder of a run stopped after micro-step 3) beside the whole run in
    tmp_path/a: 6 samples, batches of 2, 2 epochs, a checkpoint every 2 micro-steps."""
    data = write_data(tmp_path / "d.jsonl", 6, seed=1)
    args = ["--base", str(base), "--data", str(data), *COMMON, "--batch-size", "2", "--grad-accum", "2",
            "--epochs", "2", "--lr", "5e-3", "--save-every", "2"]
    main([*args, "--out", str(tmp_path / "a")])
    b = tmp_path / "b"
    main([*args, "--out", str(b), "--stop-after", "3"])
    return args, b


@pytest.mark.extended
def test_resume_after_interruption_matches_uninterrupted_run(base, tmp_path):
    args, b = full_and_stopped_runs(base, tmp_path)
    assert not (b / "head").exists()
    assert json.loads((b / "metrics.json").read_text())["step"] == 3  # the figures of the state saved
    # a kill between two saves: drop the newest checkpoint, so the run resumes mid-accumulation from step 2
    steps = sorted(int(p.name) for p in (b / "ckpt").iterdir() if p.name.isdigit())
    assert steps[-1] == 3
    shutil.rmtree(b / "ckpt" / "3")
    main([*args, "--out", str(b)])
    want, got = load_file(tmp_path / "a" / "head" / "model.safetensors"), load_file(b / "head" / "model.safetensors")
    assert set(want) == set(got)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    # 6 samples in batches of 2, 2 epochs: 6 micro-steps; a rerun with nothing left keeps the figures
    assert json.loads((b / "metrics.json").read_text())["step"] == 6
    main([*args, "--out", str(b)])
    assert json.loads((b / "metrics.json").read_text())["step"] == 6
    with pytest.raises(ValueError, match="other settings"):
        main([*args[:-2], "--save-every", "2", "--out", str(b), "--lr", "1e-3"])


@pytest.mark.extended
def test_two_devices_match_one_device_starting_from_a_head(base, tmp_path):
    data = write_data(tmp_path / "d.jsonl", 4, seed=2)
    init = make_tiny_head(tmp_path / "init", base, draft_length=3, draft_vocab_size=64, head_dim=8)
    common = [a for a in COMMON if a not in ("--draft-vocab", "64")]
    args = ["--base", str(base), "--data", str(data), *common, "--batch-size", "2", "--epochs", "1",
            "--lr", "5e-3", "--init-head", str(init)]
    env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2",
               JAX_PLATFORMS="cpu")
    code = ("import jax; jax.config.update('jax_default_matmul_precision', 'highest'); "
            "assert jax.local_device_count() == 2; from dart_jax.train.__main__ import main; import sys; "
            "main(sys.argv[1:])")
    subprocess.run([sys.executable, "-c", code, *args, "--out", str(tmp_path / "two")], check=True, env=env, cwd=REPO)
    main([*args, "--out", str(tmp_path / "one")])
    one, two = load_file(tmp_path / "one" / "head" / "model.safetensors"), load_file(tmp_path / "two" / "head" / "model.safetensors")
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-4, atol=1e-5, err_msg=name)
    start = load_file(init / "model.safetensors")
    np.testing.assert_array_equal(one["d2t"], start["d2t"])  # the head's draft vocabulary is kept
    assert not np.allclose(one["fc.weight"], start["fc.weight"], atol=1e-4)  # and its weights trained


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    for option in ("--base", "--data", "--out", "--init-head", "--draft-length", "--draft-vocab", "--max-length",
                   "--anchors-per-seq", "--batch-size", "--grad-accum", "--lr", "--epochs", "--gamma",
                   "--save-every", "--keep-last", "--regenerate", "--skip-bad"):
        assert option in text


@pytest.mark.extended
def test_a_damaged_latest_checkpoint_and_data_cache_fall_back(base, tmp_path, capsys):
    """An emptied latest checkpoint: the run resumes from the one before; a truncated data.npz and
    vocab.npz are derived again; the head is the uninterrupted run's."""
    args, b = full_and_stopped_runs(base, tmp_path)
    for entry in (b / "ckpt" / "3").iterdir():  # emptied: the folder stays, its files are gone
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    for name in ("data.npz", "vocab.npz"):
        os.truncate(b / name, (b / name).stat().st_size // 2)
    capsys.readouterr()
    main([*args, "--out", str(b)])
    err = capsys.readouterr().err
    assert "resuming from micro-step 2 of 6" in err
    assert f"checkpoint {b / 'ckpt' / '3'} cannot be read" in err
    assert "data.npz: cannot be read" in err and "vocab.npz: cannot be read" in err
    assert (b / "ckpt.damaged-3").is_dir()  # moved aside, not deleted
    want, got = load_file(tmp_path / "a" / "head" / "model.safetensors"), load_file(b / "head" / "model.safetensors")
    assert set(want) == set(got)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_truncated_checkpoint_files_fall_back_to_the_step_before(tmp_path):
    import jax.numpy as jnp

    from dart_jax.train.checkpoint import Checkpoints

    like = [jnp.arange(3.0), jnp.zeros((2, 2))]
    ckpt = Checkpoints(tmp_path / "ckpt", 3)
    ckpt.save(1, [x + 1 for x in like])
    ckpt.save(2, [x + 2 for x in like])
    ckpt.close()
    for path in (tmp_path / "ckpt" / "2").rglob("*"):
        if path.is_file() and path.stat().st_size:
            os.truncate(path, path.stat().st_size // 2)
    lines = []
    ckpt = Checkpoints(tmp_path / "ckpt", 3)
    step, state = ckpt.restore_latest(like, log=lines.append)
    assert step == 1 and len(lines) == 1 and "cannot be read" in lines[0]
    np.testing.assert_array_equal(state[0], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(state[1], np.ones((2, 2)))
    ckpt.save(2, like)  # the step can be saved again: the damaged one is out of the way
    ckpt.close()


def test_a_damaged_data_cache_is_a_file_format_error(tmp_path):
    from dart_jax.errors import FileFormatError
    from dart_jax.train.data import Dataset

    ids = [np.arange(5, dtype=np.int32), np.arange(3, dtype=np.int32)]
    Dataset(ids, [x % 2 == 0 for x in ids]).save(tmp_path / "data.npz")
    loaded = Dataset.load(tmp_path / "data.npz")
    assert [x.tolist() for x in loaded.ids] == [[0, 1, 2, 3, 4], [0, 1, 2]]
    assert [x.tolist() for x in loaded.loss_mask] == [[True, False, True, False, True], [True, False, True]]
    os.truncate(tmp_path / "data.npz", 100)
    with pytest.raises(FileFormatError, match="data.npz: cannot be read"):
        Dataset.load(tmp_path / "data.npz")
    np.savez(tmp_path / "odd.npz", lengths=np.asarray([4, 4]), ids=np.arange(5), loss_mask=np.ones(5, bool))
    with pytest.raises(FileFormatError, match="arrays disagree"):
        Dataset.load(tmp_path / "odd.npz")


def grown_oracle(used, ids, mask, size):
    """Plain-Python restatement: `used` plus the most frequent loss-mask targets it lacks (ties to
    the smaller id), up to `size` ids, sorted."""
    counts = {}
    for t in np.asarray(ids)[np.asarray(mask, bool)].tolist():
        counts[t] = counts.get(t, 0) + 1
    have = set(int(u) for u in used)
    missing = sorted((-c, t) for t, c in counts.items() if t not in have)
    return sorted(have | {t for _, t in missing[:size - len(have)]})


def test_a_dart_head_grows_its_draft_vocabulary(base, tmp_path, capsys):
    """--init-head with a larger --draft-vocab: the head keeps its layers and its own LM-head
    columns; the new ids are the most frequent training targets it lacks, their columns the
    least-squares map from the target's output rows (a float64 NumPy oracle)."""
    import jax.numpy as jnp

    from dart_jax.models.checkpoints import load_dart_head, load_target
    from dart_jax.train.loop import widened_head
    from dart_jax.train.vocab import used_from_d2t

    data = write_data(tmp_path / "d.jsonl", 12)
    init = make_tiny_head(tmp_path / "init", base, draft_length=3, draft_vocab_size=64, head_dim=8, first_ids=True)
    start = load_file(init / "model.safetensors")
    args = ["--base", str(base), "--data", str(data), *[a for a in COMMON if a not in ("--draft-vocab", "64")],
            "--batch-size", "2", "--epochs", "1", "--lr", "5e-3", "--init-head", str(init)]
    main([*args, "--draft-vocab", "72", "--out", str(tmp_path / "run")])
    with np.load(tmp_path / "run" / "data.npz") as f:
        ids, mask = f["ids"], f["loss_mask"]
    want = grown_oracle(np.arange(64), ids, mask, 72)
    assert len(set(want) - set(range(64))) == 8 and set(want) - set(range(64)) <= set(ids[mask].tolist())
    trained = load_file(tmp_path / "run" / "head" / "model.safetensors")
    assert (trained["d2t"] + np.arange(72)).tolist() == want
    assert trained["lm_head.weight"].shape == (72, start["lm_head.weight"].shape[1])
    target = load_target(base, dtype=jnp.float32)
    assert load_dart_head(tmp_path / "run" / "head", target).config.draft_vocab_size == 72  # loads as a published head

    # the head training starts from, against the oracle
    head = widened_head(load_dart_head(init, target, dtype=jnp.float32), target, np.asarray(want))
    assert used_from_d2t(np.asarray(head.d2t.get_value())).tolist() == want
    kernel = np.asarray(head.lm_head.kernel[...]).T  # [72, H], PyTorch's layout
    old = np.isin(want, np.arange(64))
    np.testing.assert_array_equal(kernel[old], start["lm_head.weight"])
    weights = load_file(base / "model.safetensors")
    rows = weights.get("lm_head.weight", weights["model.embed_tokens.weight"]).astype(np.float64)
    a = np.linalg.lstsq(rows[:64], start["lm_head.weight"].astype(np.float64), rcond=None)[0]
    np.testing.assert_allclose(kernel[~old], rows[np.asarray(want)[~old]] @ a, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(head.fc.kernel[...]).T, start["fc.weight"])

    with pytest.raises(ValueError, match="can grow .*never shrink"):
        main([*args, "--draft-vocab", "32", "--out", str(tmp_path / "smaller")])

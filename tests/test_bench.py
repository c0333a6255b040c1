"""`python -m dart_jax.bench`: every mode on tiny inputs emits the documented JSON keys, and the
figures it reports agree with independent recomputations."""
from __future__ import annotations

import json
import math
import re
import sys
from collections import Counter
from pathlib import Path

import numba
import numpy as np
import pytest

from dart_jax import bench
from dart_jax.bench.e2e import load_prompts
from dart_jax.bench.shapes import KNOWN_SHAPES, TINY_SHAPE, param_count
from dart_jax.ngram import Trie

README = Path(__file__).resolve().parent.parent / "benchmarks" / "README.md"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_json(capsys, *argv):
    assert bench.main([*argv, "--json", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == argv[0]
    assert {"mode", "meta", "config", "rows", "summary"} <= set(out)
    assert {"date", "command", "hardware"} <= set(out["meta"])
    assert out["meta"]["command"].startswith(f"python -m dart_jax.bench {argv[0]}")
    return out


def documented_keys(mode: str, section: str) -> set[str]:
    """Keys listed in benchmarks/README.md under '### <mode>' in the line starting with '<section>:'."""
    text = README.read_text()
    block = text.split(f"### `{mode}`", 1)[1].split("###", 1)[0]
    line = next(ln for ln in block.splitlines() if ln.strip().startswith(f"- {section}:"))
    return set(re.findall(r"`([a-z_0-9]+)`", line.split(":", 1)[1]))


def check_documented(out):
    mode = out["mode"]
    for row in out["rows"]:
        assert documented_keys(mode, "rows") <= set(row), (mode, sorted(row))
    assert documented_keys(mode, "summary") <= set(out["summary"]), (mode, sorted(out["summary"]))


def ngram_prefixes(sequences, order):
    """Plain-Python restatement of the trie's node set: every prefix (length 1..order) of every
    window of `order` tokens, cut short at the sequence end, plus the root."""
    prefixes = set()
    for seq in sequences:
        for i in range(len(seq)):
            window = tuple(seq[i:i + order])
            prefixes.update(window[:j] for j in range(1, len(window) + 1))
    return len(prefixes) + 1


def test_search_grid(capsys):
    out = run_json(capsys, "search", "--keeps", "4,12", "--beams", "2,6", "--reps", "3", "--warmup", "1",
                   "--corpus-tokens", "4000", "--vocab", "300", "--samples", "3")
    check_documented(out)
    assert [(r["keep"], r["beam"]) for r in out["rows"]] == [(4, 2), (4, 6), (12, 2), (12, 6)]
    for r in out["rows"]:
        assert 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"]
        # 8 rows of 25 distinct candidates always offer more expansions than the tree keeps
        assert r["nodes"] == r["keep"] + 1
    assert out["summary"]["median_ms"] == out["rows"][-1]["median_ms"]


def test_ngram_on_a_given_trie(capsys, tmp_path):
    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, 40, size=int(n)).tolist() for n in rng.integers(5, 60, size=30)]
    Trie.build(seqs, order=3).save(tmp_path / "t.trie")
    out = run_json(capsys, "ngram", "--trie", str(tmp_path / "t.trie"), "--queries", "50", "--candidates", "5",
                   "--reps", "2")
    check_documented(out)
    row = out["rows"][0]
    assert row["num_nodes"] == ngram_prefixes(seqs, 3)
    assert row["file_bytes"] == (tmp_path / "t.trie").stat().st_size
    assert row["bytes_per_node_file"] == pytest.approx(row["file_bytes"] / row["num_nodes"])
    assert 0.0 <= row["hit_rate"] <= 1.0 and row["query_us"] > 0 and row["kernel_query_us"] > 0


def test_ngram_synthetic_and_plot(capsys, tmp_path):
    out = run_json(capsys, "ngram", "--corpus-tokens", "3000", "--vocab", "200", "--queries", "20", "--reps", "1",
                   "--plot", str(tmp_path / "n.png"))
    check_documented(out)
    assert out["rows"][0]["build_s"] > 0 and out["rows"][0]["hit_rate"] > 0
    assert (tmp_path / "n.png").read_bytes()[:8] == PNG_MAGIC


def test_shapes_tiny_and_plot(capsys, tmp_path):
    out = run_json(capsys, "shapes", "--tiny", "--layers", "3", "--budgets", "5", "--context", "8", "--reps", "2",
                   "--warmup", "1", "--plot", str(tmp_path / "s.png"))
    check_documented(out)
    rows = out["rows"]
    assert [(r["kind"], r["name"], r["budget"], r["tokens"]) for r in rows] == [
        ("decode", "", 0, 1), ("plain", "", 0, 1), ("call", "empty", 0, 0), ("call", "weights", 0, 0), ("verify", "", 5, 6)]
    assert rows[-1]["gemms"] == "xla"  # a CPU keeps XLA's own GEMMs (and 6 rows are under the GPU's 32)
    assert out["summary"]["call_ms"] == {"empty": rows[2]["median_ms"], "weights": rows[3]["median_ms"]}
    for r in rows:
        assert r["ratio_to_decode"] == pytest.approx(r["median_ms"] / rows[0]["median_ms"])
        assert r["ratio_to_plain"] == pytest.approx(r["median_ms"] / rows[1]["median_ms"])
    assert out["summary"]["decode_ms"] == rows[0]["median_ms"]
    assert out["summary"]["plain_token_ms"] == rows[1]["median_ms"]
    assert list(out["summary"]["ratio_to_plain"]) == ["5"]
    assert (tmp_path / "s.png").read_bytes()[:8] == PNG_MAGIC


def test_param_counts_match_transformers():
    """The shape table's parameter count (used for the memory check) against transformers' own
    model built on the meta device."""
    torch = pytest.importorskip("torch")
    from transformers import Qwen3Config, Qwen3ForCausalLM

    for name in ("Qwen3-0.6B", "Qwen3-8B", "tiny"):  # tied and untied embeddings
        fields = TINY_SHAPE if name == "tiny" else KNOWN_SHAPES[name]
        with torch.device("meta"):
            model = Qwen3ForCausalLM(Qwen3Config(**fields))
        assert param_count(fields) == sum(p.numel() for p in model.parameters()), name


def test_known_shapes_match_the_model_cards():
    """Non-embedding parameter counts published on the Qwen3 model cards (billions)."""
    published = {"Qwen3-0.6B": 0.44, "Qwen3-1.7B": 1.4, "Qwen3-4B": 3.6, "Qwen3-8B": 6.95, "Qwen3-14B": 13.2,
                 "Qwen3-32B": 31.2}
    assert set(published) == set(KNOWN_SHAPES)
    for name, fields in KNOWN_SHAPES.items():
        embedding = fields["vocab_size"] * fields["hidden_size"] * (1 if fields["tie_word_embeddings"] else 2)
        assert (param_count(fields) - embedding) / 1e9 == pytest.approx(published[name], rel=0.02), name


def test_shapes_errors_name_the_fix(capsys):
    # one `error:` line and exit code 2, no traceback
    assert bench.main(["shapes", "--model", "Qwen3-7B", "--no-progress"]) == 2
    assert "error: unknown model shape 'Qwen3-7B'" in capsys.readouterr().err
    assert bench.main(["shapes", "--tiny", "--layers", "2", "--no-progress"]) == 2
    assert capsys.readouterr().err.count("error:") == 1
    # Qwen3-32B at full depth in float32 does not fit this machine: refused before allocating
    assert bench.main(["shapes", "--model", "Qwen3-32B", "--dtype", "float32", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    lines = [{"id": "a", "category": "code", "prompt": "def f(x):"},
             {"id": "b", "category": "code", "prompt": "x = 1"},
             {"id": "c", "category": "chat", "prompt": "Hi there"}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


MODEL = ["--random", "--random-layers", "3", "--random-hidden", "32", "--max-new-tokens", "6", "--max-length", "96",
         "--keep", "4", "--no-chat", "--reps", "1", "--warmup", "1"]


def test_e2e_random_model_and_plot(capsys, tmp_path, prompt_file):
    out = run_json(capsys, "e2e", *MODEL, "--prompts", str(prompt_file), "--plot", str(tmp_path / "e.png"))
    check_documented(out)
    rows = out["rows"]
    assert [r["id"] for r in rows] == ["a", "b", "c"]
    for r in rows:
        # greedy DART must reproduce autoregressive decoding token for token
        assert r["same_output"] is True
        assert 1 <= r["new_tokens"] <= 6
        assert r["speedup"] == pytest.approx(r["dart_tok_s"] / r["ar_tok_s"])
    hist = {int(k): v for k, v in out["summary"]["accept_hist"].items()}
    assert sum(hist.values()) == sum(r["steps"] for r in rows)
    # the first token comes from the prefill, the others from the steps (the last step may be cut
    # short by --max-new-tokens)
    assert sum(k * v for k, v in hist.items()) >= sum(r["new_tokens"] - 1 for r in rows)
    tau = sum(k * v for k, v in hist.items()) / sum(hist.values())
    assert out["summary"]["tau"] == pytest.approx(tau)
    assert set(out["summary"]["per_category"]) == {"code", "chat"}
    assert out["summary"]["per_category"]["code"]["prompts"] == 2
    assert (tmp_path / "e.png").read_bytes()[:8] == PNG_MAGIC


def test_phases_random_model_and_plot(capsys, tmp_path, prompt_file):
    out = run_json(capsys, "phases", *MODEL, "--prompts", str(prompt_file), "--limit", "1",
                   "--plot", str(tmp_path / "p.png"))
    check_documented(out)
    phases = {r["phase"]: r for r in out["rows"]}
    assert list(phases) == ["verify_draft_device", "topk_transfer", "tree_search", "host_overhead", "step_total"]
    assert sum(r["share"] for name, r in phases.items() if name != "step_total") == pytest.approx(1.0)
    assert all(r["median_ms"] >= 0 for r in phases.values())
    assert phases["step_total"]["median_ms"] >= phases["verify_draft_device"]["median_ms"]
    assert out["summary"]["steps"] >= 2  # two prompts (one per category), several steps each
    assert (tmp_path / "p.png").read_bytes()[:8] == PNG_MAGIC


def test_prompt_sets(tmp_path):
    shipped = load_prompts()
    counts = Counter(p["category"] for p in shipped)
    assert {"code", "math", "chat"} <= set(counts) and min(counts.values()) >= 5
    assert len({p["id"] for p in shipped}) == len(shipped)
    assert [p["category"] for p in load_prompts(categories="math", limit=2)] == ["math", "math"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": \n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        load_prompts(bad)
    with pytest.raises(ValueError, match="categories"):
        load_prompts(categories="poetry")
    with pytest.raises(FileNotFoundError):
        load_prompts(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("mode", ["e2e", "phases", "search", "ngram", "shapes"])
def test_help_per_mode(capsys, mode):
    with pytest.raises(SystemExit) as err:
        bench.main([mode, "--help"])
    assert err.value.code == 0
    text = capsys.readouterr().out
    assert "--json" in text and "--plot" in text and "--reps" in text


def test_plot_without_matplotlib_says_how_to_install(monkeypatch):
    result = {"mode": "search", "rows": [], "summary": {}, "config": {}, "meta": {"hardware": {"backend": "cpu"}}}
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ValueError, match="pip install matplotlib"):
        bench.plot(result, "x.png")


def test_table_output(capsys):
    assert bench.main(["search", "--keeps", "4", "--beams", "2", "--reps", "1", "--warmup", "0", "--no-ngram",
                       "--vocab", "100", "--samples", "1", "--no-progress"]) == 0
    text = capsys.readouterr().out
    header = next(ln for ln in text.splitlines() if ln.split()[:2] == ["keep", "beam"])
    assert "median_ms" in header and not math.isnan(float(text.splitlines()[text.splitlines().index(header) + 1].split()[2]))


def test_random_assets_with_a_known_shape(tmp_path):
    """--random-shape writes an untied bfloat16 target of the requested widths that our loaders
    and transformers' tokenizer accept, with a head sized to it."""
    from transformers import AutoTokenizer

    from dart_jax.bench.tiny import build_random_assets
    from dart_jax.convert import load_dart_head, load_qwen3
    from dart_jax.convert.safetensors_io import read_tensors

    shape = {**TINY_SHAPE, "tie_word_embeddings": False, "vocab_size": 640}
    paths = build_random_assets(tmp_path, layers=3, shape=shape)
    target = load_qwen3(paths["base"])
    c = target.config
    assert (c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
            c.vocab_size, c.num_hidden_layers, c.tie_word_embeddings) == (64, 128, 4, 2, 16, 640, 3, False)
    tensors = read_tensors(paths["base"])
    assert str(tensors["lm_head.weight"].dtype) == "bfloat16" and tensors["lm_head.weight"].shape == (640, 64)
    head = load_dart_head(paths["dart"], target)
    assert head.config.num_rows == 8 and head.config.draft_vocab_size == 640
    tok = AutoTokenizer.from_pretrained(paths["base"])
    assert tok.decode(tok("héllo, world")["input_ids"]) == "héllo, world"
    assert Trie.load(paths["ngram"]).order == 3


def test_ngram_options_root_table_hot_contexts_and_conversion(capsys, tmp_path):
    rng = np.random.default_rng(2)
    seqs = [rng.integers(0, 50, size=int(n)).tolist() for n in rng.integers(5, 60, size=30)]
    Trie.build(seqs, order=3).save(tmp_path / "t.trie")
    out = run_json(capsys, "ngram", "--trie", str(tmp_path / "t.trie"), "--queries", "40", "--candidates", "5",
                   "--reps", "1", "--hot-contexts", "4", "--root-table", "--convert", "--clock", "cpu")
    check_documented(out)
    row = out["rows"][0]
    n = row["num_nodes"]
    assert sum(row["nodes_per_depth"]) == n and row["nodes_per_depth"][0] == 1
    # docs/spec.md §6: a 16-byte header, 24 bytes per node record, 12 per edge (every node but the root)
    assert row["reference_file_bytes"] == 16 + 24 * n + 12 * (n - 1)
    assert row["convert_identical"] is True and row["convert_mb_per_s"] > 0
    assert row["root_table_bytes"] == 4 * (max(max(s) for s in seqs) + 1)  # int32 per id up to the largest
    for key in ("kernel_query_us_hot", "kernel_query_us_root_table", "kernel_query_us_hot_root_table"):
        assert row[key] > 0, key
    assert out["config"]["clock"] == "cpu" and out["config"]["hot_contexts"] == 4


def test_search_batched_on_a_phrase_corpus(capsys):
    threads = numba.get_num_threads()
    out = run_json(capsys, "search", "--keeps", "5", "--beams", "3", "--reps", "2", "--warmup", "1",
                   "--corpus", "phrases", "--corpus-tokens", "3000", "--vocab", "300", "--samples", "2",
                   "--batch", "3", "--threads", "1", "--ngram-weight", "0.3")
    check_documented(out)
    (row,) = out["rows"]
    assert row["batch"] == 3 and row["ms_per_tree"] == pytest.approx(row["median_ms"] / 3)
    assert row["nodes"] == 6
    config = out["config"]
    assert (config["batch"], config["threads"], config["ngram_weight"]) == (3, 1, 0.3)
    assert config["trie_nodes"] > 1 and config["trie_build_s"] > 0
    assert numba.get_num_threads() == threads  # the thread count is restored


@pytest.mark.extended  # a second look (the default run's 10 minutes): .ci/run runs it after
def test_batch_mode_random_model_and_plot(capsys, tmp_path, prompt_file):
    out = run_json(capsys, "batch", *MODEL, "--prompts", str(prompt_file), "--batches", "1,2",
                   "--plot", str(tmp_path / "b.png"))
    check_documented(out)
    assert [r["batch"] for r in out["rows"]] == [1, 2]
    for r in out["rows"]:
        assert r["same_output"] is True  # greedy DART in the pool = batched autoregressive decoding
        assert 1 <= r["new_tokens"] <= 6 * r["batch"]
        assert r["speedup"] == pytest.approx(r["dart_tok_s"] / r["ar_tok_s"])
    assert (tmp_path / "b.png").read_bytes()[:8] == PNG_MAGIC


def test_bench_compare_defaults_to_the_demos_held_out_prompts():
    """`bench compare` alone runs what the README says: the SmolLM2 demo's 20 held-out prompts (10
    per category) at 128 new tokens; given options and other models keep theirs."""
    from dart_jax.bench.cli import demo_workload
    from dart_jax.bench.options import build_parser

    parser = build_parser()
    args = parser.parse_args(["compare"])
    demo_workload(args)
    rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    kept = {c: [r for r in rows if r["category"] == c][:args.limit] for c in ("code", "chat")}
    assert args.limit == 10 and sum(map(len, kept.values())) == 20 and args.max_new_tokens == 128
    args = parser.parse_args(["compare", "--max-new-tokens", "32", "--limit", "3"])
    demo_workload(args)
    assert (args.max_new_tokens, args.limit) == (32, 3)
    args = parser.parse_args(["compare", "--random"])
    demo_workload(args)
    assert args.prompts is None and args.max_new_tokens == 64


def _cpu_ticks(pid: int) -> int:
    """User + system clock ticks a process has run (/proc/PID/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def test_busy_neighbours_burn_cpu_and_end_with_the_block():
    import time

    from dart_jax.bench.util import busy_neighbours

    with busy_neighbours(2) as procs:
        assert len(procs) == 2
        start = [_cpu_ticks(p.pid) for p in procs]
        time.sleep(1.5)
        assert all(p.poll() is None for p in procs)
        assert all(_cpu_ticks(p.pid) > t for p, t in zip(procs, start))  # each one runs
    assert all(p.returncode is not None for p in procs)  # gone with the block
    with pytest.raises(ValueError, match="--neighbours"):
        with busy_neighbours(-1):
            pass

"""`python -m dart_jax.bench compare`: the method table against recomputations from the run's
own per-prompt rows and a hand-worked acceptance example."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dart_jax import bench
from dart_jax.bench.e2e import step_figures

from test_bench import check_documented


def test_acceptance_per_depth_by_hand():
    # accepted lengths 1, 1, 2, 4 (drafted tokens accepted: 0, 0, 1, 3): of 4 steps 2 accept a
    # first drafted token, of those 1 a second, of that 1 a third
    figures = step_figures({"hist": {1: 2, 2: 1, 4: 1}, "steps": 4, "tree_s": 0.02, "device_s": 0.4})
    assert figures["accept_per_depth"] == [0.5, 0.5, 1.0]
    assert figures["tree_ms_per_step"] == pytest.approx(5.0)
    assert figures["device_ms_per_step"] == pytest.approx(100.0)
    assert step_figures({"hist": {}, "steps": 0, "tree_s": 0.0, "device_s": 0.0})["accept_per_depth"] == []


@pytest.mark.extended
def test_compare_random_models(capsys, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps(x) for x in [{"id": "a", "category": "code", "prompt": "def f(x):"},
                                                           {"id": "b", "category": "chat", "prompt": "Hi there"}]) + "\n")
    argv = ["compare", "--random", "--random-layers", "3", "--random-hidden", "32", "--eagle3", "random",
            "--eagle3-total-token", "6", "--eagle3-depth", "3", "--eagle3-top-k", "4", "--keep", "4",
            "--max-new-tokens", "6", "--max-length", "96", "--no-chat", "--prompts", str(prompts), "--draft-reps", "3",
            "--json", "--no-progress"]
    assert bench.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    check_documented(out)
    rows = {r["method"]: r for r in out["rows"]}
    assert list(rows) == ["ar", "dart", "eagle3"]
    prompt_rows = out["prompt_rows"]
    assert [r["id"] for r in prompt_rows] == ["a", "b"]
    # each figure recomputed from the per-prompt rows
    assert rows["dart"]["speedup"] == pytest.approx(np.median([r["dart_tok_s"] / r["ar_tok_s"] for r in prompt_rows]))
    assert rows["eagle3"]["speedup_min"] == pytest.approx(min(r["eagle3_tok_s"] / r["ar_tok_s"] for r in prompt_rows))
    assert rows["ar"]["tok_s"] == pytest.approx(np.median([r["ar_tok_s"] for r in prompt_rows]))
    # greedy: both drafters give plain decoding's tokens
    assert rows["dart"]["same"] == rows["eagle3"]["same"] == "2/2" and out["summary"]["all_same_output"]
    assert rows["eagle3"]["tree"] == "6 nodes, 3 steps, top-4" and rows["dart"]["tree"] == "5 nodes"
    for m in ("dart", "eagle3"):
        assert rows[m]["draft_ms"] > 0 and rows[m]["tree_ms"] >= 0
        steps = sum(r["steps" if m == "dart" else "eagle3_steps"] for r in prompt_rows)
        assert out["e2e_summary"]["drafting"][m]["steps"] == steps
    assert out["summary"]["dart_over_eagle3"] == pytest.approx(rows["dart"]["speedup"] / rows["eagle3"]["speedup"])
    assert set(out["summary"]["per_category_speedup"]) == {"code", "chat"}
    # the table form names every method and the DART/EAGLE-3 ratio
    assert bench.main([a for a in argv if a != "--json"]) == 0
    text = capsys.readouterr().out
    assert "eagle3" in text and "DART's speedup / EAGLE-3's" in text

"""The step profile (`python -m dart_jax.bench.profile`, dart_jax/bench/profile.py)."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from dart_jax.bench.profile import PHASES, hlo_scopes, main, phase_of, search_part, tables


def meta(pid, tid, process, thread):
    return [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": process}},
            {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": thread}}]


def op(pid, tid, name, ts, dur, **args):
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": ts, "dur": dur, "args": args}


SCOPES = {"fusion.1": "jit(_step)/verify/layer_0/attention/dot_general",
          "fusion.2": "jit(_step)/verify/lm_head/dot_general",
          "fusion.3": "jit(_step)/draft/draft_mlp/dot_general",
          "cc.4": "jit(_step)/commit/scatter"}
HOST = [{"wall_s": 0.010, "tree_s": 0.002, "device_call_s": 0.006, "accepted": 2.0},
        {"wall_s": 0.012, "tree_s": 0.002, "device_call_s": 0.008, "accepted": 3.0}]


def expected_phases(device_ms: dict) -> dict:
    """The table worked out by hand from HOST and per-step device ms (no concurrency)."""
    call, wall, tree = 7.0, 11.0, 2.0  # means of HOST, ms
    out = {p: 0.0 for p in PHASES}
    out.update(device_ms)
    out["dispatch_and_sync"] = call - sum(device_ms.values())
    out["tree_search"] = tree
    out["host_other"] = wall - tree - call
    return out


def test_tables_on_a_cpu_style_trace():
    events = meta(1, 10, "/host:CPU", "python") + meta(1, 11, "/host:CPU", "tf_XLAPjRtCpuClient/1")
    events += [op(1, 10, "dart_profile_step", 0, 10_000), op(1, 10, "dart_profile_step", 20_000, 12_000)]
    for base in (0, 20_000):  # per step: 1 ms attention, 0.5 ms LM head, 0.25 ms draft, 0.25 ms commit
        events += [op(1, 11, "fusion.1", base + 100, 1000), op(1, 11, "fusion.2", base + 1100, 500),
                   op(1, 11, "fusion.3", base + 1600, 250), op(1, 11, "cc.4", base + 1850, 250),
                   op(1, 11, "end: fusion.1", base + 2100, 0), op(1, 11, "ThunkExecutor::Execute", base, 2500)]
    events.append(op(1, 11, "fusion.1", 50_000, 1000))  # after the last step: not counted
    phases, ops, summary = tables(events, SCOPES, HOST)
    got = {r["phase"]: r["ms_per_step"] for r in phases}
    want = expected_phases({"verify_attention": 1.0, "verify_lm_head": 0.5, "draft_head": 0.25, "cache_write": 0.25})
    assert list(got) == list(PHASES)
    for p in PHASES:
        assert got[p] == pytest.approx(want[p]), p
    counts = {r["phase"]: r["ops_per_step"] for r in phases}  # 2 steps, each op once a step
    assert counts["verify_attention"] == counts["cache_write"] == 1 and counts["accept"] == 0
    assert summary["phases_sum_ms"] == pytest.approx(summary["step_ms"]) == pytest.approx(11.0)
    assert summary["device_busy_ms"] == pytest.approx(2.0)
    assert [r["op"] for r in ops] == ["fusion.1", "fusion.2", "fusion.3", "cc.4"]
    assert ops[0]["count"] == 2 and ops[0]["ms_per_step"] == pytest.approx(1.0)
    assert summary["accepted_per_step"] == pytest.approx(2.5)
    kinds = {(r["phase"], r["kind"]): r["ms_per_step"] for r in summary["op_kinds"]}
    assert kinds == pytest.approx({("verify_attention", "dot_general"): 1.0, ("verify_lm_head", "dot_general"): 0.5,
                                   ("draft_head", "dot_general"): 0.25, ("cache_write", "scatter"): 0.25})


def test_tables_on_a_gpu_style_trace():
    events = meta(1, 10, "/host:CPU", "python") + meta(7, 1, "/device:GPU:0", "XLA Ops")
    events += meta(7, 2, "/device:GPU:0", "Stream #13(MemcpyDtoH)") + meta(7, 3, "/device:GPU:0", "Stream #14(Compute)")
    events += [op(1, 10, "dart_profile_step", 0, 10_000), op(1, 10, "dart_profile_step", 20_000, 12_000)]
    for base in (0, 20_000):
        module = "XlaModule:#hlo_module=jit__step,program_id=12#"  # what a GPU trace gives as tf_op
        events += [op(7, 1, "fusion.1", base + 100, 2000, tf_op=module, hlo_op="fusion.1"),
                   op(7, 1, "fusion.3", base + 2100, 1000, tf_op=module),
                   op(7, 3, "loop_fusion_kernel", base + 100, 2000),  # the same work seen as a kernel: not twice
                   op(7, 2, "MemcpyDtoH", base + 3200, 500)]
    phases, ops, summary = tables(events, SCOPES, HOST)
    got = {r["phase"]: r["ms_per_step"] for r in phases}
    want = expected_phases({"verify_attention": 2.0, "draft_head": 1.0, "transfers": 0.5})
    for p in PHASES:
        assert got[p] == pytest.approx(want[p]), p
    assert "loop_fusion_kernel" not in {r["op"] for r in ops}


def test_concurrent_ops_are_scaled_to_the_busy_time():
    events = meta(1, 10, "/host:CPU", "python") + meta(1, 11, "/host:CPU", "tf_XLAEigen/1")
    events += [op(1, 10, "dart_profile_step", 0, 10_000)]
    events += [op(1, 11, "fusion.1", 0, 2000), op(1, 11, "fusion.3", 1000, 2000)]  # overlap 1 ms: busy 3 ms
    phases, _, summary = tables(events, SCOPES, HOST[:1])
    got = {r["phase"]: r["ms_per_step"] for r in phases}
    assert summary["device_busy_ms"] == pytest.approx(3.0)
    assert got["verify_attention"] == pytest.approx(1.5) and got["draft_head"] == pytest.approx(1.5)


def test_phase_and_scope_parsing():
    assert phase_of("jit(_step)/verify/layer_3/mlp/dot", "f") == "verify_mlp"
    assert phase_of("jit(_step)/verify/embed/gather", "f") == "verify_other"
    assert phase_of("jit(_step)/accept/vmap()/argmax", "f") == "accept"
    assert phase_of("jit(_step)/draft/lm_head/dot", "f") == "draft_lm_head"
    assert phase_of("", "MemcpyHtoD") == "transfers"
    assert phase_of(None, "copy.3") == "device_other"
    text = ('%fused_computation.1 (p: f32[4]) -> f32[4] {\n  %p = f32[4]{0} parameter(0)\n'
            '  ROOT %t = f32[4]{0} tanh(%p), metadata={op_name="jit(f)/verify/mlp/tanh"}\n}\n\n'
            'ENTRY %main.5 (a: f32[4]) -> f32[4] {\n  %a = f32[4]{0} parameter(0)\n'
            '  %ynn_fusion.1 = f32[4]{0} fusion(%a), kind=kCustom, calls=%fused_computation.1\n'
            '  %d = f32[4]{0} dot(%ynn_fusion.1, %a), lhs_contracting_dims={0}\n'
            '  ROOT %c = (f32[4]{0}, s32[]) tuple(%d), metadata={op_name="jit(f)/accept/copy"}\n}\n')
    # d has no metadata: it takes its first operand's scope, its last component marked inferred
    assert hlo_scopes(text) == {"t": "jit(f)/verify/mlp/tanh", "ynn_fusion.1": "jit(f)/verify/mlp/tanh",
                                "d": "jit(f)/verify/mlp/dot~", "c": "jit(f)/accept/copy"}


def test_profile_of_a_tiny_model_on_this_device(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "category": "code", "prompt": "def f(x):"}) + "\n")
    out = tmp_path / "prof"
    assert main(["--out", str(out), "--random", "--random-layers", "3", "--random-hidden", "32", "--keep", "4",
                 "--max-new-tokens", "16", "--max-length", "96", "--no-chat", "--prompts", str(prompts),
                 "--steps", "3", "--force-tau", "2"]) == 0
    result = json.loads((out / "profile.json").read_text())
    assert "| phase | ms per step |" in (out / "profile.md").read_text()
    s = result["summary"]
    phases = {r["phase"]: r["ms_per_step"] for r in result["phases"]}
    assert set(phases) == set(PHASES) and all(v >= 0 for v in phases.values())
    assert s["phases_sum_ms"] == pytest.approx(s["step_ms"], rel=0.05)
    # the step time against the trace's own record of the step annotations (read here directly)
    trace = next((out / "trace").rglob("*.trace.json.gz"))
    events = json.load(gzip.open(trace, "rt"))["traceEvents"]
    steps = [e["dur"] / 1e3 for e in events if e.get("name") == "dart_profile_step" and e.get("ph") == "X"]
    assert len(steps) == s["steps"] == 3
    assert s["step_ms"] == pytest.approx(np.mean(steps), rel=0.2)
    # device ops were found, most carry the step's named scopes, and the verify is among them
    assert s["ops_traced"] > 0 and s["ops_with_scope"] >= s["ops_traced"] // 2
    assert phases["verify_attention"] > 0 and phases["tree_search"] > 0
    # the same steps timed without the profiler, and no Python call traced under it
    u = s["untraced"]
    assert u["steps"] == 3 and 0 < u["tree_search_ms"] < u["step_ms"] and 0 < u["device_call_ms"] < u["step_ms"]
    assert "The same steps without the profiler" in (out / "profile.md").read_text()
    assert not [e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("$")]
    assert {r["phase"] for r in result["ops"]} & {"verify_attention", "verify_mlp", "verify_lm_head"}


@pytest.mark.extended
def test_profile_of_the_device_loop(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "category": "code", "prompt": "def f(x):"}) + "\n")
    out = tmp_path / "prof"
    assert main(["--out", str(out), "--random", "--random-layers", "3", "--random-hidden", "32", "--keep", "4",
                 "--max-new-tokens", "24", "--max-length", "128", "--no-chat", "--prompts", str(prompts),
                 "--steps", "5", "--device-steps", "3", "--force-tau", "2"]) == 0
    result = json.loads((out / "profile.json").read_text())
    c, s = result["config"], result["summary"]
    # whole calls of 3 steps, enough of them to cover 5 steps: 2 calls, 6 steps (24 new tokens at
    # τ 2: no call ends early)
    assert (c["device_steps"], c["calls"], c["steps"], s["steps"]) == (3, 2, 6, 6)
    trace = next((out / "trace").rglob("*.trace.json.gz"))
    events = json.load(gzip.open(trace, "rt"))["traceEvents"]
    calls = [e["dur"] / 1e3 for e in events if e.get("name") == "dart_profile_step" and e.get("ph") == "X"]
    assert len(calls) == 2
    # per step: the calls' annotated time over the steps they took
    assert s["step_ms"] == pytest.approx(sum(calls) / 6, rel=0.2)
    phases = {r["phase"]: r["ms_per_step"] for r in result["phases"]}
    assert phases["tree_search"] == 0 and s["untraced"]["steps"] == 6
    # the search runs on the device, under its own scope in the loop's HLO
    assert phases["device_tree_search"] > 0 and phases["verify_attention"] > 0
    assert phases["forcing"] > 0  # --force-tau's edit, under its own scope in the loop
    assert s["accepted_per_step"] > 1
    # the search split by part: each of its scopes has device ops, and the parts hold all of the phase's
    parts = {r["part"]: r for r in s["search_parts"]}
    assert {"context", "level_0", "levels_1+", "select", "links"} <= set(parts)
    assert all(parts[p]["ops_per_step"] > 0 and parts[p]["ms_per_step"] > 0 for p in ("level_0", "select", "links"))
    search_ops = next(r["ops_per_step"] for r in result["phases"] if r["phase"] == "device_tree_search")
    assert sum(r["ops_per_step"] for r in parts.values()) == pytest.approx(search_ops)
    assert "| device search part |" in (out / "profile.md").read_text()


def test_a_search_op_is_given_its_part():
    loop = "jit(_device_steps)/while/body/tree_search/vmap()/"
    assert search_part(loop + "vmap(level_0)/sort") == "level_0"
    assert search_part(loop + "vmap(level_12)/jit(lexsort)/sort") == "levels_1+"
    assert search_part(loop + "vmap(links)/gather") == "links"
    assert search_part(loop + "select/reduce_sum") == "select"
    assert search_part(loop + "vmap(context)/gather") == "context"
    assert search_part(loop + "select_n") == search_part(loop + "vmap(selection)/x") == "other"  # not a part's name
    assert search_part("") == "other"


def test_a_device_loop_search_scope_is_its_own_phase():
    assert phase_of("jit(_device_steps)/while/body/tree_search/sort", "f") == "device_tree_search"
    assert phase_of("jit(_device_steps)/while/body/verify/layer_0/mlp/dot", "f") == "verify_mlp"

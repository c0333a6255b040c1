"""A device trace of a few DART steps, and where a step's time goes: `python -m dart_jax.bench.profile`.

    python -m dart_jax.bench.profile --out DIR [model options of `bench e2e`] [--steps 8] [--force-tau 3.61]

With `--device-steps N` the steps run in the device loop (N a call, the trees searched on the
device): whole calls are traced and timed, enough to cover --steps steps, and every figure is per
step; tree_search (host) is then 0 and device_tree_search holds the search.

One prompt is decoded once untimed (everything compiles); then `--steps` of its decoding steps
run twice, once timed on the host alone (`summary.untraced`: the step's own wall time and tree
search, which a profiler slows) and once under `jax.profiler`, Python calls not traced (the trace
lands in DIR/trace/, for TensorBoard or Perfetto). From the trace's Chrome-format
`*.trace.json.gz` (read with the standard library) and the host's own step timing come two
tables, written to DIR as `profile.json` and `profile.md`:

per phase, mean ms per step (the rows add up to the step's wall time):
  verify_attention, verify_mlp, verify_lm_head, verify_other   the target over the tree (device)
  accept                      greedy/sampled acceptance on the device
  cache_write                 the accepted path's keys/values into the cache
  draft_head                  the drafter's call for the next step (draft_lm_head: its LM head)
  device_tree_search          the tree search on the device (`--device-steps`: the device loop)
  forcing                     --force-tau's edit of the trees in the device loop (bench work, not DART's:
                              the loop's `tree_edit` scope)
  device_other                device work outside those scopes (copies, cache views)
  transfers                   host↔device copies the trace shows (GPU memcpy events; none on a CPU)
  dispatch_and_sync           the device call's wall time not covered by device work: launch,
                              argument handling, waiting, the fetch of the packed result
  tree_search                 the host's tree search (Numba)
  host_other                  the rest of the step on the host (unpacking, bookkeeping, Python)

Each phase row also gives its device ops per step (`ops_per_step`: on a GPU, kernels launched; a
phase of many small ops is bound by their launches rather than by its work). The device search is
split by part (`search_parts`, the named scopes of `device_tree.search_tree`): context (the trie
nodes of the preceding ids), level_0 and levels_1+ (the beam's levels), select (the pool's best
`keep`) and links (parents, mask, retrieve rows), in unscaled device ms and ops per step.

per op kind: device time by phase and kind of op (the scope's last component: dot_general,
transpose, reduce_max, …); per op: the top device ops by total time (XLA instruction or GPU
kernel names), with the named scope they come from and their phase. DIR/scopes.json (instruction
→ scope) and DIR/step.hlo.txt.gz (the step's optimized HLO) are kept to read the trace again.

On a GPU, XLA runs the kernels of its command buffers (CUDA graphs) one by one while a profiler
traces (its default, --xla_enable_command_buffers_during_profiling=false): the trace has every
kernel, and the untraced timing is the program as it runs otherwise.

A device op is given its phase by the `jax.named_scope` path of its HLO instruction, read from
the optimized HLO of the step (compiled once more for that; `--no-scopes` skips it, and every
op is then device_other). Device time is the union of the ops' intervals per step on a GPU's
streams (on a CPU, the XLA threads), so concurrent ops are not counted twice in the phase sum;
each phase gets its ops' share of that union.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import jax
import numpy as np

from dart_jax.bench.e2e import ModelSet, Workload, open_model, tree_label
from dart_jax.bench.forced import Forcing, reference_outputs
from dart_jax.bench.options import _model_options
from dart_jax.decoding.driver import Driver
from dart_jax.errors import cli_boundary

SEARCH_PARTS = ("context", "level_0", "levels_1+", "select", "links", "other")
DEVICE_PHASES = ("verify_attention", "verify_mlp", "verify_lm_head", "verify_other", "accept", "cache_write",
                 "draft_head", "draft_lm_head", "device_tree_search", "forcing", "device_other", "transfers")
PHASES = DEVICE_PHASES + ("dispatch_and_sync", "tree_search", "host_other")
_STEP = "dart_profile_step"
# host-side bookkeeping events of the XLA CPU runtime and profiler, not device work
_NOT_OPS = re.compile(r"^(end: |ThreadpoolListener|ThunkExecutor|SlinkyThreadPool|PjRt|CommonPjRt|\$|Handle |Wait for|Allocate|"
                      r"ParseArguments|PythonRefManager|PjitFunction|TfrtCpu|XlaCompile|Execute)")


def phase_of(scope: str | None, name: str) -> str:
    """The phase of a device op from its named-scope path (`jit(_step)/verify/layer_3/attention/...`)."""
    if "memcpy" in name.lower() or "MemcpyDtoH" in name or "MemcpyHtoD" in name:
        return "transfers"
    parts = (scope or "").split("/")
    if "verify" in parts:
        for sub, phase in (("lm_head", "verify_lm_head"), ("attention", "verify_attention"), ("mlp", "verify_mlp")):
            if sub in parts:
                return phase
        return "verify_other"
    if "accept" in parts:
        return "accept"
    if "commit" in parts:
        return "cache_write"
    if "draft" in parts:
        return "draft_lm_head" if "lm_head" in parts else "draft_head"
    if "tree_search" in parts:
        return "device_tree_search"
    if "tree_edit" in parts:  # the only edit of the device loop's trees is the forced bench's
        return "forcing"
    return "device_other"


def search_part(scope: str) -> str:
    """The part of the device search (SEARCH_PARTS) an op of phase device_tree_search belongs to."""
    found = re.search(r"(?:^|[/(])(context|level_\d+|select|links)(?:$|[/)])", scope or "")
    if not found:
        return "other"
    part = found.group(1)
    return part if not part.startswith("level_") or part == "level_0" else "levels_1+"


def op_kind(scope: str, name: str) -> str:
    """What an op does, for the per-kind table: the last component of its scope path
    (`dot_general`, `reduce_max`, `transpose`, …), else its name without the number."""
    last = scope.rstrip("/").rsplit("/", 1)[-1] if scope else ""
    return last or re.sub(r"[.\d]+$", "", name) or name


def hlo_scopes(hlo_text: str) -> dict[str, str]:
    """HLO instruction name → the named-scope path of its metadata op_name, from optimized HLO
    text. A fusion or call without metadata of its own takes the first op_name inside the
    computation it calls; an instruction with neither (the CPU compiler drops it on some fused
    dots, e.g. attention's scores over the cache) takes the scope of its first operand that has
    one, its last component replaced by the instruction's opcode (or its fused root's) and "~"
    (inferred)."""
    own, calls, inside, roots, operands = {}, {}, {}, {}, {}
    current = None
    for line in hlo_text.splitlines():
        head = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if head and "=" not in line.split("{", 1)[0]:
            current = head.group(1)
            continue
        m = re.match(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=(.*)$", line)
        if not m:
            continue
        name, rest = m.group(2), m.group(3)
        code = re.search(r"\s([a-z][\w\-]*)\(", rest)
        if code:
            operands[name] = (code.group(1), re.findall(r"%([\w.\-]+)", rest[code.end():rest.find(")", code.end())]))
            if m.group(1) and current is not None:
                roots[current] = code.group(1)
        op = re.search(r'op_name="([^"]*)"', rest)
        if op:
            own.setdefault(name, op.group(1))
            if current is not None:
                inside.setdefault(current, op.group(1))
        called = re.search(r"(?:calls|to_apply|body)=%?([\w.\-]+)", rest)
        if called:
            calls[name] = called.group(1)
    scopes = dict(own)
    for name, comp in calls.items():
        if name not in scopes and comp in inside:
            scopes[name] = inside[comp]

    def inferred(name: str, seen: set) -> str | None:
        if name in scopes:
            return scopes[name]
        if name in seen or name not in operands:
            return None
        seen.add(name)
        opcode, args = operands[name]
        for arg in args:
            found = inferred(arg, seen)
            if found:
                kind = roots.get(calls.get(name, ""), opcode)
                scopes[name] = found.rstrip("~").rsplit("/", 1)[0] + f"/{kind}~"
                return scopes[name]
        return None

    for name in list(operands):
        inferred(name, set())
    return scopes


def op_scope(args: dict[str, Any], key: str, name: str, scopes: dict[str, str]) -> str:
    """The named-scope path of a traced op: the trace's own `tf_op` or `name_scope` where it is a
    path, else the optimized HLO's (`hlo_scopes`) for its instruction. A GPU trace's `tf_op` names
    the module (`XlaModule:#hlo_module=jit__step...#`), not the op: it is passed over."""
    own = str(args.get("tf_op") or args.get("name_scope") or "")
    if own.startswith("XlaModule") or "/" not in own:
        own = ""
    return own or scopes.get(key) or scopes.get(name) or ""


def read_trace(folder: Path) -> list[dict[str, Any]]:
    """The events of the newest Chrome-format trace under `folder`."""
    found = sorted(folder.rglob("*.trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"no *.trace.json.gz under {folder}: the profiler wrote no trace (is the "
                                "tensorboard-plugin-profile/xprof package missing? jax.profiler needs it on some versions)")
    with gzip.open(found[-1], "rt", encoding="utf-8") as f:
        return json.load(f).get("traceEvents", [])


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -np.inf
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def device_ops(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[tuple[float, float]]]:
    """(device op events, the step windows) of a trace: ops are complete events on a GPU/TPU
    process, or on the XLA runtime threads of the host for a CPU backend; windows are the
    `_STEP` annotations on the Python thread (µs)."""
    procs = {e["pid"]: e["args"].get("name", "") for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e.get("tid")): e["args"].get("name", "") for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    accel = {pid for pid, name in procs.items() if "/device:" in name and "CPU" not in name.split("/device:")[-1][:3]}
    # an accelerator's trace has the ops once per line kind: "XLA Ops" (HLO op names) where the
    # profiler derives it, else the streams' kernels; copies show on the streams only
    xla_ops = {key for key, name in threads.items() if key[0] in accel and name == "XLA Ops"}
    ops, windows = [], []
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        if e["name"] == _STEP:
            windows.append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
            continue
        thread = threads.get((e["pid"], e.get("tid")), "")
        if accel:
            key = (e["pid"], e.get("tid"))
            on_stream = e["pid"] in accel and "stream" in thread.lower()
            if not (key in xla_ops or (on_stream and (not xla_ops or "memcpy" in e["name"].lower()))):
                continue
        elif not thread.startswith("tf_XLA") or _NOT_OPS.match(e["name"]):
            continue
        ops.append(e)
    return ops, windows


def tables(events: list[dict[str, Any]], scopes: dict[str, str], step_host: list[dict[str, float]],
           top: int = 30) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """(per-phase rows, per-op rows, summary) from trace events, the HLO scopes and the host's
    timing of each device call (`wall_s`, `tree_s`, `device_call_s`, and the `steps` it took:
    1 a call, or up to `device_steps` in the device loop); every figure is per step."""
    ops, windows = device_ops(events)
    steps = sum(s.get("steps", 1) for s in step_host)
    if windows:
        lo, hi = min(a for a, _ in windows), max(b for _, b in windows)
        ops = [e for e in ops if float(e["ts"]) < hi and float(e["ts"]) + float(e["dur"]) > lo]
    per_op = collections.defaultdict(lambda: {"total_us": 0.0, "count": 0, "scope": "", "phase": ""})
    phase_us, kind_us, phase_n = collections.Counter(), collections.Counter(), collections.Counter()
    part_us, part_n = collections.Counter(), collections.Counter()
    for e in ops:
        args = e.get("args") or {}
        key = str(args.get("hlo_op") or e["name"])
        scope = op_scope(args, key, e["name"], scopes)
        phase = phase_of(scope, e["name"])
        row = per_op[key]
        row["total_us"] += float(e["dur"])
        row["count"] += 1
        row["scope"], row["phase"] = scope, phase
        phase_us[phase] += float(e["dur"])
        phase_n[phase] += 1
        kind_us[(phase, op_kind(scope, key))] += float(e["dur"])
        if phase == "device_tree_search":
            part = search_part(scope)
            part_us[part] += float(e["dur"])
            part_n[part] += 1
    busy_us = _union([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in ops])
    summed_us = sum(phase_us.values())
    # concurrent ops (CPU threads, several streams) are scaled to the busy time they cover together
    scale = busy_us / summed_us if summed_us > 0 else 0.0
    wall_ms, tree_ms, call_ms = (per_step(step_host, key) for key in ("wall_s", "tree_s", "device_call_s"))
    ms = {p: phase_us[p] * scale / 1e3 / max(steps, 1) for p in DEVICE_PHASES}
    device_ms = sum(ms.values())
    ms["dispatch_and_sync"] = max(call_ms - device_ms, 0.0)
    ms["tree_search"] = tree_ms
    ms["host_other"] = max(wall_ms - tree_ms - call_ms, 0.0)
    phase_rows = [{"phase": p, "ms_per_step": ms[p], "share": ms[p] / wall_ms if wall_ms > 0 else float("nan"),
                   "ops_per_step": phase_n[p] / max(steps, 1)} for p in PHASES]
    op_rows = sorted(({"op": k, **v, "ms_per_step": v["total_us"] / 1e3 / max(steps, 1)} for k, v in per_op.items()),
                     key=lambda r: -r["total_us"])[:top]
    for r in op_rows:
        r["share_of_device"] = r["total_us"] / summed_us if summed_us else float("nan")
    kind_rows = [{"phase": phase, "kind": kind, "ms_per_step": us / 1e3 / max(steps, 1),
                  "share_of_device": us / summed_us if summed_us else float("nan")}
                 for (phase, kind), us in kind_us.most_common(top)]
    search_rows = [{"part": part, "ms_per_step": part_us[part] / 1e3 / max(steps, 1),
                    "ops_per_step": part_n[part] / max(steps, 1)} for part in SEARCH_PARTS if part_n[part]]
    summary = {"op_kinds": kind_rows, "search_parts": search_rows, "steps": steps, "step_ms": wall_ms,
               "device_busy_ms": busy_us / 1e3 / max(steps, 1),
               "device_ops_summed_ms": summed_us / 1e3 / max(steps, 1), "device_call_ms": call_ms,
               "tree_search_ms": tree_ms, "phases_sum_ms": sum(r["ms_per_step"] for r in phase_rows),
               "ops_traced": len(ops), "ops_with_scope": sum(1 for e in ops if op_scope(
                   e.get("args") or {}, str((e.get("args") or {}).get("hlo_op") or e["name"]), e["name"], scopes)),
               "accepted_per_step": sum(s["accepted"] for s in step_host) / max(steps, 1)}
    return phase_rows, op_rows, summary


def per_step(calls: list[dict[str, float]], key: str) -> float:
    """`key` summed over the timed calls, per step taken, in ms (seconds × 1e3)."""
    steps = sum(c.get("steps", 1) for c in calls)
    return 1e3 * sum(c[key] for c in calls) / steps if steps else float("nan")


def _abstract(tree):
    def one(a):
        if isinstance(a, jax.Array):
            return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)
        return a
    return jax.tree.map(one, tree)


def profile_steps(models, work, out: str | Path, *, steps: int = 8, seed: int = 0, force_tau: float | None = None,
                  scopes: bool = True, top: int = 30) -> dict[str, Any]:
    """Trace `steps` DART steps of the first prompt of `work` on `models` (a `bench.e2e.ModelSet`)
    and write DIR/profile.json, DIR/profile.md and the trace under DIR/trace/. Returns the JSON.
    With `models.device_steps` the steps run in the device loop (trees searched on the device):
    whole calls are traced, as many as cover `steps` steps, and every figure is per step."""

    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    settings = work.settings(seed)
    with open_model(models, seed) as (model, source):
        engine = model.engine
        if engine.adaptive:
            engine = engine.with_tree(engine.tree, adaptive=False)
        item = work.items()[0]
        ids = model.encode(item["prompt"], work.chat)
        ref = reference_outputs(engine, [ids], settings)[0] if force_tau else None
        captured = {}
        # the jitted function whose scopes name the trace's ops: the step, or the device loop
        step_attr = "_device_loop" if engine.device_steps else "_step"
        step_fn = getattr(engine, step_attr)

        def spy(*args, **kwargs):
            if "call" not in captured:  # shapes only: the caches are donated to the call
                captured["call"] = (_abstract(args), kwargs)
            return step_fn(*args, **kwargs)

        def new_pool():
            if force_tau:
                forcing = Forcing(engine, tau=force_tau, seed=seed)
                pool = engine.batcher(1, settings.max_length, edit=forcing)
                forcing.submit(pool, ids, settings, ref)
            else:
                pool = engine.batcher(1, settings.max_length)
                pool.submit(ids, settings)
            return pool

        setattr(engine, step_attr, spy)
        try:
            pool = new_pool()  # untimed: compiles the prefill and every step shape of this prompt
            try:
                for _ in Driver(pool).run():
                    pass
            finally:
                pool.close()
            def timed_steps(trace: Path | None) -> list[dict[str, float]]:
                """The device calls of the first `steps` steps after the prefill of a new pool (one
                call a step, or whole calls of the device loop), timed on the host, under the
                profiler with `trace` (Python calls not traced: that tracer slows every call)."""
                pool, host = new_pool(), []
                driver = Driver(pool)
                try:
                    driver.step()  # the prefill
                    if trace is not None:
                        options = jax.profiler.ProfileOptions()
                        options.python_tracer_level = 0
                        jax.profiler.start_trace(str(trace), profiler_options=options)
                    try:
                        while sum(h["steps"] for h in host) < steps:
                            if not pool.active:
                                break
                            request = next(r for r in pool.busy if r is not None)
                            tree0, dev0 = request.stats.tree_s, request.stats.device_s
                            t0 = time.perf_counter()
                            with jax.profiler.TraceAnnotation(_STEP):
                                events = driver.step().events
                            wall = time.perf_counter() - t0
                            mine = [a for r, _, a in events if r is request]
                            host.append({"wall_s": wall, "tree_s": request.stats.tree_s - tree0,
                                         "device_call_s": request.stats.device_s - dev0,
                                         "steps": max(len(mine), 1), "accepted": float(sum(mine))})
                    finally:
                        if trace is not None:
                            jax.profiler.stop_trace()
                finally:
                    pool.close()
                return host

            untraced = timed_steps(None)  # the same steps without the profiler: the step's own times
            trace_dir = out / "trace"
            host = timed_steps(trace_dir)
        finally:
            setattr(engine, step_attr, step_fn)
        if not host:
            raise ValueError("no decoding step ran (the generation stopped at its first token); raise --max-new-tokens")
        hlo, scope_note = {}, "skipped (--no-scopes)"
        if scopes:
            if "call" in captured and hasattr(step_fn, "lower"):
                args, kwargs = captured["call"]
                text = step_fn.lower(*args, **kwargs).compile().as_text()
                with gzip.open(out / "step.hlo.txt.gz", "wt", encoding="utf-8") as f:  # for later reading
                    f.write(text)
                hlo = hlo_scopes(text)
                scope_note = f"{len(hlo)} HLO instructions with a scope"
            else:
                scope_note = "unavailable (the step is not a plain jitted function here, e.g. with --mesh)"
        keep = tree_label(engine)
    phase_rows, op_rows, summary = tables(read_trace(trace_dir), hlo, host, top=top)
    summary["scopes"] = scope_note
    summary["untraced"] = {"step_ms": per_step(untraced, "wall_s"), "tree_search_ms": per_step(untraced, "tree_s"),
                           "device_call_ms": per_step(untraced, "device_call_s"),
                           "steps": sum(h["steps"] for h in untraced)}
    result = {"mode": "profile",
              "config": {"model": source, "prompt_id": item["id"], "steps": sum(h["steps"] for h in host), "keep": keep,
                         "device_steps": engine.device_steps, "calls": len(host),
                         "tree_depth": engine.depth, "force_tau": force_tau, **work.config(seed),
                         "backend": jax.default_backend(), "device": jax.devices()[0].device_kind},
              "phases": phase_rows, "ops": op_rows, "summary": summary, "trace_dir": str(trace_dir)}
    (out / "profile.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "scopes.json").write_text(json.dumps(hlo) + "\n")  # instruction → scope, to re-read the trace later
    (out / "profile.md").write_text(markdown(result))
    return result


def markdown(result: dict[str, Any]) -> str:
    c, s = result["config"], result["summary"]
    loop = (f"; device loop, {c['device_steps']} steps a call, {c['calls']} calls" if c.get("device_steps")
            else "")
    lines = [f"### Profile of {c['steps']} DART steps ({c['backend']}, {c['device']}; keep {c['keep']}, "
             f"forced τ {c['force_tau'] or 'none'}{loop})", "",
             f"Step {s['step_ms']:.3f} ms (phases add up to {s['phases_sum_ms']:.3f} ms); device busy "
             f"{s['device_busy_ms']:.3f} ms; accepted per step {s['accepted_per_step']:.2f}; scopes: {s['scopes']}.", "",
             *([f"The same steps without the profiler: step {u['step_ms']:.3f} ms, of which the device call "
                f"{u['device_call_ms']:.3f} ms and the tree search {u['tree_search_ms']:.3f} ms.", ""]
               if (u := s.get("untraced")) else []),
             "| phase | ms per step | share | device ops per step |", "|---|---|---|---|"]
    lines += [f"| {r['phase']} | {r['ms_per_step']:.3f} | {r['share']:.1%} | {r.get('ops_per_step', 0):.1f} |"
              for r in result["phases"]]
    if s.get("search_parts"):
        lines += ["", "| device search part | ms per step (unscaled) | device ops per step |", "|---|---|---|"]
        lines += [f"| {r['part']} | {r['ms_per_step']:.3f} | {r['ops_per_step']:.1f} |" for r in s["search_parts"]]
    lines += ["", "| phase | op kind | ms per step | share of device |", "|---|---|---|---|"]
    lines += [f"| {r['phase']} | `{r['kind']}` | {r['ms_per_step']:.3f} | {r['share_of_device']:.1%} |"
              for r in s.get("op_kinds", [])]
    lines += ["", "| op | ms per step | calls | share of device | phase | scope |", "|---|---|---|---|---|---|"]
    lines += [f"| `{r['op'][:60]}` | {r['ms_per_step']:.3f} | {r['count']} | {r['share_of_device']:.1%} | {r['phase']} | "
              f"`{r['scope'][-70:]}` |" for r in result["ops"]]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:

    p = argparse.ArgumentParser(prog="python -m dart_jax.bench.profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for profile.json, profile.md and the trace")
    p.add_argument("--steps", type=int, default=8, help="decoding steps traced (default 8)")
    p.add_argument("--force-tau", type=float, help="force the mean accepted length (see bench e2e --force-tau)")
    p.add_argument("--no-scopes", action="store_true", help="do not compile the step again to read its scopes")
    p.add_argument("--top", type=int, default=30, help="ops in the per-op table (default 30)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    _model_options(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:

    args = build_parser().parse_args(argv)

    def body() -> None:
        models = ModelSet(base=args.base, dart=args.dart, ngram=args.ngram, small_ngram=args.small_ngram,
                          random=args.random, random_layers=args.random_layers, random_hidden=args.random_hidden,
                          random_shape=args.random_shape, keep=args.keep, mesh=args.mesh, demo=args.demo,
                          device_steps=args.device_steps, verify_gemms=args.verify_gemms,
                          attention=args.attention)
        work = Workload(prompts=args.prompts, categories=args.categories, limit=args.limit,
                        max_new_tokens=args.max_new_tokens, max_length=args.max_length,
                        temperature=args.temperature, chat=not args.no_chat)
        result = profile_steps(models, work, args.out, steps=args.steps, seed=args.seed, force_tau=args.force_tau,
                               scopes=not args.no_scopes, top=args.top)
        print(markdown(result))
    return cli_boundary(body, prog="dart_jax.bench.profile")


if __name__ == "__main__":
    sys.exit(main())

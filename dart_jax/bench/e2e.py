"""`e2e` and `phases` modes: whole generations with DART and with plain autoregressive decoding.

The model set is, in this order of preference: the checkpoints given on the command line, the
offline demo model shipped in dart_jax/demo/, or a tiny random set built in a temporary folder
(`bench.tiny.build_random_assets`). With --random-shape (a known Qwen3 shape, or "tiny") the
random target and head are drawn on the device instead (`random_model`: only the tokenizer, the
configs and the trie go to the temporary folder), so that a real shape at full depth (16 GB of
bf16 for Qwen3-8B's 36 layers) is neither written nor read. Random weights give meaningful
timings only; τ needs a trained head.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import tempfile
import time
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dart_jax.api import methods as decoding_methods
from dart_jax.api.model import DartModel, demo_eagle3, demo_options, demo_paths
from dart_jax.api.prompts import read_prompt_file
from dart_jax.bench.shapes import KNOWN_SHAPES, TINY_SHAPE
from dart_jax.bench.tiny import HOT_SCALE, build_random_assets, hot_token_ids, make_tiny_eagle3, random_std
from dart_jax.convert.dart_head import read_head_config, tensor_table as head_tensor_table
from dart_jax.convert.qwen3 import tensor_table as qwen3_tensor_table
from dart_jax.convert.target import load_target_config
from dart_jax.models.head import DartHead
from dart_jax.models.qwen3 import Qwen3, default_dtype, use_backend_layout
from dart_jax.ngram import Trie
from dart_jax.bench.util import check_reps, median, progress, summary_ms
from dart_jax.decoding.driver import Driver, decode, decode_together
from dart_jax.decoding.requests import Stats
from dart_jax.decoding.settings import GenerationSettings
from dart_jax.errors import load_tokenizer_folder

PHASES = ("verify_draft_device", "topk_transfer", "tree_search", "host_overhead")


def tree_label(engine) -> int | str:
    """The engine's tree size as reported: an integer, or "auto (sizes …)"."""
    if engine.adaptive:
        return f"auto (sizes {', '.join(map(str, engine.tree_sizes))})"
    return engine.tree.keep


def default_prompts_path() -> Path:
    return Path(str(resources.files("dart_jax") / "data" / "prompts.jsonl"))


def load_prompts(path: str | Path | None = None, *, categories: str | None = None,
                 limit: int | None = None) -> list[dict[str, str]]:
    """Prompts from a JSONL file: one object per line with `prompt` and optional `category`/`id`."""
    path = Path(path) if path else default_prompts_path()
    lines = read_prompt_file(path, fields=None, messages=False, token_ids=False, what="prompt file")
    prompts = [{"id": str(item.get("id", f"{path.stem}-{n}")), "category": str(item.get("category", "all")),
                "prompt": item["prompt"]} for n, item in lines]
    if categories:
        wanted = [c.strip() for c in categories.split(",") if c.strip()]
        unknown = sorted(set(wanted) - {p["category"] for p in prompts})
        if unknown:
            raise ValueError(f"categories {unknown} are not in {path}; it has {sorted({p['category'] for p in prompts})}")
        prompts = [p for p in prompts if p["category"] in wanted]
    if limit is not None:
        if limit < 1:
            raise ValueError(f"--limit must be >= 1, got {limit}")
        seen: Counter = Counter()
        kept = []
        for p in prompts:
            if seen[p["category"]] < limit:
                kept.append(p)
                seen[p["category"]] += 1
        prompts = kept
    if not prompts:
        raise ValueError(f"no prompts to run from {path}")
    return prompts


def _demo_assets(name: str = "smollm2") -> dict[str, Path]:
    """The demo model set `name` (see `DartModel.demo`; the smollm2 base is fetched on first use)."""
    base, dart, ngram = demo_paths(name)
    return {"base": base, "dart": dart, "ngram": ngram}


@dataclasses.dataclass(frozen=True)
class ModelSet:
    """Which model set to measure (the command line's model options); see `open_model`."""

    base: str | None = None
    dart: str | None = None
    ngram: str | None = None
    small_ngram: bool = False
    random: bool = False
    random_layers: int = 4
    random_hidden: int = 64
    random_shape: str | None = None
    keep: int | str | None = None
    eagle3: str | None = None  # an EAGLE-3 head; a random one over the demo / random target when "random"
    demo: str = "smollm2"  # the demo set measured when neither --dart nor --random is given
    mesh: str | None = None  # shard the model over devices ("model=4", "data=2,model=4")
    eagle3_total_token: int | None = None  # EAGLE-3 tree (default: from_pretrained's, or the demo's on a CPU)
    eagle3_depth: int | None = None
    eagle3_top_k: int | None = None
    device_steps: int = 0  # DART's steps per device call, trees searched on the device (0: one call a step)
    verify_gemms: str = "auto"  # the GEMMs a GPU compiles a verification with (qwen3.verify_compiler_options)
    attention: str = "xla"  # how the target attends over its cache (qwen3.Qwen3.use_attention)

    def eagle3_sizes(self) -> dict[str, int]:
        return {k: v for k, v in (("eagle3_total_token", self.eagle3_total_token), ("eagle3_depth", self.eagle3_depth),
                                  ("eagle3_top_k", self.eagle3_top_k)) if v is not None}

    def shipped_eagle3(self) -> bool:
        """Whether the demo measured ships an EAGLE-3 head of its own (loaded unless --eagle3 names one)."""
        return not (self.dart or self.random or self.random_shape) and demo_eagle3(self.demo) is not None


@dataclasses.dataclass(frozen=True)
class Workload:
    """What to generate: the prompts and the generation settings shared by both decoders."""

    prompts: str | None = None
    categories: str | None = None
    limit: int | None = None
    max_new_tokens: int = 64
    max_length: int = 2048
    temperature: float = 0.0
    chat: bool = True

    def settings(self, seed: int) -> GenerationSettings:
        if self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        return GenerationSettings(max_new_tokens=self.max_new_tokens, max_length=self.max_length,
                                  temperature=self.temperature, seed=seed)

    def items(self) -> list[dict[str, str]]:
        return load_prompts(self.prompts, categories=self.categories, limit=self.limit)

    def config(self, seed: int) -> dict[str, Any]:
        """The run's settings as recorded in the JSON `config`."""
        return {"prompts": str(self.prompts or default_prompts_path()), "max_new_tokens": self.max_new_tokens,
                "max_length": self.max_length, "temperature": self.temperature, "seed": seed, "chat": self.chat}


@contextlib.contextmanager
def _eagle3_opts(m: ModelSet, base, seed: int) -> Iterator[dict[str, Any]]:
    """The `from_pretrained` options of the EAGLE-3 head (none without one; a random head over
    `base` in a temporary folder for m.eagle3 == "random")."""
    if m.eagle3 is None:
        yield {}
    elif m.eagle3 == "random":
        with tempfile.TemporaryDirectory(prefix="dart_jax_bench_eagle3_") as tmp:
            yield {"eagle3": make_tiny_eagle3(Path(tmp) / "eagle3", base, seed=seed)}
    else:
        yield {"eagle3": m.eagle3}


# --random-shape: the known Qwen3 shapes, and "tiny" (bench.shapes.TINY_SHAPE, for CPU checks)
RANDOM_SHAPES = {**KNOWN_SHAPES, "tiny": TINY_SHAPE}


@functools.lru_cache(maxsize=None)
def _draw(shape: tuple[int, ...], dtype: str, norm: bool):
    """A jitted draw of one tensor of the random sets' law (`bench.tiny.random_tensors`: norm weights
    1 + 0.1·N(0, 1), the rest std·N(0, 1)), made on the device in its dtype (no float32 copy)."""
    def draw(key, std):
        x = jax.random.normal(key, shape, jnp.float32)
        return ((1.0 + 0.1 * x) if norm else std * x).astype(dtype)

    return jax.jit(draw)


def _fill_random(module, table, key, std: float, dtype) -> None:
    """Every parameter of `module` (abstract, from nnx.eval_shape) named in a tensor `table` drawn
    on the device; d2t / t2d (a head's vocabulary maps) are left to the caller."""
    for i, (name, (path, _, _)) in enumerate(table.items()):
        if name in ("d2t", "t2d"):
            continue
        var = module
        for part in path:
            var = var[part] if isinstance(part, int) else getattr(var, part)
        shape = tuple(var.get_value().shape)
        var.set_value(_draw(shape, jnp.dtype(dtype).name, name.endswith("norm.weight"))(jax.random.fold_in(key, i),
                                                                                          std))


def _peak_lm_head(target: Qwen3, hot_ids: np.ndarray) -> None:
    """The peaked LM head of the random sets (`bench.tiny`'s module docstring): the rows `hot_ids`
    of the LM head ([H, V] kernel: its columns), or of the embedding when tied, times HOT_SCALE."""
    hot = jnp.asarray(hot_ids)
    if target.lm_head is None:
        var = target.embed_tokens.embedding
        var.set_value(var.get_value().at[hot].multiply(HOT_SCALE))
    else:
        var = target.lm_head.kernel
        var.set_value(var.get_value().at[:, hot].multiply(HOT_SCALE))


def random_target(config, seed: int, dtype) -> Qwen3:
    """A target of `config` (a Qwen3Config) in `dtype`, its weights drawn on the device by the random
    sets' law (`random_model`'s target, peaked LM head included), in the checkpoint's layout (not
    `use_backend_layout`'s, which the loaders apply only when no mesh is given)."""
    target = nnx.eval_shape(lambda: Qwen3(config, dtype=dtype, param_dtype=dtype, rngs=None))  # every value drawn below
    _fill_random(target, qwen3_tensor_table(config), jax.random.fold_in(jax.random.key(seed), 0),
                 random_std(config.hidden_size), dtype)
    _peak_lm_head(target, hot_token_ids(config.vocab_size, seed))
    return target


def random_model(paths: dict[str, Path], seed: int, **opts) -> DartModel:
    """The random model set of `build_random_assets(..., weights=False)` (its tokenizer, configs and
    trie in `paths`) with the target's and the head's weights drawn on the device, in the loaders'
    dtype (`default_dtype`: float32 on a CPU, bfloat16 elsewhere), by the law of the sets written
    to disk (not the same numbers), the peaked LM head included (the same hot rows,
    `bench.tiny.hot_token_ids`); the head's draft vocabulary is the first ids, as there.
    `opts`: `DartModel.from_modules`'s settings (keep, ...)."""
    dtype = default_dtype()
    target_config, head_config = load_target_config(paths["base"]), read_head_config(paths["dart"])
    std = random_std(target_config.hidden_size)
    key = jax.random.key(seed)
    target = random_target(target_config, seed, dtype)
    use_backend_layout(target)  # as the loaders do (on a CPU: an untied copy of the peaked head)
    head = nnx.eval_shape(lambda: DartHead(head_config, target.embed_tokens, dtype=dtype, param_dtype=dtype,
                                           rngs=None))
    head.embed_tokens = target.embed_tokens
    _fill_random(head, head_tensor_table(head_config), jax.random.fold_in(key, 1), std, dtype)
    head.d2t.set_value(jnp.zeros((head_config.draft_vocab_size,), jnp.int32))
    head.t2d.set_value(jnp.arange(head_config.vocab_size) < head_config.draft_vocab_size)
    tokenizer = load_tokenizer_folder(paths["base"])
    eos = json.loads((paths["base"] / "generation_config.json").read_text())["eos_token_id"]
    return DartModel.from_modules(target, head, tokenizer, Trie.load(paths["ngram"]), eos_ids=eos, **opts)


@contextlib.contextmanager
def open_model(models: ModelSet, seed: int) -> Iterator[tuple[DartModel, dict[str, Any]]]:
    """Yield (DartModel, description of the model set); a random set lives as long as the block."""
    m = models
    # the bench's own defaults (keep "auto", the host loop) on every backend, not the backend's
    opts = {"keep": "auto" if m.keep is None else m.keep, "device_steps": m.device_steps}
    opts.update(m.eagle3_sizes())
    if m.verify_gemms != "auto":
        opts["verify_gemms"] = m.verify_gemms
    if m.attention != "xla":
        opts["attention"] = m.attention
    if m.mesh:
        opts["mesh"] = m.mesh
    if m.eagle3 == "random" and m.dart:
        raise ValueError("--dart needs a trained EAGLE-3 head beside it: pass --eagle3 PATH")
    random = m.random
    if m.random_shape:
        if m.random_shape not in RANDOM_SHAPES:
            raise ValueError(f"unknown --random-shape {m.random_shape!r}; known: {', '.join(RANDOM_SHAPES)}")
        random = True
    if m.dart and random:
        raise ValueError("pass either --dart (and --base/--ngram) or --random/--random-shape, not both")
    if not m.dart and (m.base or m.ngram):
        raise ValueError("--base/--ngram need --dart (the DART head checkpoint)")
    if m.dart:
        with _eagle3_opts(m, m.base, seed) as eagle3:
            yield (DartModel.from_pretrained(m.base, m.dart, m.ngram, small_ngram=m.small_ngram, **opts, **eagle3),
                   {"kind": "given", "base": m.base, "dart": m.dart, "ngram": m.ngram, "eagle3": m.eagle3})
        return
    demo = None if random else _demo_assets(m.demo)
    if demo:
        with _eagle3_opts(m, demo["base"], seed) as eagle3:
            yield (DartModel.from_pretrained(demo["base"], demo["dart"], demo["ngram"], **{**demo_options(m.demo, opts), **eagle3}),
                   {"kind": "demo", **{k: str(v) for k, v in demo.items()},
                    "eagle3": m.eagle3 or (str(demo_eagle3(m.demo)) if m.shipped_eagle3() else None)})
        return
    with tempfile.TemporaryDirectory(prefix="dart_jax_bench_") as tmp:
        shape = RANDOM_SHAPES[m.random_shape] if m.random_shape else None
        # a shaped set is drawn on the device (nothing of its size on disk), unless an EAGLE-3 head or
        # a mesh needs the loaders
        in_memory = shape is not None and m.eagle3 is None and not m.mesh
        paths = build_random_assets(tmp, layers=m.random_layers, hidden=m.random_hidden, shape=shape, seed=seed,
                                    weights=not in_memory)
        config = json.loads((paths["base"] / "config.json").read_text())
        described = {"kind": "random", "shape": m.random_shape or "small", "layers": m.random_layers,
                     "hidden": config["hidden_size"], "vocab": config["vocab_size"], "eagle3": m.eagle3,
                     "weights": "drawn on the device" if in_memory else "written and loaded"}
        if in_memory:
            yield random_model(paths, seed, **opts), described
            return
        with _eagle3_opts(m, paths["base"], seed) as eagle3:
            yield DartModel.from_pretrained(paths["base"], paths["dart"], paths["ngram"], **opts, **eagle3), described


METHODS = decoding_methods.names()  # as loaded; check_methods reads the registry itself


def check_methods(methods) -> tuple[str, ...]:
    """The e2e methods, checked against dart_jax.api.methods: dart and ar (the speedups' baseline)
    always, any other registered method optionally."""
    known, base = decoding_methods.names(), decoding_methods.baseline().name
    methods = tuple(dict.fromkeys(methods))
    bad = [m for m in methods if m not in known]
    if bad or base not in methods or "dart" not in methods:
        raise ValueError(f"--methods takes a comma list of {', '.join(known)} that names dart and {base}, got "
                         f"{','.join(methods)!r}")
    return methods


def run_e2e(models: ModelSet, work: Workload, *, reps: int = 1, warmup: int = 1, seed: int = 0,
            show_progress: bool = True, methods=("dart", "ar"), probe=None) -> dict[str, Any]:
    """Tokens/s of each method (DART, EAGLE-3, autoregressive decoding) per prompt (wall clock,
    prefill included), each speculative method's speedup over "ar", τ and DART's accepted-length
    histogram; medians over `reps` after `warmup` runs. Rows keep `dart_tok_s`, `ar_tok_s`,
    `speedup`, `tau`, `same_output` for DART and add `<method>_tok_s`, `<method>_speedup`,
    `<method>_tau`, `<method>_same` for the others. `probe(model)`, when given, is called on the
    open model after the runs; its dict goes into the summary under "probe"."""
    check_reps(reps, warmup)
    methods = check_methods(methods)
    if "eagle3" in methods and models.eagle3 is None and not models.shipped_eagle3():
        models = dataclasses.replace(models, eagle3="random")
    items, settings = work.items(), work.settings(seed)
    kwargs = {**dataclasses.asdict(settings), "chat": work.chat}
    rows = []
    drafted = {name: {"hist": Counter(), "steps": 0, "tree_s": 0.0, "device_s": 0.0} for name in methods if name != "ar"}
    with open_model(models, seed) as (model, source):
        bar = progress(len(items) * len(methods) * (reps + warmup), "e2e", show_progress)
        for item in items:
            rates = {name: [] for name in methods}
            results = {}
            for name in methods:
                fn = functools.partial(model.generate, method=name)
                for _ in range(warmup):
                    fn(item["prompt"], **kwargs)
                    bar.update()
                for _ in range(reps):
                    t0 = time.perf_counter()
                    results[name] = fn(item["prompt"], **kwargs)
                    rates[name].append(len(results[name].token_ids) / (time.perf_counter() - t0))
                    bar.update()
            dart_res, ar_res = results["dart"], results["ar"]
            for name, acc in drafted.items():  # the last run's steps of each drafting method
                acc["hist"].update(results[name].accept_lengths)
                acc["steps"] += len(results[name].accept_lengths)
                acc["tree_s"] += float(results[name].stats.get("tree_s", 0.0))
                acc["device_s"] += float(results[name].stats.get("device_s", 0.0))
            dart_rate, ar_rate = median(rates["dart"]), median(rates["ar"])
            row = {"id": item["id"], "category": item["category"], "prompt_tokens": len(dart_res.prompt_ids),
                   "new_tokens": len(dart_res.token_ids), "steps": len(dart_res.accept_lengths),
                   "dart_tok_s": dart_rate, "ar_tok_s": ar_rate, "speedup": dart_rate / ar_rate,
                   "tau": _tau(dart_res), "same_output": dart_res.token_ids == ar_res.token_ids}
            for name in methods:
                if name not in ("dart", "ar"):
                    rate = median(rates[name])
                    row.update({f"{name}_tok_s": rate, f"{name}_speedup": rate / ar_rate, f"{name}_tau": _tau(results[name]),
                                f"{name}_steps": len(results[name].accept_lengths),
                                f"{name}_same": results[name].token_ids == ar_res.token_ids})
            rows.append(row)
        bar.close()
        keep = tree_label(model.engine)
        probed = probe(model) if probe is not None else None
    others = [m for m in methods if m not in ("dart", "ar")]
    per_category = {}
    for cat in dict.fromkeys(r["category"] for r in rows):
        per_category[cat] = _with_methods(_aggregate([r for r in rows if r["category"] == cat]),
                                          [r for r in rows if r["category"] == cat], others)
    summary = {**_with_methods(_aggregate(rows), rows, others), "per_category": per_category,
               "accept_hist": {str(k): int(v) for k, v in sorted(drafted["dart"]["hist"].items())},
               "drafting": {name: step_figures(acc) for name, acc in drafted.items()}}
    if probed is not None:
        summary["probe"] = probed
    config = {"model": source, "num_prompts": len(items), **work.config(seed), "keep": keep, "reps": reps,
              "warmup": warmup, "methods": ",".join(methods), "device_steps": models.device_steps,
              "verify_gemms": models.verify_gemms, "attention": models.attention}
    return {"mode": "e2e", "config": config, "rows": rows, "summary": summary}


def decode_pool(model: DartModel, prompts, settings: GenerationSettings) -> list:
    """DART on `prompts` together, in one pool of as many slots (`DartModel.batcher`) stepped by the
    driver → their finished requests (`token_ids`, `stats`)."""
    pool = model.batcher(len(prompts), settings.max_length)
    try:
        handles = [pool.submit(p, settings) for p in prompts]
        for _ in Driver(pool).run():
            pass
    finally:
        pool.close()
    return handles


def run_batch(models: ModelSet, work: Workload, *, batches=(1, 2, 4, 8, 16), reps: int = 1, warmup: int = 1,
              seed: int = 0, show_progress: bool = True) -> dict[str, Any]:
    """Tokens/s of DART (a continuous-batching pool of B slots) and of batched autoregressive
    decoding (one token step for all B sequences) on the same B prompts, for each batch size B:
    all new tokens over the wall time of the whole batch, medians over `reps` after `warmup` runs."""
    check_reps(reps, warmup)
    items, settings = work.items(), work.settings(seed)
    if min(batches) < 1:
        raise ValueError(f"--batches must be >= 1, got {list(batches)}")
    rows = []
    with open_model(models, seed) as (model, source):
        ids = [model.encode(item["prompt"], work.chat) for item in items]
        engine = model.engine
        bar = progress(len(batches) * 2 * (reps + warmup), "batch", show_progress)
        for b in batches:
            prompts = [ids[i % len(ids)] for i in range(b)]
            rates, outputs, taus = {"dart": [], "ar": []}, {}, []

            def dart():
                handles = decode_pool(model, prompts, settings)
                taus.append(float(np.mean([t for h in handles for t in h.stats.accept_lengths] or [float("nan")])))
                return [list(h.token_ids) for h in handles]

            def ar():
                return decode_together(engine, prompts, [settings] * b, plain=True)

            for name, fn in (("dart", dart), ("ar", ar)):
                for _ in range(warmup):
                    fn()
                    bar.update()
                for _ in range(reps):
                    t0 = time.perf_counter()
                    outputs[name] = fn()
                    rates[name].append(sum(len(o) for o in outputs[name]) / (time.perf_counter() - t0))
                    bar.update()
            dart_rate, ar_rate = median(rates["dart"]), median(rates["ar"])
            rows.append({"batch": b, "new_tokens": sum(len(o) for o in outputs["dart"]), "dart_tok_s": dart_rate,
                         "ar_tok_s": ar_rate, "speedup": dart_rate / ar_rate, "tau": taus[-1],
                         "same_output": outputs["dart"] == outputs["ar"]})
        bar.close()
    summary = {"speedup": {str(r["batch"]): r["speedup"] for r in rows},
               "all_same_output": all(r["same_output"] for r in rows)}
    config = {"model": source, "num_prompts": len(items), **work.config(seed), "batches": list(batches),
              "keep": tree_label(model.engine), "reps": reps, "warmup": warmup}
    return {"mode": "batch", "config": config, "rows": rows, "summary": summary}


def step_figures(acc: dict[str, Any]) -> dict[str, Any]:
    """A drafting method's steps over a run: accepted-length histogram (drafted tokens + the
    target's own), acceptance per depth (the share of steps that accept a k-th drafted token
    among those that accepted k − 1), and the host tree search and device time per step."""
    hist, steps = acc["hist"], acc["steps"]
    reached = [sum(v for length, v in hist.items() if length - 1 >= k) for k in range(max(hist or [1]))]
    per_depth = [reached[k] / reached[k - 1] for k in range(1, len(reached)) if reached[k - 1]]
    return {"steps": steps, "accept_hist": {str(k): int(v) for k, v in sorted(hist.items())},
            "accept_per_depth": per_depth,
            "tree_ms_per_step": 1e3 * acc["tree_s"] / steps if steps else float("nan"),
            "device_ms_per_step": 1e3 * acc["device_s"] / steps if steps else float("nan")}


def _tau(result) -> float:
    return float(np.mean(result.accept_lengths)) if result.accept_lengths else float("nan")


def _with_methods(summary: dict[str, Any], rows: list[dict[str, Any]], methods: list[str]) -> dict[str, Any]:
    """`summary` with the medians of each other method's tokens/s and speedup and its τ over all steps."""
    for m in methods:
        steps = sum(r[f"{m}_steps"] for r in rows)
        summary.update({f"{m}_tok_s": median([r[f"{m}_tok_s"] for r in rows]),
                        f"{m}_speedup": median([r[f"{m}_speedup"] for r in rows]),
                        f"{m}_tau": sum(r[f"{m}_tau"] * r[f"{m}_steps"] for r in rows if r[f"{m}_steps"]) / steps
                        if steps else float("nan"),
                        f"{m}_all_same": all(r[f"{m}_same"] for r in rows)})
    return summary


def _aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    steps = sum(r["steps"] for r in rows)
    # τ over all steps of the set: tokens produced by speculative steps / steps
    tau = sum(r["tau"] * r["steps"] for r in rows if r["steps"]) / steps if steps else float("nan")
    return {"speedup": median([r["speedup"] for r in rows]), "dart_tok_s": median([r["dart_tok_s"] for r in rows]),
            "ar_tok_s": median([r["ar_tok_s"] for r in rows]), "tau": tau, "prompts": len(rows),
            "all_same_output": all(r["same_output"] for r in rows)}


def _transfer_ms(n_values: int, reps: int) -> float:
    """Median time to copy `n_values` int32 from the device to the host (what a step's top-k
    candidates and scores cost to fetch), measured on fresh, already computed arrays."""
    fresh = jax.jit(lambda x, i: x + i)
    src = jnp.zeros((1, n_values), jnp.int32)
    times = []
    for i in range(max(reps, 5)):
        x = jax.block_until_ready(fresh(src, i))
        t0 = time.perf_counter()
        np.asarray(x)
        times.append(time.perf_counter() - t0)
    return summary_ms(times)["median_ms"]


def run_phases(models: ModelSet, work: Workload, *, reps: int = 1, warmup: int = 1, seed: int = 0,
               show_progress: bool = True) -> dict[str, Any]:
    """Per-step phase times of DART generations, as medians and shares of the step time.

    The engine accounts each step's tree search and device call (dispatch, verify, compaction,
    draft, and the fetch of the packed result); the fetch of the top-k draft candidates is timed
    apart on an array of the same size and taken out of the device time. Host overhead is the rest
    of the step's wall time (packing, bookkeeping, the Python loop).
    """
    check_reps(reps, warmup)
    items, settings = work.items(), work.settings(seed)
    per_step = {p: [] for p in PHASES}
    step_ms, prefill_ms = [], []
    with open_model(models, seed) as (model, source):
        engine = model.engine
        topk_ms = _transfer_ms(2 * engine.depth * engine.tree.topk, reps=20)
        bar = progress(len(items) * (reps + warmup), "phases", show_progress)
        for item in items:
            ids = model.encode(item["prompt"], work.chat)
            for _ in range(warmup):
                for _ in decode(engine, ids, settings):
                    pass
                bar.update()
            for _ in range(reps):
                stats = Stats()
                steps = decode(engine, ids, settings, stats)
                next(steps)  # the prefill's token
                prefill_ms.append(stats.prefill_s * 1e3)
                while True:
                    tree0, device0 = stats.tree_s, stats.device_s
                    t0 = time.perf_counter()
                    if next(steps, None) is None:
                        break
                    wall = (time.perf_counter() - t0) * 1e3
                    tree, device = (stats.tree_s - tree0) * 1e3, (stats.device_s - device0) * 1e3
                    transfer = min(topk_ms, device)
                    per_step["verify_draft_device"].append(device - transfer)
                    per_step["topk_transfer"].append(transfer)
                    per_step["tree_search"].append(tree)
                    per_step["host_overhead"].append(max(wall - device - tree, 0.0))
                    step_ms.append(wall)
                bar.update()
        bar.close()
        keep = tree_label(engine)
    if not step_ms:
        raise ValueError("no decoding step ran (every generation stopped at its first token); "
                         "raise --max-new-tokens or use other prompts")
    total = sum(sum(v) for v in per_step.values())
    rows = [{"phase": p, "median_ms": median(per_step[p]), "share": sum(per_step[p]) / total} for p in PHASES]
    rows.append({"phase": "step_total", "median_ms": median(step_ms), "share": 1.0})
    summary = {"steps": len(step_ms), "step_ms": median(step_ms), "prefill_ms": median(prefill_ms),
               "topk_transfer_ms": topk_ms, "shares": {r["phase"]: r["share"] for r in rows[:-1]}}
    config = {"model": source, "num_prompts": len(items), **work.config(seed), "keep": keep, "reps": reps,
              "warmup": warmup}
    return {"mode": "phases", "config": config, "rows": rows, "summary": summary}

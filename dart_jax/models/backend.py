"""The one place that decides how dart_jax runs on a backend: `BackendDefaults`, the choices that
depend on the device (attention kernel, GEMM choice, weight layout, device loop, tree size), and
`defaults_for(backend)`, the fastest known path per backend (benchmarks/RESULTS.md). Every
option of `DartModel.from_pretrained` and the loaders that is None takes its value from here;
one that is given overrides it (`BackendDefaults.override`).

It lives in `models` because the loaders lay a model out with it (fused projections, an untied
LM head); the engine's choices (device loop, tree size) are plain values here, read above."""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp

from dart_jax.errors import InputError
from dart_jax.files import compile_cache_dir

# the reference's draft tree size (nodes besides the root)
REFERENCE_KEEP = 60
# DART steps a device call on an accelerator: the device loop of 32 steps beat the host loop and
# smaller loops at the Qwen3-8B shape on an H200 (benchmarks/RESULTS.md)
ACCELERATOR_DEVICE_STEPS = 32
# The most DART steps a device call may take. Its answer holds device_steps x (depth + 1) token
# ids per sequence, allocated whether the steps run or not, and the host sees none of them (no
# streaming, no stop string, no freed slot) before the call ends; every step commits at least one
# token, so a call never takes more steps than its sequences have tokens: twice the default
# max_length (2048) is more than any call can use.
MAX_DEVICE_STEPS = 4096
# XLA:CPU's option naming the fusions it hands to YNNPACK, with the value that hands it none
CPU_NO_YNN_FUSIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BackendDefaults:
    """The backend choices of one model (None in an option means: this object's value).

    attention: how the target attends over its cache (`Qwen3.use_attention`).
    verify_gemms: which GEMMs a GPU compiles a tree verification with (`qwen3.verify_compiler_options`).
    fused_projections: each layer's q/k/v and gate/up kernels fused into one matmul each (`Qwen3.fuse_projections`).
    untied_lm_head: a tied embedding copied into an [H, V] LM head (`Qwen3.untie_lm_head`).
    device_steps: DART steps a device call, the trees searched on the device (0: the host loop).
    keep: the draft tree size, an integer or "auto" (chosen per step by measured speed).
    """

    backend: str
    attention: str = "xla"
    verify_gemms: str = "auto"
    fused_projections: bool = False
    untied_lm_head: bool = False
    device_steps: int = 0
    keep: int | str = "auto"

    def override(self, **given) -> "BackendDefaults":
        """These defaults with every option in `given` that is not None put in their place."""
        unknown = sorted(set(given) - {f.name for f in dataclasses.fields(self)} - {"backend"})
        if unknown:
            raise InputError(f"unknown backend option(s) {unknown}; valid: "
                             f"{[f.name for f in dataclasses.fields(self) if f.name != 'backend']}.")
        steps = given.get("device_steps")
        if steps is not None and not (isinstance(steps, int) and not isinstance(steps, bool)
                                      and 0 <= steps <= MAX_DEVICE_STEPS):
            raise InputError(f"device_steps (--device-steps) must be an integer in [0, {MAX_DEVICE_STEPS}] (0: a host "
                             f"call per step), got {steps!r}.")
        return dataclasses.replace(self, **{k: v for k, v in given.items() if v is not None})


def current_backend() -> str:
    """The backend JAX runs on ("cpu", "gpu", "tpu"): the one function that asks (tests fake it)."""
    return jax.default_backend()


def defaults_for(backend: str | None = None) -> BackendDefaults:
    """The defaults on `backend` (None: `current_backend()`). On a GPU or a TPU: the device loop of
    ACCELERATOR_DEVICE_STEPS steps a call over the reference's fixed tree of REFERENCE_KEEP nodes,
    fused projections, the GEMM choice "auto". On a CPU (and any other backend): the host loop with
    keep "auto" (the SmolLM2 demo fixes its own CPU tree, `api.model.demo_options`), the layout the
    loaders give it, and an untied LM head (XLA:CPU multiplies a tree's rows by an [H, V] head
    faster than by the [V, H] embedding)."""
    backend = backend or current_backend()
    if backend in ("gpu", "tpu"):
        return BackendDefaults(backend, fused_projections=True, device_steps=ACCELERATOR_DEVICE_STEPS,
                               keep=REFERENCE_KEEP)
    return BackendDefaults(backend, untied_lm_head=backend == "cpu")


def program_compiler_options() -> dict[str, object] | None:
    """The XLA options every decoding program compiles with on this backend, None for XLA's own.
    On a CPU, no fusion goes to YNNPACK (`CPU_NO_YNN_FUSIONS`): a program whose matrix products
    YNNPACK runs spends a long first call setting them up after it loads (every program of a new
    process: a prefill's first answer waits for it), while XLA's own kernels decode as fast and
    compile quicker; a prefill chunk's products of many rows run somewhat slower
    (benchmarks/RESULTS.md). An XLA without that option (older than YNNPACK on the CPU) keeps its
    defaults. A tree verification's options on a GPU come on top (`qwen3.verify_compiler_options`)."""
    if current_backend() != "cpu" or not _xla_knows_no_ynn():
        return None
    return dict(CPU_NO_YNN_FUSIONS)


@functools.cache
def _xla_knows_no_ynn() -> bool:
    """Whether this XLA compiles with `CPU_NO_YNN_FUSIONS`: one tiny program, once per process."""
    try:
        jax.jit(_same, compiler_options=CPU_NO_YNN_FUSIONS).lower(jax.ShapeDtypeStruct((), jnp.float32)).compile()
    except Exception as e:  # an option this XLA does not know: its own error, kept in the log
        log.info("XLA's defaults kept: this XLA refuses %s (%s)", CPU_NO_YNN_FUSIONS, e)
        return False
    return True


def _same(x):
    return x


def use_compile_cache(path: str | os.PathLike | None = None) -> Path | None:
    """Keep compiled programs on disk: JAX's persistent compilation cache, so that a later process
    (or a later shape bucket in this one, compiled before) loads an executable instead of compiling
    it. Every entry point calls it: `DartModel` (the Python API, notebooks, the server and the
    generate command), the trainer and the benchmarks. The folder is `path`, else the one already
    set (`jax_compilation_cache_dir`, e.g. JAX's JAX_COMPILATION_CACHE_DIR), else
    `compile_cache_dir()`. The one opt-out is JAX's own switch: JAX_ENABLE_COMPILATION_CACHE=false
    in the environment, or `jax.config.update("jax_enable_compilation_cache", False)` before the
    first model (the command lines' --no-compile-cache sets it). Returns the folder in use, or None
    (off, or, with a warning, a folder that cannot be created). Idempotent."""
    if not jax.config.jax_enable_compilation_cache:
        return None
    current = jax.config.jax_compilation_cache_dir
    if path is None and current:
        return Path(current)
    folder = Path(path) if path is not None else compile_cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        warnings.warn(f"no compilation cache: cannot create {folder} ({e.strerror}); every run compiles again. "
                      "Set XDG_CACHE_HOME to a writable folder, or turn the cache off with "
                      "JAX_ENABLE_COMPILATION_CACHE=false.", stacklevel=2)
        return None
    jax.config.update("jax_compilation_cache_dir", str(folder))
    # the steps and their helpers (which add up to seconds on a CPU), not every eager operation
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    return folder


def no_compile_cache() -> None:
    """The command lines' --no-compile-cache: JAX's persistent cache off for this process."""
    jax.config.update("jax_enable_compilation_cache", False)

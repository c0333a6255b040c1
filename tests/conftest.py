import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The oracles' torch runs one thread per process: the suite runs one pytest worker per core (and
# subprocesses beside them), and torch's OpenMP threads spin-waiting for a core another process
# holds made SmolLM2's transformers `generate` 30x slower (60 s for 32 tokens on a loaded 2-core
# machine, 2 s with one thread). Set before torch is imported (subprocesses inherit it).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The suite compiles hundreds of small programs and runs each on tiny shapes: less LLVM optimisation
# makes compiling about a third faster (subprocesses inherit it); the results are the same.
_FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FAST_COMPILE).strip()

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

# One persistent XLA compilation cache for the whole run, shared by the xdist workers (they inherit
# the variable from the controller, which imports this file first): the tiny models' programs are
# the same in every worker and module, so each compiles once. Compile counters count its hits.
_XLA_CACHE = os.environ.setdefault("DART_JAX_TEST_XLA_CACHE", tempfile.mkdtemp(prefix="dart_jax_test_xla_"))
jax.config.update("jax_compilation_cache_dir", _XLA_CACHE)
_MIN_CACHED_SECS = 0.2
jax.config.update("jax_persistent_cache_min_compile_time_secs", _MIN_CACHED_SECS)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


# Programs compiled by the modules that run training steps are not written to that cache. In full
# parallel runs, xdist workers that had run hundreds of tests died inside XLA while writing
# (test_train_eagle3's steps, four times; that module now runs its training tests in processes of
# their own) or reading (a DART training step, once) such an entry; the same tests pass alone, and
# nothing else ever failed there. Those modules' programs compile in memory (a few seconds each),
# every other module keeps sharing the cache.
_UNCACHED = ("test_train_loop", "test_train_taps", "test_train_cli", "test_multihost", "test_sharding")


@pytest.fixture(autouse=True, scope="module")
def _training_programs_stay_out_of_the_cache(request):
    name = request.module.__name__.rpartition(".")[2]
    if name not in _UNCACHED:
        yield
        return
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1e9)
    try:
        yield
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", _MIN_CACHED_SECS)


@pytest.fixture(autouse=True, scope="module")
def _exported_programs_kept_apart(request, tmp_path_factory):
    # The store of exported programs (dart_jax.decoding.exported) is off in the suite: a test that
    # patches a function inside a program would read back the program stored before the patch. A
    # module that sets EXPORTED_PROGRAMS = True gets a store of its own, and its programs jitted
    # anew, so that they go through it.
    from dart_jax.decoding import autoregressive, exported

    where = tmp_path_factory.mktemp("exported") if getattr(request.module, "EXPORTED_PROGRAMS", False) else None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(exported, "folder", lambda: where)
        if where is not None:
            autoregressive._JITTED.clear()
        yield


@pytest.fixture(autouse=True)
def _compile_cache_switch_restored():
    # a command run in-process with --no-compile-cache turns JAX's cache switch off, as it does for a
    # user's process; the next tests of this worker get it back
    enabled = jax.config.jax_enable_compilation_cache
    yield
    if jax.config.jax_enable_compilation_cache != enabled:
        jax.config.update("jax_enable_compilation_cache", enabled)


def pytest_sessionfinish(session, exitstatus):
    if not hasattr(session.config, "workerinput"):  # the controller (or a run without xdist) cleans up
        shutil.rmtree(_XLA_CACHE, ignore_errors=True)

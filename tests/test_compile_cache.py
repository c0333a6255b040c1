"""The persistent compilation cache is on for the Python API by default: a second process's
`DartModel.demo(...).generate(...)` loads the decoding programs the first one compiled (and reads
them back from the store of exported programs beside it instead of tracing them, also plain
decoding's), JAX's own switch turns it off, and the model says when it compiles. Each run is a new Python process (JAX
decides once per process whether it uses the cache); JAX's compiler log says, per program, whether
it was a hit or a miss of the persistent cache: the oracle is JAX's, not ours."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# one worker runs both tests of the `runs` fixture (two processes that compile the tiny model)
pytestmark = pytest.mark.xdist_group("compile_cache")

# the child: JAX's compiler log at DEBUG names each program looked up in the persistent cache
CHILD = r"""
import json, logging, sys
hits, misses = [], []

class Seen(logging.Handler):
    def emit(self, record):
        text = record.getMessage()
        name = text.split("'")[1] if "'" in text else ""
        if text.startswith("Persistent compilation cache hit"):
            hits.append(name)
        elif text.startswith("PERSISTENT COMPILATION CACHE MISS"):
            misses.append(name)

log = logging.getLogger("jax._src.compiler")
log.setLevel(logging.DEBUG)
log.addHandler(Seen())
import functools
import jax
from dart_jax.api import compiling
from dart_jax.api.model import DartModel
from dart_jax.decoding import autoregressive, engine
compiling.API_NOTICE_AFTER = 0.0  # say every compilation, however short (the tiny model's are)
traced = []  # the programs whose Python body ran: traced, not read from the store

def counted(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        traced.append(fn.__name__)
        return fn(*args, **kwargs)
    return run

import dataclasses
for owner in (engine.Engine, autoregressive.AutoregressiveDecoder):  # every program is a row of its table
    owner.PROGRAMS = tuple(dataclasses.replace(spec, fn=counted(spec.fn)) for spec in owner.PROGRAMS)
model = DartModel.demo("tiny", keep=4)
prompt = "What is speculative decoding?"
ids = model.generate(prompt, max_new_tokens=6).token_ids
plain = model.generate(prompt, max_new_tokens=6, method="ar").token_ids
print(json.dumps({"hits": hits, "misses": misses, "ids": ids, "plain": plain, "traced": traced,
                  "dir": jax.config.jax_compilation_cache_dir}))
"""

# the engine's programs that the first answer runs (jit names the module after the function)
PROGRAMS = ("jit__prefill", "jit__step")


def _run(tmp_path, **env) -> tuple[dict, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    environ.update(XDG_CACHE_HOME=str(tmp_path), **env)
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600, env=environ)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("xdg")
    first, first_err = _run(tmp)
    second, _ = _run(tmp)
    return tmp, first, first_err, second


@pytest.mark.extended
def test_a_second_process_loads_the_programs_the_first_compiled(runs):
    tmp, first, _, second = runs
    folder = tmp / "dart_jax" / "xla"
    assert first["dir"] == second["dir"] == str(folder) and any(folder.iterdir())
    for program in PROGRAMS:
        assert any(name.startswith(program) for name in first["misses"]), (program, first["misses"])
        assert any(name.startswith(program) for name in second["hits"]), (program, second["hits"])
        assert not any(name.startswith(program) for name in second["misses"]), (program, second["misses"])
    assert second["ids"] == first["ids"]


@pytest.mark.extended
def test_a_second_process_reads_the_programs_the_first_exported_instead_of_tracing_them(runs):
    tmp, first, _, second = runs
    assert sorted(set(first["traced"])) == ["_decode_chunk", "_prefill", "_prefill_rows", "_step"], first["traced"]
    assert any((tmp / "dart_jax" / "xla" / "exported").glob("*.jaxexp"))
    assert second["traced"] == []
    assert second["ids"] == first["ids"] == first["plain"] == second["plain"]  # greedy DART is plain decoding


@pytest.mark.extended
def test_the_model_says_what_it_compiles(runs):
    tmp, _, first_err, _ = runs
    assert f"kept in {tmp / 'dart_jax' / 'xla'} for later runs" in first_err
    closing = [line for line in first_err.replace("\r", "\n").splitlines() if line.startswith("compiled ")]
    assert any("the DART prefill" in line and line.endswith(" s") for line in closing), closing


# the child with the cache switched off: JAX's switch, before anything compiles
OFF = r"""
import json, logging
looked_up = []
logging.getLogger("jax._src.compiler").setLevel(logging.DEBUG)
logging.getLogger("jax._src.compiler").addHandler(type("H", (logging.Handler,), {
    "emit": lambda self, r: looked_up.append(r.getMessage()) if "ersistent" in r.getMessage().lower() else None})())
import jax, jax.numpy as jnp
from dart_jax.api.compiling import use_compile_cache
folder = use_compile_cache()
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.jit(lambda x: jnp.cumsum(x) * 2)(jnp.arange(9.0)).block_until_ready()
print(json.dumps({"folder": None if folder is None else str(folder), "looked_up": looked_up}))
"""


@pytest.mark.parametrize("switch", ["false", "true"])
def test_jax_switch_turns_the_cache_off(tmp_path, switch):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    environ.update(XDG_CACHE_HOME=str(tmp_path), JAX_ENABLE_COMPILATION_CACHE=switch)
    done = subprocess.run([sys.executable, "-c", OFF], capture_output=True, text=True, timeout=300, env=environ)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    folder = tmp_path / "dart_jax" / "xla"
    if switch == "false":
        assert seen == {"folder": None, "looked_up": []} and not folder.exists()
    else:  # the same child with the switch on: the program is looked up in (and written to) our folder
        assert seen["folder"] == str(folder) and seen["looked_up"] and any(folder.iterdir())

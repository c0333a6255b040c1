"""Run a test in a pytest process of its own, as a user runs a command: a fresh process, its
programs compiled in memory only (no persistent XLA cache), nothing of the suite's other tests
in it.

In full parallel runs an xdist worker that had already run hundreds of tests died inside XLA
(SIGSEGV or abort while compiling or serialising a program of test_train_eagle3.py's training
and decoding, four times); the same tests pass in a process of their own. A test that needs
that isolation starts with `if in_own_process(request): return`: in the suite's process this
runs the test again in a child pytest and asserts that it passed (its output is in the failure
message); in the child it returns False and the test runs. Fixtures that do the heavy work are
then asked for with `request.getfixturevalue` after that line, so that only the child runs them.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_CHILD = "DART_JAX_TEST_OWN_PROCESS"
_ROOT = Path(__file__).resolve().parents[1]


def in_own_process(request, timeout: float = 1200) -> bool:
    """True once the test has passed in a child pytest (the caller returns); False in that child."""
    nodeid = request.node.nodeid
    if os.environ.get(_CHILD) == nodeid:
        return False
    env = {k: v for k, v in os.environ.items() if k != "DART_JAX_TEST_XLA_CACHE"}  # the child's own, removed after it
    env.update({_CHILD: nodeid, "JAX_ENABLE_COMPILATION_CACHE": "false", "JAX_PLATFORMS": "cpu"})
    # -m "": the node runs whatever its marks (the default run leaves out `slow` and `extended` ones)
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-m", "", nodeid]
    done = subprocess.run(cmd, cwd=_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (f"{nodeid} failed in a process of its own (exit {done.returncode}):\n"
                                  f"{done.stdout[-8000:]}\n{done.stderr[-4000:]}")
    return True

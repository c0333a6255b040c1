"""The bad-input audit of issue 42 (scripts/audit_bad_inputs.py), a few cases per family: every
one a clear error or a checked recovery, none a traceback, 5xx, hang, lost input or silent success."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "audit_bad_inputs.py"


@pytest.mark.extended
def test_the_quick_audit_finds_nothing():
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = re.search(r"(\d+) cases in \d+ s: clear (\d+), recovered (\d+), traceback 0, 5xx 0, hang 0, "
                        r"data lost 0, no auth 0, silent 0", done.stdout)
    assert summary, done.stdout[-2000:]
    cases, clear, recovered = map(int, summary.groups())
    assert cases == clear + recovered and cases >= 25
    families = set(re.findall(r"^  (\S.*?)\s{2,}", done.stdout, flags=re.M))
    assert families >= {"cli generate", "cli serve", "cli launch", "cli convert", "cli ngram", "cli train", "cli bench",
                        "gguf", "converted cache", "heads", "tries", "python api", "http (key)", "http (no key)"}, families

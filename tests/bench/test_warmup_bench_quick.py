"""`python -m bench.warmup --quick` runs end to end: every row, the warm-up counted in.

Speed is measured by the bench, never asserted here.
"""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_warmup_bench_quick_runs(tmp_path):
    result = subprocess.run([sys.executable, "-m", "bench.warmup", "--quick", "--data-dir",
                             str(tmp_path / "data")], cwd=REPO, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")][2:]
    assert [row.split("|")[1].strip() for row in rows] == [
        "ext4-1", "dlfs-cold", "dlfs-warm-first", "dlfs-warm-on-read"]
    warm_first = rows[2].split("|")
    total, warm = float(warm_first[2].split("/")[1]), float(warm_first[3])
    assert 0 < warm <= total  # the warm-up is part of the epoch time, never left out

"""`python -m bench.dlio_mount --quick` runs the real DLIO benchmark end to end, from ext4
and through the mount, and reports every epoch of every case.

Speed is measured by the bench, never asserted here.  Needs DLIO in its own
virtualenv (DLFS_TEST_DLIO_PYTHON, as tests/training/test_dlio.py) and FUSE.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dlfs.tools.launch import fuse_unavailable

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DLIO_PYTHON = os.environ.get("DLFS_TEST_DLIO_PYTHON", "")

pytestmark = [
    pytest.mark.dlio, pytest.mark.mount,
    pytest.mark.skipif(not DLIO_PYTHON, reason="set DLFS_TEST_DLIO_PYTHON to a Python with "
                       "dlio_benchmark installed (docs/training.md; DLFS_WITH_DLIO=1 ./dev test)"),
    pytest.mark.skipif(bool(fuse_unavailable()), reason=f"FUSE: {fuse_unavailable()}"),
]


@pytest.mark.timeout(900)
def test_quick_dlio_benchmark_reports_every_case_and_epoch(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "bench.dlio_mount", "--quick", "--dlio-python", DLIO_PYTHON,
         "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "out")],
        cwd=REPO, capture_output=True, text=True, timeout=880)
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [line.split("|") for line in result.stdout.splitlines()
            if line.startswith("| ") and "x |" in line]
    assert [(r[1].strip(), r[3].strip()) for r in rows] == [
        (case, epoch) for case in ("resnet50", "unet3d", "resnet50-over-budget")
        for epoch in ("1", "2")]
    with open(tmp_path / "out" / "dlio_mount.json") as f:
        results = json.load(f)
    for case in results["cases"]:
        for run in case["ext4"] + case["mount"]:
            assert len(run["samples_per_s"]) == 2 and min(run["samples_per_s"]) > 0
        for run in case["mount"]:
            assert run["requests"]["read"] > 0  # DLIO read through the mount
            # The warm-up ran, and stopped at the budget where the data exceeds it.
            assert run["warm"]["state"] == ("partial" if "warm_budget_bytes" in case
                                            else "warm")

"""`python -m bench.gpu_train --quick` runs its CPU form end to end and reports every row.

Speed is measured in bench/, never asserted here: this checks that the
harness runs on tiny data and that its JSON holds a figure for every row.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(180)
def test_quick_gpu_training_benchmark_reports_every_row(tmp_path):
    out = tmp_path / "gpu_train.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu_train", "--quick", "--data-dir", str(tmp_path / "data"),
         "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "| feed | images/s |" in proc.stdout
    with open(out) as f:
        report = json.load(f)
    rows = [r["row"] for r in report["results"]]
    assert rows == ["compute", "imagefolder-cpu", "dlfs-cpu", "dlfs-gpu"]
    for row in report["results"]:
        assert row["images"] == report["plan"]["steps"] * report["plan"]["batch_size"]
        assert row["images_per_s"] > 0 and row["utilisation"] > 0
    assert report["results"][0]["utilisation"] == 1.0
    assert report["results"][-1]["note"] == "decoder pillow"

"""`python -m bench.train_bench --quick` runs end to end and reports every loader.

Utilisation is measured in bench/, never asserted here: this only checks that
the harness runs on tiny data and that its JSON holds a number for every
loader, cold and warm, and the hint comparison.
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
def test_quick_training_benchmark_reports_every_loader(tmp_path):
    out = tmp_path / "train.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.train_bench", "--quick", "--samples", "512",
         "--compute-ms", "8", "--data-dir", str(tmp_path / "data"), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "| compute ms/batch" in proc.stdout and "Clairvoyant prefetch" in proc.stdout
    with open(out) as f:
        report = json.load(f)
    loaders = set(report["plan"]["loaders"])
    assert {"ext4-folder", "dlfs-readahead-direct"} <= loaders
    main_rows = {(r["loader"], r["cache"]) for r in report["results"]
                 if r["compute_ms"] == 8 and not r["variant"]}
    assert main_rows == {(loader, cache) for loader in loaders for cache in ("cold", "warm")}
    for row in report["results"]:
        assert row["samples"] == 512 and 0 < row["utilisation"] <= 1.0

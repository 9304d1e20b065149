"""`./dev bench --workloads dataloader --quick` (python -m bench): the README's first
DataLoader example (ReadAhead) and its example with a transform in workers, against the
same loop over ext4 files, run end to end and report each, cold and warm, with the
ratios; the cold epochs are checked against the page cache.  Speed is measured in bench/, never asserted
here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(300)
def test_the_dataloader_workload_reports_dlfs_against_ext4(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench", "--workloads", "dataloader", "--quick",
                           "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=290)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(tmp_path / "dataloader-quick.json") as f:
        report = json.load(f)
    rows = {(r["loader"], r["cache"]): r for r in report["results"]}
    assert set(rows) == {(loader, cache) for loader in ("ext4-folder", "dlfs-first",
                                                        "dlfs-workers")
                         for cache in ("cold", "warm")}
    assert all(r["samples"] == 1536 and r["samples_per_s"] > 0 for r in rows.values())
    text = (tmp_path / "dataloader-quick.md").read_text()
    assert "reads: extents" in text  # the default on the daemon's host
    assert "checked against the page cache" in text
    assert [line.split(" | ")[0] for line in text.splitlines() if "x | >= 1.2x: " in line] == \
        ["| cold", "| warm"]

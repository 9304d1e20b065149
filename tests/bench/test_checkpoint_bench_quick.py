"""`python -m bench --quick --workloads checkpoint` runs end to end: every row measured
against a real daemon and ext4 on this disk, the results written and well formed."""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_checkpoint_rows_run_and_write_results(tmp_path):
    done = subprocess.run([sys.executable, "-m", "bench", "--quick", "--workloads", "checkpoint",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "checkpoint-quick.json") as f:
        result = json.load(f)
    assert set(result["gb_per_s"]) == {
        "ext4 torch.save + fsync", "dlfs client torch.save", "ext4 torch.load cold",
        "dlfs client torch.load cold", "DCP FileSystemWriter on ext4", "dlfs DCP writer",
        "DCP FileSystemReader cold", "dlfs DCP reader cold", "dlfs mount torch.save + fsync",
        "dlfs mount torch.load cold", "DCP FileSystemWriter through the mount",
        "DCP FileSystemReader through the mount cold"}
    assert all(rate > 0 for rate in result["gb_per_s"].values())
    assert result["daemon_cpu_s_per_gb_written"] > 0
    table = (tmp_path / "checkpoint-quick.md").read_text()
    assert "| dlfs client torch.save |" in table and "| dlfs DCP writer |" in table
    assert "async_save` blocks the caller" in table

"""bench/native_for.sh: the C exchange built for an interpreter the venv's setup did not
build it for (the GPU machine runs the project from src/ with its own python3.12 and
no compiler), placed where that interpreter's client finds it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_built_extension_is_the_one_the_client_uses(tmp_path):
    # The package as src/ has it, minus any build: only the script's may be found.
    shutil.copytree(os.path.join(REPO, "src", "dlfs"), tmp_path / "dlfs",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    transport = tmp_path / "dlfs" / "client" / "transport"
    done = subprocess.run(["bash", os.path.join(REPO, "bench", "native_for.sh"), sys.executable,
                           str(transport)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    built = done.stdout.strip()
    assert os.path.dirname(built) == str(transport) and os.path.isfile(built)
    probe = "from dlfs.client.transport import datapath_conn; print(datapath_conn.native.__file__)"
    used = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, cwd=tmp_path,
                          timeout=60)
    assert used.returncode == 0, used.stderr
    assert used.stdout.strip() == built


def test_it_says_how_to_call_it():
    done = subprocess.run(["bash", os.path.join(REPO, "bench", "native_for.sh")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    assert "usage: bash bench/native_for.sh PYTHON [OUTDIR]" in done.stderr

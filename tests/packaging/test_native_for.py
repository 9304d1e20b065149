"""bench/native_for.sh: the C exchange built for an interpreter the venv's setup did not
build it for (the GPU machine runs the project from src/ with its own python3.12 and
no compiler), placed where that interpreter's client finds it."""

from __future__ import annotations

import ast
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


def test_it_compiles_with_the_flags_setup_py_gives():
    """The script repeats setup.py's compile flags (the other interpreter may have no
    setuptools): they must not drift apart."""
    with open(os.path.join(REPO, "setup.py")) as f:
        tree = ast.parse(f.read())
    flags, libraries = (_setup_keyword(tree, name) for name in ("extra_compile_args", "libraries"))
    with open(os.path.join(REPO, "bench", "native_for.sh")) as f:
        command = " ".join(line.rstrip("\\\n") for line in f
                           if not line.startswith("#")).split()
    assert flags and all(flag in command for flag in flags), (flags, command)
    assert all(f"-l{library}" in command for library in libraries), (libraries, command)


def _setup_keyword(tree: ast.AST, name: str):
    """The literal value of keyword `name` in setup.py's Extension(...)."""
    return next(ast.literal_eval(keyword.value) for node in ast.walk(tree)
                if isinstance(node, ast.Call) for keyword in node.keywords if keyword.arg == name)

"""bench/native_for.sh: the C extensions built for an interpreter the venv's setup did not
build them for (the GPU machine runs the project from src/ with its own python3.12 and
no compiler), placed where that interpreter's client and daemon find them."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_built_extensions_are_the_ones_the_client_and_daemon_use(tmp_path):
    # The package as src/ has it, minus any build: only the script's may be found.
    shutil.copytree(os.path.join(REPO, "src", "dlfs"), tmp_path / "dlfs",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    done = subprocess.run(["bash", os.path.join(REPO, "bench", "native_for.sh"), sys.executable,
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    built = done.stdout.split()
    assert [os.path.dirname(path) for path in built] == [
        str(tmp_path / "dlfs" / "client" / "transport"), str(tmp_path / "dlfs" / "server" / "read")]
    assert all(os.path.isfile(path) for path in built)
    probe = ("from dlfs.client.transport import datapath_conn; "
             "from dlfs.server.read import mapped_sends; "
             "print(datapath_conn.native.__file__, mapped_sends.native.__file__)")
    used = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, cwd=tmp_path,
                          timeout=60)
    assert used.returncode == 0, used.stderr
    assert used.stdout.split() == built


@pytest.mark.daemons
def test_a_daemon_without_the_builds_says_it_sends_from_python_and_why(tmp_path):
    """Installed where no C compiler was found, the daemon works from its Python send and
    says so: in `dlfs status`, and as a warning in its log that says what to do."""
    shutil.copytree(os.path.join(REPO, "src", "dlfs"), tmp_path / "pkg" / "dlfs",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    from dlfs import Client
    from dlfs.tools.launch import DaemonProcess

    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    why = (f"Python (the C send is not built for Python {version} here: reinstall DLFS "
           "where a C compiler is found)")
    daemon = DaemonProcess(str(tmp_path / "data"), str(tmp_path / "daemon.log"),
                           ["--datapath-workers", "1"],
                           extra_env={"PYTHONPATH": str(tmp_path / "pkg")})
    with daemon, Client(daemon.address) as client:
        assert client.status().mapped_sends.endswith(f"; whole replies sent by {why}")
    with open(daemon.log_path) as f:
        log = f.read()
    assert f"cached samples sent from mapped extents: on; whole replies sent by {why}" in log
    assert "the daemon's C send is not built for this Python" in log
    assert "reinstall DLFS where a C compiler is found" in log


def test_it_says_how_to_call_it():
    done = subprocess.run(["bash", os.path.join(REPO, "bench", "native_for.sh")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    assert "usage: bash bench/native_for.sh PYTHON [SRCDIR]" in done.stderr


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
    """The literal value of keyword `name` in setup.py's first Extension(...) (a name
    bound to a literal list is looked up: both extensions share their flags)."""
    lists = {node.targets[0].id: ast.literal_eval(node.value) for node in ast.walk(tree)
             if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}
    value = next(keyword.value for node in ast.walk(tree) if isinstance(node, ast.Call)
                 for keyword in node.keywords if keyword.arg == name)
    return lists[value.id] if isinstance(value, ast.Name) else ast.literal_eval(value)

"""The wheel as a user gets it: built from this checkout, installed without -e into a fresh
virtualenv, then used: the version, the three commands, a daemon and the CLI talking, the
extras' messages, py.typed, mypy checking a small typed user script against it, and
the C exchange built into it (or, with no C compiler, left out of a wheel that still
works).

Slow for a unit test (a virtualenv and its packages: about 30 s here) and it needs the
package index (or pip's cache) for the dependencies, as `./dev setup` does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import dlfs
from dlfs.version import DISTRIBUTION

# They build the wheel and install it into new virtualenvs (minutes).
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What an sdist of the project holds: enough to build the wheel.
BUILD_INPUTS = ("pyproject.toml", "setup.py", "LICENSE", "README.md", "src")

USER_SCRIPT = '''
from dlfs import Client, Dataset, DatasetInfo, NotFound, request_id


def first_sample(address: str, name: str) -> bytes:
    with Client(address, reconnect_timeout_s=2.0) as client:
        infos: list[DatasetInfo] = client.dataset_infos()
        ds: Dataset = client.dataset(infos[0].name if infos else name)
        with request_id("typed-script"):
            try:
                return bytes(ds.get_batch([0])[0])
            except NotFound:
                return b""
'''

# Misuses a checker must catch: only possible when Client and Dataset are not Any.
MISUSED_SCRIPT = '''
from dlfs import Client

client = Client("127.0.0.1:7010")
count: int = client.datasets()
client.dataset(42)
'''


def run(*argv, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                          timeout=600, **kwargs)
    if check:
        assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
    return done


def build_wheel(root, env: dict | None = None) -> str:
    """The wheel's file name, built under `root` from a copy of the checkout's sources
    (without what an editable install built in place)."""
    source = root / "source"
    for name in BUILD_INPUTS:
        path = os.path.join(REPO, name)
        if os.path.isdir(path):
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns(
                "__pycache__", "*.egg-info", "*.so"))
        else:
            os.makedirs(source, exist_ok=True)
            shutil.copy(path, source / name)
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", root / "dist",
        source, env=env)
    [wheel] = os.listdir(root / "dist")
    # A platform wheel: it carries the C exchange (setup.py).
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert wheel.startswith(f"{DISTRIBUTION.replace('-', '_')}-{dlfs.__version__}-{tag}-{tag}-")
    return wheel


def wheel_files(path) -> list[str]:
    import zipfile

    with zipfile.ZipFile(path) as archive:
        return archive.namelist()


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(virtualenv dir, wheel path): the wheel built from a copy of the checkout and
    installed, without extras, into a new virtualenv."""
    root = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(root)
    venv = root / "venv"
    run(sys.executable, "-m", "venv", venv)
    run(venv / "bin" / "pip", "install", "--quiet", "-c", os.path.join(REPO, "constraints.txt"),
        root / "dist" / wheel)
    return venv, root / "dist" / wheel


def test_the_installed_package_is_the_wheel_with_its_metadata(installed, tmp_path):
    venv, _ = installed
    python = venv / "bin" / "python"
    where = run(python, "-c", "import dlfs; print(dlfs.__file__)", cwd=tmp_path).stdout.strip()
    assert where.startswith(str(venv)) and "site-packages" in where
    package = os.path.dirname(where)
    for name in ("py.typed", "__init__.pyi", "proto/dlfs.proto", "proto/dlfs_pb2.pyi"):
        assert os.path.isfile(os.path.join(package, name)), name
    metadata = run(python, "-c", textwrap.dedent(f"""
        import importlib.metadata as m
        meta = m.metadata({DISTRIBUTION!r})
        print(meta["Name"], meta["Version"], meta["License-Expression"])
        print(sorted(e.name for e in m.entry_points(group="console_scripts")
                     if e.dist.name == {DISTRIBUTION!r}))
        print(sorted(meta.get_all("Provides-Extra")))
        """), cwd=tmp_path).stdout.splitlines()
    assert metadata == [f"{DISTRIBUTION} {dlfs.__version__} Apache-2.0",
                        "['dlfs', 'dlfs-mount', 'dlfs-server']", "['fuse', 'test', 'torch']"]


def test_the_commands_run_from_the_wheel(installed, tmp_path):
    venv, _ = installed
    bin_dir = venv / "bin"
    assert run(bin_dir / "dlfs", "--version").stdout == f"dlfs {dlfs.__version__}\n"
    assert run(bin_dir / "dlfs-server", "--version").stdout == \
        f"dlfs-server {dlfs.__version__}\n"
    address_file = tmp_path / "address"
    server = subprocess.Popen([bin_dir / "dlfs-server", "--data-dir", tmp_path / "data",
                               "--listen", "127.0.0.1:0", "--address-file", address_file,
                               "--demo"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        from dlfs.tools.launch import wait_for_file

        wait_for_file(str(address_file), server, "dlfs-server", os.devnull)
        address = address_file.read_text().strip()
        listed = run(bin_dir / "dlfs", "datasets", "--server", address, "--json")
        assert '"name": "demo"' in listed.stdout
    finally:
        server.terminate()
        assert server.wait(60) == 0


def test_the_wheel_reads_batches_through_its_c_exchange(installed, tmp_path):
    venv, wheel = installed
    assert any(name.startswith("dlfs/client/transport/native_exchange.")
               and name.endswith(".so") for name in wheel_files(wheel))
    python = venv / "bin" / "python"
    probe = "from dlfs.client.transport import datapath_conn; print(datapath_conn.native)"
    assert "native_exchange" in run(python, "-c", probe, cwd=tmp_path).stdout
    assert run(python, "-c", probe, cwd=tmp_path,
               env={**os.environ, "DLFS_NATIVE": "0"}).stdout == "None\n"


def test_without_a_c_compiler_the_wheel_is_pure_python_and_works(tmp_path):
    """The C exchange is optional: a build that cannot compile it still makes a
    wheel, whose client reads with the Python exchange."""
    wheel = build_wheel(tmp_path, env={**os.environ, "CC": "/bin/false"})
    names = wheel_files(tmp_path / "dist" / wheel)
    assert "dlfs/client/transport/datapath_conn.py" in names
    assert not [name for name in names if name.endswith(".so")]
    unpacked = tmp_path / "unpacked"
    import zipfile

    with zipfile.ZipFile(tmp_path / "dist" / wheel) as archive:
        archive.extractall(unpacked)
    probe = ("import dlfs; from dlfs.client.transport import datapath_conn; "
             "print(dlfs.__file__); print(datapath_conn.native)")
    done = run(sys.executable, "-c", probe, cwd=tmp_path,
               env={**os.environ, "PYTHONPATH": str(unpacked)})
    assert done.stdout == f"{unpacked / 'dlfs' / '__init__.py'}\nNone\n"


def test_missing_extras_are_named(installed, tmp_path):
    venv, wheel = installed
    mount = run(venv / "bin" / "dlfs-mount", "127.0.0.1:7010", tmp_path, check=False)
    assert mount.returncode == 1
    assert mount.stderr == ("dlfs-mount: dlfs-mount needs trio, which is not installed; it "
                            "comes with the 'fuse' extra: pip install '.[fuse]' in a checkout "
                            f"of DLFS ({DISTRIBUTION} is not on the package index yet)\n")
    # The version needs no mount, so no extra.
    version = run(venv / "bin" / "dlfs-mount", "--version", check=False)
    assert (version.returncode, version.stdout) == (0, f"dlfs-mount {dlfs.__version__}\n")
    torch = run(venv / "bin" / "python", "-c", "import dlfs.torch", check=False, cwd=tmp_path)
    assert torch.returncode == 1
    assert torch.stderr.strip().endswith(
        "ModuleNotFoundError: dlfs.torch needs PyTorch, which is not installed; it comes with "
        "the 'torch' extra: pip install '.[torch]' in a checkout of DLFS "
        f"({DISTRIBUTION} is not on the package index yet)")
    # With the extra, the command is there.
    run(venv / "bin" / "pip", "install", "--quiet", "-c", os.path.join(REPO, "constraints.txt"),
        f"{wheel}[fuse]")
    assert run(venv / "bin" / "dlfs-mount", "--version").stdout == \
        f"dlfs-mount {dlfs.__version__}\n"


def test_mypy_checks_a_user_script_against_the_installed_types(installed, tmp_path):
    venv, _ = installed
    (tmp_path / "user.py").write_text(USER_SCRIPT)
    (tmp_path / "misused.py").write_text(MISUSED_SCRIPT)
    mypy = [sys.executable, "-m", "mypy", "--python-executable", venv / "bin" / "python",
            "--no-incremental", "--strict"]
    good = run(*mypy, "user.py", cwd=tmp_path, check=False)
    assert good.returncode == 0, good.stdout
    assert good.stdout.startswith("Success: no issues found")
    bad = run(*mypy, "misused.py", cwd=tmp_path, check=False)
    assert bad.returncode == 1
    assert 'misused.py:5: error: Incompatible types in assignment (expression has type ' \
           '"list[str]", variable has type "int")' in bad.stdout
    assert 'misused.py:6: error: Argument 1 to "dataset" of "Client" has incompatible type ' \
           '"int"; expected "str"' in bad.stdout

"""`dlfs ingest` of a tree with files and directories it may not read, run as a user
runs it: the command without the capabilities that let root read everything
(CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), so mode 000 means what it means to a user.

Without --skip-unreadable: one line on stderr, PermissionDenied, exit 1; an
unreadable directory stops it before anything is sent, an unreadable file
when its turn comes, with the files before it parked for the same command
with --resume.  With it: left out, and counted in the "skipped:" line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from helpers.daemons import read_dataset
from helpers.trees import write_tree
from dlfs import Client

SETPRIV = shutil.which("setpriv")
pytestmark = pytest.mark.skipif(SETPRIV is None or os.geteuid() != 0,
                                reason="needs root and setpriv (util-linux)")

# What makes root a user as far as file permissions go.
WITHOUT_DAC = [SETPRIV or "setpriv", "--inh-caps=-all",
               "--bounding-set=-dac_override,-dac_read_search"]

FILES = {"a/1.bin": b"one", "b/2.bin": b"two", "b/secret.bin": b"no", "c/3.bin": b"three",
         "locked/4.bin": b"four", "z.bin": b"zed"}


def as_user(address: str, *argv: str) -> subprocess.CompletedProcess:
    """`dlfs --server ADDRESS ARGV...` without the capabilities that bypass permissions."""
    return subprocess.run([*WITHOUT_DAC, sys.executable, "-m", "dlfs.cli", "--server", address,
                           *argv], capture_output=True, text=True, timeout=120)


def one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "src"
    write_tree(root, FILES)
    os.chmod(root / "b/secret.bin", 0)
    os.chmod(root / "locked", 0)
    yield root
    os.chmod(root / "locked", 0o755)  # so that pytest can remove it


def test_the_test_really_drops_the_capabilities(tree):
    denied = subprocess.run([*WITHOUT_DAC, "cat", str(tree / "b/secret.bin")],
                            capture_output=True, text=True)
    assert denied.returncode == 1 and "Permission denied" in denied.stderr


def test_an_unreadable_directory_is_one_line_and_nothing_is_sent(daemon, tree):
    done = as_user(daemon.address, "ingest", str(tree), "ds")
    assert done.returncode == 1
    assert one_line(done.stderr) == (
        f"dlfs: PermissionDenied: cannot list directory '{tree}/locked': permission denied; "
        "fix its permissions, or pass --skip-unreadable to leave out what cannot be read")
    with Client(daemon.address) as client:
        assert client.dataset_infos() == []


def test_an_unreadable_source_directory_is_one_line(daemon, tree):
    os.chmod(tree, 0)
    try:
        for options in ([], ["--skip-unreadable"]):
            done = as_user(daemon.address, "ingest", str(tree), "ds", *options)
            assert done.returncode == 1
            assert one_line(done.stderr).startswith(
                f"dlfs: PermissionDenied: cannot list the source directory '{tree}': "
                "permission denied; ")
    finally:
        os.chmod(tree, 0o755)


@pytest.mark.parametrize("via", ["datapath", "grpc"])
def test_an_unreadable_file_parks_the_ingest_and_the_same_command_resumes_it(
        daemon, tree, via):
    os.chmod(tree / "locked", 0o755)
    argv = ["ingest", str(tree), "ds", "--via", via]
    done = as_user(daemon.address, *argv)
    assert done.returncode == 1
    line = one_line(done.stderr)
    assert line.startswith(
        f"dlfs: PermissionDenied: cannot read '{tree}/b/secret.bin': permission denied; "
        "fix its permissions, or pass --skip-unreadable to leave out what cannot be read; "
        "the ingest is parked with 2 files (6 B) on "), line  # a/1.bin, b/2.bin
    assert "run the same command with --resume to continue it" in line
    os.chmod(tree / "b/secret.bin", 0o644)
    resumed = as_user(daemon.address, *argv, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed after 2 files already on the daemon" in resumed.stdout
    with Client(daemon.address) as client:
        assert read_dataset(client, "ds") == FILES


@pytest.mark.parametrize("follow", [[], ["--follow-symlinks"]])
def test_skip_unreadable_leaves_them_out_and_counts_them(daemon, tree, follow):
    done = as_user(daemon.address, "ingest", str(tree), "ds", "--skip-unreadable", *follow)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "skipped: 2 unreadable"
    with Client(daemon.address) as client:
        got = read_dataset(client, "ds")
        names = [e.name for e in client.listdir("ds", "")]
    assert names == ["a", "b", "c", "z.bin"]  # "locked" is no empty directory either
    assert got == {p: d for p, d in FILES.items() if p not in ("b/secret.bin", "locked/4.bin")}


def test_a_dry_run_names_what_it_would_skip(tree):
    done = subprocess.run([*WITHOUT_DAC, sys.executable, "-m", "dlfs.cli", "ingest", str(tree),
                           "ds", "--skip-unreadable", "--dry-run"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"skip\tunreadable\t{tree}/b/secret.bin" in lines
    assert f"skip\tunreadable\t{tree}/locked\tdirectory" in lines
    assert lines[-1].endswith(", 2 unreadable")

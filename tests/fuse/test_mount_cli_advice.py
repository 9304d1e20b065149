"""`dlfs-mount`'s command line as a user meets it: refusals, the advice they print (each
run as printed), --nonempty, --version, a background mount's log and the mount's
metrics."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest

from dlfs import Client
from dlfs.tools.launch import MountProcess, is_mounted, unmount
from helpers.trees import write_tree

pytestmark = pytest.mark.mount


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    """Where a background mount without --log-file logs (its default log file is
    $XDG_STATE_HOME/dlfs/mount.log): this test's own directory."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture
def dataset(daemon, tmp_path):
    write_tree(tmp_path / "src", {"a/one.txt": b"one", "two.bin": b"\x02" * 5000})
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "pets")
    return daemon.address


def mount_command(*argv: str) -> subprocess.CompletedProcess:
    """`dlfs-mount ARGV` as a user runs it (in the background mode, the default)."""
    return subprocess.run([sys.executable, "-m", "dlfs.fuse.mount_cli", *argv],
                          capture_output=True, text=True, timeout=120)


def advice(message: str) -> list[str]:
    """The one command quoted in backticks in `message`, as argv."""
    [quoted] = re.findall(r"`([^`]+)`", message)
    return shlex.split(quoted)


def run_advice(argv: list[str]) -> subprocess.CompletedProcess:
    """Run advice as printed; `dlfs` is this test run's own command."""
    if argv[0] == "dlfs":
        argv = [sys.executable, "-m", "dlfs.cli", *argv[1:]]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_a_missing_dataset_names_the_command_that_lists_them(dataset, tmp_path):
    os.mkdir(tmp_path / "m")
    result = mount_command(dataset, str(tmp_path / "m"), "--dataset", "nope")
    assert result.returncode == 1
    assert f"the DLFS daemon at {dataset} has no dataset 'nope'" in result.stderr
    argv = advice(result.stderr)
    assert argv == ["dlfs", "datasets", "--server", dataset]
    listed = run_advice(argv)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith("pets\t2 samples")


def test_a_non_empty_mount_point_is_refused_unless_nonempty(dataset, tmp_path):
    mountpoint = tmp_path / "m"
    write_tree(mountpoint, {"keep.txt": b"mine"})
    result = mount_command(dataset, str(mountpoint))
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"dlfs-mount: mount point {mountpoint} is not empty (it holds keep.txt): the mount "
        "would hide that; give an empty directory, or pass --nonempty to mount over it")
    assert not is_mounted(str(mountpoint))
    result = mount_command(dataset, str(mountpoint), "--nonempty", "--log-file",
                           str(tmp_path / "mount.log"))
    try:
        assert result.returncode == 0, result.stderr
        assert sorted(os.listdir(mountpoint)) == ["pets"]  # keep.txt is hidden meanwhile
    finally:
        unmount(str(mountpoint))
    assert os.listdir(mountpoint) == ["keep.txt"]


def test_a_mount_point_in_use_names_the_unmount_command(dataset, tmp_path, mount_factory):
    first = mount_factory(dataset)
    result = mount_command(dataset, first.mountpoint)
    assert result.returncode == 1
    argv = advice(result.stderr)
    assert argv == ["fusermount3", "-u", first.mountpoint]
    assert run_advice(argv).returncode == 0
    assert first.process.wait(60) == 0  # unmounted: the mount process ends cleanly
    assert not is_mounted(first.mountpoint)


def test_a_dead_mount_names_the_command_that_clears_it(dataset, tmp_path):
    mountpoint = str(tmp_path / "m")
    dead = MountProcess(dataset, mountpoint, str(tmp_path / "mount.log"))
    dead.start()
    dead.process.send_signal(signal.SIGKILL)  # the kernel keeps a mount nobody serves
    dead.process.wait(60)
    try:
        result = mount_command(dataset, mountpoint)
        assert result.returncode == 1
        assert "is unusable (Transport endpoint is not connected)" in result.stderr
        argv = advice(result.stderr)
        assert argv == ["fusermount3", "-u", mountpoint]
        assert run_advice(argv).returncode == 0
        again = mount_command(dataset, mountpoint, "--log-file", str(tmp_path / "again.log"))
        assert again.returncode == 0, again.stderr
        with open(os.path.join(mountpoint, "pets", "a", "one.txt"), "rb") as f:
            assert f.read() == b"one"
    finally:
        unmount(mountpoint)


def test_a_background_mount_logs_to_its_file_not_to_the_terminal(dataset, tmp_path,
                                                                  state_dir):
    """The mount process left behind never writes to the caller's stderr (a pipe here,
    which this call would otherwise wait on until the unmount)."""
    os.mkdir(tmp_path / "m")
    result = mount_command(dataset, str(tmp_path / "m"))
    try:
        assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
        log_file = state_dir / "dlfs" / "mount.log"
        pid = re.search(r"dlfs-mount\[(\d+)\]", log_file.read_text()).group(1)
        assert os.readlink(f"/proc/{pid}/fd/2") == str(log_file)  # gRPC's own lines too
        assert sorted(os.listdir(tmp_path / "m")) == ["pets"]
    finally:
        unmount(str(tmp_path / "m"))


def test_no_daemon_is_one_line_about_the_daemon_not_a_mount_that_fails_reads(tmp_path):
    os.mkdir(tmp_path / "m")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    for mode in ([], ["--foreground"]):
        result = mount_command(address, str(tmp_path / "m"), *mode)
        assert result.returncode == 1
        [line] = result.stderr.splitlines()
        assert line.startswith(f"dlfs-mount: cannot reach the DLFS daemon at {address}: ")
        assert "EIO" not in result.stderr
        assert not is_mounted(str(tmp_path / "m"))


def test_version():
    done = mount_command("--version")
    assert done.returncode == 0 and done.stdout.strip() == "dlfs-mount 0.1.0"


def test_the_mount_serves_its_metrics(dataset, mount_factory):
    from prometheus_client.parser import text_string_to_metric_families

    mount = mount_factory(dataset, "--metrics-listen", "127.0.0.1:0")
    with open(os.path.join(mount.mountpoint, "pets", "two.bin"), "rb") as f:
        assert f.read() == b"\x02" * 5000
    [where] = re.findall(r"metrics at http://(\S+)/metrics", mount.log())
    text = urllib.request.urlopen(f"http://{where}/metrics", timeout=30).read().decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("dlfs_mount_requests_total", (("op", "lookup"),))] >= 1
    assert samples[("dlfs_mount_daemon_up", ())] == 1
    assert samples[("dlfs_build_info", (("version", "0.1.0"),))] == 1
    assert samples[("process_resident_memory_bytes", ())] > 0
    assert not [name for name, _ in samples if name.endswith("_created")]
    # The file came from the extents (the daemon's host) or through the daemon: counted.
    assert (samples[("dlfs_mount_extent_read_files_total", ())] >= 1
            or any(name == "dlfs_mount_daemon_calls_total" for name, _ in samples))

"""The Exec lines of deploy/systemd/ run for real, expanded as systemd would.

systemd is not PID 1 here (and usually not in CI containers), so the units
cannot be started; their sandboxing is checked by test_manifests.py with
systemd-analyze.  What these tests show is that the command lines the units
build, from their Environment= defaults and the example EnvironmentFiles,
are accepted by today's dlfs-server and dlfs-mount and behave as the units
assume: the daemon serves and writes %t/dlfs/address, stops with status 0 on
KillSignal; the mount sequence ExecStartPre, ExecStart, ExecStartPost,
ExecStop mounts, serves reads and unmounts, and the process exits 0.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys

import pytest

from helpers.trees import unique_name, write_tree
from dlfs import Client
from dlfs.staging.tree_walk import walk_tree
from dlfs.tools.launch import is_mounted, wait_for_file
from helpers.systemd_units import (INSTALL_BIN, MOUNT_ENV, MOUNT_UNIT, SERVER_ENV, SERVER_UNIT,
                           command_line, one, parse_unit, unit_environment)


def _local_bin(argv: list[str]) -> list[str]:
    """The units name /opt/dlfs/venv/bin; use this test run's virtualenv."""
    bin_dir = os.path.dirname(sys.executable) + "/"
    return [a.replace(INSTALL_BIN, bin_dir) if a.startswith(INSTALL_BIN) else a for a in argv]


def _seconds(value: str) -> float:
    assert value.isdigit(), f"expected whole seconds, got {value!r}"
    return float(value)


def test_server_unit_command_serves_and_stops_on_its_kill_signal(tmp_path):
    _run_server_unit(tmp_path, {})


def test_server_unit_command_joins_the_cluster_of_its_etcd(tmp_path, etcd_server):
    """DLFS_ETCD and DLFS_CLUSTER in the env file: the unit's command line makes the
    daemon a member, found through etcd; its stop takes it off the list at once."""
    name = unique_name("unit")
    overrides = {"DLFS_ETCD": etcd_server.urls, "DLFS_CLUSTER": name}
    _run_server_unit(tmp_path, overrides, in_cluster=(etcd_server.urls, name))


def _run_server_unit(tmp_path, overrides: dict[str, str],
                     in_cluster: tuple[str, str] | None = None) -> None:
    unit = parse_unit(SERVER_UNIT)
    spec = {"S": str(tmp_path / "state"), "t": str(tmp_path / "run")}
    os.makedirs(spec["S"] + "/dlfs", mode=0o700)   # StateDirectory=dlfs
    os.makedirs(spec["t"] + "/dlfs")               # RuntimeDirectory=dlfs
    # The example env file as shipped, except the port: 7010 may be taken here.
    env = unit_environment(unit, spec, SERVER_ENV,
                           overrides={"DLFS_LISTEN": "127.0.0.1:0", **overrides})
    argv = _local_bin(command_line(one(unit, "Service", "ExecStart"), env, spec))
    address_file = os.path.join(spec["t"], "dlfs", "address")
    assert argv[argv.index("--address-file") + 1] == address_file
    data_dir = os.path.join(spec["S"], "dlfs", "data")
    # Never a system path: the example env file must leave the data dir to the unit.
    assert argv[argv.index("--data-dir") + 1] == data_dir
    log_path = str(tmp_path / "server.log")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_file(address_file, process, "dlfs-server", log_path)
        with open(address_file) as f:
            address = f.read().strip()
        with Client(address) as client:
            assert client.datasets() == []
        assert stat.S_IMODE(os.stat(data_dir).st_mode) == 0o700
        if in_cluster is not None:
            with Client(etcd=in_cluster[0], cluster=in_cluster[1]) as client:
                assert [m.address for m in client.members()] == [address]
        process.send_signal(getattr(signal, one(unit, "Service", "KillSignal")))
        returncode = process.wait(_seconds(one(unit, "Service", "TimeoutStopSec")))
        with open(log_path) as f:
            assert returncode == 0, f.read()
        if in_cluster is not None:  # a clean stop revoked its lease
            with Client(etcd=in_cluster[0], cluster=in_cluster[1]) as client:
                assert client.members() == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.mount
@pytest.mark.skipif(os.geteuid() != 0, reason="the unit runs as root: --allow-other "
                    "(in the example env file) and mount(2) need it")
def test_mount_unit_commands_mount_read_and_unmount(tmp_path, daemon):
    source = tmp_path / "src"
    write_tree(source, {"train/a.bin": b"alpha" * 100, "README.txt": b"hello\n"})
    with Client(daemon.address) as client:
        client.upload(walk_tree(str(source)), "demo-set")
    argv = _run_mount_unit(tmp_path, {"DLFS_SERVER": daemon.address})
    assert argv[1:7] == ["--etcd", "", "--cluster", "default", daemon.address,
                         str(tmp_path / "mnt" / "demo-set")]


@pytest.mark.mount
@pytest.mark.skipif(os.geteuid() != 0, reason="the unit runs as root: --allow-other "
                    "(in the example env file) and mount(2) need it")
def test_mount_unit_commands_mount_a_cluster_found_in_etcd(tmp_path, cluster):
    """DLFS_ETCD and DLFS_CLUSTER set, DLFS_SERVER empty: the unit mounts the striped
    dataset of the cluster's members."""
    cluster.start(2)
    source = tmp_path / "src"
    write_tree(source, {"train/a.bin": b"alpha" * 100, "README.txt": b"hello\n"})
    with cluster.client() as client:
        client.ingest(str(source), "demo-set", replicas=2)
    argv = _run_mount_unit(tmp_path, {"DLFS_SERVER": "", "DLFS_ETCD": cluster.urls,
                                      "DLFS_CLUSTER": cluster.name})
    assert argv[1:7] == ["--etcd", cluster.urls, "--cluster", cluster.name, "",
                         str(tmp_path / "mnt" / "demo-set")]


def _run_mount_unit(tmp_path, overrides: dict[str, str]) -> list[str]:
    """Run the mount unit's Exec lines for dataset demo-set (train/a.bin, README.txt)
    with the shipped env file and `overrides`; its ExecStart argv."""
    unit = parse_unit(MOUNT_UNIT)
    service = unit["Service"]
    # `systemctl start "dlfs-mount@$(systemd-escape demo-set)"`: %i is the
    # escaped instance name, %I the dataset name.
    spec = {"i": "demo\\x2dset", "I": "demo-set"}
    mountpoint = str(tmp_path / "mnt" / "demo-set")
    # The shared example file with this test's daemon, as a per-instance
    # /etc/dlfs/dlfs-mount-demo-set.env would set them.
    env = unit_environment(unit, spec, MOUNT_ENV,
                           overrides={**overrides, "DLFS_MOUNTPOINT": mountpoint})
    run_timeout_s = _seconds(one(unit, "Service", "TimeoutStartSec"))
    for line in service["ExecStartPre"]:
        subprocess.run(command_line(line, env, spec), check=True, timeout=run_timeout_s)
    assert os.path.isdir(mountpoint)

    argv = _local_bin(command_line(one(unit, "Service", "ExecStart"), env, spec))
    log_path = str(tmp_path / "mount.log")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT)
    try:
        post = subprocess.run(command_line(one(unit, "Service", "ExecStartPost"), env, spec),
                              timeout=run_timeout_s)
        with open(log_path) as f:
            assert post.returncode == 0, "ExecStartPost saw no mount:\n" + f.read()
        assert is_mounted(mountpoint)
        with open(os.path.join(mountpoint, "train", "a.bin"), "rb") as f:
            assert f.read() == b"alpha" * 100
        assert sorted(os.listdir(mountpoint)) == ["README.txt", "train"]

        stop = subprocess.run(command_line(one(unit, "Service", "ExecStop"), env, spec),
                              capture_output=True, text=True, timeout=run_timeout_s)
        assert stop.returncode == 0, stop.stderr
        returncode = process.wait(_seconds(one(unit, "Service", "TimeoutStopSec")))
        with open(log_path) as f:
            assert returncode == 0, f.read()
        assert not is_mounted(mountpoint)
    finally:
        if is_mounted(mountpoint):
            subprocess.run(["fusermount3", "-u", "-z", mountpoint], capture_output=True)
        if process.poll() is None:
            process.kill()
            process.wait()
    return argv

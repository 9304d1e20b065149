"""Power loss keeps every acknowledged change: the daemon on a file system that forgets
whatever was not fsynced (tests/helpers/powercut_fs.py), its power cut, then a restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from dlfs import Client
from dlfs.tools.launch import DaemonProcess, wait_for_file
from helpers.daemons import read_dataset
from helpers.trees import write_tree

POWERCUT_FS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "helpers", "powercut_fs.py")


class PowercutMount:
    """tests/helpers/powercut_fs.py on `mountpoint`; `cut()` writes what survives to `image`."""

    def __init__(self, tmp_path):
        self.backing = tmp_path / "backing"
        self.mountpoint = tmp_path / "mnt"
        self.image = tmp_path / "image"
        self.log_path = str(tmp_path / "powercut.log")
        ready = str(tmp_path / "powercut.ready")
        self.backing.mkdir()
        self.mountpoint.mkdir()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, POWERCUT_FS, str(self.backing), str(self.mountpoint),
                 "--image", str(self.image), "--ready-file", ready],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        wait_for_file(ready, self.process, "powercut_fs", self.log_path)

    def cut(self) -> str:
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(60) == 0, open(self.log_path).read()
        return str(self.image)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True)


@pytest.mark.mount
@pytest.mark.daemons
def test_acknowledged_changes_survive_a_power_cut(tmp_path):
    trees = {}
    for key, size in (("keep", 9000), ("old", 7000), ("new", 11000), ("gone", 5000),
                      ("last", 8000)):
        trees[key] = {f"sub{i % 2}/{key}{i:02d}.bin": os.urandom(size + i) for i in range(16)}
        write_tree(tmp_path / "src" / key, trees[key])
    mount = PowercutMount(tmp_path)
    try:
        # Small extents, so a dataset spans several files and directory entries.
        daemon = DaemonProcess(str(mount.mountpoint / "data"), str(tmp_path / "daemon.log"),
                               ["--extent-bytes-max", "65536"])
        daemon.start()
        with Client(daemon.address) as client:
            client.ingest(str(tmp_path / "src" / "keep"), "keep")
            client.ingest(str(tmp_path / "src" / "old"), "rep")
            client.ingest(str(tmp_path / "src" / "new"), "rep", replace=True)
            client.ingest(str(tmp_path / "src" / "gone"), "gone")
            client.delete("gone")
            # Last, so that no later delete's fsync of the extents root covers it.
            client.ingest(str(tmp_path / "src" / "last"), "last")
        daemon.kill()  # no clean shutdown, then the power goes
        image = mount.cut()
    finally:
        mount.close()

    restarted = DaemonProcess(os.path.join(image, "data"), str(tmp_path / "restarted.log"))
    with restarted:
        with Client(restarted.address) as client:
            assert sorted(i.name for i in client.dataset_infos()) == ["keep", "last", "rep"]
            assert read_dataset(client, "keep") == trees["keep"]
            assert read_dataset(client, "rep") == trees["new"]
            assert read_dataset(client, "last") == trees["last"]
    assert len(os.listdir(os.path.join(image, "data", "extents"))) == 3

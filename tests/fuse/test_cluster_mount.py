"""dlfs-mount --etcd URL: a dataset striped over three daemons of a cluster, read through FUSE,
with failover."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import sys

import numpy as np

from helpers.trees import write_tree


def test_mount_of_a_striped_dataset_survives_a_killed_daemon(cluster, mount_factory,
                                                              tmp_path):
    daemons = cluster.start(3, ["--member-lease-ttl-s", "60"])  # the killed one stays listed
    rng = np.random.default_rng(3)
    files = {f"c{i % 3}/{i:03d}.bin": rng.bytes(int(rng.integers(1, 20000))) for i in range(90)}
    files["large.raw"] = rng.bytes(12 * 1024 * 1024)  # read in units, not whole
    write_tree(tmp_path / "src", files)
    with cluster.client() as client:
        client.ingest(str(tmp_path / "src"), "ds", replicas=2)
    mount = mount_factory(None, *cluster.cli(), "--reconnect-timeout", "2")

    def digests() -> dict[str, str]:
        found = {}
        for root, _dirs, names in os.walk(os.path.join(mount.mountpoint, "ds")):
            for name in names:
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    found[os.path.relpath(path, os.path.join(mount.mountpoint, "ds"))] = \
                        hashlib.sha256(f.read()).hexdigest()
        return found

    expected = {p: hashlib.sha256(d).hexdigest() for p, d in files.items()}
    daemons[0].kill()  # before any read: every file must come from a surviving replica
    assert digests() == expected


def test_a_missing_dataset_of_a_cluster_names_the_listing_command(cluster, tmp_path):
    """The refusal's advice names the cluster, not a daemon, and runs as printed."""
    cluster.start(1)
    write_tree(tmp_path / "src", {"a.txt": b"alpha"})
    with cluster.client() as client:
        client.ingest(str(tmp_path / "src"), "pets")
    os.mkdir(tmp_path / "m")
    done = subprocess.run([sys.executable, "-m", "dlfs.fuse.mount_cli", *cluster.cli(),
                           str(tmp_path / "m"), "--dataset", "nope"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert f"the DLFS cluster etcd {cluster.urls.removeprefix('http://')} (cluster " \
           f"{cluster.name}) has no dataset 'nope'" in done.stderr
    [quoted] = re.findall(r"`([^`]+)`", done.stderr)
    argv = shlex.split(quoted)
    assert argv == ["dlfs", "datasets", "--etcd", cluster.urls, "--cluster", cluster.name]
    listed = subprocess.run([sys.executable, "-m", "dlfs.cli", *argv[1:]],
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith("pets\t1 sample\t")

"""dlfs-mount against a daemon that requires tokens: credentials come from the environment."""

from __future__ import annotations

import os
import subprocess
import sys

from dlfs import Client
from helpers.trees import write_tree

TOKEN = "mount-read-token-0123456789"
ADMIN = "mount-admin-token-0123456789"


def test_mount_reads_with_a_token_from_the_environment(daemon_factory, mount_factory,
                                                        tmp_path, monkeypatch):
    tokens = tmp_path / "tokens"
    tokens.write_text(f"read {TOKEN}\nadmin {ADMIN}\n")
    os.chmod(tokens, 0o600)
    daemon = daemon_factory(extra_args=["--tokens-file", str(tokens)])
    write_tree(tmp_path / "src", {"a.txt": b"secret sample"})
    with Client(daemon.address, token=ADMIN) as admin:
        admin.ingest(str(tmp_path / "src"), "ds")
    monkeypatch.setenv("DLFS_TOKEN", "")
    (tmp_path / "m").mkdir()  # an empty mount point (dlfs-mount refuses a non-empty one)
    refused = subprocess.run([sys.executable, "-m", "dlfs.fuse.mount_cli", daemon.address,
                              str(tmp_path / "m"), "--reconnect-timeout", "1"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "requires a token" in refused.stderr
    monkeypatch.setenv("DLFS_TOKEN", TOKEN)
    mount = mount_factory(daemon.address)
    with open(os.path.join(mount.mountpoint, "ds", "a.txt"), "rb") as f:
        assert f.read() == b"secret sample"

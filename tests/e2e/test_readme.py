"""The README's tour, run as written against a demo daemon (`dlfs-server --demo`, as
`./dev demo` starts it): the shell tour, the Python client's blocks, the mount's
commands (the blocks marked `<!-- runs: tests/e2e/test_readme.py -->`).

The only changes made to a block: the daemon's address (127.0.0.1:7010 is the
demo's; here a fresh daemon on port 0, also given as $DLFS_SERVER, as the README
says), and /tmp/mydata and /mnt/dlfs put in the test's directory.  Shell lines run
one by one from the repository root (`.venv/bin/...` as written) and must exit 0; a
line whose comment shows what it prints is checked against it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.doc_blocks import DEMO_ADDRESS, REPO, marked_blocks
from dlfs.tools.launch import fuse_unavailable

DOC = "README.md"
TEST = "tests/e2e/test_readme.py"


def blocks() -> list[str]:
    found = marked_blocks(DOC, TEST)
    assert len(found) == 4, found  # the shell tour, two Python blocks, the mount
    return found


def shell_lines(block: str) -> list[tuple[str, str]]:
    """(command, the comment after it) for each line of a shell block."""
    lines = []
    for line in block.splitlines():
        command, _, comment = line.partition("  #")
        lines.append((command.strip(), comment.strip()))
    return lines


def run_line(command: str, address: str, tmp_path) -> subprocess.CompletedProcess:
    command = (command.replace(DEMO_ADDRESS, address).replace("/tmp/mydata", str(tmp_path / "mydata"))
               .replace("/mnt/dlfs", str(tmp_path / "mnt")))
    env = {**os.environ, "DLFS_SERVER": address, "XDG_STATE_HOME": str(tmp_path / "state"),
           "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_shell_tour_runs_as_written(demo, tmp_path):
    outputs = {}
    for command, comment in shell_lines(blocks()[0]):
        done = run_line(command, demo, tmp_path)
        assert done.returncode == 0, f"{command}: {done.stderr}"
        outputs[command.split()[1]] = (done.stdout, comment)
    listed, comment = outputs["datasets"]
    assert listed.split() == comment.split(), (listed, comment)  # demo  361 samples  1.1 MiB
    assert outputs["ingest"][0].startswith("ingested mydata: 1 sample, 6 bytes")
    assert outputs["rm"][0].startswith("removed mydata: 1 sample")


def test_the_python_blocks_run_as_written(demo):
    namespace: dict = {"__name__": "readme"}
    for number, code in enumerate(blocks()[1:3]):
        assert DEMO_ADDRESS in code
        exec(compile(code.replace(DEMO_ADDRESS, demo), f"README.md python block {number}",
                     "exec"), namespace)
    assert namespace["image"].shape == (32, 32, 3)
    namespace["local"].close()
    namespace["client"].close()


@pytest.mark.skipif(bool(fuse_unavailable()), reason=f"no FUSE: {fuse_unavailable()}")
def test_the_mount_commands_run_as_written(demo, tmp_path):
    lines = shell_lines(blocks()[3])
    assert lines[-1][0].startswith("fusermount3 -u")
    try:
        for command, _ in lines:
            done = run_line(command, demo, tmp_path)
            assert done.returncode == 0, f"{command}: {done.stderr}"
        assert done.stdout == ""
    finally:
        run_line(lines[-1][0], demo, tmp_path)  # unmounted whatever failed

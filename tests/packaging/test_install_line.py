"""The install line the README gives, run as typed in a checkout (pip's dry run, no
package index: what it installs is this checkout, with both extras), and the same
line in the advice of a command run without its extra."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

from dlfs.version import DISTRIBUTION, install_line, missing_extra

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def readme_install_line() -> str:
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    found = re.findall(r"`(pip install [^`]*)`", text.split("## ")[0])
    assert len(found) == 1, found  # the one line of the README's opening
    return found[0]


def test_the_readme_install_line_installs_this_checkout_with_its_extras():
    line = readme_install_line()
    assert line == install_line("fuse,torch")
    words = shlex.split(line)
    done = subprocess.run(
        [sys.executable, "-m", *words, "--dry-run", "--no-deps", "--no-index",
         "--no-build-isolation", "--quiet", "--report", "-"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    [installed] = json.loads(done.stdout)["install"]
    assert installed["metadata"]["name"] == DISTRIBUTION
    assert installed["download_info"]["url"] == f"file://{REPO}"
    assert sorted(installed["requested_extras"]) == ["fuse", "torch"]


def test_the_advice_for_a_missing_extra_is_the_same_line():
    assert missing_extra("dlfs-mount", "fuse", "trio") == (
        "dlfs-mount needs trio, which is not installed; it comes with the 'fuse' extra: "
        f"{install_line('fuse')} in a checkout of DLFS ({DISTRIBUTION} is not on the "
        "package index yet)")

"""Advice in error messages, run exactly as printed: the `dlfs ...` commands a message
quotes in backticks, and "the same command with --resume".

A message that tells the user what to type is tested by typing it: the
command is parsed out of the message and run (with the test's --server, or
a cluster's --etcd and --cluster), never re-typed in the test.  A target is
one daemon's address, or the global options that name a cluster
(`ClusterFixture.cli()`).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

_QUOTED = re.compile(r"`(dlfs [^`]*)`")


def quoted_commands(message: str) -> list[str]:
    """The `dlfs ...` command lines `message` quotes in backticks, in order."""
    return _QUOTED.findall(message)


def the_command(message: str, starting: str) -> str:
    """The one quoted command of `message` that starts with `starting` once a global
    `--server ADDRESS` (or `--etcd URLS --cluster NAME`) is left out ("dlfs discard"
    finds `dlfs --server H:P discard ds` too); fails the test when there is none or
    several."""
    found = [c for c in quoted_commands(message)
             if shlex.join(_without_server(shlex.split(c))).startswith(starting)]
    assert len(found) == 1, f"no single `{starting}...` in: {message}"
    return found[0]


def _without_server(words: list[str]) -> list[str]:
    while len(words) > 2 and words[1] in ("--server", "--etcd", "--cluster"):
        words = words[:1] + words[3:]
    return words


def _options(target: str | list[str]) -> list[str]:
    return ["--server", target] if isinstance(target, str) else list(target)


def run_dlfs(target: str | list[str], argv: list[str], timeout_s: float = 120.0
             ) -> subprocess.CompletedProcess:
    """`dlfs --server ADDRESS ARGV...` (or a cluster's options) as a user runs it."""
    return subprocess.run([sys.executable, "-m", "dlfs.cli", *_options(target), *argv],
                          capture_output=True, text=True, timeout=timeout_s)


def run_as_printed(target: str | list[str], command: str) -> subprocess.CompletedProcess:
    """Run the quoted `command` ("dlfs discard ds") against `target`, unless it names its
    own --server or --etcd (the CLI's advice does; the daemon's cannot know how it is
    reached)."""
    words = shlex.split(command)
    assert words[0] == "dlfs", command
    if "--server" in words or "--etcd" in words:
        return subprocess.run([sys.executable, "-m", "dlfs.cli", *words[1:]],
                              capture_output=True, text=True, timeout=120)
    return run_dlfs(target, words[1:])

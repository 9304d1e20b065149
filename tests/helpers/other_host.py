"""Another host for tests: a network namespace joined to this one by a veth pair.

A client run in it (`OtherHost.run`) reaches this host's end of the pair over a
network device, not the loopback, exactly as a client on another machine would
reach a daemon listening on `OtherHost.address`.  Needs root and `ip` (iproute2).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class OtherHost:
    namespace: str
    address: str  # this host's end of the pair: where a daemon listens for it
    own_address: str  # the other host's address, as the daemon sees its clients

    def run(self, argv: list[str], timeout: float = 120, **options) -> subprocess.CompletedProcess:
        """Run `argv` on the other host (in its namespace), its output captured."""
        return subprocess.run(["ip", "netns", "exec", self.namespace, *argv],
                              capture_output=True, text=True, timeout=timeout, **options)


def _ip(*args: str, namespace: str | None = None) -> None:
    prefix = ["ip", "netns", "exec", namespace] if namespace else []
    subprocess.run([*prefix, "ip", *args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def other_host():
    """An OtherHost for the duration of the block; its namespace and links are removed
    afterwards, whatever happened."""
    tag = os.getpid() % 100_000  # interface names are at most 15 characters
    net = 10 + os.getpid() % 240
    host = OtherHost(f"dlfs-test-{tag}", f"10.231.{net}.1", f"10.231.{net}.2")
    here, there = f"dlfs{tag}h", f"dlfs{tag}t"
    try:
        _ip("netns", "add", host.namespace)
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", host.namespace)
        _ip("addr", "add", f"{host.address}/30", "dev", here)
        _ip("link", "set", here, "up")
        _ip("addr", "add", f"{host.own_address}/30", "dev", there, namespace=host.namespace)
        _ip("link", "set", there, "up", namespace=host.namespace)
        _ip("link", "set", "lo", "up", namespace=host.namespace)
        yield host
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True, timeout=30)

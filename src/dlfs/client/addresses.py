"""Daemon addresses as users write them: split, trimmed, with the default port added.

    daemon_addresses("localhost")             -> ["localhost:7010"]
    daemon_addresses("a:7010, b ,[::1]")      -> ["a:7010", "b:7010", "[::1]:7010"]

gRPC would take a bare host to mean port 443; DLFS daemons listen on
`limits.daemon_port_default` unless told otherwise.  A port that is not a
number from 1 to 65535 ("127.0.0.1:notaport"), or an address without a host,
is refused at once (InvalidArgument): gRPC would only say "unavailable",
after the whole first-contact wait.
"""

from __future__ import annotations

from typing import Sequence

from dlfs import limits
from dlfs.errors import InvalidArgument

# gRPC target schemes, passed on as they are ("unix:/run/dlfs.sock").
_SCHEMES = ("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:")


def with_default_port(address: str) -> str:
    """`address` with `limits.daemon_port_default` when it names no port: a host name or
    IPv4 address, "[v6]", or a bare IPv6 address ("::1", which becomes "[::1]:7010").
    Raises InvalidArgument for a port that is no number from 1 to 65535, or no host."""
    if address.startswith(_SCHEMES):
        return address
    if address.startswith("["):
        if "]:" not in address:
            return f"{address}:{limits.daemon_port_default}"
        host, port = address.rsplit("]:", 1)
        return _checked(address, host + "]", port)
    colons = address.count(":")
    if colons == 0:
        return f"{address}:{limits.daemon_port_default}"
    if colons == 1:
        return _checked(address, *address.split(":"))
    return f"[{address}]:{limits.daemon_port_default}"


def _checked(address: str, host: str, port: str) -> str:
    if not host or host == "[]":
        raise InvalidArgument(f"daemon address {address!r} names no host (HOST:PORT, e.g. "
                              f"127.0.0.1:{limits.daemon_port_default})")
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise InvalidArgument(f"daemon address {address!r}: the port {port!r} is not a number "
                              f"from 1 to 65535 (HOST:PORT, e.g. "
                              f"127.0.0.1:{limits.daemon_port_default})")
    return address


def daemon_addresses(address: str | Sequence[str]) -> list[str]:
    """The daemons `address` names (one string, several separated by ',', or a list of
    such strings), in order, without repeats, each with a port.  Raises
    InvalidArgument when none is given."""
    parts = [address] if isinstance(address, str) else list(address)
    found = [with_default_port(a.strip()) for part in parts for a in part.split(",")
             if a.strip()]
    if not found:
        raise InvalidArgument("no daemon address given (HOST:PORT, or several separated by ',')")
    return list(dict.fromkeys(found))

"""The DLFS release, its distribution name, how to install it, and the version policy:
which client and daemon releases talk to each other.  Importable without loading the client (the
daemon reports the version; the tools name the distribution in advice).

The policy (docs/DESIGN.md, "Versions"): a client and a daemon interoperate
when their releases share the major and the minor number (0.1.0 with 0.1.7),
and only then.  A change to what crosses the wire (a gRPC message's meaning,
a data path frame) comes with a new minor release, so within one minor both
ends have the same features and no code asks what the other end has.  The
check is made once per connection, where it is cheap: a data path HELLO
carries the client's release and WELCOME the daemon's (each end checks the
other's); every gRPC call of a DLFS client carries its release in the
`dlfs-version` metadata, which the daemon's interceptor checks.  A gRPC
caller that sends none (grpcurl, a health probe) is served: it speaks the
protocol of dlfs/proto/ as this release defines it.
"""

from __future__ import annotations

__version__ = "0.1.0"

# What `pip install` calls this package (the import name stays `dlfs`): "dlfs"
# on the package index is an unrelated project.
DISTRIBUTION = "dlfs-storage"

# The gRPC metadata key a DLFS client's calls carry its release in.
VERSION_METADATA = "dlfs-version"
# Bytes a release takes in a data path HELLO or WELCOME (UTF-8, NUL-padded).
RELEASE_BYTES_MAX = 16


def install_line(extras: str) -> str:
    """The command that installs DLFS with `extras` ("fuse,torch"): from a checkout, as
    DISTRIBUTION is not on the package index yet (README.md, its opening)."""
    return f"pip install '.[{extras}]'"


def missing_extra(who: str, extra: str, module: str) -> str:
    """The message for `who` (a command or module) run without optional dependency
    `module`, which the extra `extra` of the distribution installs."""
    return (f"{who} needs {module}, which is not installed; it comes with the '{extra}' "
            f"extra: {install_line(extra)} in a checkout of DLFS ({DISTRIBUTION} is not "
            "on the package index yet)")


def release_line(release: str) -> tuple[str, str] | None:
    """(major, minor) of `release` ("0.1.0" -> ("0", "1")); None when it is not one."""
    parts = release.split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        return None
    return parts[0], parts[1]


def interoperates(release: str, other: str = __version__) -> bool:
    """Whether a peer of `release` and one of `other` (default: this one) talk."""
    line = release_line(release)
    return line is not None and line == release_line(other)


def mismatch_message(peer: str, peer_release: str, *, this: str) -> str:
    """Why a `peer` ("client" or "daemon") of `peer_release` ("" when it could not be
    read: a data path handshake of another layout) is refused by this `this` side,
    and what to do."""
    said = f"DLFS {peer_release}" if peer_release else "a DLFS release of another minor"
    major, minor = release_line(__version__) or ("?", "?")
    return (f"this {this} is DLFS {__version__} and the {peer} is {said}: a client and a "
            f"daemon work together only within one minor release ({major}.{minor}.x); "
            f"install the same release on both ends (from a checkout of DLFS "
            f"{major}.{minor}: pip install .)")

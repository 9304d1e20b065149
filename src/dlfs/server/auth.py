"""Token authentication: who may call what.

A tokens file holds one token per line, with its role::

    # role  token
    read    5c1d...      # may call every read and metadata method
    admin   9e07...      # may also ingest and delete datasets

Clients send ``authorization: Bearer TOKEN`` metadata.  With a tokens file
configured, a call without a known token is refused with UNAUTHENTICATED and
a read token calling an admin method with PERMISSION_DENIED.  The standard
health service stays open, so orchestrators can probe the daemon.  Tokens
travel in clear text unless the daemon also serves TLS.  Nothing here
imports grpc.
"""

from __future__ import annotations

import hmac
import logging
import os
import stat as stat_module

from dlfs.errors import InvalidArgument, PermissionDenied, Unauthenticated

log = logging.getLogger(__name__)

ROLES = ("read", "admin")
# Methods that change what is stored.
ADMIN_METHODS = frozenset({"/dlfs.v1.Dlfs/Ingest", "/dlfs.v1.Dlfs/DeleteDataset",
                           "/dlfs.v1.Dlfs/DiscardIngest", "/dlfs.v1.Dlfs/CreateSpace",
                           "/dlfs.v1.Dlfs/MakeDir", "/dlfs.v1.Dlfs/Remove",
                           "/dlfs.v1.Dlfs/Rename"})
OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
METADATA_KEY = "authorization"
SCHEME = "Bearer "


def load_tokens(path: str) -> dict[str, str]:
    """Token -> role from a tokens file.  Raises InvalidArgument naming the bad line."""
    tokens: dict[str, str] = {}
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            if len(fields) != 2 or fields[0] not in ROLES or len(fields[1]) < 16:
                raise InvalidArgument(
                    f"{path}:{number}: expected 'ROLE TOKEN' with ROLE one of {', '.join(ROLES)} "
                    "and a token of at least 16 characters")
            tokens[fields[1]] = fields[0]
    if not tokens:
        raise InvalidArgument(f"{path} holds no tokens")
    if os.stat(path).st_mode & (stat_module.S_IRWXG | stat_module.S_IRWXO):
        log.warning("tokens file %s is readable by other users; chmod 600 it", path)
    return tokens


class Authorizer:
    """Decides whether a call may proceed.  Thread-safe (immutable)."""

    def __init__(self, tokens: dict[str, str]):
        self._tokens = dict(tokens)

    def tokens(self) -> dict[str, str]:
        """Token -> role, a copy (for the data path's worker processes to check HELLOs)."""
        return dict(self._tokens)

    def check(self, method: str, metadata) -> None:
        """Raise Unauthenticated or PermissionDenied unless the call is allowed."""
        if method.startswith(OPEN_PREFIXES):
            return
        role = self.role_of(metadata)
        if role is None:
            raise Unauthenticated(
                "this daemon requires a token: pass --token (or set DLFS_TOKEN) with a token "
                "from its tokens file")
        if method in ADMIN_METHODS and role != "admin":
            raise PermissionDenied(f"{method.rsplit('/', 1)[1]} needs an admin token; this "
                                   "token may only read")

    def role_of(self, metadata) -> str | None:
        """The role of the bearer token in a call's metadata, or None."""
        token = ""
        for key, value in metadata or ():
            if key == METADATA_KEY and isinstance(value, str) and value.startswith(SCHEME):
                token = value[len(SCHEME):]
        return self.role(token)

    def role(self, token: str) -> str | None:
        """The role of `token`, or None.  Compares with every known token in
        constant time, so the time taken says nothing about a near match."""
        found = None
        for known, role in self._tokens.items():  # compare all: no timing hint of a match
            if hmac.compare_digest(known.encode(), token.encode()):
                found = role
        return found

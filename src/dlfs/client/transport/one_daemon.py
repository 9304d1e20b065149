"""`Transport.each` and `call_any` for a transport that reaches one daemon: it is
itself the one `Daemon` they hand out (`dlfs.client.transport.contract`)."""

from __future__ import annotations

from typing import Callable, Self, TypeVar

from dlfs.errors import DlfsError

T = TypeVar("T")


class OneDaemon:
    """Mixed into the one-daemon transports (gRPC, data path, direct)."""

    address: str

    def call_any(self, call: Callable[[Self], T]) -> T:
        """`call(self)`: there is no other daemon to try."""
        return call(self)

    def each(self, call: Callable[[Self], T]) -> dict[str, T | DlfsError]:
        """{address: call(self)}, or the DlfsError it raised in its place."""
        try:
            return {self.address: call(self)}
        except DlfsError as exc:
            return {self.address: exc}

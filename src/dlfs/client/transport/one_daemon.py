"""`Transport.each` and `call_any` for a transport that reaches one daemon: it is
itself the one `Daemon` they hand out (`dlfs.client.transport.contract`); and the
metadata calls, which every such transport asks of that daemon's control plane."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Self, TypeVar

import numpy as np

from dlfs.errors import DlfsError
from dlfs.types import Entry

if TYPE_CHECKING:
    from dlfs.client.transport.grpc_control import GrpcControl

T = TypeVar("T")


class OneDaemon:
    """Mixed into the one-daemon transports (gRPC, data path, direct)."""

    address: str
    control: "GrpcControl"  # the daemon's control plane, whatever carries the samples

    def call_any(self, call: Callable[[Self], T]) -> T:
        """`call(self)`: there is no other daemon to try."""
        return call(self)

    def each(self, call: Callable[[Self], T]) -> dict[str, T | DlfsError]:
        """{address: call(self)}, or the DlfsError it raised in its place."""
        try:
            return {self.address: call(self)}
        except DlfsError as exc:
            return {self.address: exc}

    # --- metadata: the daemon's control plane answers, on every transport --------------

    def stat(self, dataset: str, path: str, generation: int) -> Entry:
        return self.control.stat(dataset, path, generation)

    def list_page(self, dataset: str, path: str, start_after: str,
                  page_size: int, generation: int) -> tuple[list[Entry], bool]:
        return self.control.list_page(dataset, path, start_after, page_size, generation)

    def lookup(self, dataset: str, *, ids: np.ndarray | None = None,
               paths=None) -> list[Entry]:
        return self.control.lookup(dataset, ids=ids, paths=paths)

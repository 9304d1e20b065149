"""Turn gRPC failures into the typed errors of `dlfs.errors`."""

from __future__ import annotations

import grpc

from dlfs.errors import ERROR_BY_STATUS_CODE_NAME, DlfsError, Internal, Unavailable


def from_rpc_error(exc: grpc.RpcError, address: str) -> DlfsError:
    """The DlfsError matching `exc`'s status code, keeping the daemon's message."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
    if code == grpc.StatusCode.UNAVAILABLE:
        return Unavailable(f"DLFS daemon at {address} is unavailable ({details}); is "
                           "dlfs-server running there?")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        details = f"call to DLFS daemon at {address} exceeded its deadline ({details})"
    cls = ERROR_BY_STATUS_CODE_NAME.get(code.name, Internal)
    if cls is Internal and code != grpc.StatusCode.INTERNAL:
        details = f"{code.name}: {details}"
    return cls(details)

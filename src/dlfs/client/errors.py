"""Turn gRPC failures into the typed errors of `dlfs.errors`."""

from __future__ import annotations

import grpc

from dlfs.errors import (
    ERROR_BY_CLASS_NAME,
    ERROR_BY_STATUS_CODE_NAME,
    ERROR_CLASS_METADATA,
    DlfsError,
    Internal,
    Unavailable,
)


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
    named = _class_from_metadata(exc)
    if named is not None and named.status_code_name == cls.status_code_name:
        cls = named
    if cls is Internal and code != grpc.StatusCode.INTERNAL:
        details = f"{code.name}: {details}"
    return cls(details)


def _class_from_metadata(exc: grpc.RpcError) -> type[DlfsError] | None:
    """The error class the daemon named in trailing metadata, if any."""
    try:
        metadata = exc.trailing_metadata() or ()
    except Exception:  # noqa: BLE001 - some RpcErrors carry no call
        return None
    for key, value in metadata:
        if key == ERROR_CLASS_METADATA:
            return ERROR_BY_CLASS_NAME.get(value)
    return None

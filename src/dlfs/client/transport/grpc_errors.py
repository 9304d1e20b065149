"""Turn gRPC failures into the typed errors of `dlfs.errors`."""

from __future__ import annotations

from typing import Callable, TypeVar

import grpc

from dlfs.logs import REQUEST_ID_METADATA
from dlfs.errors import (
    ERROR_BY_CLASS_NAME,
    ERROR_BY_STATUS_CODE_NAME,
    ERROR_CLASS_METADATA,
    DlfsError,
    Internal,
    Unavailable,
)


T = TypeVar("T")


def typed(call: Callable[[], T], address: str) -> T:
    """`call()` (one gRPC call to the daemon at `address`), its failure raised as the
    typed DlfsError (`from_rpc_error`)."""
    try:
        return call()
    except grpc.RpcError as exc:
        raise from_rpc_error(exc, address) from None


def from_rpc_error(exc: grpc.RpcError, address: str) -> DlfsError:
    """The DlfsError matching `exc`'s status code, keeping the daemon's message.

    The error's `request_id` is the id the daemon logged the call under
    (None when the call never reached it)."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
    if code == grpc.StatusCode.UNAVAILABLE:
        return Unavailable(f"DLFS daemon at {address} is unavailable ({details}); is "
                           "dlfs-server running there?")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        details = f"call to DLFS daemon at {address} exceeded its deadline ({details})"
    cls = ERROR_BY_STATUS_CODE_NAME.get(code.name, Internal)
    trailing = _trailing_metadata(exc)
    named = ERROR_BY_CLASS_NAME.get(trailing.get(ERROR_CLASS_METADATA, ""))
    if named is not None and named.status_code_name == cls.status_code_name:
        cls = named
    if cls is Internal and code != grpc.StatusCode.INTERNAL:
        details = f"{code.name}: {details}"
    error = cls(details)
    error.request_id = trailing.get(REQUEST_ID_METADATA)
    return error


def _trailing_metadata(exc: grpc.RpcError) -> dict[str, str]:
    """The call's trailing metadata (empty when the RpcError carries no call)."""
    try:
        metadata = exc.trailing_metadata() or ()
    except Exception:  # noqa: BLE001 - some RpcErrors carry no call
        return {}
    return {key: value for key, value in metadata if isinstance(value, str)}

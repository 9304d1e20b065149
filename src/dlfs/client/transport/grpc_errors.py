"""Turn gRPC failures into the typed errors of `dlfs.errors`."""

from __future__ import annotations

import errno
import os
from typing import Callable, TypeVar

import grpc

from dlfs.logs import REQUEST_ID_METADATA
from dlfs.errors import (
    ERROR_BY_CLASS_NAME,
    ERROR_BY_STATUS_CODE_NAME,
    ERROR_CLASS_METADATA,
    DlfsError,
    Internal,
    InvalidArgument,
    Unavailable,
)


# What gRPC says when the other end of the connection does not speak HTTP/2
# (the daemon's data-path port, its metrics port, any other service), and when
# a gRPC server lacks the DLFS service.
_NOT_HTTP2 = "Failed parsing HTTP/2"
_NO_SUCH_METHOD = "Method not found"
# What gRPC's core says of a connect refused by the host (ECONNREFUSED: nothing
# listens on the port), in the C library's words for that errno.
_REFUSED = os.strerror(errno.ECONNREFUSED)


def not_a_daemon(address: str) -> InvalidArgument:
    """The error for an address whose server is not a DLFS daemon's gRPC port (gRPC's own
    words, "Failed parsing HTTP/2 ...", would only blur the point): not retried, since
    asking again cannot help."""
    return InvalidArgument(f"{address} is not a DLFS daemon (is it the data-path or metrics "
                           "port?)")


def nothing_listens(address: str) -> Unavailable:
    """The error for a connection to `address` that was refused (`Unavailable.refused`):
    one line saying what to do, without gRPC's account of its attempts."""
    error = Unavailable(f"DLFS daemon at {address} is unavailable: nothing listens there "
                        "(connection refused); start dlfs-server there, or give the address "
                        "one listens on")
    error.refused = True
    return error


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

    A server at `address` that is not a DLFS daemon (it does not speak HTTP/2, or
    lacks the DLFS service) gives InvalidArgument naming the address (`not_a_daemon`);
    a refused connection, Unavailable with `refused` set (`nothing_listens`).

    The error's `request_id` is the id the daemon logged the call under
    (None when the call never reached it)."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
    if (code == grpc.StatusCode.UNAVAILABLE and _NOT_HTTP2 in details) or \
            (code == grpc.StatusCode.UNIMPLEMENTED and _NO_SUCH_METHOD in details):
        return not_a_daemon(address)
    if code == grpc.StatusCode.UNAVAILABLE and _REFUSED in details:
        return nothing_listens(address)
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

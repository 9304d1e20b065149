"""The one place where typed errors become gRPC status codes, and where each RPC gets its id.

Any `DlfsError` raised by a handler is sent as its status code and message,
with the error's class name in the `dlfs-error` trailing metadata.
Anything else is a bug: it becomes INTERNAL, and the traceback goes to the
daemon log under the call's request id so an operator can find it.

Every call runs with its request id bound (see `dlfs.logs`), so each log
line written while serving it names it; a failed call returns the id in
`x-request-id` trailing metadata.  Finished calls are logged at DEBUG
(method, status, duration, peer), calls slower than `limits.slow_rpc_log_s`
at WARNING, failures that point at the daemon's side (corrupt data, full
disk, overload, bugs) at WARNING or ERROR.
"""

from __future__ import annotations

import logging
import time

import grpc
from google.protobuf.message import DecodeError

from dlfs import limits, logs
from dlfs.errors import (
    ERROR_CLASS_METADATA,
    DlfsError,
    Internal,
    InvalidArgument,
    VersionMismatch,
)
from dlfs.server.grpc.call_guard import LONG_METHODS
from dlfs.server.grpc.door import client_peer
from dlfs.server.metrics import OPERATOR_CODES
from dlfs.version import VERSION_METADATA, interoperates, mismatch_message

log = logging.getLogger(__name__)


class Undecodable:
    """Stands in for a request message that failed to parse (see `tolerant`)."""

    def __init__(self, reason: str):
        self.reason = reason


def tolerant(deserializer):
    """Wrap a request deserializer so a malformed message reaches the interceptor.

    gRPC itself answers a deserializer's exception with INTERNAL; a client
    that sends invalid protobuf (e.g. a string that is not UTF-8) made a bad
    request, so the interceptor answers INVALID_ARGUMENT instead.
    """
    def parse(raw: bytes):
        try:
            return deserializer(raw)
        except DecodeError as exc:
            return Undecodable(str(exc) or "malformed message")

    return parse


class ErrorInterceptor(grpc.ServerInterceptor):
    """Translates errors to status codes and counts calls in flight and errors by code."""

    def __init__(self, metrics, authorizer=None, guard=None):
        self.metrics = metrics
        self.authorizer = authorizer  # dlfs.server.auth.Authorizer, or None: no tokens
        self.guard = guard  # dlfs.server.grpc.call_guard.CallGuard for long calls, or None

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        guard = self.guard if method in LONG_METHODS else None
        mismatch = _version_mismatch(handler_call_details.invocation_metadata)
        if mismatch is not None:
            handler, guard = _refusing(handler, mismatch), None
        elif self.authorizer is not None:
            try:
                self.authorizer.check(method, handler_call_details.invocation_metadata)
            except DlfsError as denial:
                handler = _refusing(handler, denial)
                guard = None  # a refused call takes no ticket an authorized one needs
        call = _Call(method, self.metrics,
                     logs.request_id_from(handler_call_details.invocation_metadata), guard)
        if handler.unary_unary:
            return handler._replace(unary_unary=_wrap_unary(handler.unary_unary, call, False))
        if handler.stream_unary:
            return handler._replace(stream_unary=_wrap_unary(handler.stream_unary, call, True))
        if handler.unary_stream:
            return handler._replace(unary_stream=_wrap_stream(handler.unary_stream, call, False))
        if handler.stream_stream:
            return handler._replace(stream_stream=_wrap_stream(handler.stream_stream, call, True))
        return handler


def _version_mismatch(metadata) -> VersionMismatch | None:
    """The refusal of a call whose `dlfs-version` names a release of another minor
    (`dlfs.version`'s policy); None for one of this minor, or one that names none."""
    release = next((value for key, value in metadata or () if key == VERSION_METADATA), None)
    if release is None or interoperates(release):
        return None
    return VersionMismatch(mismatch_message("client", release, this="daemon"))


def _refusing(handler, denial: Exception):
    """The same kind of handler, raising `denial` instead of serving."""
    def refuse(request, context):
        raise denial

    def refuse_stream(request, context):
        raise denial
        yield  # a generator, as streaming handlers are

    if handler.unary_unary:
        return handler._replace(unary_unary=refuse)
    if handler.stream_unary:
        return handler._replace(stream_unary=refuse)
    if handler.unary_stream:
        return handler._replace(unary_stream=refuse_stream)
    return handler._replace(stream_stream=refuse_stream)


class _Call:
    """One RPC: its method, request id and, once known, its status code name."""

    __slots__ = ("method", "metrics", "request_id", "code", "started", "guard", "ticket")

    def __init__(self, method: str, metrics, request_id: str, guard=None):
        self.method = method
        self.metrics = metrics
        self.request_id = request_id
        self.code = "OK"
        self.started = 0.0
        self.guard = guard  # set for long calls (call_guard.LONG_METHODS)
        self.ticket = None

    def begin(self):
        """Bind the request id to this thread and start the clock; returns the binding."""
        self.started = time.monotonic()
        self.metrics.rpcs_in_flight.inc()
        return logs.bind_request_id(self.request_id)

    def admit(self, context: grpc.ServicerContext) -> None:
        """Take a ticket for a long call (see call_guard).  Raises Overloaded."""
        if self.guard is not None:
            self.ticket = self.guard.admit(self.method, client_peer(context.peer()), context)

    def progress(self, message) -> None:
        """`message` (a request or a reply, bytes when pre-encoded) went in or out."""
        ticket = self.ticket
        if ticket is not None:
            ticket.progress(_size(message) if ticket.rated else 0)

    def end(self, binding, context: grpc.ServicerContext) -> None:
        if self.ticket is not None:
            self.ticket.release()
        self.metrics.rpcs_in_flight.dec()
        elapsed = time.monotonic() - self.started
        level = logging.WARNING if elapsed >= limits.slow_rpc_log_s else logging.DEBUG
        if log.isEnabledFor(level):
            peer = client_peer(context.peer())
            log.log(level, "%s %s in %.1f ms from %s%s", self.method, self.code, elapsed * 1e3,
                    peer, " (slow)" if level == logging.WARNING else "",
                    extra={"method": self.method, "code": self.code,
                           "duration_ms": round(elapsed * 1e3, 3), "peer": peer})
        logs.unbind_request_id(binding)


def _size(message) -> int:
    """Bytes of a message: pre-encoded replies are bytes, the rest protobuf messages."""
    if isinstance(message, (bytes, bytearray, memoryview)):
        return len(message)
    return message.ByteSize()


def _checked(request, streaming: bool, call: _Call):
    if streaming:
        return _checked_stream(request, call)
    if isinstance(request, Undecodable):
        raise _undecodable_error(request)
    return request


def _checked_stream(requests, call: _Call):
    for request in requests:
        call.progress(request)
        if isinstance(request, Undecodable):
            raise _undecodable_error(request)
        yield request


def _undecodable_error(request: Undecodable) -> InvalidArgument:
    return InvalidArgument(f"the request is not a valid message ({request.reason}); string fields "
                           "must be UTF-8")


def _wrap_unary(behavior, call: _Call, streaming: bool):
    def wrapped(request, context):
        binding = call.begin()
        try:
            call.admit(context)
            return behavior(_checked(request, streaming, call), context)
        except Exception as exc:  # noqa: BLE001 - translated, never swallowed
            _abort(context, exc, call)
        finally:
            call.end(binding, context)

    return wrapped


def _wrap_stream(behavior, call: _Call, streaming: bool):
    def wrapped(request, context):
        binding = call.begin()
        try:
            call.admit(context)
            for reply in behavior(_checked(request, streaming, call), context):
                yield reply
                call.progress(reply)  # it went out (or at least into the send window)
        except Exception as exc:  # noqa: BLE001 - translated, never swallowed
            _abort(context, exc, call)
        finally:
            call.end(binding, context)

    return wrapped




def _abort(context: grpc.ServicerContext, exc: Exception, call: _Call):
    method = call.method
    if isinstance(exc, OSError) and context.is_active():
        # A disk error is not a bug: say which, and where to look.
        log.error("%s: disk error", method, exc_info=exc)
        exc = Internal(f"the daemon's disk failed during {method}: {exc}; what the call "
                       "changed was undone (check the data dir's device: dmesg), then retry")
    if isinstance(exc, DlfsError):
        code = getattr(grpc.StatusCode, exc.status_code_name, grpc.StatusCode.UNKNOWN)
        call.code = code.name
        call.metrics.count_error(code.name, method)
        log.log(logging.WARNING if code.name in OPERATOR_CODES else logging.DEBUG,
                "%s -> %s: %s", method, code.name, exc.message,
                extra={"method": method, "code": code.name})
        # The exact class, so the client can raise e.g. StorageFull rather than
        # the Overloaded that its status code alone would give.
        context.set_trailing_metadata(((ERROR_CLASS_METADATA, type(exc).__name__),
                                       (logs.REQUEST_ID_METADATA, call.request_id)))
        context.abort(code, exc.message)
    if not context.is_active():
        call.code = "CANCELLED"
        log.info("%s: client went away (%s)", method, type(exc).__name__)
        raise exc
    if context.code() is not None:
        raise exc  # the handler already set a status with context.abort()
    call.code = "INTERNAL"
    call.metrics.count_error("INTERNAL", method)
    log.error("%s failed with an internal error", method, exc_info=exc,
              extra={"method": method, "code": "INTERNAL"})
    context.set_trailing_metadata(((logs.REQUEST_ID_METADATA, call.request_id),))
    context.abort(grpc.StatusCode.INTERNAL,
                  f"internal error in {method} (request id {call.request_id}); the daemon log "
                  "has the details")

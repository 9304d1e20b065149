"""The one place where typed errors become gRPC status codes.

Any `DlfsError` raised by a handler is sent as its status code and message,
with the error's class name in the `dlfs-error` trailing metadata.
Anything else is a bug: it becomes INTERNAL with a short error id, and the
traceback goes to the daemon log under that id so an operator can find it.
"""

from __future__ import annotations

import logging
import uuid

import grpc
from google.protobuf.message import DecodeError

from dlfs.errors import ERROR_CLASS_METADATA, DlfsError, InvalidArgument

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
    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if handler.unary_unary:
            return handler._replace(unary_unary=_wrap_unary(handler.unary_unary, method, False))
        if handler.stream_unary:
            return handler._replace(stream_unary=_wrap_unary(handler.stream_unary, method, True))
        if handler.unary_stream:
            return handler._replace(unary_stream=_wrap_stream(handler.unary_stream, method, False))
        if handler.stream_stream:
            return handler._replace(stream_stream=_wrap_stream(handler.stream_stream, method, True))
        return handler


def _checked(request, streaming: bool):
    if streaming:
        return _checked_stream(request)
    if isinstance(request, Undecodable):
        raise _undecodable_error(request)
    return request


def _checked_stream(requests):
    for request in requests:
        if isinstance(request, Undecodable):
            raise _undecodable_error(request)
        yield request


def _undecodable_error(request: Undecodable) -> InvalidArgument:
    return InvalidArgument(f"the request is not a valid message ({request.reason}); string fields "
                           "must be UTF-8")


def _wrap_unary(behavior, method: str, streaming: bool):
    def wrapped(request, context):
        try:
            return behavior(_checked(request, streaming), context)
        except Exception as exc:  # noqa: BLE001 - translated, never swallowed
            _abort(context, exc, method)

    return wrapped


def _wrap_stream(behavior, method: str, streaming: bool):
    def wrapped(request, context):
        try:
            yield from behavior(_checked(request, streaming), context)
        except Exception as exc:  # noqa: BLE001 - translated, never swallowed
            _abort(context, exc, method)

    return wrapped


def _abort(context: grpc.ServicerContext, exc: Exception, method: str):
    if isinstance(exc, DlfsError):
        code = getattr(grpc.StatusCode, exc.status_code_name, grpc.StatusCode.UNKNOWN)
        log.debug("%s -> %s: %s", method, code.name, exc.message)
        # The exact class, so the client can raise e.g. StorageFull rather than
        # the Overloaded that its status code alone would give.
        context.set_trailing_metadata(((ERROR_CLASS_METADATA, type(exc).__name__),))
        context.abort(code, exc.message)
    if not context.is_active():
        log.info("%s: client went away (%s)", method, type(exc).__name__)
        raise exc
    if context.code() is not None:
        raise exc  # the handler already set a status with context.abort()
    error_id = uuid.uuid4().hex[:12]
    log.error("%s failed with internal error %s", method, error_id, exc_info=exc)
    context.abort(grpc.StatusCode.INTERNAL,
                  f"internal error {error_id} in {method}; the daemon log has the details")

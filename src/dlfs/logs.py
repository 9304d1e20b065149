"""Log setup shared by `dlfs-server` and `dlfs-mount`: text or JSON lines, with request ids.

Every log line carries the id of the RPC being served when it was written
(`-` outside one), so an operator can follow one request through the
daemon's log: `grep 3f9a0c1e2b7d4a56 dlfs-server.log`, or with
``--log-format json`` one JSON object per line (fields `timestamp` in RFC 3339,
UTC: ``2026-11-27T14:55:08.968Z``, `level`,
`logger`, `message`, `request_id` plus whatever the call site passed as
``extra=``), ready for Loki, Elasticsearch or `jq`.

Request ids come from the caller's ``x-request-id`` metadata when it sends a
well-formed one (so a client, a load balancer or a training job can choose
them), else the daemon makes one.  The daemon returns the id in the
trailing metadata of every failed call; the client puts it on the exception
it raises (`DlfsError.request_id`).

On the client, ``with dlfs.request_id("epoch3-step17"): ds.get_batch(ids)``
sends that id with every call made in the block, including the parts of a
batch a multi-daemon client sends to each daemon, so one grep finds the
step in every daemon's log.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import logging
import os
import re
import sys
import tempfile
from typing import Iterator, TextIO

from pythonjsonlogger.json import JsonFormatter

from dlfs import limits
from dlfs.version import VERSION_METADATA, __version__

REQUEST_ID_METADATA = "x-request-id"
NO_REQUEST = "-"
FORMATS = ("text", "json")

_current_request = contextvars.ContextVar("dlfs_request_id", default=NO_REQUEST)
_WELL_FORMED = re.compile(r"[A-Za-z0-9._:-]{1,%d}" % limits.request_id_chars_max)


def new_request_id() -> str:
    """A fresh random id: 16 hex digits (64 bits; collisions are negligible per log).

    Made for every request that came without one: 8 random bytes, a third of
    what a UUID object costs.
    """
    return os.urandom(8).hex()


def request_id_from(metadata) -> str:
    """The caller's ``x-request-id`` if present and well formed, else a fresh id.

    Well formed: 1..`limits.request_id_chars_max` characters of letters,
    digits and ``._:-``, so a hostile id cannot forge log lines or fields.
    """
    for key, value in metadata or ():
        if key == REQUEST_ID_METADATA and _well_formed(value):
            return value
    return new_request_id()


def accept_request_id(value: str) -> str:
    """`value` when well formed (see `request_id_from`), else a fresh id."""
    return value if _well_formed(value) else new_request_id()


def current_request_id() -> str:
    """The request id bound in this thread, or "" outside one."""
    value = _current_request.get()
    return "" if value == NO_REQUEST else value


def _well_formed(value) -> bool:
    return isinstance(value, str) and _WELL_FORMED.fullmatch(value) is not None


def bind_request_id(request_id: str) -> contextvars.Token:
    """Make `request_id` current in this thread until `unbind_request_id(token)`."""
    return _current_request.set(request_id)


def unbind_request_id(token: contextvars.Token) -> None:
    _current_request.reset(token)


@contextlib.contextmanager
def request_id(value: str):
    """Send `value` as ``x-request-id`` with every DLFS call this thread makes in the block.

    Raises InvalidArgument unless it is 1..`limits.request_id_chars_max`
    letters, digits or ``._:-``.
    """
    if not _well_formed(value):
        from dlfs.errors import InvalidArgument

        raise InvalidArgument(f"request id {value!r} must be 1 to {limits.request_id_chars_max} "
                              "letters, digits or '._:-'")
    token = bind_request_id(value)
    try:
        yield value
    finally:
        unbind_request_id(token)


_RELEASE_METADATA = ((VERSION_METADATA, __version__),)


def outgoing_metadata() -> tuple:
    """Call metadata of a DLFS client's gRPC call: its release (`dlfs.version`'s policy,
    checked by the daemon) and the bound request id, if any."""
    value = _current_request.get()
    return _RELEASE_METADATA if value == NO_REQUEST else \
        _RELEASE_METADATA + ((REQUEST_ID_METADATA, value),)


class RequestIdFilter(logging.Filter):
    """Stamps each record with the current request id (attribute `request_id`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = _current_request.get()
        return True


def configure(level: str | int, log_format: str = "text", program: str = "dlfs",
              stream: TextIO | None = None, path: str | None = None) -> logging.Handler:
    """Send the root logger's records at `level` and above to `path` or `stream`.

    `log_format` is ``text`` (one human line each) or ``json`` (one JSON
    object each).  Returns the installed handler.  Raises ValueError for an
    unknown format.
    """
    if log_format not in FORMATS:
        raise ValueError(f"unknown log format {log_format!r}; choose one of {', '.join(FORMATS)}")
    handler: logging.Handler = (logging.FileHandler(path) if path
                                else logging.StreamHandler(stream or sys.stderr))
    handler.addFilter(RequestIdFilter())
    if log_format == "json":
        handler.setFormatter(JsonLineFormatter(
            "{asctime}{levelname}{name}{message}{request_id}{process}", style="{",
            rename_fields={"asctime": "timestamp", "levelname": "level", "name": "logger",
                           "process": "pid"},
            static_fields={"program": program}))
    else:
        handler.setFormatter(TextFormatter(
            f"%(asctime)s {program}[%(process)d] %(levelname)s %(name)s [%(request_id)s]: "
            "%(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
    return handler


# A line of gRPC's C core log (abseil's format): "E1127 14:55:08.968 123 add_port.cc:83] ...".
GRPC_NATIVE_LINE = re.compile(r"[EWIF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [\w.]+:\d+\] ")


class HeldStderr:
    """What C code wrote to file descriptor 2 while `held_stderr` held it."""

    def __init__(self) -> None:
        self.text = ""
        # Set inside the block to drop gRPC's own lines (the caller reports the
        # failure they describe in its own words, in the log's format).
        self.drop_grpc_lines = False


@contextlib.contextmanager
def held_stderr() -> Iterator[HeldStderr]:
    """Hold what is written to file descriptor 2 during the block (gRPC's C core writes
    there directly, in its own format), then write it out, less gRPC's lines if the
    block set `drop_grpc_lines`.  For short blocks at start-up: other threads' stderr
    is held too, and written out after the block.  Cost: a temporary file."""
    held = HeldStderr()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield held
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            held.text = tmp.read().decode(errors="replace")
            kept = [line for line in held.text.splitlines(keepends=True)
                    if not (held.drop_grpc_lines and GRPC_NATIVE_LINE.match(line))]
            if kept:
                os.write(2, "".join(kept).encode())


def rfc3339(created: float) -> str:
    """A log record's time as RFC 3339 in UTC with milliseconds: 2026-11-27T14:55:08.968Z."""
    moment = datetime.datetime.fromtimestamp(created, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class _Rfc3339:
    """Mixin for logging formatters: `asctime` in RFC 3339 (`rfc3339`)."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return rfc3339(record.created)


class TextFormatter(_Rfc3339, logging.Formatter):
    """One human line per record, its time in RFC 3339."""


class JsonLineFormatter(_Rfc3339, JsonFormatter):
    """One JSON object per record, its `timestamp` in RFC 3339."""

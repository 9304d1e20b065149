"""Typed errors shared by daemon, client and FUSE layer.

Each class names the gRPC status code it travels as.  The daemon's error
interceptor turns a raised `DlfsError` into that status with the message;
the client turns the status back into the same class.  The FUSE layer maps
classes to errno values in one table (`dlfs.fuse.errno_map`).

Messages name the thing (dataset, path, id, limit) and, where there is one,
the fix.  This module never imports grpc: status codes are kept as the
names of `grpc.StatusCode` members.
"""

from __future__ import annotations

from typing import Callable


class DlfsError(Exception):
    """Base of every error DLFS raises on purpose."""

    status_code_name = "UNKNOWN"
    # The id the daemon logged the failed call under (`x-request-id`), when
    # the error came back from a daemon; quote it when reporting a problem.
    request_id: str | None = None
    # What the client's call policy tried before it gave up with this error, each
    # attempt's error message (target and outcome), this one last; () after one try
    # (dlfs.client.transport.call_policy).
    tried: tuple[str, ...] = ()

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidArgument(DlfsError, ValueError):
    """The request is malformed: bad id, bad path, batch over a limit."""

    status_code_name = "INVALID_ARGUMENT"


class NotFound(DlfsError, KeyError):
    """The named dataset, path or sample does not exist."""

    status_code_name = "NOT_FOUND"

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return self.message


class AlreadyExists(DlfsError):
    """A dataset of that name exists (or is being ingested)."""

    status_code_name = "ALREADY_EXISTS"


class FailedPrecondition(DlfsError):
    """The system is not in a state the call needs (e.g. dataset not sealed)."""

    status_code_name = "FAILED_PRECONDITION"


class StaleGeneration(FailedPrecondition):
    """The read named a version (generation) of a dataset that was since replaced or
    deleted.  A `Dataset` asks for the current version and retries a batch once;
    an open file of the mount reads as ESTALE."""


class ResumeConflict(FailedPrecondition):
    """An ingest cannot be resumed as asked: the daemon holds a different
    number of files than the client assumed, the resume's options differ from
    the broken-off ingest's, another client is still sending it, or the
    source no longer starts with the files the daemon holds."""


class VersionMismatch(FailedPrecondition):
    """The client and the daemon are of different minor releases, which do not work
    together (`dlfs.version`'s policy); the message names both and what to install."""


class StoredElsewhere(FailedPrecondition):
    """A co-located reader was asked for a sample of a striped dataset that other
    daemons store, not the one whose extents it mapped: read it through the cluster
    (the mount then asks the daemons instead)."""


class ReplyTooLarge(FailedPrecondition):
    """A GetSmallBatch reply would not fit in one message; GetBatch streams it."""


class DataCorruption(DlfsError):
    """Stored bytes do not match their checksum, or a file is truncated."""

    status_code_name = "DATA_LOSS"
    # A checksum mismatch found on the client's side names the sample by id and, for
    # a part of one, the block (start, end) of it; `renamed(what)` is the same error
    # naming `what` (its path) instead (dlfs.client.transport.checksum_errors).
    sample_id: int | None = None
    block: tuple[int, int] | None = None
    renamed: "Callable[[str], DataCorruption] | None" = None


class Overloaded(DlfsError):
    """A resource limit was hit: too many RPCs, ingests, or a full disk."""

    status_code_name = "RESOURCE_EXHAUSTED"
    # A data path connection refused at its HELLO by one of a daemon's serving
    # processes, each of which holds its own share of the limit that refused: how
    # many there are (another may have room; 0 when the limit is not split).
    split = 0
    # The data path refused the connection itself at its HELLO (the daemon's connection
    # limit, the peer's share, no descriptors left), not a request on it: the client's
    # read policy reads through gRPC meanwhile (dlfs.client.transport.read_policy).
    refused_at_connect = False
    # On the daemon's side: which budget refused (the dlfs_data_refused_connections
    # reason), "connections" unless set.
    refusal = "connections"


class StorageFull(Overloaded):
    """The data directory's file system has no space left."""


class Unavailable(DlfsError):
    """The daemon cannot be reached or is shutting down."""

    status_code_name = "UNAVAILABLE"
    # The daemon was reached, and then the connection broke, was reset or stopped
    # answering (a data path worker that died or hung), rather than not reached at
    # all: the client's call policy tries again at once, on a new connection.
    connection_lost = False
    # ... by staying silent for the stall bound while a reply was due (1), not broken.
    stalled = 0
    # Nothing listened at the address: the connection was refused (ECONNREFUSED), as
    # opposed to one that timed out, broke or reached a daemon shutting down.  The
    # call policy raises it at once for a daemon this process never reached.
    refused = False


class DeadlineExceeded(DlfsError, TimeoutError):
    """The call did not finish within its deadline."""

    status_code_name = "DEADLINE_EXCEEDED"


class Cancelled(DlfsError):
    """The caller cancelled the call."""

    status_code_name = "CANCELLED"


class PermissionDenied(DlfsError):
    """The caller's credentials do not allow the call."""

    status_code_name = "PERMISSION_DENIED"


class Unauthenticated(DlfsError):
    """The call carried no valid credentials."""

    status_code_name = "UNAUTHENTICATED"


class Internal(DlfsError):
    """A bug in DLFS; the message carries an error id found in the daemon log."""

    status_code_name = "INTERNAL"


class InvalidReply(Internal):
    """A daemon's reply does not match its request: another number of samples than
    asked for, another version than named, lengths that disagree with the dataset's
    directory or the reply's own payload, a payload over what the caller can take.
    Never retried (the daemon that sent it is broken; its connection is closed).
    INTERNAL: a bug in DLFS, on the daemon's side."""


class StorageFailed(Internal):
    """The daemon's data dir failed a write or an fsync (EIO and the like): not a bug
    in DLFS, and not full (that is StorageFull); its device needs looking at
    (dmesg).  INTERNAL, as gRPC has no closer code; what the failed call had
    changed was undone."""


class ReadOnly(FailedPrecondition):
    """A change asked of something that cannot change: a sealed dataset (ingest a new
    version instead), or a file version.  The mount answers EROFS."""


class NotADirectory(FailedPrecondition):
    """A path names a file where a directory is needed (ENOTDIR through the mount)."""


class IsADirectory(FailedPrecondition):
    """A path names a directory where a file is needed (EISDIR through the mount)."""


class DirectoryNotEmpty(FailedPrecondition):
    """A directory to remove, or to rename over, still has entries (ENOTEMPTY)."""


class Busy(FailedPrecondition):
    """The path is held by a file being written; retry once it is closed (EBUSY)."""


# Trailing-metadata key carrying the error's class name across the wire.
ERROR_CLASS_METADATA = "dlfs-error"

ERROR_BY_STATUS_CODE_NAME: dict[str, type[DlfsError]] = {
    cls.status_code_name: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        FailedPrecondition,
        DataCorruption,
        Overloaded,
        Unavailable,
        DeadlineExceeded,
        Cancelled,
        PermissionDenied,
        Unauthenticated,
        Internal,
    )
}


def _all_subclasses(cls: type[DlfsError]) -> list[type[DlfsError]]:
    found = [cls]
    for child in cls.__subclasses__():
        found += _all_subclasses(child)
    return found


ERROR_BY_CLASS_NAME: dict[str, type[DlfsError]] = {c.__name__: c for c in _all_subclasses(DlfsError)}

"""The one table from DLFS errors to errno values, and the FUSE error it yields.

Every handler of the file system funnels its failures through `fuse_error`,
so the errno a reader sees for a given daemon error is decided here only.
"""

from __future__ import annotations

import errno
import os

from dlfs import errors


class FuseError(Exception):
    """Answer the request with `errno` (the only exception a handler lets out)."""

    def __init__(self, number: int):
        super().__init__(number, os.strerror(number))
        self.errno = number


class Stale(errors.DlfsError):
    """A file changed under the mount: the daemon now holds different bytes
    than the size or window this mount cached (the dataset was replaced).
    Readers see ESTALE; reopening the path after the cache timeout helps."""

    status_code_name = "FAILED_PRECONDITION"


# Most specific class first: the first isinstance match wins.
ERRNO_BY_ERROR: tuple[tuple[type[errors.DlfsError], int], ...] = (
    (Stale, errno.ESTALE),
    # The dataset was replaced since the file was opened (its version is gone).
    (errors.StaleGeneration, errno.ESTALE),
    (errors.NotFound, errno.ENOENT),
    (errors.InvalidArgument, errno.EINVAL),
    (errors.AlreadyExists, errno.EEXIST),
    (errors.StorageFull, errno.ENOSPC),
    # A sealed dataset, or a file version: nothing changes them.
    (errors.ReadOnly, errno.EROFS),
    (errors.NotADirectory, errno.ENOTDIR),
    (errors.IsADirectory, errno.EISDIR),
    (errors.DirectoryNotEmpty, errno.ENOTEMPTY),
    # A checkpoint file being written holds its path (rename) or has nothing to read.
    (errors.Busy, errno.EBUSY),
    # Transient: the daemon refused the call at its concurrency limit.
    (errors.Overloaded, errno.EAGAIN),
    (errors.PermissionDenied, errno.EACCES),
    (errors.Unauthenticated, errno.EACCES),
    # The daemon is gone or did not answer in time; a log line names it.
    (errors.Unavailable, errno.EIO),
    (errors.DeadlineExceeded, errno.EIO),
    (errors.DataCorruption, errno.EIO),
    (errors.FailedPrecondition, errno.EIO),
    (errors.Cancelled, errno.EIO),
    (errors.Internal, errno.EIO),
    (errors.DlfsError, errno.EIO),
)

# Errors that mean "the daemon is not serving", logged with its address.
DAEMON_DOWN: tuple[type[errors.DlfsError], ...] = (errors.Unavailable, errors.DeadlineExceeded)


def errno_for(exc: errors.DlfsError, *, on_handle: bool = False) -> int:
    """The errno for `exc`.

    With `on_handle` (the request names an open file or directory, not a
    path), NotFound becomes ESTALE: the thing existed when it was opened and
    has since been deleted or replaced on the daemon.  Cost: O(table).
    """
    if on_handle and isinstance(exc, errors.NotFound):
        return errno.ESTALE
    for cls, number in ERRNO_BY_ERROR:
        if isinstance(exc, cls):
            return number
    raise AssertionError(f"{type(exc).__name__} is not a DlfsError")  # table ends with the base


def fuse_error(exc: errors.DlfsError, *, on_handle: bool = False) -> FuseError:
    """`FuseError` carrying `errno_for(exc)`, chained to `exc` by the caller."""
    return FuseError(errno_for(exc, on_handle=on_handle))

"""The one table from DLFS errors to errno values."""

from __future__ import annotations

import errno

import pytest

from dlfs import errors
from dlfs.fuse.errno_map import FuseError, Stale, errno_for, fuse_error

EXPECTED = {
    errors.NotFound: errno.ENOENT,
    errors.InvalidArgument: errno.EINVAL,
    errors.AlreadyExists: errno.EEXIST,
    errors.FailedPrecondition: errno.EIO,
    errors.ReplyTooLarge: errno.EIO,  # never reaches a reader: the client streams instead
    errors.ResumeConflict: errno.EIO,  # never reaches a reader: only ingests raise it
    errors.StaleGeneration: errno.ESTALE,  # the file's version was replaced
    errors.DataCorruption: errno.EIO,
    errors.Overloaded: errno.EAGAIN,
    errors.StorageFull: errno.ENOSPC,
    errors.Unavailable: errno.EIO,
    errors.DeadlineExceeded: errno.EIO,
    errors.Cancelled: errno.EIO,
    errors.PermissionDenied: errno.EACCES,
    errors.Unauthenticated: errno.EACCES,
    errors.Internal: errno.EIO,
    errors.StorageFailed: errno.EIO,  # the daemon's disk failed a write
    errors.ReadOnly: errno.EROFS,  # a sealed dataset
    errors.NotADirectory: errno.ENOTDIR,
    errors.IsADirectory: errno.EISDIR,
    errors.DirectoryNotEmpty: errno.ENOTEMPTY,
    errors.Busy: errno.EBUSY,  # a checkpoint file being written
    errors.VersionMismatch: errno.EIO,  # the mount and the daemon are of other minors
    errors.StoredElsewhere: errno.EIO,  # never reaches a reader: the router reads elsewhere
    errors.InvalidReply: errno.EIO,  # a reply that does not match its request
    errors.DlfsError: errno.EIO,
    Stale: errno.ESTALE,
}


def all_error_classes(base=errors.DlfsError):
    found = {base}
    for sub in base.__subclasses__():
        found |= all_error_classes(sub)
    return found


@pytest.mark.parametrize("cls", sorted(all_error_classes(), key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_every_error_class_has_its_errno(cls):
    assert cls in EXPECTED, f"{cls.__name__} is new: decide its errno in errno_map and here"
    assert errno_for(cls("message")) == EXPECTED[cls]
    error = fuse_error(cls("message"))
    assert isinstance(error, FuseError) and error.errno == EXPECTED[cls]


def test_not_found_on_an_open_handle_is_stale():
    assert errno_for(errors.NotFound("gone"), on_handle=True) == errno.ESTALE
    assert errno_for(errors.Unavailable("down"), on_handle=True) == errno.EIO

"""DLFS: a user-level file system service for deep-learning training data.

    from dlfs import Client
    client = Client("127.0.0.1:7010")
    ds = client.dataset("demo")
    samples = ds.get_batch([7, 3, 7, 12])

`Client`, `Dataset` and the value types are loaded on first use, so that
importing any part of the package (the daemon imports `dlfs.formats.disk_layout`,
`dlfs.limits`, ...) does not load the client, gRPC stubs included.  Type
checkers cannot follow that; they read `__init__.pyi`, which names the module
of each public name (the package is typed: `py.typed`).

Installed as the distribution `dlfs-storage` (`dlfs.version.DISTRIBUTION`).
"""

import importlib as _importlib

from dlfs.errors import (
    AlreadyExists,
    Cancelled,
    DataCorruption,
    DeadlineExceeded,
    DlfsError,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    InvalidReply,
    NotFound,
    Overloaded,
    PermissionDenied,
    ResumeConflict,
    StaleGeneration,
    StorageFailed,
    StorageFull,
    Unauthenticated,
    Unavailable,
    VersionMismatch,
)
from dlfs.version import __version__

# Public names defined elsewhere, and the module that defines each.
_LAZY = {"Client": "dlfs.client.client", "Dataset": "dlfs.client.dataset",
         "DatasetTicket": "dlfs.client.ticket",
         "DatasetInfo": "dlfs.types", "Entry": "dlfs.types", "request_id": "dlfs.logs"}

__all__ = [
    "AlreadyExists", "Cancelled", "Client", "DataCorruption", "Dataset", "DatasetInfo",
    "DatasetTicket",
    "DeadlineExceeded", "DlfsError", "Entry", "FailedPrecondition", "Internal",
    "InvalidArgument", "InvalidReply", "NotFound", "Overloaded", "PermissionDenied", "ResumeConflict",
    "StaleGeneration", "StorageFailed", "StorageFull",
    "Unauthenticated", "Unavailable", "VersionMismatch", "request_id",
]


def __getattr__(name: str):
    """`dlfs.Client` and friends, and submodules as attributes (`dlfs.limits`)."""
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name]), name)
    else:
        try:
            value = _importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise  # the module exists but needs something missing
            raise AttributeError(f"module 'dlfs' has no attribute {name!r}") from None
    globals()[name] = value
    return value

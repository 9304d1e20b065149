"""DLFS: a user-level file system service for deep-learning training data.

    from dlfs import Client
    client = Client("127.0.0.1:7010")
    ds = client.dataset("demo")
    samples = ds.get_batch([7, 3, 7, 12])
"""

from dlfs.client import Client, Dataset, DatasetInfo, Entry
from dlfs.errors import (
    AlreadyExists,
    Cancelled,
    DataCorruption,
    DeadlineExceeded,
    DlfsError,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    Overloaded,
    PermissionDenied,
    StorageFull,
    Unauthenticated,
    Unavailable,
)

__version__ = "0.1.0"

__all__ = [
    "AlreadyExists", "Cancelled", "Client", "DataCorruption", "Dataset", "DatasetInfo",
    "DeadlineExceeded", "DlfsError", "Entry", "FailedPrecondition", "Internal",
    "InvalidArgument", "NotFound", "Overloaded", "PermissionDenied", "StorageFull",
    "Unauthenticated", "Unavailable",
]

"""DLFS: a user-level file system service for deep-learning training data.

    from dlfs import Client
    client = Client("127.0.0.1:7010")
    ds = client.dataset("demo")
    samples = ds.get_batch([7, 3, 7, 12])
"""

import os as _os

# gRPC must know before it is first imported that this process may fork
# (DataLoader workers): without fork support a child can hang creating its
# channel (seen in 4 of 8 runs of the DataLoader tests).  A user's explicit
# setting wins.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "true")

from dlfs.client import Client, Dataset, DatasetInfo, Entry  # noqa: E402
from dlfs.logs import request_id  # noqa: E402
from dlfs.version import __version__  # noqa: E402
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

__all__ = [
    "AlreadyExists", "Cancelled", "Client", "DataCorruption", "Dataset", "DatasetInfo",
    "DeadlineExceeded", "DlfsError", "Entry", "FailedPrecondition", "Internal",
    "InvalidArgument", "NotFound", "Overloaded", "PermissionDenied", "StorageFull",
    "Unauthenticated", "Unavailable", "request_id",
]

# Types of the `dlfs` package for type checkers and IDEs.  At run time
# `dlfs/__init__.py` loads `Client` and friends on first use (so `import dlfs`
# stays light); a checker cannot follow that, so this stub names where each
# public name comes from.  tests/packaging/test_public_types.py keeps it equal to
# `__all__`.
from dlfs.client.client import Client as Client
from dlfs.client.dataset import Dataset as Dataset
from dlfs.client.ticket import DatasetTicket as DatasetTicket
from dlfs.errors import (
    AlreadyExists as AlreadyExists,
    Cancelled as Cancelled,
    DataCorruption as DataCorruption,
    DeadlineExceeded as DeadlineExceeded,
    DlfsError as DlfsError,
    FailedPrecondition as FailedPrecondition,
    Internal as Internal,
    InvalidArgument as InvalidArgument,
    InvalidReply as InvalidReply,
    NotFound as NotFound,
    Overloaded as Overloaded,
    PermissionDenied as PermissionDenied,
    ResumeConflict as ResumeConflict,
    StaleGeneration as StaleGeneration,
    StorageFailed as StorageFailed,
    StorageFull as StorageFull,
    Unauthenticated as Unauthenticated,
    Unavailable as Unavailable,
    VersionMismatch as VersionMismatch,
)
from dlfs.logs import request_id as request_id
from dlfs.types import DatasetInfo as DatasetInfo
from dlfs.types import Entry as Entry
from dlfs.version import __version__ as __version__

__all__: list[str]

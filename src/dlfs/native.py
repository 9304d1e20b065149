"""The optional C extensions (setup.py), loaded where they were built, behind one switch.

Each has Python code beside it that does the same and stays the reference:
the client's GET_BATCH exchange, the daemon's send of a whole reply from
mappings.  Nothing here imports grpc.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def disabled() -> bool:
    """Whether DLFS_NATIVE=0 turned every C extension off in this process."""
    return os.environ.get("DLFS_NATIVE", "1") == "0"


def extension(name: str) -> ModuleType | None:
    """The C extension module `name`, or None: not built where this was installed (no C
    compiler at install), or turned off with DLFS_NATIVE=0.  The caller then uses
    its Python code."""
    if disabled():
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None

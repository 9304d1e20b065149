"""The optional C extensions (setup.py), loaded where they were built, behind one switch.

Each has Python code beside it that does the same and stays the reference:
the client's GET_BATCH exchange, the daemon's send of a whole reply from
mappings.  Nothing here imports grpc.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

# How an installation gets the C extensions: setup.py builds them where it finds a C
# compiler (and leaves them out, quietly, where it finds none).
BUILD_HINT = "reinstall DLFS where a C compiler is found"


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


def unbuilt(module: ModuleType | None) -> bool:
    """Whether the extension `module` (as `extension` gave it) is missing because it was
    not built for this interpreter, not because DLFS_NATIVE=0 turned it off."""
    return module is None and not disabled()


def describe(module: ModuleType | None, what: str, build_hint: str = BUILD_HINT) -> str:
    """Which code does `what` in this process, as status lines and benchmark tables say
    it: "C" where the extension `module` loaded, else "Python" and why: DLFS_NATIVE=0,
    or not built for this interpreter (then `build_hint`: how to build it)."""
    if module is not None:
        return "C"
    if disabled():
        return "Python (DLFS_NATIVE=0)"
    return (f"Python (the C {what} is not built for Python {sys.version_info.major}."
            f"{sys.version_info.minor} here: {build_hint})")

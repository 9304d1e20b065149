"""Rules for dataset names and sample paths, shared by daemon, client and FUSE.

A sample path is relative to its dataset: components separated by a single
``/``, none empty, none ``.`` or ``..``, no NUL byte, valid UTF-8 (no lone
surrogates), at most `limits.path_bytes_max` bytes in all and
`limits.path_component_bytes_max` per component.  The empty string names the
dataset's root directory where a directory is expected.

Sample ids follow sorted path order.  Python compares `str` by code point,
which for valid UTF-8 is exactly the byte order of the encoded path, so
``sorted(paths)`` is the id order.
"""

from __future__ import annotations

import re

from dlfs import limits
from dlfs.errors import InvalidArgument

_DATASET_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")


def check_dataset_name(name: str) -> str:
    """Return `name` if it is a valid dataset name, else raise InvalidArgument.

    Valid: 1..dataset_name_bytes_max characters of ``[A-Za-z0-9_.-]``, not
    starting with ``.`` or ``-`` (so it is a safe file and directory name).
    """
    if not isinstance(name, str):
        raise InvalidArgument(f"dataset name must be a string, got {type(name).__name__}")
    if not name:
        raise InvalidArgument("dataset name is empty")
    if len(name) > limits.dataset_name_bytes_max:
        raise InvalidArgument(
            f"dataset name {name[:40]!r}... is {len(name)} characters, "
            f"over the limit of {limits.dataset_name_bytes_max}"
        )
    if not _DATASET_NAME_RE.fullmatch(name):
        raise InvalidArgument(
            f"dataset name {name!r} is malformed: use letters, digits, '_', '.' and '-', "
            "not starting with '.' or '-'"
        )
    return name


# A file version of a checkpoint space is read as the one-sample dataset
# "SPACE@VERSION" (version id in lowercase hex): see dlfs.server.core.space_records.
FILE_VERSION_SEP = "@"
_FILE_VERSION_RE = re.compile(r"[0-9a-f]{1,16}")


def file_version_name(space: str, version_id: int) -> str:
    """The name reads give file version `version_id` of space `space`."""
    return f"{space}{FILE_VERSION_SEP}{version_id:x}"


def check_read_name(name: str) -> str:
    """Return `name` if reads may name it: a dataset (or space) name, or a file
    version's "SPACE@VERSION" (`file_version_name`); else raise InvalidArgument."""
    if isinstance(name, str) and FILE_VERSION_SEP in name:
        space, _, version = name.partition(FILE_VERSION_SEP)
        check_dataset_name(space)
        if not _FILE_VERSION_RE.fullmatch(version):
            raise InvalidArgument(f"{name!r} is malformed: a file version is read as "
                                  "SPACE@VERSION, the version in hex (as `dlfs stat` shows it)")
        return name
    return check_dataset_name(name)


def path_utf8(path: str) -> bytes:
    """Encode `path` as UTF-8, raising InvalidArgument for lone surrogates."""
    try:
        return path.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(
            f"path {path!r} is not valid UTF-8 (it holds undecodable bytes)"
        ) from None


def check_sample_path(path: str, *, allow_root: bool = False) -> str:
    """Return `path` if it is a valid sample path, else raise InvalidArgument.

    With `allow_root`, the empty string (the dataset root) is accepted too.
    Cost: O(len(path)).
    """
    if not isinstance(path, str):
        raise InvalidArgument(f"path must be a string, got {type(path).__name__}")
    if path == "":
        if allow_root:
            return path
        raise InvalidArgument("path is empty: name a sample inside the dataset")
    encoded = path_utf8(path)
    if len(encoded) > limits.path_bytes_max:
        raise InvalidArgument(
            f"path {path[:60]!r}... is {len(encoded)} bytes, over the limit of "
            f"{limits.path_bytes_max}"
        )
    if "\x00" in path:
        raise InvalidArgument(f"path {path!r} contains a NUL byte")
    if path.startswith("/"):
        raise InvalidArgument(
            f"path {path!r} is absolute: sample paths are relative to their dataset"
        )
    for component in path.split("/"):
        if component in ("", ".", ".."):
            raise InvalidArgument(
                f"path {path!r} is malformed: empty, '.' and '..' components are not allowed"
            )
        if len(component.encode("utf-8")) > limits.path_component_bytes_max:
            raise InvalidArgument(
                f"path {path!r} has a component over {limits.path_component_bytes_max} bytes"
            )
    return path


def normalize_dir_path(path: str) -> str:
    """Strip leading/trailing slashes from a directory path and validate it.

    ``""``, ``"/"`` and ``"a/b/"`` become ``""``, ``""`` and ``"a/b"``.
    """
    stripped = path.strip("/") if isinstance(path, str) else path
    return check_sample_path(stripped, allow_root=True)


def split_dataset_path(full: str) -> tuple[str, str]:
    """Split a CLI-style ``NAME/PATH`` into (dataset, path) and validate both.

    ``NAME`` alone gives (``NAME``, ``""``), the dataset's root.
    """
    name, _, rest = full.strip("/").partition("/")
    check_dataset_name(name)
    return name, normalize_dir_path(rest)

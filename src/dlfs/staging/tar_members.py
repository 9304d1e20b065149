"""Tar members as samples: their dataset paths, link targets, modes and bytes.

Pure functions of `tarfile` headers (and one opener of a member's bytes),
for `dlfs.staging.tar_archive`.  A member's dataset path is its name inside
the archive, '/'-separated, without a leading './'; absolute names, '..'
components and names that are not valid UTF-8 are refused (InvalidArgument
naming the archive and the member): extracting such an archive would write
outside its directory, and DLFS refuses to guess what was meant.
"""

from __future__ import annotations

import posixpath
import stat as stat_module
import tarfile

from dlfs.errors import InvalidArgument
from dlfs.staging.source_files import has_surrogates


class _MemberStream:
    def __init__(self, tf: tarfile.TarFile, member: tarfile.TarInfo):
        self._file = tf.extractfile(member)

    def __enter__(self):
        return self._file

    def __exit__(self, *exc):
        self._file.close()


def member_reader(tf: tarfile.TarFile, member: tarfile.TarInfo):
    """An opener of `member`'s bytes: a context manager yielding a file object."""
    return lambda: _MemberStream(tf, member)


def normalized_name(name: str) -> str:
    """A member name without empty and '.' components (how links name members)."""
    return "/".join(part for part in name.split("/") if part not in ("", "."))


def member_path(archive: str, name: str) -> str:
    """The dataset path of archive member `name` ("" for the archive's root).

    Raises InvalidArgument for absolute names, '..' components and names
    that are not valid UTF-8.
    """
    if has_surrogates(name):
        raise InvalidArgument(
            f"archive {archive!r} has member {name!r} whose name is not valid UTF-8; "
            "dataset paths are UTF-8 (re-create the archive with UTF-8 names)")
    if name.startswith("/"):
        raise InvalidArgument(
            f"archive {archive!r} has member {name!r} with an absolute name; DLFS takes only "
            "relative names (re-create the archive without the leading '/')")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise InvalidArgument(
            f"archive {archive!r} has member {name!r} with a '..' component, which would "
            "point outside the archive; DLFS refuses such archives")
    return "/".join(parts)


def link_target(member: tarfile.TarInfo) -> str | None:
    """Normalized member name a link points to; None if it leaves the archive."""
    if member.islnk():
        target = member.linkname  # hard links name a member of the archive
    else:
        if member.linkname.startswith("/"):
            return None
        target = posixpath.join(posixpath.dirname(member.name), member.linkname)
    if target.startswith("/"):
        return None
    parts: list[str] = []
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return None
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts) or None


def member_mode(member: tarfile.TarInfo) -> int:
    """The st_mode of the sample a regular member becomes."""
    return stat_module.S_IFREG | (member.mode & 0o7777)


def member_mtime_ns(member: tarfile.TarInfo) -> int:
    """The member's mtime (whole seconds in a tar header), in nanoseconds."""
    return int(member.mtime) * 1_000_000_000

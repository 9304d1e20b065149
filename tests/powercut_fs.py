"""A pass-through FUSE file system that remembers only what was fsynced: power-loss tests.

    python tests/powercut_fs.py BACKING MOUNTPOINT --image DIR [--ready-file F]

Every operation goes through to the directory BACKING, so programs on the
mount work as usual.  Beside that, the file system keeps the state a
power loss would leave under the POSIX rules, at their most pessimistic:

- a file's contents survive as of its last fsync (none: empty);
- a directory's entries (files and directories created, renamed or
  removed in it) survive as of the last fsync of that directory (none:
  as they were when mounted, or empty for a directory made since).

SIGTERM "cuts the power": the surviving tree is written to DIR, the mount
is unmounted and the process exits.  Real file systems keep more (ext4
commits its journal every few seconds, and an fsync commits every earlier
metadata change too), which is why a program that forgets a directory
fsync passes on them and loses data on the next file system or kernel; this
one loses it every time.  For tests only.
"""

from __future__ import annotations

import argparse
import errno
import itertools
import os
import signal
import stat
import sys

import pyfuse3
import trio


class PowercutFs(pyfuse3.Operations):
    """Pass-through to `backing` plus the model of what is durable (see module doc)."""

    def __init__(self, backing: str):
        super().__init__()
        self.backing = os.path.abspath(backing)
        self.root_ino = os.lstat(self.backing).st_ino
        self.paths: dict[int, str] = {self.root_ino: self.backing}
        self.files: dict[int, tuple[int, int]] = {}  # fh -> (fd, backing inode)
        self.dirs: dict[int, tuple[int, list]] = {}  # fh -> (backing inode, entries)
        self.handles = itertools.count(1)
        self.synced_data: dict[int, bytes] = {}
        self.synced_entries: dict[int, dict[str, tuple[int, bool]]] = {}
        for top, dirnames, filenames in os.walk(self.backing):
            ino = os.lstat(top).st_ino
            self.synced_entries[ino] = self._entries(top)
            for name in filenames:
                path = os.path.join(top, name)
                with open(path, "rb") as f:
                    self.synced_data[os.lstat(path).st_ino] = f.read()

    # --- the model --------------------------------------------------------------

    @staticmethod
    def _entries(path: str) -> dict[str, tuple[int, bool]]:
        return {e.name: (e.inode(), e.is_dir(follow_symlinks=False)) for e in os.scandir(path)}

    def write_image(self, target: str) -> None:
        """Write the tree a power loss now would leave to `target` (a new directory)."""
        os.makedirs(target)
        self._write_dir(self.root_ino, target)

    def _write_dir(self, ino: int, target: str) -> None:
        for name, (child, is_dir) in self.synced_entries.get(ino, {}).items():
            path = os.path.join(target, name)
            if is_dir:
                os.mkdir(path, 0o700)
                self._write_dir(child, path)
            else:
                with open(path, "wb") as f:
                    f.write(self.synced_data.get(child, b""))

    # --- inodes and attributes ------------------------------------------------------

    def _fuse_ino(self, ino: int) -> int:
        return pyfuse3.ROOT_INODE if ino == self.root_ino else ino

    def _backing_ino(self, inode: int) -> int:
        return self.root_ino if inode == pyfuse3.ROOT_INODE else inode

    def _path(self, inode: int) -> str:
        try:
            return self.paths[self._backing_ino(inode)]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def _attributes(self, path: str) -> pyfuse3.EntryAttributes:
        try:
            st = os.lstat(path)
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        self.paths[st.st_ino] = path
        attributes = pyfuse3.EntryAttributes()
        for field in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_rdev", "st_size",
                      "st_blksize", "st_blocks", "st_atime_ns", "st_mtime_ns", "st_ctime_ns"):
            setattr(attributes, field, getattr(st, field))
        attributes.st_ino = self._fuse_ino(st.st_ino)
        attributes.entry_timeout = 0
        attributes.attr_timeout = 0
        return attributes

    def _child(self, parent_inode: int, name: bytes) -> str:
        return os.path.join(self._path(parent_inode), os.fsdecode(name))

    # --- operations -------------------------------------------------------------------

    async def lookup(self, parent_inode, name, ctx=None):
        return self._attributes(self._child(parent_inode, name))

    async def getattr(self, inode, ctx=None):
        return self._attributes(self._path(inode))

    async def setattr(self, inode, attr, fields, fh, ctx):
        path = self._path(inode)
        try:
            if fields.update_size:
                if fh is not None and fh in self.files:
                    os.ftruncate(self.files[fh][0], attr.st_size)
                else:
                    os.truncate(path, attr.st_size)
            if fields.update_mode:
                os.chmod(path, stat.S_IMODE(attr.st_mode))
            if fields.update_mtime or fields.update_atime:
                st = os.lstat(path)
                os.utime(path, ns=(attr.st_atime_ns if fields.update_atime else st.st_atime_ns,
                                   attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns))
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        return self._attributes(path)

    async def opendir(self, inode, ctx):
        path = self._path(inode)
        fh = next(self.handles)
        entries = sorted(os.listdir(path))
        self.dirs[fh] = (self._backing_ino(inode), [os.path.join(path, n) for n in entries])
        return fh

    async def readdir(self, fh, start_id, token):
        _ino, entries = self.dirs[fh]
        for index in range(start_id, len(entries)):
            path = entries[index]
            try:
                attributes = self._attributes(path)
            except pyfuse3.FUSEError:
                continue  # removed since opendir
            if not pyfuse3.readdir_reply(token, os.fsencode(os.path.basename(path)), attributes,
                                         index + 1):
                return

    async def releasedir(self, fh):
        self.dirs.pop(fh, None)

    async def fsyncdir(self, fh, datasync):
        ino, _entries = self.dirs[fh]
        self.synced_entries[ino] = self._entries(self.paths[ino])

    async def mkdir(self, parent_inode, name, mode, ctx):
        path = self._child(parent_inode, name)
        try:
            os.mkdir(path, stat.S_IMODE(mode))
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        return self._attributes(path)

    async def rmdir(self, parent_inode, name, ctx):
        try:
            os.rmdir(self._child(parent_inode, name))
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None

    async def unlink(self, parent_inode, name, ctx):
        try:
            os.unlink(self._child(parent_inode, name))
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None

    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        if flags:
            raise pyfuse3.FUSEError(errno.EINVAL)
        old = self._child(parent_inode_old, name_old)
        new = self._child(parent_inode_new, name_new)
        try:
            ino = os.lstat(old).st_ino
            os.rename(old, new)
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        prefix = old + os.sep
        self.paths[ino] = new
        for other, path in list(self.paths.items()):
            if path.startswith(prefix):
                self.paths[other] = new + path[len(old):]

    async def open(self, inode, flags, ctx):
        return self._open(self._path(inode), flags & ~os.O_CREAT)

    async def create(self, parent_inode, name, mode, flags, ctx):
        path = self._child(parent_inode, name)
        info = self._open(path, flags | os.O_CREAT, stat.S_IMODE(mode))
        return info, self._attributes(path)

    def _open(self, path: str, flags: int, mode: int = 0o600) -> pyfuse3.FileInfo:
        try:
            fd = os.open(path, flags & ~os.O_APPEND, mode)
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        fh = next(self.handles)
        self.files[fh] = (fd, os.fstat(fd).st_ino)
        return pyfuse3.FileInfo(fh=fh, keep_cache=False)

    async def read(self, fh, offset, size):
        return os.pread(self.files[fh][0], size, offset)

    async def write(self, fh, offset, buf):
        return os.pwrite(self.files[fh][0], buf, offset)

    async def fsync(self, fh, datasync):
        fd, ino = self.files[fh]
        # The handle may be write-only: read the same file through /proc.
        with open(f"/proc/self/fd/{fd}", "rb") as f:
            self.synced_data[ino] = f.read()

    async def flush(self, fh):
        pass

    async def release(self, fh):
        fd, _ino = self.files.pop(fh)
        os.close(fd)

    async def statfs(self, ctx):
        st = os.statvfs(self.backing)
        data = pyfuse3.StatvfsData()
        for field in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                      "f_ffree", "f_favail", "f_namemax"):
            setattr(data, field, getattr(st, field))
        return data


async def serve(fs: PowercutFs, mountpoint: str, image: str, ready_file: str | None) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pyfuse3.main)
        await trio.to_thread.run_sync(os.stat, mountpoint)
        if ready_file:
            with open(ready_file, "w") as f:
                f.write(f"{os.getpid()}\n")
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async for _ in signals:
                fs.write_image(image)  # between two operations: a consistent cut
                nursery.cancel_scope.cancel()
                return


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python tests/powercut_fs.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("backing")
    parser.add_argument("mountpoint")
    parser.add_argument("--image", required=True, help="where SIGTERM writes the surviving tree")
    parser.add_argument("--ready-file", help="written once the mount answers")
    args = parser.parse_args(argv)
    fs = PowercutFs(args.backing)
    pyfuse3.init(fs, args.mountpoint, set(pyfuse3.default_options) | {"fsname=powercut"})
    try:
        trio.run(serve, fs, args.mountpoint, args.image, args.ready_file)
    finally:
        pyfuse3.close(unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

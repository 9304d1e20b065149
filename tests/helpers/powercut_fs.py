"""A pass-through FUSE file system that remembers only what was fsynced: power-loss tests.

    python tests/helpers/powercut_fs.py BACKING MOUNTPOINT --image DIR [--ready-file F]

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
import os
import stat
import sys

import mfusepy


def _errors(method):
    """Turn an OSError of the backing directory into the same errno for the kernel."""
    def wrapped(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except OSError as exc:
            raise mfusepy.FuseOSError(exc.errno or errno.EIO) from None
    return wrapped


class PowercutFs(mfusepy.Operations):
    """Pass-through to `backing` plus the model of what is durable (see module doc).

    Files are known by their backing inode number, so renames and open
    handles keep their identity.  One thread (nothreads): no locking.
    """

    use_ns = True

    def __init__(self, backing: str):
        self.backing = os.path.abspath(backing)
        self.root_ino = os.lstat(self.backing).st_ino
        self.synced_data: dict[int, bytes] = {}
        self.synced_entries: dict[int, dict[str, tuple[int, bool]]] = {}
        for top, _dirnames, filenames in os.walk(self.backing):
            self.synced_entries[os.lstat(top).st_ino] = self._entries(top)
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

    # --- operations: pass-through, and fsync/fsyncdir record what is durable -----------

    def _real(self, path: str) -> str:
        return self.backing + path

    @_errors
    def getattr(self, path, fh=None):
        st = os.lstat(self._real(path))
        return {key: getattr(st, key) for key in (
            "st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino",
            "st_atime_ns", "st_mtime_ns", "st_ctime_ns")}

    @_errors
    def readdir(self, path, fh):
        return [".", "..", *sorted(os.listdir(self._real(path)))]

    @_errors
    def opendir(self, path):
        return 0

    @_errors
    def fsyncdir(self, path, datasync, fh):
        real = self._real(path)
        self.synced_entries[os.lstat(real).st_ino] = self._entries(real)
        return 0

    @_errors
    def mkdir(self, path, mode):
        os.mkdir(self._real(path), stat.S_IMODE(mode))
        return 0

    @_errors
    def rmdir(self, path):
        os.rmdir(self._real(path))
        return 0

    @_errors
    def unlink(self, path):
        os.unlink(self._real(path))
        return 0

    @_errors
    def rename(self, old, new):
        os.rename(self._real(old), self._real(new))
        return 0

    @_errors
    def chmod(self, path, mode):
        os.chmod(self._real(path), stat.S_IMODE(mode))
        return 0

    @_errors
    def utimens(self, path, times=None):
        os.utime(self._real(path), ns=times)
        return 0

    @_errors
    def truncate(self, path, length, fh=None):
        if fh:
            os.ftruncate(fh, length)
        else:
            os.truncate(self._real(path), length)
        return 0

    @_errors
    def open(self, path, flags):
        return os.open(self._real(path), flags & ~os.O_APPEND)

    @_errors
    def create(self, path, mode, fi=None):
        return os.open(self._real(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                       stat.S_IMODE(mode))

    @_errors
    def read(self, path, size, offset, fh):
        return os.pread(fh, size, offset)

    @_errors
    def write(self, path, data, offset, fh):
        return os.pwrite(fh, data, offset)

    @_errors
    def fsync(self, path, datasync, fh):
        # The handle may be write-only: read the same file through /proc.
        with open(f"/proc/self/fd/{fh}", "rb") as f:
            self.synced_data[os.fstat(fh).st_ino] = f.read()
        return 0

    def flush(self, path, fh):
        return 0

    @_errors
    def release(self, path, fh):
        os.close(fh)
        return 0

    @_errors
    def statfs(self, path):
        st = os.statvfs(self.backing)
        return {key: getattr(st, key) for key in (
            "f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree",
            "f_favail", "f_namemax")}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python tests/helpers/powercut_fs.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("backing")
    parser.add_argument("mountpoint")
    parser.add_argument("--image", required=True, help="where SIGTERM writes the surviving tree")
    parser.add_argument("--ready-file", help="written once the mount answers")
    args = parser.parse_args(argv)
    fs = PowercutFs(args.backing)

    mounted = []

    def ready(*_args):
        mounted.append(True)
        if args.ready_file:
            with open(args.ready_file, "w") as f:
                f.write(f"{os.getpid()}\n")

    fs.init = ready  # libfuse calls init once the mount is up
    # Serves until SIGTERM (libfuse's handler ends the loop and unmounts);
    # the loop has stopped by then, so the image is a cut between operations.
    try:
        mfusepy.FUSE(fs, args.mountpoint, foreground=True, nothreads=True, fsname="powercut",
                     entry_timeout=0, attr_timeout=0, negative_timeout=0)
    except RuntimeError as exc:  # libfuse reports the loop ended by a signal as an error
        if not mounted:
            raise
        print(f"powercut_fs: the loop ended ({exc})", file=sys.stderr)
    fs.write_image(args.image)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

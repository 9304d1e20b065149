"""A naive FUSE file system over DLFS: the baseline `fuse_bench` compares against.

    python -m bench.naive_fuse ADDR MOUNTPOINT [--ready-file PATH]   # serves until fusermount3 -u

What a first attempt looks like: every lookup and getattr is a Stat RPC,
every read call is one ReadRange RPC for exactly the bytes the kernel asked
for, nothing is cached in the process or by the kernel (zero entry and
attribute timeouts), and every file is opened with an OPEN (not FUSE
no-open) and without keep_cache (so each open drops the page cache of the
file).  It runs on the mount's own binding (`dlfs.fuse.session`), and its
blocking calls run in threads, so the comparison is about caching and round
trips, not about the binding or blocking the event loop.  Not for use; for
measurement only.
"""

from __future__ import annotations

import argparse
import errno
import itertools
import os
import stat
import sys

import trio

from dlfs import Client, errors
from dlfs.fuse import lowlevel as ll
from dlfs.fuse.errno_map import FuseError
from dlfs.fuse.session import Session


class NaiveFs:
    """Handlers in `dlfs.fuse.session`'s contract; every one waits for an RPC."""

    def __init__(self, client: Client):
        self.client = client
        self.session: Session | None = None
        self.paths: dict[int, tuple[str, str]] = {ll.ROOT_INODE: ("", "")}
        self.inodes: dict[tuple[str, str], int] = {("", ""): ll.ROOT_INODE}
        self.next_inode = itertools.count(ll.ROOT_INODE + 1)
        self.files: dict[int, tuple[str, str]] = {}
        self.dirs: dict[int, list] = {}
        self.handles = itertools.count(1)
        self.datasets: dict[str, object] = {}

    async def _call(self, function, *args):
        try:
            return await trio.to_thread.run_sync(function, *args)
        except errors.NotFound:
            raise FuseError(errno.ENOENT) from None
        except errors.DlfsError:
            raise FuseError(errno.EIO) from None

    def _inode(self, key: tuple[str, str]) -> int:
        if key not in self.inodes:
            inode = next(self.next_inode)
            self.inodes[key] = inode
            self.paths[inode] = key
        return self.inodes[key]

    async def _entry(self, key: tuple[str, str]) -> ll.EntryParam:
        dataset, path = key
        entry = ll.EntryParam()  # timeouts 0: the kernel asks again every time
        entry.ino = entry.attr.st_ino = self._inode(key)
        entry.attr.st_nlink = 1
        if not dataset:
            entry.attr.st_mode = stat.S_IFDIR | 0o555
            return entry
        found = await self._call(self.client.stat, dataset, path)  # one RPC per request
        entry.attr.st_mode, entry.attr.st_size = found.mode, found.size
        entry.attr.st_mtim.tv_sec, entry.attr.st_mtim.tv_nsec = divmod(found.mtime_ns, 10**9)
        return entry

    def lookup(self, req, parent_inode, name):
        dataset, path = self.paths[parent_inode]
        name = name.decode()
        key = (name, "") if not dataset else (dataset, f"{path}/{name}" if path else name)
        return self._reply_entry(req, key)

    async def _reply_entry(self, req, key):
        self.session.reply_entry(req, await self._entry(key))

    def forget(self, items):
        pass

    def getattr(self, req, inode):
        return self._reply_attr(req, self.paths[inode])

    async def _reply_attr(self, req, key):
        self.session.reply_attr(req, (await self._entry(key)).attr, 0.0)

    def opendir(self, req, inode):
        return self._opendir(req, inode)

    async def _opendir(self, req, inode):
        dataset, path = self.paths[inode]
        if not dataset:
            names = [((name, ""), name) for name in await self._call(self.client.datasets)]
        else:
            entries = await self._call(lambda: list(self.client.listdir(dataset, path)))
            names = [((dataset, e.path), e.name) for e in entries]
        fh = next(self.handles)
        self.dirs[fh] = names
        self.session.reply_open(req, fh)

    def readdirplus(self, req, inode, size, offset, fh):
        return self._readdirplus(req, size, offset, fh)

    async def _readdirplus(self, req, size, offset, fh):
        reply = self.session.directory_buffer(req, size)
        for index in range(offset, len(self.dirs[fh])):
            key, name = self.dirs[fh][index]
            if not reply.add(name.encode(), await self._entry(key), index + 1):
                break
        reply.reply()

    def releasedir(self, req, inode, fh):
        self.dirs.pop(fh, None)
        self.session.reply_err(req, 0)

    def open(self, req, inode, flags):
        fh = next(self.handles)
        self.files[fh] = self.paths[inode]
        self.session.reply_open(req, fh, keep_cache=False)

    def _read(self, dataset: str, path: str, offset: int, size: int) -> memoryview:
        if dataset not in self.datasets:  # one GetDataset per dataset
            self.datasets[dataset] = self.client.dataset(dataset)
        return self.datasets[dataset].read(path, offset, size)  # one ReadRange per read

    def read(self, req, inode, size, offset):
        return self._reply_read(req, inode, size, offset)

    async def _reply_read(self, req, inode, size, offset):
        dataset, path = self.paths[inode]
        self.session.reply_data(req, await self._call(self._read, dataset, path, offset, size))

    def release(self, req, inode, fh):
        self.files.pop(fh, None)
        self.session.reply_err(req, 0)


async def serve(session: Session, mountpoint: str, ready_file: str | None) -> None:
    """Serve until unmounted; write `ready_file` once a stat of the mount answers."""
    async with trio.open_nursery() as nursery:
        async def run() -> None:
            await session.serve(nursery)
            nursery.cancel_scope.cancel()

        nursery.start_soon(run)
        await trio.to_thread.run_sync(os.stat, mountpoint)
        if ready_file:
            with open(ready_file, "w") as f:
                f.write(f"{os.getpid()}\n")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.naive_fuse")
    parser.add_argument("address")
    parser.add_argument("mountpoint")
    parser.add_argument("--foreground", action="store_true",
                        help="accepted for dlfs-mount's command line; always in the foreground")
    parser.add_argument("--ready-file", help="written once the mount answers, as by dlfs-mount")
    args = parser.parse_args(argv)
    client = Client(args.address)
    fs = NaiveFs(client)
    fs.session = Session(fs, args.mountpoint, ["ro", "default_permissions", "fsname=dlfs-naive"],
                         want=ll.CAP_READDIRPLUS, unwant=ll.CAP_READDIRPLUS_AUTO)
    try:
        trio.run(serve, fs.session, args.mountpoint, args.ready_file)
    finally:
        fs.session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

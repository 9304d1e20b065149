"""A naive pyfuse3 file system over DLFS: the baseline `fuse_bench` compares against.

    python -m bench.naive_fuse ADDR MOUNTPOINT [--ready-file PATH]   # serves until fusermount3 -u

What a first attempt looks like: every lookup and getattr is a Stat RPC,
every read call is one ReadRange RPC for exactly the bytes the kernel asked
for, nothing is cached in the process and files are opened without
keep_cache (so each open drops the page cache of the file).  Blocking calls
still run in threads, so the comparison is about caching and round trips,
not about blocking the event loop.  Not for use; for measurement only.
"""

from __future__ import annotations

import argparse
import errno
import itertools
import os
import stat
import sys

import pyfuse3
import trio

from dlfs import Client, errors


class NaiveFs(pyfuse3.Operations):
    def __init__(self, client: Client):
        super().__init__()
        self.client = client
        self.paths: dict[int, tuple[str, str]] = {pyfuse3.ROOT_INODE: ("", "")}
        self.inodes: dict[tuple[str, str], int] = {("", ""): pyfuse3.ROOT_INODE}
        self.next_inode = itertools.count(pyfuse3.ROOT_INODE + 1)
        self.files: dict[int, tuple[str, str]] = {}
        self.dirs: dict[int, list] = {}
        self.handles = itertools.count(1)
        self.datasets: dict[str, object] = {}

    async def _call(self, function, *args):
        try:
            return await trio.to_thread.run_sync(function, *args)
        except errors.NotFound:
            raise pyfuse3.FUSEError(errno.ENOENT) from None
        except errors.DlfsError:
            raise pyfuse3.FUSEError(errno.EIO) from None

    def _inode(self, key: tuple[str, str]) -> int:
        if key not in self.inodes:
            inode = next(self.next_inode)
            self.inodes[key] = inode
            self.paths[inode] = key
        return self.inodes[key]

    async def _attributes(self, key: tuple[str, str]) -> pyfuse3.EntryAttributes:
        dataset, path = key
        attributes = pyfuse3.EntryAttributes()
        attributes.st_ino = self._inode(key)
        if not dataset:
            attributes.st_mode = stat.S_IFDIR | 0o555
            return attributes
        entry = await self._call(self.client.stat, dataset, path)  # one RPC per request
        attributes.st_mode = entry.mode
        attributes.st_size = entry.size
        attributes.st_mtime_ns = entry.mtime_ns
        return attributes

    async def lookup(self, parent_inode, name, ctx=None):
        dataset, path = self.paths[parent_inode]
        name = name.decode()
        key = (name, "") if not dataset else (dataset, f"{path}/{name}" if path else name)
        return await self._attributes(key)

    async def getattr(self, inode, ctx=None):
        return await self._attributes(self.paths[inode])

    async def opendir(self, inode, ctx):
        dataset, path = self.paths[inode]
        if not dataset:
            names = [((name, ""), name) for name in await self._call(self.client.datasets)]
        else:
            entries = await self._call(lambda: list(self.client.listdir(dataset, path)))
            names = [((dataset, e.path), e.name) for e in entries]
        fh = next(self.handles)
        self.dirs[fh] = names
        return fh

    async def readdir(self, fh, start_id, token):
        for index in range(start_id, len(self.dirs[fh])):
            key, name = self.dirs[fh][index]
            if not pyfuse3.readdir_reply(token, name.encode(), await self._attributes(key),
                                         index + 1):
                return

    async def releasedir(self, fh):
        self.dirs.pop(fh, None)

    async def open(self, inode, flags, ctx):
        fh = next(self.handles)
        self.files[fh] = self.paths[inode]
        return pyfuse3.FileInfo(fh=fh, keep_cache=False)  # pyfuse3's default is True

    def _read(self, dataset: str, path: str, offset: int, size: int) -> memoryview:
        if dataset not in self.datasets:  # one GetDataset per dataset
            self.datasets[dataset] = self.client.dataset(dataset)
        return self.datasets[dataset].read(path, offset, size)  # one ReadRange per read

    async def read(self, fh, offset, size):
        dataset, path = self.files[fh]
        return await self._call(self._read, dataset, path, offset, size)

    async def release(self, fh):
        self.files.pop(fh, None)


async def serve(mountpoint: str, ready_file: str | None) -> None:
    """Serve until unmounted; write `ready_file` once a stat of the mount answers."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pyfuse3.main)
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
    options = set(pyfuse3.default_options) | {"ro", "fsname=dlfs-naive"}
    pyfuse3.init(NaiveFs(client), args.mountpoint, options)
    try:
        trio.run(serve, args.mountpoint, args.ready_file)
    finally:
        pyfuse3.close(unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

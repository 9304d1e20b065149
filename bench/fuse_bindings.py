"""`python -m bench.fuse_bindings [--files N]`: which FUSE binding lets warm small files fly.

The measurement behind the mount's binding (docs/DESIGN.md, "The mount on
libfuse's low-level API").  Every candidate serves the same in-memory tree
of N 4 KiB files (no daemon, no network: only the binding and the kernel's
round trips are measured) in a subprocess, and this process reads every
file with Python's ``open(path, "rb").read()`` (as PIL and DLIO do; in
Python 3.11 that includes an isatty ioctl, which the kernel forwards to the
file system) and with ``open(path, "rb", buffering=0)`` (no ioctl), once to
warm the caches and then in timed passes.  ext4 reads the same files from /var/tmp in the same
run.  Candidates:

- ``lowlevel``: `dlfs.fuse.session` (our ctypes binding of libfuse's
  low-level API): OPEN answered ENOSYS (FUSE no-open: no OPEN, FLUSH or
  RELEASE per open), READDIRPLUS, hour-long entry/attr timeouts, the
  ioctl answered ENOTTY in Python;
- ``lowlevel-c-ioctl``: the same with the ioctl slot left NULL, so libfuse
  answers it in C without calling Python;
- ``pyfuse3``: what the mount used before, with keep_cache (OPEN and
  RELEASE per open; pyfuse3's read gets no inode, so no no-open);
- ``mfusepy``: libfuse's high-level (path) API, open answered ENOSYS so
  reads get the path and fh 0, hour-long timeouts, libfuse's threads.

A candidate whose package is not installed is reported as such.  Prints
a markdown table: files/s (median of the passes, min..max) and the ratio
to ext4, for each way of opening.
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import stat
import statistics
import subprocess
import sys
import tempfile
import time

FILE_BYTES = 4096
DIRS = 100
TIMEOUT_S = 3600.0
CANDIDATES = ("lowlevel", "lowlevel-c-ioctl", "pyfuse3", "mfusepy")


def rel_path(i: int) -> str:
    return f"c{i % DIRS:03d}/{i:07d}.bin"


def content(i: int) -> bytes:
    return (i.to_bytes(8, "little") * (FILE_BYTES // 8))[:FILE_BYTES]


class Tree:
    """The in-memory tree: inode numbers 1 (root), 2..DIRS+1 (dirs), then files."""

    def __init__(self, files: int):
        self.names: dict[int, dict[str, int]] = {1: {}}
        self.data: dict[int, bytes] = {}
        for d in range(DIRS):
            self.names[1][f"c{d:03d}"] = 2 + d
            self.names[2 + d] = {}
        for i in range(files):
            inode = 2 + DIRS + i
            self.names[2 + i % DIRS][f"{i:07d}.bin"] = inode
            self.data[inode] = content(i)
        self.paths = {"/": 1}
        for parent_name, parent in self.names[1].items():
            self.paths["/" + parent_name] = parent
            for name, inode in self.names[parent].items():
                self.paths[f"/{parent_name}/{name}"] = inode

    def mode(self, inode: int) -> int:
        return stat.S_IFREG | 0o444 if inode in self.data else stat.S_IFDIR | 0o555

    def size(self, inode: int) -> int:
        return len(self.data.get(inode, b""))


# --- servers (each runs in its own process) ------------------------------------------------

def serve_lowlevel(tree: Tree, mountpoint: str, ioctl_in_python: bool) -> None:
    import trio

    from dlfs.fuse import lowlevel as ll
    from dlfs.fuse.errno_map import FuseError
    from dlfs.fuse.session import Session, inline

    class Handlers:
        def _entry(self, inode: int) -> ll.EntryParam:
            entry = ll.EntryParam(ino=inode, attr_timeout=TIMEOUT_S, entry_timeout=TIMEOUT_S)
            entry.attr.st_ino, entry.attr.st_mode = inode, tree.mode(inode)
            entry.attr.st_size, entry.attr.st_nlink = tree.size(inode), 1
            return entry

        def lookup(self, req, parent, name):
            inode = tree.names.get(parent, {}).get(name.decode())
            if inode is None:
                raise FuseError(errno.ENOENT)
            session.reply_entry(req, self._entry(inode))

        def forget(self, items):
            pass

        def getattr(self, req, inode):
            session.reply_attr(req, self._entry(inode).attr, TIMEOUT_S)

        def open(self, req, inode, flags):
            raise FuseError(errno.ENOSYS)

        def read(self, req, inode, size, offset):
            session.reply_data(req, tree.data[inode][offset:offset + size])

        def opendir(self, req, inode):
            session.reply_open(req, 0, keep_cache=True, cache_readdir=True)

        def readdirplus(self, req, inode, size, offset, fh):
            reply = session.directory_buffer(req, size)
            for index, (name, child) in enumerate(list(tree.names[inode].items())[offset:]):
                if not reply.add(name.encode(), self._entry(child), offset + index + 1):
                    break
            reply.reply()

        def releasedir(self, req, inode, fh):
            session.reply_err(req, 0)

    if ioctl_in_python:
        Handlers.ioctl = inline(lambda self, req, inode, command:
                                session.reply_err(req, errno.ENOTTY))
    session = Session(Handlers(), mountpoint, ["ro", "fsname=bench-lowlevel"],
                      want=ll.CAP_READDIRPLUS, unwant=ll.CAP_READDIRPLUS_AUTO)

    async def main():
        async with trio.open_nursery() as nursery:
            await session.serve(nursery, threads_max=8)
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        session.close()


def serve_pyfuse3(tree: Tree, mountpoint: str) -> None:
    import pyfuse3
    import trio

    class Fs(pyfuse3.Operations):
        def _attributes(self, inode: int) -> pyfuse3.EntryAttributes:
            attributes = pyfuse3.EntryAttributes()
            attributes.st_ino, attributes.st_mode = inode, tree.mode(inode)
            attributes.st_size, attributes.st_nlink = tree.size(inode), 1
            attributes.attr_timeout = attributes.entry_timeout = TIMEOUT_S
            return attributes

        async def lookup(self, parent, name, ctx=None):
            inode = tree.names.get(parent, {}).get(name.decode())
            if inode is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._attributes(inode)

        async def getattr(self, inode, ctx=None):
            return self._attributes(inode)

        async def open(self, inode, flags, ctx):
            return pyfuse3.FileInfo(fh=inode, keep_cache=True)

        async def read(self, fh, offset, size):
            return tree.data[fh][offset:offset + size]

        async def flush(self, fh):
            raise pyfuse3.FUSEError(errno.ENOSYS)

        async def release(self, fh):
            pass

        async def opendir(self, inode, ctx):
            return inode

        async def readdir(self, fh, start_id, token):
            for index, (name, child) in enumerate(list(tree.names[fh].items())[start_id:]):
                if not pyfuse3.readdir_reply(token, name.encode(), self._attributes(child),
                                             start_id + index + 1):
                    return

    pyfuse3.init(Fs(), mountpoint, set(pyfuse3.default_options) | {"ro", "fsname=bench-pyfuse3"})
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=True)


def serve_mfusepy(tree: Tree, mountpoint: str) -> None:
    import mfusepy

    class Fs(mfusepy.Operations):
        use_ns = True

        def getattr(self, path, fh=None):
            inode = tree.paths.get(path)
            if inode is None:
                raise mfusepy.FuseOSError(errno.ENOENT)
            return {"st_ino": inode, "st_mode": tree.mode(inode), "st_size": tree.size(inode),
                    "st_nlink": 1}

        def open(self, path, flags):
            raise mfusepy.FuseOSError(errno.ENOSYS)

        def read(self, path, size, offset, fh):
            return tree.data[tree.paths[path]][offset:offset + size]

        def readdir(self, path, fh):
            return list(tree.names[tree.paths[path]])

    mfusepy.FUSE(Fs(), mountpoint, foreground=True, ro=True, fsname="bench-mfusepy",
                 entry_timeout=TIMEOUT_S, attr_timeout=TIMEOUT_S, negative_timeout=TIMEOUT_S)


# --- the measurement ------------------------------------------------------------------------

def read_all(root: str, paths: list[str], buffering: int) -> None:
    for rel in paths:
        with open(os.path.join(root, rel), "rb", buffering=buffering) as f:
            f.read()


def files_per_s(root: str, paths: list[str], passes: int) -> dict[int, list[float]]:
    """Files/s of each pass, by `buffering` (-1: Python's default, which asks
    isatty: one ioctl per file; 0: unbuffered, no ioctl)."""
    read_all(root, paths, -1)  # warm: names, attributes and pages cached
    rates: dict[int, list[float]] = {-1: [], 0: []}
    for _ in range(passes):
        for buffering in rates:
            started = time.perf_counter()
            read_all(root, paths, buffering)
            rates[buffering].append(len(paths) / (time.perf_counter() - started))
    return rates


def available(candidate: str) -> str:
    """"" if the candidate can run here, else why not."""
    import importlib.util
    module = {"pyfuse3": "pyfuse3", "mfusepy": "mfusepy"}.get(candidate, "trio")
    return "" if importlib.util.find_spec(module) else f"{module} is not installed"


def measure(candidate: str, files: int, passes: int, workdir: str) -> dict[int, list[float]]:
    mountpoint = os.path.join(workdir, candidate)
    os.mkdir(mountpoint)
    server = subprocess.Popen([sys.executable, "-m", "bench.fuse_bindings", "--serve", candidate,
                               "--files", str(files), mountpoint])
    try:
        deadline = time.monotonic() + 60
        while not os.path.ismount(mountpoint):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{candidate}: the file system did not mount")
            time.sleep(0.05)
        paths = [rel_path(i) for i in range(files)]
        with open(os.path.join(mountpoint, paths[-1]), "rb") as f:
            assert f.read() == content(files - 1), f"{candidate} serves wrong bytes"
        return files_per_s(mountpoint, paths, passes)
    finally:
        subprocess.run(["fusermount3", "-u", "-z", mountpoint], check=False)
        server.wait(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuse_bindings")
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--serve", choices=CANDIDATES, help=argparse.SUPPRESS)
    parser.add_argument("mountpoint", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        tree = Tree(args.files)
        if args.serve.startswith("lowlevel"):
            serve_lowlevel(tree, args.mountpoint, ioctl_in_python=args.serve == "lowlevel")
        elif args.serve == "pyfuse3":
            serve_pyfuse3(tree, args.mountpoint)
        else:
            serve_mfusepy(tree, args.mountpoint)
        return 0
    workdir = tempfile.mkdtemp(prefix="fuse-bindings-", dir="/var/tmp")
    try:
        ext4 = os.path.join(workdir, "ext4")
        for i in range(args.files):
            os.makedirs(os.path.join(ext4, os.path.dirname(rel_path(i))), exist_ok=True)
            with open(os.path.join(ext4, rel_path(i)), "wb") as f:
                f.write(content(i))
        paths = [rel_path(i) for i in range(args.files)]
        results = {"ext4": files_per_s(ext4, paths, args.passes)}
        for candidate in args.candidates.split(","):
            why = available(candidate)
            results[candidate] = why or measure(candidate, args.files, args.passes, workdir)
        print(f"\nwarm {FILE_BYTES}-byte files, open(path, 'rb'[, buffering=0]).read(), 1 "
              f"thread, {args.files} files, {args.passes} passes, Python "
              f"{sys.version.split()[0]}, kernel {os.uname().release}\n")
        print("| binding | open(): files/s (median) | min..max | x ext4 | buffering=0: "
              "files/s | min..max | x ext4 |\n| --- | ---: | --- | ---: | ---: | --- | ---: |")
        for name, rates in results.items():
            if isinstance(rates, str):
                print(f"| {name} | not available: {rates} | | | | | |")
                continue
            cells = []
            for buffering, values in rates.items():
                median = statistics.median(values)
                base = statistics.median(results["ext4"][buffering])
                cells.append(f"{median:,.0f} | {min(values):,.0f}..{max(values):,.0f} | "
                             f"{median / base:.2f}x")
            print(f"| {name} | {' | '.join(cells)} |")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

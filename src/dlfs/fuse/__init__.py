"""`dlfs-mount`: a read-only FUSE file system over a DLFS daemon (libfuse's low-level API + trio).

`main` here is the `dlfs-mount` command: it says which extra to install when
trio (the `fuse` extra) is missing, then runs `mount_cli.main`.

Modules, one job each:

- `mount_cli`: the command line, mounting, background start, signals, readiness.
- `lowlevel`: the ctypes declarations of libfuse 3's low-level API.
- `session`: one FUSE session: libfuse's threads read, handlers answer on trio.
- `fs`: the requests answered from the pieces below; only FuseError escapes.
- `inodes`: inode numbers, lookup counts, bounded idle nodes.
- `dirlist`: one open directory, listed page by page at kernel offsets.
- `readcache`: sample bytes staged between the daemon and the page cache.
- `backend`: blocking calls to the daemon (run in worker threads).
- `errno_map`: the one table from DLFS errors to errno values.
- `failurelog`: failures logged once per interval, not once per request.
- `dlfs.limits` (`mount_*`): every bound of the FUSE layer, with its reason.
"""

import sys


def main(argv: list[str] | None = None) -> int:
    """The `dlfs-mount` command (see `dlfs.fuse.mount_cli`).  Without the `fuse` extra's
    trio: `--version` prints the version (exit status 0), anything else exits with
    status 1 and one line naming the extra."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        import trio  # noqa: F401 - the mount's event loop, from the `fuse` extra
    except ModuleNotFoundError as exc:
        if exc.name != "trio":
            raise
        from dlfs.version import __version__, missing_extra

        if "--version" in argv:  # the one answer that needs no mount: as mount_cli's
            print(f"dlfs-mount {__version__}")
            return 0

        print(f"dlfs-mount: {missing_extra('dlfs-mount', 'fuse', 'trio')}", file=sys.stderr)
        return 1
    from dlfs.fuse import mount_cli

    return mount_cli.main(argv)

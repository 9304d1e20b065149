"""`dlfs-mount`: a read-only FUSE file system over a DLFS daemon (libfuse's low-level API + trio).

Modules, one job each:

- `main`: the command line, mounting, background start, signals, readiness.
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
